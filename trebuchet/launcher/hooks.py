"""What the run's supervisor is handed from above the engines (cli/supervise.py): light, so
that `treb run` can pass it before the handover without importing the supervisor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.plain import record

if TYPE_CHECKING:
    from trebuchet.launcher.submitted import Submitted
    from trebuchet.store.db import RunRecord, Store


@record(frozen=True)
class Hooks:
    """What the run's supervisor is given from above (cli/supervise.py), where the
    diagnosis, the trackers and the terminal summary live: this layer may not import them."""

    hang_lines: Callable[[Path], list[str]] | None = None  # a hang, said on the terminal
    close_trackers: Callable[[Store, str], None] | None = None  # the trackers' end
    end: Callable[[Store, Submitted, Path, str], int] | None = None  # attached: summary, code
    # --after: the engines' word on runs waited for that others supervise (runner.refresh)
    refresh: Callable[[Store, list[RunRecord]], None] | None = None

"""The run's supervisor process (`treb run` after the local engine took it over, or a
detached run's). A front door because it wires what the supervisor may not import itself:
the hang's diagnosis, the trackers' end and the attached summary, each imported only when
called: the launch path stays light."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.launcher.hooks import Hooks

if TYPE_CHECKING:
    from trebuchet.launcher.submitted import Submitted
    from trebuchet.runtime.contracts.schema import JobFile
    from trebuchet.store.db import RunRecord, Store


def _hang_lines(adir: Path) -> list[str]:
    from trebuchet.diagnose.hang import hang_lines

    return hang_lines(adir)


def _close_trackers(store: Store, run_id: str) -> None:
    from trebuchet.tracking import close

    close(store, run_id)


def _end(store: Store, result: Submitted, run_dir: Path, profile: str) -> int:
    from trebuchet.cli.report import attached_end

    return attached_end(store, result, run_dir, profile)


def _refresh(store: Store, runs: list[RunRecord]) -> None:
    from trebuchet.runner import refresh

    refresh(store, runs)


HOOKS = Hooks(hang_lines=_hang_lines, close_trackers=_close_trackers, end=_end,
              refresh=_refresh)  # fmt: skip


def main(argv: list[str], job: JobFile | None = None, unsynced: list[str] | None = None) -> int:
    from trebuchet.launcher.supervisor import main as supervise

    return supervise(argv, job, unsynced, HOOKS)


if __name__ == "__main__":
    from trebuchet.launcher.supervisor import leave

    leave(main(sys.argv[1:]))

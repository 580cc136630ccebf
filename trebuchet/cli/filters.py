"""What `treb ps` and `treb prune` accept to pick runs: states, an age or a date.

Bad values are the user's to fix: a UserError (exit 2) that names the flag and the forms
accepted, never a traceback."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from datetime import datetime

from trebuchet.errors import UserError
from trebuchet.store.states import ACTIVE, TERMINAL

STATES = sorted(ACTIVE | TERMINAL)
GROUPS = {"active": sorted(ACTIVE), "ended": sorted(TERMINAL)}


def parse_states(values: Sequence[str], flag: str = "--state") -> list[str]:
    """`--state failed,timeout --state lost` -> ["FAILED", "TIMEOUT", "LOST"]; `active` and
    `ended` stand for their states."""
    out: list[str] = []
    for value in values:
        for word in filter(None, (w.strip() for w in value.split(","))):
            names = GROUPS.get(word.lower(), [word.upper()])
            if names[0] not in STATES:
                raise UserError(
                    f"{flag} {word}: not a state (one of {', '.join(STATES)}, active, ended)"
                )
            out += [n for n in names if n not in out]
    return out


def parse_when(text: str, flag: str) -> float:
    """An age ("2h", "3d", "1h30m": that long ago) or an ISO date or time
    ("2024-05-01", "2024-05-01T14:00", local time unless it carries an offset) -> epoch."""
    from trebuchet.spec.duration import parse_duration

    with contextlib.suppress(ValueError):
        return time.time() - parse_duration(text)
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise UserError(
            f"{flag} {text}: expected an age such as 2h, 3d or 1h30m, or an ISO date such as "
            "2024-05-01 or 2024-05-01T14:00"
        ) from None

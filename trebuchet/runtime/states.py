"""Run and attempt states: which are active, which final, and the moves between them; in
the runtime (stdlib, no imports) because the job controller decides them and the run index
(store/states.py, store/db.py) enforces them: one table for both."""

from __future__ import annotations

# A run's state moves among the active ones (an engine may queue a running job
# again: PENDING) until one of TERMINAL, which is final: the run index refuses any other
# state after it (store/db.py update_run), whoever asks.
TERMINAL = ("SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "LOST")
ACTIVE = ("PENDING", "RUNNING", "RETRYING")
# The attempt states a next attempt may follow; any other (SUCCEEDED, CANCELLED, LOST) ends
# the run.
RETRIABLE = ("FAILED", "TIMEOUT")
TRANSITIONS = {state: tuple(s for s in ACTIVE + TERMINAL if s != state) for state in ACTIVE}


def allowed(old: str, new: str) -> bool:
    """Whether a run may move from state `old` to `new` (staying is always allowed)."""
    return old == new or new in TRANSITIONS.get(old, ())

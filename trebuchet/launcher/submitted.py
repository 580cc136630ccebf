"""What an engine's submit returns: light (the supervisor's end builds one), beside the
engine interface that re-exports it (backends/base.py)."""

from __future__ import annotations

from trebuchet.plain import record


@record(frozen=True)
class Submitted:
    """What `submit` returns. Detached, the run is handed over and `state` is None; attached,
    how it ended: its final state, its exit code where the engine knows it, and the signal
    that cancelled it from this process (Ctrl+C: 2), which `treb run` exits with."""

    run_id: str
    state: str | None = None
    exit_code: int | None = None
    cancel_signal: int | None = None


@record(frozen=True)
class SweepSubmitted:
    """What `submit_sweep` returns; `failed` (runs that did not succeed) is known attached."""

    sweep_id: str
    runs: int
    failed: int | None = None
    cancel_signal: int | None = None

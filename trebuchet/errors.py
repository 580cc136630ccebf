"""Exceptions the CLI turns into clean messages and exit codes (never tracebacks)."""

from __future__ import annotations


class TrebError(Exception):
    """Base error: the message is meant for the user as is."""

    exit_code = 1


class UserError(TrebError):
    """Bad input from the user (spec, flags, run ids): exit code 2."""

    exit_code = 2


class StateError(UserError):
    """TREB_HOME or its index cannot be used as it is (not a folder, read-only, full,
    damaged): the message says what is wrong and what to do. Exit code 2."""


class SpecError(UserError):
    """One or more problems in a spec, each already formatted as `file:line: field: why`."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


class RunFailed(TrebError):
    """Raised by Run.wait() when a run ends in any state but SUCCEEDED."""

    def __init__(self, run_id: str, state: str, detail: str = "") -> None:
        self.run_id = run_id
        self.state = state
        msg = f"run {run_id} ended {state}"
        super().__init__(f"{msg}: {detail}" if detail else msg)

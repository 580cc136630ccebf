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
    """Raised by Run.wait() when a run ends in any state but SUCCEEDED.

    Besides the state, what a caller needs to act without reading logs: the failing rank,
    its exit code and its error line (the diagnosis' summary, e.g. `KeyError: 'lr'`)."""

    # The failing rank's exit code (None: unknown), not TrebError's exit status of the CLI,
    # which never raises RunFailed: the API's name, kept although the two types differ.
    exit_code: int | None  # type: ignore[assignment]

    def __init__(
        self, run_id: str, state: str, detail: str = "", *, error: str | None = None,
        rank: int | None = None, exit_code: int | None = None, cause: str | None = None,
        log: str | None = None,
    ) -> None:  # fmt: skip
        self.run_id = run_id
        self.state = state
        self.error = error  # the failing rank's error line, when its log has one
        self.rank = rank
        self.exit_code = exit_code
        self.cause = cause  # the diagnosis category (python_exception, gpu_oom, ...)
        self.log = log
        msg = f"run {run_id} ended {state}"
        said = ": ".join(part for part in (detail, error) if part)
        super().__init__(f"{msg}: {said}" if said else msg)

"""The interface every engine implements: render, submit, refresh, cancel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store


class Backend(Protocol):
    name: str

    def check(self, loaded: LoadedSpec) -> None:
        """Raise UserError for what this engine cannot run, before anything is recorded."""

    def render(self, loaded: LoadedSpec) -> str:
        """Exactly what would be submitted, secrets masked."""

    def submit(self, sub: Submission, attach: bool) -> int:
        """Start the run; attached, stream its logs and return `treb run`'s exit code."""

    def refresh(self, store: Store, runs: list[RunRecord]) -> None:
        """Bring the states of active runs up to date, all of them in one batch."""

    def cancel(self, store: Store, run: RunRecord) -> None:
        """Stop the run wherever it executes."""

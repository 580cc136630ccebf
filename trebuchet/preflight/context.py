"""What every check gets: the loaded spec, the engine it is checked for, the environment."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trebuchet.plain import record
from trebuchet.preflight.findings import Finding

if TYPE_CHECKING:
    from trebuchet.backends.base import Backend
    from trebuchet.spec.load import LoadedSpec


@record
class Context:
    loaded: LoadedSpec
    engine: Backend  # given by the caller: checks run below the engine registry
    environ: Mapping[str, str]

    @property
    def spec(self) -> Any:
        return self.loaded.spec

    @property
    def remote(self) -> bool:
        """The ranks run on other machines than the submitting host."""
        return self.engine.remote

    @property
    def multi_node(self) -> bool:
        """Several machines, each with its own local disks (local nodes share this one)."""
        return self.remote and self.spec.nodes > 1

    def at(self, *path: str | int) -> str:
        """`file:line` of a field (or the `-o` that set it)."""
        return self.loaded.where(*path)  # type: ignore[arg-type]

    def finding(self, id: str, severity: str, message: str, fix: str, *path: str | int) -> Finding:
        return Finding(id, severity, message, fix, self.at(*path))

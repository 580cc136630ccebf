"""What a spec says beyond its fields (ranks per node, world size...), written once for the
two forms a validated spec takes: the pydantic model (model.py) and the plain view of a
cached spec (frozen.py). Standard library only: a cached `treb run` never imports pydantic.
No annotations here: pydantic would read them as fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the fields each form has, for the type checker (class annotations: fields)
    from typing import Protocol

    class _SpecFields(Protocol):
        timeout: float | None
        timeout_warning: float | None
        procs_per_node: int | None
        gpus_per_node: int
        master_port: int | None
        env: dict[str, str]
        nodes: int

        @property
        def ranks_per_node(self) -> int: ...

    class _EnvironmentFields(Protocol):
        @property
        def image(self) -> str | None: ...
        @property
        def conda(self) -> object: ...


class SpecFacts:
    """Mixed into Spec and its cached view."""

    @property
    def warning_seconds(self: _SpecFields) -> float | None:
        """When to send the checkpoint signal before a timeout."""
        if self.timeout is None:
            return None
        if self.timeout_warning is not None:
            return min(self.timeout_warning, self.timeout)
        return min(60.0, 0.1 * self.timeout)

    @property
    def ranks_per_node(self: _SpecFields) -> int:
        """procs_per_node, defaulting to one rank per GPU (or 1 without GPUs)."""
        if self.procs_per_node:
            return self.procs_per_node
        return self.gpus_per_node if self.gpus_per_node > 0 else 1

    @property
    def fixed_port(self: _SpecFields) -> int | None:
        """MASTER_PORT when the spec pins it (master_port or env.MASTER_PORT)."""
        if self.master_port:
            return self.master_port
        return int(self.env["MASTER_PORT"]) if "MASTER_PORT" in self.env else None

    @property
    def world_size(self: _SpecFields) -> int:
        return self.nodes * self.ranks_per_node


class EnvironmentFacts:
    """Mixed into Environment and its cached view."""

    @property
    def kind(self: _EnvironmentFields) -> str:
        return "image" if self.image else "conda" if self.conda else "venv"


# Model class name -> its facts, for the cached view; a model class not named here must
# have no properties or methods of its own (tests/fast/test_spec_cache.py checks).
FACTS: dict[str, type] = {"Spec": SpecFacts, "Environment": EnvironmentFacts}

"""The engine interface: what `--on NAME` needs from an engine, and what it gets back.

Why an abstract class and not a duck-typed protocol: an engine is complete when it
implements the five abstract methods, and one that can do more says so here rather than
callers probing it with hasattr. Engine modules keep this import light: no pydantic, rich
or torch at import time (`treb ps` refreshes runs through them).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trebuchet.errors import UserError
from trebuchet.launcher.submitted import Submitted as Submitted
from trebuchet.launcher.submitted import SweepSubmitted as SweepSubmitted

if TYPE_CHECKING:
    from trebuchet.envs.recipe import Recipe
    from trebuchet.launcher.hooks import Hooks
    from trebuchet.launcher.submit import Submission
    from trebuchet.preflight.context import Context
    from trebuchet.preflight.findings import Finding
    from trebuchet.spec.load import LoadedSpec
    from trebuchet.store.db import RunRecord, Store

# One point of a sweep: its swept overrides ({"env.LR": "0.1"}) and what they apply to.
SpecPoint = tuple[dict[str, str], "LoadedSpec"]
SubmissionPoint = tuple[dict[str, str], "Submission"]


class Backend(ABC):
    """One engine. `name` is what `--on` takes and what the run store records."""

    name: ClassVar[str]
    # The pydantic model of the spec's `<name>:` block. The built-in engines name theirs in
    # the registry instead, so that loading a spec does not import the engine modules.
    options: ClassVar[Any] = None
    # The ranks run on machines other than the submitting host (multi-node preflight
    # checks apply; `treb diagnose` cannot assume a single host).
    remote: ClassVar[bool] = True
    # The ranks see the run directory the submitting host writes (`--resume-from` can
    # place checkpoints there at submission).
    shared_run_dir: ClassVar[bool] = False
    sweeps: ClassVar[bool] = False
    # The ranks run inside the engine's Slurm job and see its environment (SLURM_*): the
    # trainers' own Slurm handlers (Lightning's auto-requeue) turn on there.
    slurm_environment: ClassVar[bool] = False
    faults: ClassVar[bool] = False  # fault_nodes and inject_fault are implemented
    node_checks: ClassVar[bool] = False  # check_nodes is implemented
    # Ids of the findings `preflight` reports beyond preflight/findings.py's CHECKS, with
    # what each catches: a spec may name them in `ignore_checks`.
    check_ids: ClassVar[dict[str, str]] = {}

    # -- what every engine implements ------------------------------------------------------
    @abstractmethod
    def check(self, loaded: LoadedSpec) -> None:
        """Raise UserError for what this engine cannot run, before anything is recorded."""

    @abstractmethod
    def render(self, loaded: LoadedSpec) -> str:
        """Exactly what would be submitted, secrets masked."""

    @abstractmethod
    def submit(self, sub: Submission, attach: bool) -> Submitted:
        """Start a prepared run; attached, follow it until it ends."""

    @abstractmethod
    def refresh(self, store: Store, runs: list[RunRecord]) -> None:
        """Bring the states of active runs up to date, all of them in one batch."""

    @abstractmethod
    def cancel(self, store: Store, run: RunRecord) -> None:
        """Stop the run wherever it executes."""

    # -- what an engine may add (the defaults hold for an engine without it) -------------
    def fault_nodes(self, run: RunRecord) -> list[str]:
        """`treb fault`: the run's nodes as this engine names them now, node 0 first."""
        raise UserError(f"treb fault: not on {self.name} (an engine without fault injection)")

    def inject_fault(self, run: RunRecord, action: str, target: str | None, node: int | None,
                     host: str | None) -> int:  # fmt: skip
        """`treb fault`: the fault on this engine's node; 0 when something was hit."""
        raise UserError(f"treb fault: not on {self.name} (an engine without fault injection)")

    def check_nodes(self, folder: Path, n: int, conf: dict[str, Any], workdir: str, spec: Any,
                    token: str) -> list[dict[str, Any]]:  # fmt: skip
        """`treb check --nodes N`: the health checks on N of this engine's nodes now, one
        result each (runtime/node/health.py's)."""
        raise UserError(f"treb check --nodes: not on {self.name}")

    def handover(self, sub: Submission, hooks: Hooks | None = None) -> None:
        """`treb run` attached, a single run: the engine may replace the calling process by
        the run's own lean follower (never returning), so that the modules that validated
        the spec do not stay in memory for the whole run. By default submit follows it."""
        return None

    def sync_logs(self, store: Store, run: RunRecord) -> None:  # noqa: B027 - optional
        """Engines whose nodes keep the logs (SkyPilot, Kubernetes): bring what the engine's
        API holds of them into the run directory as per-rank logs (node_logs.py)."""

    def node_outcomes(self, store: Store, run: RunRecord) -> list[dict[str, Any]] | None:
        """Per-node outcomes as the engine reports them (`treb status`): dicts with node,
        attempt, name, state, exit_code, reason."""
        return None

    def agents_share_run_dir(self, run: RunRecord) -> bool:
        """Whether this run's node agents work in the run directory this machine sees
        (`treb stacks` asks them through it)."""
        return not self.remote or self.shared_run_dir

    def preflight(self, ctx: Context) -> list[Finding]:
        """This engine's own preflight findings (`treb check`), beside the shared ones."""
        return []

    def time_limit(self, loaded: LoadedSpec) -> tuple[float | None, tuple[str, ...]] | None:
        """(seconds or None: unlimited, field path) of a limit the engine's block sets on an
        attempt instead of the spec's `timeout` (slurm.time)."""
        return None

    def recipe(self, loaded: LoadedSpec) -> Recipe | None:
        """The environment this engine builds on the submitting host (`treb build`)."""
        return None

    def check_sweep(self, points: list[SpecPoint]) -> None:  # noqa: B027 - optional
        """Raise UserError when the points cannot be one sweep on this engine."""

    def render_sweep(self, points: list[SpecPoint]) -> str:
        """Every point's render, headed by its overrides."""
        from trebuchet.spec.sweep import point_text

        out = []
        for i, (point, loaded) in enumerate(points):
            out.append(f"# ==== sweep point {i} (of {len(points)}): {point_text(point)}\n")
            out.append(self.render(loaded))
        return "".join(out)

    def submit_sweep(
        self, sweep_id: str, points: list[SubmissionPoint], attach: bool
    ) -> SweepSubmitted:
        """Start the prepared runs of a sweep (engines with `sweeps = True`)."""
        raise NotImplementedError(f"the {self.name} engine does not run sweeps")

    def cancel_sweep(self, store: Store, runs: list[RunRecord]) -> None:
        """`treb cancel SWEEP`: one by one unless the engine can do better (Slurm's one
        scancel for a job array)."""
        for run in runs:
            fresh = store.get(run.id)
            if fresh and fresh.active:
                self.cancel(store, fresh)

    def perf_fields(self, row: dict[str, Any]) -> dict[str, str]:
        """The perf.csv columns this engine fills for one of its result rows."""
        return {"deployment_type": self.name}

    def explain_ending(self, run: dict[str, Any]) -> dict[str, Any] | None:
        """`treb diagnose` of a run that ended with no process's failure record (LOST, or
        FAILED before any rank started), from the run's record as plain data. None: what
        diagnose says of any engine. Else a dict: `category` (docs/diagnose.md), `summary`,
        `evidence` (lines), optionally `fix` (in place of the category's remedy) or
        `resources` (what the scheduler has now). Plain data: engines do not import diagnose/."""
        return None

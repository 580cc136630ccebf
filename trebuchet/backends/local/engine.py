"""The local engine: `nodes` simulated nodes of real processes on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import SubmissionPoint, Submitted, SweepSubmitted
from trebuchet.backends.supervised_here import SupervisedHere, signals_lent, start_detached
from trebuchet.envs import gpus
from trebuchet.envs.build import missing_tool
from trebuchet.envs.recipe import recipe_for
from trebuchet.envs.wrap import engine_problem
from trebuchet.launcher.plan import Placement, describe, local_plan, ranks_per_node
from trebuchet.launcher.rank_wrapper import AGENT_LAUNCHERS
from trebuchet.launcher.runtime_file import ship
from trebuchet.runtime.contracts.schema import JobFile
from trebuchet.store import lifecycle
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import write_json
from trebuchet.store.paths import runs_dir
from trebuchet.store.states import CANCELLED, PENDING

if TYPE_CHECKING:  # `treb ps` refreshes local runs: it must not import pydantic
    from trebuchet.envs.recipe import Recipe
    from trebuchet.launcher.hooks import Hooks
    from trebuchet.launcher.submit import Submission
    from trebuchet.spec.load import LoadedSpec

# The supervisor process's module: a front door, where its Hooks are wired.
SUPERVISOR = "trebuchet.cli.supervise"
HANDOVER_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class LocalBackend(SupervisedHere):
    name = "local"
    faults = True
    node_checks = True
    remote = False
    sweeps = True

    def __init__(self) -> None:
        self._placements: dict[int, Placement] = {}

    def placement(self, loaded: LoadedSpec) -> Placement:
        """GPUs per simulated node and the environment recipe; raises UserError."""
        key = id(loaded)
        if key in self._placements:
            return self._placements[key]
        spec = loaded.spec
        vendor = "none"
        detected: list[str] = []
        if spec.gpus_per_node != 0 or spec.environment is not None:
            vendor, detected = gpus.detect()
        if spec.gpu_vendor != "auto":
            vendor = spec.gpu_vendor
        # torchrun's manual launch (--node-rank, plan.py): this machine is one whole node
        manual = os.environ.get("TREB_NODE_RANK_ONLY") is not None
        try:
            node_gpus = gpus.node_masks(
                spec.gpus_per_node, gpus.existing_mask(vendor, os.environ), detected,
                1 if manual else spec.nodes,
            )  # fmt: skip
            if manual:
                node_gpus = node_gpus * spec.nodes
        except gpus.GpuError as exc:
            raise loaded.refusal("gpus_per_node", str(exc)) from None
        place = Placement(vendor, node_gpus, recipe_for(spec, loaded.base, vendor))
        self._placements[key] = place
        return place

    def recipe(self, loaded: LoadedSpec) -> Recipe | None:
        return self.placement(loaded).recipe

    def check(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        launcher_exe = {"mpirun": "mpirun", "horovod": "horovodrun"}.get(spec.launcher)
        if launcher_exe and spec.environment is None and not shutil.which(launcher_exe):
            how = (
                "OpenMPI (Debian: apt-get install openmpi-bin)"
                if launcher_exe == "mpirun"
                else "horovod"
            )
            raise loaded.refusal("launcher", f"{launcher_exe} is not on PATH; install {how}")
        if spec.launcher == "horovod":
            from trebuchet.runtime.node.horovodrun import env_problem

            bad = env_problem(dict(spec.env))
            if bad:
                raise loaded.refusal(*bad)
        recipe = self.placement(loaded).recipe
        if recipe and recipe.kind == "image":
            problem = engine_problem()
            if problem:
                raise loaded.refusal("environment.image", problem)
        elif recipe and (missing := missing_tool(recipe)):
            field, why = missing
            raise loaded.refusal(".".join(field), why)
        if spec.profile == "nsys" and recipe is None and not shutil.which("nsys"):
            raise loaded.refusal(
                "profile",
                "nsys is not on PATH (install NVIDIA Nsight "
                "Systems, or use profile: torch or none)",
            )
        if spec.launcher == "torchrun" and recipe is None and not shutil.which("torchrun"):
            raise loaded.refusal(
                "launcher",
                "torchrun is not on PATH (install torch in this "
                "environment, or use launcher: native)",
            )

    def render(self, loaded: LoadedSpec) -> str:
        """What would run; tools that are only needed to run (an engine) are not required."""
        return describe(self.job_file(loaded, "RUN_ID", runs_dir() / "RUN_ID"))

    def job_file(self, loaded: LoadedSpec, run_id: str, run_dir: Path) -> JobFile:
        """The job file of every engine, its ranks per node (one per visible GPU when the
        spec leaves it to them) and this engine's processes (launcher/plan.py)."""
        from trebuchet.backends.job_file import controller_job  # not for `treb ps`

        place = self.placement(loaded)
        job = controller_job(loaded.spec, run_id, run_dir)
        job["ppn"] = ranks_per_node(loaded.spec, place)
        job["plan"] = local_plan(loaded.spec, loaded.workdir, run_id, run_dir,
                                  dict(os.environ), place)  # fmt: skip
        return job

    def write_plan(self, sub: Submission, durable: bool = True) -> JobFile:
        """job.json; `durable=False`: left in sub.unsynced for the supervisor to sync."""
        job = self.job_file(sub.loaded, sub.record.id, sub.run_dir)
        if job["launcher"] in AGENT_LAUNCHERS:  # each worker runs the runtime's `worker`
            ship(sub.run_dir)
        write_json(sub.run_dir / "job.json", job, durable=durable)
        if not durable:
            sub.unsynced.append(str(sub.run_dir / "job.json"))
        return job

    def submit(self, sub: Submission, attach: bool) -> Submitted:
        plan = self.write_plan(sub)
        if attach:
            from trebuchet.launcher.local_nodes import Supervisor
            from trebuchet.view.live import View

            view = View()
            sup = Supervisor(plan, sub.store, view)
            with signals_lent():
                sup.install_signals()
                try:
                    state = sup.run()
                finally:
                    view.close()
                    sup.reap()
            rec = sub.store.get(sub.record.id) or sub.record
            return Submitted(rec.id, state, rec.exit_code, sup.cancel_signal)
        start_supervisor(sub.store, sub.record.id, sub.run_dir)
        return Submitted(sub.record.id)

    def handover(self, sub: Submission, hooks: Hooks | None = None) -> None:
        """`treb run` becomes the run's supervisor (same pid, terminal and process group).
        With the spec from the spec cache, nothing heavy was imported: the supervisor runs
        here and now. Otherwise exec a fresh interpreter that imports neither pydantic nor
        the spec models (their ~20 MiB would stay resident for the whole run). Stop signals
        are blocked until the supervisor has its handlers (the mask survives the exec), so a
        Ctrl+C in between still cancels the run."""
        signal.pthread_sigmask(signal.SIG_BLOCK, HANDOVER_SIGNALS)  # before the plan: a
        plan = self.write_plan(sub, durable=False)  # Ctrl+C while it is written still cancels
        sys.stdout.flush()
        sys.stderr.flush()
        argv = [sys.executable, "-m", SUPERVISOR, "--attached",
                "--profile", sub.loaded.spec.profile, str(sub.run_dir)]  # fmt: skip
        from trebuchet.spec.cache import always

        if "pydantic" not in sys.modules or always():  # always: the tests try this path
            from trebuchet.launcher import supervisor

            code = supervisor.main(argv[3:], plan, sub.unsynced, hooks)
            sub.store.close()
            supervisor.leave(code)
        sub.sync()  # the new interpreter's supervisor does not know them
        try:
            os.execv(sys.executable, argv)
        except OSError:  # no exec here: supervise in this process (submit, below)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDOVER_SIGNALS)

    def submit_sweep(
        self, sweep_id: str, points: list[SubmissionPoint], attach: bool
    ) -> SweepSubmitted:
        """At most sweep_parallel runs at once (default 1), by the driver in sweep.py."""
        from trebuchet.backends.local.sweep import submit_local

        return submit_local(self, sweep_id, points, attach)

    def fault_nodes(self, run: RunRecord) -> list[str]:
        from trebuchet.backends.local import fault

        return fault.nodes(run)

    def inject_fault(self, run: RunRecord, action: str, target: str | None, node: int | None,
                     host: str | None) -> int:  # fmt: skip
        from trebuchet.backends.local import fault

        return fault.inject(run, action, target, node)

    def check_nodes(self, folder: Path, n: int, conf: dict[str, Any], workdir: str, spec: Any,
                    token: str) -> list[dict[str, Any]]:  # fmt: skip
        from trebuchet.backends.local.node_check import check

        return check(folder, n, conf, workdir, token)

    def sweep_queued(self, sweep_id: str) -> bool:
        from trebuchet.backends.local.sweep import driver_alive

        return driver_alive(sweep_id)

    def cancel_sweep(self, store: Store, runs: list[RunRecord]) -> None:
        """Points not started yet are cancelled first, so the driver starts no more."""
        for r in runs:
            if r.state == PENDING and not r.supervisor_pid:
                lifecycle.ended(store, r.id, CANCELLED, "cancelled before it started")
        super().cancel_sweep(store, runs)


def start_supervisor(store: Store, run_id: str, run_dir: Path) -> int:
    return start_detached(store, run_id, run_dir, SUPERVISOR)


BACKEND = LocalBackend()

"""SkyPilot: the spec as a SkyPilot task YAML; `treb run --on skypilot` hands it to SkyPilot.

The task's `run:` section only places the node from SkyPilot's variables and starts
trebuchet's node agent, which runs the node's ranks as on every engine; the agent and its
job file travel with the task as `file_mounts`. Rendering needs nothing installed.
Submitting makes a managed job (`sky.jobs.launch`) when the spec asks for spot instances or
retries, so that SkyPilot recovers it, else a cluster launch torn down when the job ends.
SkyPilot reports one status per job, no per-node outcome.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trebuchet.backends.base import Backend, Submitted
from trebuchet.backends.job_file import (
    check_node_engine,
    engine_options,
    failed,
    job_text,
    node_job,
    refuse_spares,
    require,
    running,
    start_lines,
    uses_secret,
    write_job_files,
)
from trebuchet.backends.node_setup import check_files, setup_lines
from trebuchet.errors import UserError
from trebuchet.launcher.runtime_file import file_name as runtime_file_name
from trebuchet.preflight.findings import WARNING
from trebuchet.runtime.contracts.rank_env import DEFAULT_MASTER_PORT
from trebuchet.runtime.contracts.schema import JobFile
from trebuchet.store import lifecycle

if TYPE_CHECKING:
    from trebuchet.backends.skypilot.options import SkyPilot
    from trebuchet.preflight.context import Context
    from trebuchet.preflight.findings import Finding
    from trebuchet.spec.load import LoadedSpec

# Where file_mounts put the runtime (named by its content: runs share it) and the job file
# on every node; the job file's folder is the node-local run directory.
REMOTE_RUNTIME = "~/.trebuchet/runtime"
REMOTE_RUNS = "~/.trebuchet/runs"
CHECKPOINTS = "/treb-checkpoints"  # where skypilot.checkpoint_bucket is mounted


class SkyPilotBackend(Backend):
    name = "skypilot"

    def preflight(self, ctx: Context) -> list[Finding]:
        """What the bare nodes would lack (an environment, checkpoints kept across a
        recovery), and GPUs the accelerators ask for that no rank uses."""
        from trebuchet.preflight import bare_nodes

        spec, sk = ctx.spec, ctx.spec.skypilot
        image = bool(spec.environment and spec.environment.image)
        out = bare_nodes.environment_missing(ctx, "SkyPilot", image)
        if (spec.retries or sk.use_spot) and not sk.checkpoint_bucket:
            how = (
                f"retries: {spec.retries} makes it a managed job with job_recovery"
                if spec.retries
                else "use_spot: a managed job whose preempted nodes are recovered"
            )
            at = ("retries",) if spec.retries else ("skypilot", "use_spot")
            out += bare_nodes.checkpoints_lost(
                ctx, "SkyPilot", how, "skypilot.checkpoint_bucket", *at
            )
        count = _count(sk.accelerators)
        if count and not spec.gpus_per_node and count > spec.ranks_per_node:
            ranks = spec.ranks_per_node
            out.append(
                ctx.finding(
                    "gpus-unused",
                    WARNING,
                    f"skypilot.accelerators {sk.accelerators} gives each node {count} GPUs, "
                    f"but gpus_per_node is unset and {ranks} rank(s) run per node: "
                    f"{count - ranks} GPU(s) per node idle unless each rank uses several",
                    f"set `gpus_per_node: {count}` (one rank per GPU unless procs_per_node "
                    f"says otherwise), or ask for {_gpu_name(sk.accelerators)}:{ranks}",
                    "skypilot",
                    "accelerators",
                )
            )
        return out

    def check(self, loaded: LoadedSpec) -> None:
        """Refuse what a task YAML cannot express; submitting also needs the package."""
        self.check_render(loaded)
        require("sky", "skypilot")

    def check_render(self, loaded: LoadedSpec) -> None:
        spec = loaded.spec
        check_node_engine(spec, loaded, "SkyPilot")
        refuse_spares(spec, loaded, "SkyPilot")
        env = spec.environment
        if env and env.mounts:
            raise loaded.refusal(
                "environment.mounts",
                "SkyPilot cannot bind-mount host "
                "paths into the image; use SkyPilot file_mounts or a bucket",
            )
        sk: SkyPilot = engine_options(spec, "skypilot")
        acc = sk.accelerators
        if spec.gpus_per_node > 0 and not acc:
            raise loaded.refusal(
                "skypilot.accelerators" if sk.model_fields_set else "gpus_per_node",
                "SkyPilot needs the GPU type, e.g. skypilot.accelerators: "
                f"H100:{spec.gpus_per_node}",
            )  # fmt: skip
        m = re.fullmatch(r"([^:,\s]+)(?::(\d+))?", acc or "")
        if acc and not m:
            raise loaded.refusal("skypilot.accelerators", f"{acc!r} is not NAME or NAME:COUNT")
        if m and m.group(2) and spec.gpus_per_node and int(m.group(2)) != spec.gpus_per_node:
            raise loaded.refusal(
                "skypilot.accelerators",
                f"{acc} asks for {m.group(2)} GPUs "
                f"per node but gpus_per_node is {spec.gpus_per_node}",
            )
        check_files(loaded, "SkyPilot", "workdir (it uploads nothing else)")
        if sk.checkpoint_store and sk.checkpoint_bucket and "://" in sk.checkpoint_bucket:
            raise loaded.refusal(
                "skypilot.checkpoint_store",
                "only for a bucket given by name; the URL of checkpoint_bucket names its store",
            )
        if sk.checkpoint_store and not sk.checkpoint_bucket:
            raise loaded.refusal("skypilot.checkpoint_store", "needs skypilot.checkpoint_bucket")

    def task(
        self, loaded: LoadedSpec, run_id: str = "RUN_ID", run_dir: Path | None = None
    ) -> dict[str, Any]:
        """The task as data (what render prints, what submit hands to SkyPilot). `run_dir`
        holds the files that file_mounts upload."""
        self.check_render(loaded)
        spec = loaded.spec
        if run_dir is None:
            from trebuchet.store.paths import runs_dir

            run_dir = runs_dir() / run_id
        runtime = runtime_file_name()
        task: dict[str, Any] = {
            "name": spec.name,
            "workdir": str(loaded.workdir),
            "num_nodes": spec.nodes,
        }
        res: dict[str, Any] = {}
        sk: SkyPilot = engine_options(spec, "skypilot")
        if sk.accelerators:
            acc = sk.accelerators
            if ":" not in acc and spec.gpus_per_node > 0:
                acc = f"{acc}:{spec.gpus_per_node}"
            res["accelerators"] = acc
        for key in ("cloud", "region", "use_spot", "disk_size"):
            value = getattr(sk, key)
            if value is not None:
                res[key] = value
        if spec.environment and spec.environment.image:
            res["image_id"] = "docker:" + spec.environment.image
        if spec.retries:
            res["job_recovery"] = {
                "strategy": "EAGER_NEXT_REGION",
                "max_restarts_on_errors": spec.retries,
            }
        if res:
            task["resources"] = res
        # env values that use a secret are expanded by the node agent (job.json's secret_env)
        envs = {k: v for k, v in spec.env.items() if not uses_secret(v, spec.secrets)}
        # SkyPilot gives a task no count of its recoveries (docs/backends/skypilot.md)
        envs.update({"TREB_RUN_ID": run_id, "TREB_ATTEMPT": "0"})
        task["envs"] = envs
        if spec.secrets:
            task["secrets"] = {name: None for name in spec.secrets}
        task["file_mounts"] = {
            f"{REMOTE_RUNTIME}/{runtime}": str(run_dir / runtime),
            f"{REMOTE_RUNS}/{run_id}/job.json": str(run_dir / "job.json"),
        }
        if sk.checkpoint_bucket:
            task["file_mounts"][CHECKPOINTS] = bucket_mount(sk)
        setup, activate = setup_lines(loaded)
        if setup:
            task["setup"] = "\n".join(setup) + "\n"
        port = spec.fixed_port or DEFAULT_MASTER_PORT
        lines = [
            "# trebuchet's node agent (file_mounts) runs this node's ranks: "
            f"launcher {spec.launcher}, {spec.ranks_per_node} per node",
            'export NODE_RANK="$SKYPILOT_NODE_RANK" NUM_NODES="$SKYPILOT_NUM_NODES" '
            f"MASTER_PORT={port}",
            'MASTER_ADDR="$(echo "$SKYPILOT_NODE_IPS" | head -n1)"',
            f'export MASTER_ADDR TREB_RUN_DIR="$HOME/{REMOTE_RUNS[2:]}/$TREB_RUN_ID"',
            *activate,
            *start_lines(f'"$HOME/{REMOTE_RUNTIME[2:]}/{runtime}"', '"$TREB_RUN_DIR/job.json"'),
        ]
        task["run"] = "\n".join(lines) + "\n"
        return task

    def prepare_task(self, loaded: LoadedSpec, run_id: str, run_dir: Path) -> dict[str, Any]:
        """The files that file_mounts upload, written into the run directory, and the task."""
        write_job_files(run_dir, job_of(loaded.spec, run_id))
        return self.task(loaded, run_id, run_dir)

    def render(self, loaded: LoadedSpec) -> str:
        from trebuchet.spec.dump import dump_yaml

        spec = loaded.spec
        task = self.task(loaded)
        job = job_text(job_of(spec, "RUN_ID"))
        src = task["file_mounts"][f"{REMOTE_RUNS}/RUN_ID/job.json"]
        head = (
            f"# SkyPilot task for {spec.name} ({loaded.source}); secrets are "
            "named only: SkyPilot takes their values from --secret NAME\n"
        )
        tail = f"# ---- {src} (file_mounts; read by the node agent)\n"
        tail += "".join(f"# {line}\n" for line in job.splitlines())
        return head + dump_yaml(task) + tail

    def submit(self, sub: Any, attach: bool) -> Submitted:
        require("sky", "skypilot", sub)
        import sky

        from trebuchet.spec.dump import dump_yaml
        from trebuchet.store.files import write_atomic

        loaded, spec = sub.loaded, sub.loaded.spec
        data = self.prepare_task(loaded, sub.record.id, sub.run_dir)
        write_atomic(sub.run_dir / "skypilot-task.yaml", dump_yaml(data))
        values = [(n, os.environ[n]) for n in spec.secrets]  # checked present by prepare()
        task = sky.Task.from_yaml_config(data, secrets_overrides=values or None)
        managed = bool(spec.retries or spec.skypilot.use_spot)
        try:
            if managed:
                request = sky.jobs.launch(task, name=f"{spec.name}-{sub.record.id}")
            else:
                request = sky.launch(task, cluster_name=f"treb-{sub.record.id}", down=True)
            result = sky.stream_and_get(request)
        except Exception as exc:  # SkyPilot's errors are many; the run records why
            failed(sub, f"SkyPilot refused the task: {exc}")
            raise UserError(f"--on skypilot: SkyPilot refused the task: {exc}") from None
        job_id = result[0] if isinstance(result, tuple) and result else result
        if isinstance(job_id, list):
            job_id = job_id[0] if job_id else None
        backend_id = f"{'jobs' if managed else 'cluster:treb-' + sub.record.id}:{job_id}"
        running(sub, "skypilot", backend_id, managed=managed, job_id=job_id)
        if not attach:
            return Submitted(sub.record.id)
        if managed:
            rc = sky.jobs.tail_logs(job_id=job_id, follow=True)
        else:
            rc = sky.tail_logs(f"treb-{sub.record.id}", job_id, follow=True)
        # the ranks' logs, before the end's diagnosis reads them (node_logs.py)
        self.sync_logs(sub.store, sub.store.get(sub.record.id))
        state = "SUCCEEDED" if rc == 0 else "FAILED"
        code = rc if isinstance(rc, int) else None
        lifecycle.ended(sub.store, sub.record.id, state, f"the job's logs ended ({rc})",
                        exit_code=code)  # fmt: skip
        return Submitted(sub.record.id, state, rc if isinstance(rc, int) else None)

    def refresh(self, store: Any, runs: list[Any]) -> None:
        """Active runs' states from SkyPilot (state.py)."""
        from trebuchet.backends.skypilot.state import refresh_runs

        refresh_runs(self.name, store, runs)

    def sync_logs(self, store: Any, run: Any) -> None:
        """The job's log as SkyPilot keeps it now, split into per-rank logs (node_logs.py).
        SkyPilot gives a task no count of its recoveries: everything is attempt 0."""
        kind, _, job = (run.backend_id or "").rpartition(":")
        if not job.isdigit():
            return
        try:
            import sky
        except ImportError:
            return
        import io

        from trebuchet.backends.node_logs import split, write

        buf = io.StringIO()
        try:
            if kind == "jobs":
                sky.jobs.tail_logs(job_id=int(job), follow=False, output_stream=buf)
            else:
                cluster = kind.removeprefix("cluster:")
                sky.tail_logs(cluster, int(job), follow=False, output_stream=buf)
        except Exception:  # API server unreachable, cluster gone: keep what was synced
            return
        from trebuchet.backends.skypilot.logs import by_node

        ppn = max(1, run.procs_per_node)
        for node, text in by_node(buf.getvalue()).items():  # without SkyPilot's prefixes
            write(Path(run.run_dir), 0, split(text, ppn, node))

    def cancel(self, store: Any, run: Any) -> None:
        require("sky", "skypilot")
        import sky

        kind, _, job = (run.backend_id or "").rpartition(":")
        if not job.isdigit():
            raise UserError(f"run {run.id} has no SkyPilot job id recorded ({run.backend_id!r})")
        if kind == "jobs":
            sky.get(sky.jobs.cancel(job_ids=[int(job)]))
        else:
            sky.get(sky.cancel(kind.removeprefix("cluster:"), job_ids=[int(job)]))
        lifecycle.ended(store, run.id, "CANCELLED", "treb cancel")


def _count(acc: str | None) -> int:
    """The GPU count of NAME:COUNT (0 without one)."""
    m = re.fullmatch(r"[^:,\s]+:(\d+)", acc or "")
    return int(m.group(1)) if m else 0


def _gpu_name(acc: str) -> str:
    return acc.partition(":")[0]


def bucket_mount(sk: Any) -> dict[str, Any]:
    """The file_mounts entry of skypilot.checkpoint_bucket: mounted (writes go to the
    bucket), an existing bucket by URL, or one SkyPilot creates by name and keeps."""
    bucket = sk.checkpoint_bucket
    if "://" in bucket:
        return {"source": bucket, "mode": "MOUNT"}
    mount: dict[str, Any] = {"name": bucket, "mode": "MOUNT", "persistent": True}
    if sk.checkpoint_store:
        mount["store"] = sk.checkpoint_store
    return mount


def job_of(spec: Any, run_id: str) -> JobFile:
    """job.json: checkpoints in the bucket's folder for this run when there is one."""
    ckpt = f"{CHECKPOINTS}/{run_id}" if spec.skypilot.checkpoint_bucket else None
    return node_job(spec, run_id, ckpt)


BACKEND = SkyPilotBackend()

"""Test double of SkyPilot's SDK (`sky`): what `treb run/logs --on skypilot` call, backed
by tests/engine_hosts.py, which runs the task on the ssh test hosts as SkyPilot does. The
API server and Ray cluster it stands for cannot run here (tests/stand_ins/README.md).
State (each job's log and exit code) is kept in $TREB_STAND_IN_DIR between processes."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.*

from tests.engine_hosts import sky_run_job  # noqa: E402

STATE = Path(os.environ.get("TREB_STAND_IN_DIR", "/nonexistent"))


class Task:
    def __init__(self, config: dict[str, Any], secrets: dict[str, str]) -> None:
        self.config, self.secrets = config, secrets

    @classmethod
    def from_yaml_config(cls, config: dict[str, Any], secrets_overrides: Any = None) -> Task:
        secrets = dict(secrets_overrides or [])
        missing = [n for n in config.get("secrets") or {} if n not in secrets]
        if missing:  # SkyPilot refuses a secret without a value
            raise ValueError(f"secrets without a value: {missing}")
        return cls(config, secrets)


def launch(task: Task, cluster_name: str, down: bool = False) -> dict[str, Any]:
    return {"task": task, "cluster": cluster_name}


def stream_and_get(request: dict[str, Any]) -> tuple[int, Any]:
    """The job submitted and run to its end on the test hosts (SkyPilot returns at the
    submission; `tail_logs(follow=True)` then waits: the same to its caller)."""
    STATE.mkdir(parents=True, exist_ok=True)
    job_id = 1
    cluster = request["cluster"]
    root = STATE / cluster
    task = request["task"]
    rc, log, codes = sky_run_job(task.config, task.secrets, root, job_id, cluster)
    (root / f"job-{job_id}.log").write_text(log)
    (root / f"job-{job_id}.json").write_text(json.dumps({"rc": rc, "nodes": codes}))
    return job_id, None


def tail_logs(cluster: str, job_id: int, follow: bool = True, output_stream: Any = None) -> int:
    root = STATE / cluster
    text = (root / f"job-{job_id}.log").read_text()
    (output_stream or sys.stdout).write(text)
    return int(json.loads((root / f"job-{job_id}.json").read_text())["rc"])

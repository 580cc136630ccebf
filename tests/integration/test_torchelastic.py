"""Issue 28 with real torch and Lightning: torchrun's variables under launcher native
(locally and on Slurm) and the fixed ones under launcher torchrun, a rank's @record error
file quoted by `treb diagnose`/`treb status`, and Lightning's own SLURM auto-requeue made
one requeue with the run's attempts right (Slurm test cluster)."""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, status_json, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    release_requeued,
    slurm_conf,
    status,
    streb,
    wait_for,
)
from tests.integration.test_ssh_runs import PY, ssh_config  # noqa: F401 (fixture)
from tests.integration.test_ssh_runs import spec as ssh_spec

pytestmark = pytest.mark.integration
SCRIPTS = REPO / "tests" / "integration" / "scripts"
RANK = SCRIPTS / "elastic_rank.py"
RAISED = "ValueError: corrupt batch 7 in shard-0042 on rank {}"


def _reports(run_dir: Path) -> dict[str, dict]:
    """What each rank's torch saw, by '<rank>-<attempt>'."""
    return {p.stem: json.loads(p.read_text()) for p in (run_dir / "elastic").glob("*.json")}


def _quotes_error_file(treb, rid: str, run_dir: Path, attempt: int, rank: int = 1) -> None:
    """`treb diagnose --json`, `treb status --json` and `treb status` quote the failed
    rank's error file: the exception as raised and the frame that raised it."""
    res = treb("diagnose", rid, "--json")
    assert res.returncode == 0, res.stderr
    raised = RAISED.format(rank)
    error = json.loads(res.stdout)["root_cause"]["error"]
    assert error["message"] == raised
    assert error["file"] == str(run_dir / f"attempt-{attempt}" / "errors" / f"rank-{rank}.json")
    assert error["frames"][-1].endswith(
        'in load_batch: raise ValueError(f"corrupt batch '
        "{step} in shard-0042 on rank {os.environ['RANK']}\")"
    )
    assert status_json(treb, rid)["diagnosis"]["root_cause"]["error"]["message"] == raised
    text = treb("status", rid).stdout
    assert f"error: {raised} (its error file" in text and "in load_batch" in text, text


def test_native_ranks_see_torchruns_contract(treb, tmp_path: Path) -> None:
    """2 simulated nodes x 2 ranks, one retry: in every attempt torch says the ranks were
    launched by torchelastic, with the run id, the attempt as restart count, the retries as
    the budget, an error file per rank; gloo over env:// forms (no agent store awaited)."""
    needs("torch")
    spec = write_spec(tmp_path, f"command: python {RANK} --fail-rank 1\nnodes: 2\n"
                                "procs_per_node: 2\nretries: 1\n")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    rid, run_dir = st["id"], Path(st["run_dir"])
    reports = _reports(run_dir)
    assert sorted(reports) == [f"{r}-{a}" for r in range(4) for a in range(2)]
    for key, e in reports.items():
        rank, attempt = (int(x) for x in key.split("-"))
        assert e["is_torchelastic_launched"] is True and e["world"] == 4
        assert e["TORCHELASTIC_RUN_ID"] == rid
        assert e["TORCHELASTIC_RESTART_COUNT"] == str(attempt) == e["TREB_ATTEMPT"]
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "1"
        assert e["TORCHELASTIC_ERROR_FILE"] == str(
            run_dir / f"attempt-{attempt}" / "errors" / f"rank-{rank}.json")  # fmt: skip
        assert e["TORCHELASTIC_USE_AGENT_STORE"] is None
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and e["ROLE_NAME"] == "default"
        assert e["ROLE_RANK"] == str(rank) and e["ROLE_WORLD_SIZE"] == "4"
        assert e["GROUP_RANK"] == str(rank // 2) and e["GROUP_WORLD_SIZE"] == "2"
    _quotes_error_file(treb, rid, run_dir, attempt=1)


def test_torchrun_launcher_run_id_and_error_files(treb, tmp_path: Path) -> None:
    """Under launcher torchrun: TORCHELASTIC_RUN_ID is the run id (was the literal `none`),
    @record writes where treb reads, and torchrun's own report quotes the same error."""
    needs("torch")
    spec = write_spec(tmp_path, f"command: python {RANK} --fail-rank 1\nlauncher: torchrun\n"
                                "procs_per_node: 2\n")  # fmt: skip
    res = treb("run", str(spec))
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    rid, run_dir = st["id"], Path(st["run_dir"])
    reports = _reports(run_dir)
    assert sorted(reports) == ["0-0", "1-0"]
    for key, e in reports.items():
        assert e["is_torchelastic_launched"] is True and e["TORCHELASTIC_RUN_ID"] == rid
        assert e["TORCHELASTIC_ERROR_FILE"] == str(
            run_dir / "attempt-0" / "errors" / f"rank-{key[0]}.json")  # fmt: skip
    _quotes_error_file(treb, rid, run_dir, attempt=0)
    torchrun_report = (run_dir / "attempt-0" / "node-0.log").read_text()
    assert "Root Cause (first observed failure)" in torchrun_report
    assert RAISED.format(1) in torchrun_report.split("Root Cause (first observed failure)")[1]


@pytest.mark.ssh
def test_native_ranks_are_torchelastic_launched_over_ssh(treb, ssh_config, tmp_path: Path) -> None:
    """2 real ssh hosts x 2 ranks (the node verb): torch says torchelastic launched them,
    with the run id, and rank 3's error file on the second host is quoted."""
    needs("torch")
    extra = "env:\n  GLOO_SOCKET_IFNAME: eth0\n"
    path = ssh_spec(tmp_path, ssh_config, f"{PY} {RANK} --fail-rank 3", extra, copy=False)
    res = treb("run", str(path), "--on", "ssh")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    rid, run_dir = st["id"], Path(st["run_dir"])
    reports = _reports(run_dir)
    assert sorted(reports) == [f"{r}-0" for r in range(4)]
    for key, e in reports.items():
        assert e["is_torchelastic_launched"] is True and e["TORCHELASTIC_RUN_ID"] == rid
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["TORCHELASTIC_ERROR_FILE"] == str(
            run_dir / "attempt-0" / "errors" / f"rank-{key[0]}.json")  # fmt: skip
    _quotes_error_file(treb, rid, run_dir, attempt=0, rank=3)


@pytest.mark.slurm
def test_native_contract_and_error_file_on_slurm(streb, tmp_path: Path) -> None:
    """The same contract in srun's tasks on the 2 nodes of the test cluster, but for
    TORCHELASTIC_RUN_ID: srun is their launcher (Lightning keeps its SLURMEnvironment, see
    the test below), so is_torchelastic_launched() is False, as under plain srun; the
    error file, the restart count and the budget are there."""
    needs("torch")
    spec = write_spec(tmp_path, f"command: python {RANK} --fail-rank 1\nnodes: 2\n")
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    st = wait_for(streb, rid, {"SUCCEEDED", "FAILED", "LOST"}, timeout=180)
    assert st["state"] == "FAILED", st
    run_dir = Path(st["run_dir"])
    reports = _reports(run_dir)
    assert sorted(reports) == ["0-0", "1-0"]
    for key, e in reports.items():
        assert e["is_torchelastic_launched"] is False and e["TORCHELASTIC_RUN_ID"] is None
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["TORCHELASTIC_ERROR_FILE"] == str(
            run_dir / "attempt-0" / "errors" / f"rank-{key[0]}.json")  # fmt: skip
        assert e["GROUP_RANK"] == key[0] and e["GROUP_WORLD_SIZE"] == "2"
        assert e["ROLE_NAME"] == "default" and e["TORCHELASTIC_USE_AGENT_STORE"] is None
    _quotes_error_file(streb, rid, run_dir, attempt=0)


@pytest.mark.slurm
def test_lightning_auto_requeue_is_one_requeue_and_resumes(streb, tmp_path: Path) -> None:
    """Lightning's DDP Trainer with its SLURM auto-requeue and the checkpoint signal it
    handles (SIGUSR1, as `#SBATCH --signal=SIGUSR1@60` would give it): near the limit it
    saves its checkpoint and rank 0 runs `scontrol requeue`; trebuchet makes that its own
    requeue, once; the next attempt resumes from the checkpoint and the run SUCCEEDS."""
    needs("lightning")
    shutil.copy(SCRIPTS / "lightning_requeue.py", tmp_path / "train.py")
    spec = write_spec(tmp_path, "name: lightning-requeue\ncommand: python train.py\n"
                                "procs_per_node: 2\ncheckpoint_signal: SIGUSR1\n"
                                "timeout_warning: 60s\nretries: 1\nslurm: {time: '2'}\n")  # fmt: skip
    check = streb("check", str(spec), "--on", "slurm")
    assert "trainer-requeues-itself" not in check.stdout + check.stderr  # set up as it asks
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    st = wait_for(streb, rid, {"RETRYING", "SUCCEEDED", "FAILED", "LOST"}, timeout=240)
    assert st["state"] == "RETRYING", st
    first = st["attempts"][0]
    assert first["state"] == "TIMEOUT", first
    assert "requeued at the job's request (rank 0 on " in first["reason"], first
    release_requeued(st["backend_id"])
    st = wait_for(streb, rid, {"SUCCEEDED", "FAILED", "LOST", "TIMEOUT"}, timeout=240)
    assert st["state"] == "SUCCEEDED", (st["state"], st["attempts"])
    assert [a["state"] for a in st["attempts"]] == ["TIMEOUT", "SUCCEEDED"]
    assert st["attempt"] == 1
    run_dir = Path(st["run_dir"])
    log0 = (run_dir / "attempt-0" / "rank-0.log").read_text()
    assert "SLURMEnvironment, starts at step 0 from None" in log0
    assert "handed to trebuchet's job controller" in log0  # Lightning's scontrol requeue
    log1 = (run_dir / "attempt-1" / "rank-0.log").read_text()
    resumed = [ln for ln in log1.splitlines() if "attempt 1: SLURMEnvironment, starts at" in ln]
    assert resumed, log1[-3000:]
    step = int(resumed[0].split("starts at step ")[1].split()[0])
    assert step > 0 and "hpc_ckpt_1.ckpt" in resumed[0], resumed
    assert "rank 0 done at step 160" in log1
    batch = (run_dir / "batch.log").read_text()
    assert batch.count("requeueing job") == 1, batch  # one requeue: the trainer's, by treb
    assert "asked to requeue the job (scontrol requeue): trebuchet requeues it" in batch

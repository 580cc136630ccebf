"""`treb run --on slurm` on the real 2-node test cluster: training, failures, cancel, limits.

Why: every claim of the Slurm backend (ranks really on both nodes, root cause with rank
and node, cancel, TIMEOUT, retries that resume, no port collisions) is only true if it
holds on a real slurmctld/slurmd, so these run there (CI starts the cluster).
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, TrebFn, needs, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    records,
    release_requeued,
    slurm,
    slurm_conf,
    slurm_state,
    status,
    streb,
    wait_for,
    wait_ranks_running,
)

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
DIGITS = REPO / "examples" / "digits-ddp" / "job.yaml"
HELLO = REPO / "examples" / "hello" / "job.yaml"

# The runs that wait for Slurm's time limit (slurm.time is whole minutes: each reaches it
# 60-90 s after it starts) are submitted together when this module starts, so that they
# wait while its other tests run; the tests that assert on them come later and mostly find
# them ended. A thread watches them as the tests once did (a requeued one is released as
# soon as it is RETRYING) and records what it saw; TREB_HOME is their own.
LIMIT_TESTS = {"test_time_limits_timeout_and_requeue",
               "test_checkpoint_signal_only_to_ranks_that_handle_it"}  # fmt: skip
ENDED = {"SUCCEEDED", "FAILED", "TIMEOUT", "CANCELLED", "LOST"}
CHECKPOINT_PY = (
    "import os, signal, time\n"
    "rank, got = int(os.environ['RANK']), []\n"
    "if rank % 2 == 0:\n"
    "    signal.signal(signal.SIGUSR2, lambda *_: got.append(1))\n"
    "t0 = time.time()\n"
    "while not got and time.time() - t0 < 200:\n    time.sleep(0.2)\n"
    "print(f'rank {rank} got={bool(got)}', flush=True)\n"
    "time.sleep(600)\n"
)


def limit_specs(folder: Path) -> dict[str, Path]:
    """A rank that does not handle the checkpoint signal, one that ignores it (Slurm's own
    TIMEOUT), a retried one that checkpoints on it and resumes after `scontrol requeue`,
    and 2 nodes x 2 ranks of which only the even ones handle SIGUSR2."""
    limit = "slurm: {time: '1'}\n"
    (folder / "d").mkdir(parents=True)
    (folder / "d" / "ck.py").write_text(CHECKPOINT_PY)
    return {
        "plain": write_spec(folder / "a", f"name: plain\ncommand: 'echo up; sleep 600'\n{limit}"),
        "ignore": write_spec(
            folder / "b", f"name: ignore\ncommand: 'trap \"\" USR2; echo up; sleep 600'\n{limit}"
        ),
        "requeue": write_spec(
            folder / "c",
            """\
name: requeue
command: |
  if [ "$TREB_ATTEMPT" = 0 ]; then
    trap 'echo "checkpoint at $(date +%T)"; echo "state of attempt 0" > "$TREB_CHECKPOINT_DIR/ck"' USR2
    while :; do sleep 1; done
  fi
  echo "attempt $TREB_ATTEMPT resumes from: $(cat "$TREB_CHECKPOINT_DIR/ck")"
slurm: {time: '1'}
retries: 1
""",
        ),
        "signal": write_spec(
            folder / "d",
            # 2 minutes: Slurm may send a job's signal up to 60 s before the time asked
            # (sbatch --signal); with 1, it came a second after the ranks' start, before
            # rank 0's Python had its handler (a fresh-clone CI saw it)
            "command: python3 ck.py; echo after\nnodes: 2\n"
            "procs_per_node: 2\ntimeout_warning: 30s\nslurm: {time: '2'}\n",
        ),
    }


class LimitRuns:
    """The time-limited runs, submitted at once and watched from a thread: `first` is each
    run's status when first seen RETRYING or ended, `final` once ended."""

    def __init__(self, treb: TrebFn, ids: dict[str, str]) -> None:
        self.treb, self.ids = treb, ids
        self.first: dict[str, dict] = {}
        self.final: dict[str, dict] = {}
        self.error: BaseException | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        try:
            deadline = time.monotonic() + 420  # 240 s to the limit, 120 s for the requeue
            # Nothing ends before the 1-minute limit nears (and a requeued job waits ~2 min
            # before Slurm starts it again): no `treb` processes beside the tests till then.
            if self.stop.wait(40):
                return
            while len(self.final) < len(self.ids) and not self.stop.wait(2):
                assert time.monotonic() < deadline, f"still running: {self.first}"
                res = self.treb("ps", "--json")  # one refresh of every active run
                assert res.returncode == 0, res.stderr
                states = {r["id"]: r["state"] for r in json.loads(res.stdout)}
                for name, rid in self.ids.items():
                    state = states.get(rid)
                    if name in self.final or state not in ENDED | {"RETRYING"}:
                        continue
                    if name not in self.first:
                        self.first[name] = st = status(self.treb, rid)
                        if st["state"] == "RETRYING":
                            release_requeued(st["backend_id"])
                    if state in ENDED:
                        self.final[name] = status(self.treb, rid)
        except BaseException as exc:  # re-raised in the tests that wait for these runs
            self.error = exc

    def wait(self) -> LimitRuns:
        self.thread.join(timeout=450)
        if self.error:
            raise self.error
        assert not self.thread.is_alive(), "the watch of the time-limited runs hangs"
        return self


@pytest.fixture(scope="module", autouse=True)
def limit_runs(request: pytest.FixtureRequest, tmp_path_factory) -> Iterator[LimitRuns | None]:
    """The time-limited runs, only when a test that needs them is selected."""
    wanted = {getattr(i, "originalname", "") for i in request.session.items
              if getattr(i, "module", None) is request.module}  # fmt: skip
    if not wanted & LIMIT_TESTS:
        yield None
        return
    conf = request.getfixturevalue("slurm_conf")
    folder = tmp_path_factory.mktemp("limits")
    env = {**os.environ, "TREB_HOME": str(folder / "treb-home"), "SLURM_CONF": conf,
           "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}  # fmt: skip
    env.pop("OMP_NUM_THREADS", None)

    def treb(*args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                              text=True, timeout=timeout, env=env, **kw)  # fmt: skip

    ids = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", conf)  # for release_requeued, from the thread
        try:
            for name, spec in limit_specs(folder).items():
                res = treb("run", str(spec), "--on", "slurm", "--detach")
                assert res.returncode == 0, res.stderr
                ids[name] = res.stdout.strip()
            runs = LimitRuns(treb, ids)
            yield runs
            runs.stop.set()
            runs.thread.join(timeout=60)
        finally:
            jobs = [j for rid in ids.values() if (j := status(treb, rid).get("backend_id"))]
            if jobs:
                subprocess.run(["scancel", *jobs], capture_output=True, timeout=60)


@pytest.mark.parametrize("launcher", ["native", "torchrun"])
def test_digits_ddp_on_two_nodes(launcher: str, streb) -> None:
    needs("torch")
    needs("sklearn")
    cmd = 'echo "rank $RANK on $(hostname)"; python train.py --epochs 4'
    res = streb("run", str(DIGITS), "--on", "slurm", "-o", f"launcher={launcher}",
                "-o", "nodes=2", "-o", f"command={cmd}", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    acc = re.search(r"^\[0:0\] accuracy: ([0-9.]+)$", res.stdout, re.M)
    assert acc and float(acc.group(1)) > 0.7, res.stdout[-2000:]
    assert re.search(r"^\[1:1\] rank 3 on tn2$", res.stdout, re.M), res.stdout[-2000:]
    st = status(streb)
    assert st["state"] == "SUCCEEDED" and st["shape"] == "2x2" and st["backend_id"]
    recs = records(st["run_dir"])
    hosts = {recs[f"rank-{r}"]["host"] for r in range(4)}
    assert hosts == {"tn1", "tn2"}, recs  # the ranks really ran on both nodes
    assert [recs[f"rank-{r}"]["host"] for r in range(4)] == ["tn1", "tn1", "tn2", "tn2"]
    assert all(recs[f"rank-{r}"]["exit_code"] == 0 for r in range(4))
    if launcher == "torchrun":  # one agent per node, itself recorded
        assert recs["node-0"]["host"] == "tn1" and recs["node-1"]["host"] == "tn2"
    logs = streb("logs", "--rank", "3")
    assert logs.returncode == 0 and logs.stdout.startswith("rank 3 on tn2\n"), logs
    assert len(st["procs"]) == (4 if launcher == "native" else 6)


@pytest.mark.parametrize("launcher", ["native", "none", "torchrun", "native-pmix"])
def test_hello_contract_on_slurm(launcher: str, streb) -> None:
    """The example that checks every variable of the per-rank contract, over TCP."""
    if launcher == "torchrun":
        needs("torch")
    extra = ["-o", "slurm.mpi=pmix"] if launcher.endswith("-pmix") else []
    launcher = launcher.removesuffix("-pmix")
    res = streb("run", str(HELLO), "--on", "slurm", "-o", f"launcher={launcher}", *extra,
                timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "CONTRACT FAIL" not in res.stdout + res.stderr
    assert f"all {2 if launcher == 'none' else 4} ranks said hello" in res.stdout


def test_mpirun_hello_ranks_on_both_nodes(streb) -> None:
    """launcher mpirun: one task on tn1 runs mpirun, OpenMPI starts the ranks on both nodes."""
    res = streb("run", str(HELLO), "--on", "slurm", "-o", "launcher=mpirun", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "CONTRACT FAIL" not in res.stdout + res.stderr
    assert "all 4 ranks said hello" in res.stdout
    assert re.search(r"^\[1:1\] rank 3 ok$", res.stdout, re.M), res.stdout[-2000:]
    st = status(streb)
    assert st["state"] == "SUCCEEDED" and st["exit_code"] == 0
    recs = records(st["run_dir"])
    assert [recs[f"rank-{r}"]["host"] for r in range(4)] == ["tn1", "tn1", "tn2", "tn2"]
    assert [(recs[f"rank-{r}"]["node"], recs[f"rank-{r}"]["local_rank"]) for r in range(4)] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]  # fmt: skip
    assert all(recs[f"rank-{r}"]["exit_code"] == 0 for r in range(4))
    assert recs["node-0"]["host"] == "tn1" and "node-1" not in recs  # mpirun, once
    assert len(st["procs"]) == 5


def test_mpirun_failing_rank_is_the_root_cause(streb, tmp_path: Path) -> None:
    cmd = 'if [ "$RANK" = 3 ]; then sleep 1; echo "boom on $(hostname)" >&2; exit 3; fi; sleep 120'
    spec = write_spec(tmp_path, f"name: mpifails\ncommand: '{cmd}'\nlauncher: mpirun\n"
                                "nodes: 2\nprocs_per_node: 2\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 1, res.stderr
    st = status(streb)
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and st["exit_code"] == 3, st
    assert (ff["rank"], ff["node"], ff["local_rank"], ff["host"]) == (3, 1, 1, "tn2")
    assert ff["log"].endswith("attempt-0/rank-3.log")
    recs = records(st["run_dir"])
    assert all(recs[f"rank-{r}"]["stopped_by_launcher"] for r in range(3)), recs
    assert "boom on tn2" in res.stderr


def test_mpirun_cancel_stops_every_rank(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: mpilong\ncommand: 'echo up; sleep 600'\n"
                                "launcher: mpirun\nnodes: 2\nprocs_per_node: 2\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=60)
    wait_ranks_running(st["run_dir"], 5)  # mpirun's record and the 4 ranks'
    res = streb("cancel", rid)
    assert res.returncode == 0 and "CANCELLED" in res.stdout, res.stderr
    st = status(streb, rid)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    ranks = [p for p in st["procs"] if p["rank"] is not None]
    assert len(ranks) == 4 and all(p["stopped_by_launcher"] for p in ranks), st["procs"]


def test_failing_rank_on_node_two_is_the_root_cause(streb, tmp_path: Path) -> None:
    cmd = 'if [ "$RANK" = 3 ]; then sleep 1; echo "boom on $(hostname)" >&2; exit 3; fi; sleep 120'
    spec = write_spec(tmp_path, f"name: fails\ncommand: '{cmd}'\nnodes: 2\nprocs_per_node: 2\n")
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 1, res.stderr
    st = status(streb)
    ff = st["first_failure"]
    assert st["state"] == "FAILED" and st["exit_code"] == 3
    assert (ff["rank"], ff["node"], ff["local_rank"], ff["host"]) == (3, 1, 1, "tn2")
    assert ff["log"].endswith("attempt-0/rank-3.log")
    stopped = {p["rank"] for p in st["procs"] if p["stopped_by_launcher"]}
    assert stopped == {0, 1, 2}
    # the other node's agent stopped its ranks on the controller's word (issue 36)
    batch_log = (Path(st["run_dir"]) / "batch.log").read_text()
    assert "a rank failed on tn2: the other node agents stop their ranks" in batch_log
    assert "did not answer the stop" not in batch_log
    assert "rank 3 (node 1, local rank 1) on tn2 exited with code 3" in res.stderr
    assert "boom on tn2" in res.stderr  # the tail of the failing rank's log


def test_cancel_a_running_job(streb, tmp_path: Path) -> None:
    """`treb cancel` gives the ranks what a local cancel gives: SIGTERM, then the spec's
    grace_period (not Slurm's KillWait, 5 s on the test cluster) before SIGKILL: a rank
    that traps SIGTERM and saves for 7 s saves; the job ends CANCELLED in Slurm too."""
    out = tmp_path / "out"
    out.mkdir()
    save = f"sleep 7; echo saved > {out}/saved-$RANK; exit 143"
    spec = write_spec(tmp_path, "name: long\nnodes: 2\nprocs_per_node: 2\ngrace_period: 20s\n"
                                f"command: 'trap \"{save}\" TERM; echo up; sleep 600 & wait'\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    rid = res.stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=60)
    wait_ranks_running(st["run_dir"], 4)
    res = streb("cancel", rid)
    assert res.returncode == 0 and "CANCELLED" in res.stdout, res.stderr
    st = status(streb, rid)
    assert sorted(p.name for p in out.iterdir()) == [f"saved-{r}" for r in range(4)], st
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    assert st["attempts"][0]["state"] == "CANCELLED"
    assert st["attempts"][0]["reason"] == "cancelled (treb cancel)", st["attempts"]
    q = slurm("squeue", "-h", "-t", "all", "-j", st["backend_id"], "-o", "%T")
    assert q.stdout.strip() == "CANCELLED", q
    assert len(st["procs"]) == 4, st["procs"]
    assert all(p["stopped_by_launcher"] for p in st["procs"]), st["procs"]


def test_ctrl_c_on_attached_run_cancels_the_job(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: attached\ncommand: 'echo up; sleep 600'\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trebuchet", "run", str(spec), "--on", "slurm"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.5)
            st = status(streb) if (Path(os.environ["TREB_HOME"]) / "runs.db").exists() else {}
            if st.get("state") == "RUNNING" and records(st["run_dir"]):
                break
            assert time.monotonic() < deadline, st
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    # the job's controller hands the interrupt on (test_slurm_interrupt.py), and the job
    # ends by itself, its batch step with 130
    assert "[0:0] up" in out and "interrupted: SIGINT to the ranks" in err, err
    st = status(streb)
    assert st["state"] == "CANCELLED"
    # Slurm says what the user did, as after `scancel` or `treb cancel` (not FAILED, 130)
    assert slurm_state(st["backend_id"]) == "CANCELLED", st
    assert st["attempts"][0]["reason"].startswith("cancelled (Ctrl+C)"), st["attempts"]
    assert st["procs"][0]["signal"] == "SIGINT" and st["procs"][0]["stopped_by_launcher"]


def test_retry_resumes_from_the_checkpoint(streb) -> None:
    needs("torch")
    needs("sklearn")
    cmd = "python train.py --epochs 4 --crash-after-epoch 2"
    res = streb("run", str(DIGITS), "--on", "slurm", "-o", "nodes=2", "-o", "retries=1",
                "-o", f"command={cmd}", timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status(streb)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 1 and st["max_attempts"] == 2
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    run_dir = Path(st["run_dir"])
    crashed = records(run_dir, 0)["rank-3"]
    assert crashed["exit_code"] == 1 and crashed["host"] == "tn2"
    assert "simulated crash after epoch 2" in (run_dir / "attempt-0" / "rank-3.log").read_text()
    resumed = (run_dir / "attempt-1" / "rank-0.log").read_text()
    assert "resumed from epoch 2" in resumed and "epoch 4 loss" in resumed
    assert "epoch 1 loss" not in resumed  # attempt 1 did not start over
    assert (run_dir / "checkpoints" / "digits-ddp.pt").exists()
    # the retry ran on the first attempt's node agents, in their srun step (issue 36)
    steps = {records(run_dir, a)[f"rank-{r}"]["step_id"] for a in (0, 1) for r in range(4)}
    assert len(steps) == 1, steps
    assert "on the node agents of the previous attempt's srun step" in (
        run_dir / "batch.log").read_text()  # fmt: skip


def test_time_limits_timeout_and_requeue(limit_runs: LimitRuns) -> None:
    """Three jobs at once (each waits for the job's 1-minute limit, slurm.time): a rank that
    does not handle the checkpoint signal, one that ignores it (Slurm's own TIMEOUT), and a
    retried one that checkpoints on the signal and resumes after `scontrol requeue`
    (submitted when the module starts: limit_runs)."""
    runs = limit_runs.wait()
    rq = runs.first["requeue"]
    assert rq["state"] == "RETRYING", rq
    assert rq["attempts"][0]["state"] == "TIMEOUT" and "requeued" in rq["attempts"][0]["reason"]
    rq = runs.final["requeue"]
    assert rq["state"] == "SUCCEEDED", rq
    assert [a["state"] for a in rq["attempts"]] == ["TIMEOUT", "SUCCEEDED"]
    log = (Path(rq["run_dir"]) / "attempt-1" / "rank-0.log").read_text()
    assert "attempt 1 resumes from: state of attempt 0" in log
    for name in ("plain", "ignore"):
        st = runs.final[name]
        assert st["state"] == "TIMEOUT", st
        assert st["first_failure"] is None
    ignored = status(runs.treb, runs.ids["ignore"])
    assert ignored["attempts"][0]["reason"] == "time limit"  # ended by Slurm at the limit
    assert ignored["ended_at"] - ignored["started_at"] >= 55


def test_checkpoint_signal_only_to_ranks_that_handle_it(limit_runs: LimitRuns) -> None:
    """Near the job's limit (slurm.time), the ranks that handle SIGUSR2 get it (through the
    bash in front of them), the others run on to the limit: no `scancel --signal` to every
    process (ck.py in CHECKPOINT_PY, submitted when the module starts: limit_runs)."""
    st = limit_runs.wait().final["signal"]
    assert st["state"] == "TIMEOUT", st
    run_dir = Path(st["run_dir"])
    for rank in range(4):
        log = (run_dir / "attempt-0" / f"rank-{rank}.log").read_text()
        assert (f"rank {rank} got=True" in log) == (rank % 2 == 0), (rank, log)
        rec = records(run_dir, 0)[f"rank-{rank}"]
        assert rec["signal"] != "SIGUSR2", rec
    batch = (run_dir / "batch.log").read_text()
    assert "tn1: SIGUSR2 to 1 process(es) that handle it" in batch, batch
    assert "tn2: SIGUSR2 to 1 process(es) that handle it" in batch, batch


def test_timeout_is_per_attempt_as_locally(streb, tmp_path: Path) -> None:
    """`timeout` holds each attempt, as locally (not the job, as #SBATCH --time would): a
    rank that sleeps 60 s ends TIMEOUT after 4 s, with no first failure and the exit code
    of a rank stopped by SIGTERM; with retries both attempts time out, inside one
    allocation (no requeue). The one-rank job runs inline in the batch step, the 2-node one
    as an srun step: both ways of stopping the ranks."""
    once = write_spec(tmp_path / "a", "name: once\ncommand: sleep 60\ntimeout: 4s\n")
    twice = write_spec(tmp_path / "b", "name: twice\ncommand: sleep 60\ntimeout: 4s\n"
                                       "retries: 1\nnodes: 2\n")  # fmt: skip
    ids = []
    for spec in (once, twice):
        res = streb("run", str(spec), "--on", "slurm", "--detach")
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip())
    for rid, attempts in zip(ids, (1, 2), strict=True):
        st = wait_for(streb, rid, {"TIMEOUT", "FAILED", "SUCCEEDED", "LOST"}, timeout=240)
        assert st["state"] == "TIMEOUT" and st["first_failure"] is None, st
        assert st["exit_code"] == 143, st  # as locally: the rank's SIGTERM
        assert [a["state"] for a in st["attempts"]] == ["TIMEOUT"] * attempts, st
        assert all(a["reason"] == "timeout" for a in st["attempts"]), st
        recs = records(st["run_dir"], attempts - 1)
        assert recs and all(r["stopped_by_launcher"] for r in recs.values()), recs
        batch = (Path(st["run_dir"]) / "batch.log").read_text()
        assert "requeue" not in batch, batch
        if attempts == 2:  # the srun step's node agents: each timeout's stop over their link
            assert batch.count("stopping the ranks over the agent link") == 2, batch
            assert "cannot be reached over the link" not in batch, batch
            assert "did not answer the stop" not in batch, batch


def test_checkpoint_signal_before_the_per_attempt_timeout(streb, tmp_path: Path) -> None:
    """`timeout_warning` before a per-attempt `timeout`: the controller sends the checkpoint
    signal to the rank that handles it (rank 0 traps it; rank 1, on the other node, would
    die of it and does not get it), then stops both at the timeout."""
    cmd = ('if [ "$RANK" = 0 ]; then trap "echo got USR2 on \\$(hostname)" USR2; fi; '
           "echo up; while :; do sleep 1; done")  # fmt: skip
    spec = write_spec(tmp_path, f"command: '{cmd}'\nnodes: 2\ntimeout: 12s\n"
                                "timeout_warning: 8s\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    st = wait_for(streb, res.stdout.strip(), {"TIMEOUT", "FAILED", "SUCCEEDED", "LOST"}, 240)
    assert st["state"] == "TIMEOUT" and st["attempts"][0]["reason"] == "timeout", st
    run_dir = Path(st["run_dir"])
    assert "got USR2 on tn1" in (run_dir / "attempt-0" / "rank-0.log").read_text()
    assert "got USR2" not in (run_dir / "attempt-0" / "rank-1.log").read_text()
    recs = records(run_dir)
    assert all(r["signal"] != "SIGUSR2" and r["stopped_by_launcher"] for r in recs.values())
    batch = (run_dir / "batch.log").read_text()
    assert re.search(r"timeout in \d+s: SIGUSR2 to the ranks that handle it", batch), batch
    assert "tn1: SIGUSR2 to 1 process(es) that handle it" in batch, batch
    assert "tn2: SIGUSR2 to 0 process(es) that handle it" in batch, batch


def test_two_jobs_at_once_do_not_collide_on_ports(streb, tmp_path: Path) -> None:
    """Two jobs on the same nodes at the same time: each rank 0 holds its MASTER_PORT open
    on tn1 while the other job's does too; the port follows the job id."""
    script = (
        "import os, socket, time\n"
        "if os.environ['RANK'] == '0':\n"
        "    s = socket.socket()\n"
        "    s.bind((os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])))\n"
        "    s.listen()\n"
        "    print('bound', os.environ['MASTER_PORT'], time.time(), flush=True)\n"
        "    time.sleep(8)\n"
    )
    (tmp_path / "hold.py").write_text(script)
    spec = write_spec(tmp_path, "command: python hold.py\nnodes: 2\nprocs_per_node: 2\n")
    ids = []
    for name in ("one", "two"):
        res = streb("run", str(spec), "--on", "slurm", "--detach", "--name", name)
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip())
    ports, spans = [], []
    for rid in ids:
        st = wait_for(streb, rid, {"SUCCEEDED", "FAILED", "LOST"}, timeout=120)
        assert st["state"] == "SUCCEEDED", st
        rec = records(st["run_dir"])["rank-0"]
        bound = (Path(st["run_dir"]) / "attempt-0" / "rank-0.log").read_text().split()
        ports.append(int(bound[1]))
        spans.append((float(bound[2]), rec["ended_at"]))
        assert rec["host"] == "tn1" and int(bound[1]) == 15000 + int(st["backend_id"]) % 10000
    assert ports[0] != ports[1]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans  # they overlapped


def test_logs_follow_and_status_while_running(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: talk\ncommand: 'for i in 1 2 3; do echo \"$RANK says $i\"; "
                                "sleep 1; done'\nnodes: 2\nprocs_per_node: 2\n")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", "--detach")
    rid = res.stdout.strip()
    follow = streb("logs", "-f", rid, timeout=120)
    assert follow.returncode == 0, follow.stderr
    for r in range(4):
        assert f"[{r // 2}:{r % 2}] {r} says 3" in follow.stdout, follow.stdout
    assert status(streb, rid)["state"] == "SUCCEEDED"
    one = streb("logs", rid, "--rank", "2")
    assert one.stdout == "2 says 1\n2 says 2\n2 says 3\n"


def test_pre_and_post_once_per_node(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, """\
name: hooks
command: 'echo "rank $RANK"'
nodes: 2
procs_per_node: 2
pre: 'echo "pre on $(hostname) node $NODE_RANK"'
post: 'echo "post on $(hostname)"; [ "$NODE_RANK" = 0 ]'
""")  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=120)
    assert res.returncode == 1, res.stderr  # the post command failed on node 1
    st = status(streb)
    adir = Path(st["run_dir"]) / "attempt-0"
    assert (adir / "pre-node-0.log").read_text() == "pre on tn1 node 0\n"
    assert (adir / "pre-node-1.log").read_text() == "pre on tn2 node 1\n"
    assert (adir / "post-node-1.log").read_text() == "post on tn2\n"
    assert st["state"] == "FAILED" and st["attempts"][0]["reason"] == "post"
    assert all(p["exit_code"] == 0 for p in st["procs"]) and len(st["procs"]) == 4


def test_cancel_a_pending_job(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: later\ncommand: 'true'\n"
                                "slurm: {sbatch_args: ['--begin=now+600']}\n")  # fmt: skip
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    assert status(streb, rid)["state"] == "PENDING"
    res = streb("cancel", rid)
    assert res.returncode == 0 and "CANCELLED" in res.stdout, res.stderr
    st = status(streb, rid)
    assert st["attempts"][0]["reason"] == "cancelled (treb cancel) before the job started"


def test_requeue_by_slurm_counts_as_an_attempt(streb, tmp_path: Path) -> None:
    """What a preemption (or a node failure with requeue) looks like: Slurm ends the
    running job and starts it again; the next attempt runs, the first is recorded."""
    spec = write_spec(tmp_path, "name: preempted\ncommand: 'if [ \"$TREB_ATTEMPT\" = 0 ]; then "
                                "sleep 120; fi; echo done'\nretries: 1\n")  # fmt: skip
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    st = wait_for(streb, rid, {"RUNNING"}, timeout=60)
    wait_ranks_running(st["run_dir"], 1)
    assert slurm("scontrol", "requeue", st["backend_id"]).returncode == 0
    wait_for(streb, rid, {"RETRYING"}, timeout=60)
    release_requeued(st["backend_id"])
    st = wait_for(streb, rid, {"SUCCEEDED", "FAILED", "LOST"}, timeout=120)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 1, (st["attempts"], st["state"])
    first = st["attempts"][0]
    assert first["state"] == "FAILED" and first["reason"].startswith("requeued by Slurm")


def test_ranks_that_die_as_slurm_requeues_are_no_failed_attempt(streb, tmp_path: Path) -> None:
    """Slurm signals every process of a job it requeues, so the ranks can die before the
    controller sees its own SIGTERM. Here the rank asks for the requeue and exits at once:
    the attempt is the requeued one, not a failure retried inside the job being ended (which
    a restart would then find with no attempt left)."""
    # The real scontrol, not the one trebuchet puts first on the ranks' PATH (which hands a
    # rank's requeue to the controller: test_torchelastic.py): Slurm itself requeues here.
    spec = write_spec(tmp_path, "name: self-requeued\ncommand: 'if [ \"$TREB_ATTEMPT\" = 0 ]; "
                                "then PATH=\"${PATH#\"$TREB_RUN_DIR/bin:\"}\" scontrol requeue "
                                "$SLURM_JOB_ID; exit 3; fi; echo done'\nretries: 1\n")  # fmt: skip
    rid = streb("run", str(spec), "--on", "slurm", "--detach").stdout.strip()
    st = wait_for(streb, rid, {"RETRYING", "SUCCEEDED", "FAILED", "LOST"}, timeout=60)
    assert st["state"] == "RETRYING", st
    release_requeued(st["backend_id"])
    st = wait_for(streb, rid, {"SUCCEEDED", "FAILED", "LOST"}, timeout=120)
    assert st["state"] == "SUCCEEDED" and st["attempt"] == 1, (st["attempts"], st["state"])
    first = st["attempts"][0]
    assert first["state"] == "FAILED" and first["reason"].startswith("requeued by Slurm"), first
    log = (Path(st["run_dir"]) / "batch.log").read_text()
    assert "retrying" not in log, log

"""The node agent of one Slurm task (the runtime's `task` verb), run for real from the
shipped .pyz, outside Slurm.

Why: with proctrack/linuxproc Slurm signals a step's processes one by one, children first,
so a rank's command can die of SIGTERM before its agent's own SIGTERM arrives. That rank
must still be recorded as stopped (by a cancel, a time limit or the first-failure
teardown), or a cancelled job would name it as the root cause. The ordering cannot be
forced on the test cluster, so here the command kills itself with SIGTERM and the agent
never gets one; the `squeue` on PATH is a stand-in that prints the job state Slurm shows
while it ends a job (said where it is used). (Ported from the tests of the bash wrapper
that the agent replaced: same cases, same expectations.)
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trebuchet.launcher.runtime_file import ship

SELF_TERM = "kill -TERM $$"  # the command dies of SIGTERM; the wrapper gets no signal


def task_job(run_dir: Path, workdir: Path, launcher: str, ppn: int, command: list[str],
             **extra: object) -> Path:  # fmt: skip
    """A job.json as the Slurm engine writes it (the values the agent reads)."""
    job = {"run_id": "r1", "run_dir": str(run_dir), "workdir": str(workdir), "launcher": launcher,
           "nodes": 1, "ppn": ppn, "grace": 2, "checkpoint_signal": "SIGUSR1",
           "command": command, "mpi_env": [], **extra}  # fmt: skip
    path = run_dir / "job.json"
    path.write_text(json.dumps(job))
    return path


def controller_wrote(run_dir: Path, job_id: str) -> None:
    """What the job controller writes before its step, which the agent's health checks
    read (runtime/node/health.py: the run directory is the shared one)."""
    (run_dir / "attempt-0" / "attempt.json").write_text(json.dumps({"job_id": job_id,
                                                                    "attempt": 0}))  # fmt: skip


def run_wrapper(
    tmp_path: Path, command: str, squeue_state: str | None = None, rc: int = 143
) -> dict:
    """One native task through the agent; its outcome record."""
    run_dir = tmp_path / "run"
    (run_dir / "attempt-0").mkdir(parents=True, exist_ok=True)
    controller_wrote(run_dir, "77")
    runtime = ship(run_dir)
    job = task_job(run_dir, tmp_path, "native", 1, ["bash", "-c", command])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    # scancel: the teardown after a genuine failure calls it; record instead of signalling.
    tools = {"scancel": 'echo "$*" >> "$FAKE_CALLS"\n'}
    if squeue_state is not None:  # stand-in: the job's state while Slurm ends it
        tools["squeue"] = f'echo "$*" >> "$FAKE_CALLS"\necho {squeue_state}\n'
    for name, body in tools.items():
        path = bin_dir / name
        path.write_text("#!/bin/bash\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_CALLS": str(tmp_path / "calls"),
        "TREB_RUN_DIR": str(run_dir), "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0",
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0",
        "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
        "SLURM_NNODES": "1", "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "1",
    }  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-S", str(runtime), "task", str(job)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == rc, (res.stdout, res.stderr)
    return json.loads((run_dir / "attempt-0" / "rank-0.json").read_text())


def calls(tmp_path: Path) -> str:
    path = tmp_path / "calls"
    return path.read_text() if path.exists() else ""


def test_command_killed_by_a_treb_cancel_is_recorded_as_stopped(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cancel-requested").write_text("1\n")
    rec = run_wrapper(tmp_path, SELF_TERM)
    assert rec["signal"] == "SIGTERM" and rec["stopped_by_launcher"] is True
    assert "scancel" not in calls(tmp_path) and calls(tmp_path) == ""  # no teardown, no squeue


def test_command_killed_in_a_teardown_is_recorded_as_stopped(tmp_path: Path) -> None:
    # another rank failed while this one ran: its marker, then the step's TERM
    marked = 'echo 0:1 > "$TREB_RUN_DIR/attempt-0/teardown"; ' + SELF_TERM
    rec = run_wrapper(tmp_path, marked)
    assert rec["stopped_by_launcher"] is True and calls(tmp_path) == ""


def test_a_task_started_after_the_teardown_does_not_start_its_rank(tmp_path: Path) -> None:
    """srun can start a task after the teardown's TERM went to the step's others: nobody
    would stop its rank (a retry then waited for that rank's whole run)."""
    (tmp_path / "run" / "attempt-0").mkdir(parents=True)
    (tmp_path / "run" / "attempt-0" / "teardown").write_text("0:1\n")
    with pytest.raises(FileNotFoundError):  # no record: the rank never started
        run_wrapper(tmp_path, f"touch {tmp_path}/ran")
    assert not (tmp_path / "ran").exists() and calls(tmp_path) == ""


@pytest.mark.parametrize("state", ["CANCELLED", "COMPLETING", "TIMEOUT"])
def test_command_killed_while_slurm_ends_the_job_is_recorded_as_stopped(
    tmp_path: Path, state: str
) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM, squeue_state=state)
    assert rec["stopped_by_launcher"] is True
    assert calls(tmp_path).splitlines() == ["-h -j 77 -o %T"]  # one squeue, no teardown


def test_command_killed_while_the_job_runs_is_the_first_failure(tmp_path: Path) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM, squeue_state="RUNNING")
    assert rec["stopped_by_launcher"] is False and rec["exit_code"] == 143
    # It stops the rest of the step, and says so to the wrappers that lose the race.
    assert calls(tmp_path).splitlines() == ["-h -j 77 -o %T", "--signal=TERM 77.0"]
    assert (tmp_path / "run" / "attempt-0" / "teardown").read_text().strip() == "0:0"


def test_without_squeue_a_signal_death_is_a_failure(tmp_path: Path) -> None:
    rec = run_wrapper(tmp_path, SELF_TERM)
    assert rec["stopped_by_launcher"] is False and rec["signal"] == "SIGTERM"


def test_a_crash_is_never_a_cascade(tmp_path: Path) -> None:
    """Only stop signals (HUP, INT, KILL, TERM) can come from a cancel: a segfault cannot."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "cancel-requested").write_text("1\n")
    rec = run_wrapper(tmp_path, "kill -SEGV $$", squeue_state="CANCELLED", rc=139)
    assert rec["signal"] == "SIGSEGV" and rec["stopped_by_launcher"] is False
    assert calls(tmp_path).splitlines() == ["--signal=TERM 77.0"]  # no squeue; teardown


def test_mpirun_task_command_line(tmp_path: Path) -> None:
    """The agent's mpirun line and each rank's mapping, with stand-ins for mpirun/scontrol
    (no second machine for OpenMPI's daemons here; the cluster tests run the real one)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'tn1\\ntn2\\n'\n")
    # mpirun stand-in: print its argv, then run the rank command as OpenMPI rank 5 of 8
    (bin_dir / "mpirun").write_text(
        '#!/bin/bash\nprintf "%s\\0" "$@" > "$TREB_RUN_DIR/argv"\n'
        'a=("$@"); for i in "${!a[@]}"; do [ "${a[$i]}" = worker ] && break; done\n'
        "OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=8 OMPI_COMM_WORLD_LOCAL_RANK=1 "
        'OMPI_COMM_WORLD_LOCAL_SIZE=4 exec "${a[@]:$((i - 3))}"\n'
    )  # fmt: skip
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    run_dir = tmp_path / "run"
    (run_dir / "attempt-0").mkdir(parents=True)
    controller_wrote(run_dir, "7")
    runtime = ship(run_dir)
    show = 'echo "$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $NODE_RANK $NUM_NODES"'
    job = task_job(run_dir, tmp_path, "mpirun", 4, ["bash", "-c", show], grace=1,
                   mpi_env=["MY_VAR"])  # fmt: skip
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "TREB_RUN_DIR": str(run_dir),
        "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0", "MY_VAR": "x",
        "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
        "SLURM_JOB_NODELIST": "tn[1-2]", "SLURM_JOB_ID": "7", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "15007",
    }  # fmt: skip
    res = subprocess.run([sys.executable, "-S", str(runtime), "task", str(job)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr + (run_dir / "attempt-0" / "node-0.log").read_text()
    argv = (run_dir / "argv").read_text().split("\0")[:-1]
    assert "MY_VAR" in argv and argv[argv.index("MY_VAR") - 1] == "-x"
    assert argv[:8] == ["-np", "8", "-H", "tn1:4,tn2:4", "--bind-to", "none", "--map-by", "slot"]
    assert argv[8:11] == ["--mca", "odls_base_sigkill_timeout", "1"]  # grace_period
    w = argv.index("worker")
    assert argv[w - 1] == str(runtime) and argv[w:] == [
        "worker", "--slurm", "--grace", "1", "--mpi", "4", "--", "bash", "-c", show]  # fmt: skip
    assert (run_dir / "attempt-0" / "rank-5.log").read_text() == "5 8 1 4 1 2\n"
    rec = json.loads((run_dir / "attempt-0" / "rank-5.json").read_text())
    assert (rec["rank"], rec["node"], rec["local_rank"], rec["label"]) == (5, 1, 1, "1:1")
    assert rec["exit_code"] == 0 and rec["state"] == "ENDED"
    node = json.loads((run_dir / "attempt-0" / "node-0.json").read_text())
    assert node["rank"] is None and node["exit_code"] == 0
    # no runtime in any rank's environment (the bash runtime was exported to every rank)
    assert not any(name.startswith("TREB_TASK") for name in env)


def node_agent_run(tmp_path: Path, command: str, rc: int) -> tuple[Path, str]:
    """The second node's one task of a native 2 x 3 run (issue 36: srun starts one agent per
    node, `--ntasks-per-node=1`, which starts the node's ranks itself); the first node's
    health record is on file as its agent would have written it (barrier.py)."""
    run_dir = tmp_path / "run"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    controller_wrote(run_dir, "77")
    (adir / "health-0.json").write_text(json.dumps({"attempt": 0, "step": "77.0",
                                                    "healthy": True}))  # fmt: skip
    runtime = ship(run_dir)
    srun = ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    job = task_job(run_dir, tmp_path, "native", 3, ["bash", "-c", command], nodes=2,
                   srun=srun, grace=1)  # fmt: skip
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text('#!/bin/bash\necho "$*" >> "$FAKE_CALLS"\n')
    (bin_dir / "scancel").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_CALLS": str(tmp_path / "calls"),
        "TREB_RUN_DIR": str(run_dir), "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0",
        "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NODEID": "1", "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_NNODES": "2",
        "SLURM_STEP_NUM_TASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GTIDS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_CPUS_ON_NODE": "6", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
    }  # fmt: skip
    res = subprocess.run([sys.executable, "-S", str(runtime), "task", str(job)], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert res.returncode == rc, (res.stdout, res.stderr)
    return adir, calls(tmp_path)


def test_one_task_per_node_starts_the_nodes_ranks_as_srun_would(tmp_path: Path) -> None:
    """Each rank gets its own rank contract and the SLURM_* task variables srun would have
    given it as a task of its own (Lightning's SLURMEnvironment reads SLURM_PROCID,
    SLURM_LOCALID, SLURM_NTASKS), and one agent (the ranks' one parent) starts them all."""
    show = ('echo "$RANK $LOCAL_RANK $WORLD_SIZE $NODE_RANK $SLURM_PROCID $SLURM_LOCALID '
            '$SLURM_NTASKS $SLURM_NPROCS $SLURM_STEP_NUM_TASKS $SLURM_TASKS_PER_NODE '
            '$SLURM_NTASKS_PER_NODE $SLURM_GTIDS $OMP_NUM_THREADS $PPID"')  # fmt: skip
    adir, said = node_agent_run(tmp_path, show, 0)
    parents = set()
    for local in range(3):
        rank = 3 + local
        *fields, ppid = (adir / f"rank-{rank}.log").read_text().split()
        assert fields == [str(rank), str(local), "6", "1", str(rank), str(local), "6", "6",
                          "6", "3(x2)", "3", "3,4,5", "2"], fields  # fmt: skip
        parents.add(ppid)
        rec = json.loads((adir / f"rank-{rank}.json").read_text())
        assert (rec["rank"], rec["node"], rec["local_rank"], rec["label"]) == (rank, 1, local,
                                                                              f"1:{local}")  # fmt: skip
        assert rec["exit_code"] == 0 and rec["job_id"] == "77" and rec["pid"] > 0
    assert len(parents) == 1 and said == ""  # one agent; no teardown
    assert not (adir / "rank-0.json").exists()  # the other node's ranks are its own agent's


def test_a_node_agents_first_failure_stops_its_other_ranks_and_the_step(tmp_path: Path) -> None:
    adir, said = node_agent_run(tmp_path, '[ "$LOCAL_RANK" = 1 ] && exit 3; exec sleep 30', 3)
    recs = {r: json.loads((adir / f"rank-{r}.json").read_text()) for r in (3, 4, 5)}
    assert recs[4]["exit_code"] == 3 and recs[4]["stopped_by_launcher"] is False
    assert recs[3]["stopped_by_launcher"] is True and recs[5]["stopped_by_launcher"] is True
    assert said.splitlines() == ["--signal=TERM 77.0"]  # the other nodes' agents, by Slurm
    assert (adir / "teardown").read_text().strip() == "1:1"


def alive(pid: int) -> bool:
    """Not gone nor a zombie (a killed daemon waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def parked_run(tmp_path: Path, leave: str) -> dict[tuple[int, int], list[str]]:
    """Issue 36: a retry without a new srun step. The agent (the real `task` verb) ends its
    attempt on the link, parks, and on the controller's word (a real Hub here) runs the
    next attempt's ranks itself. Attempt 0's rank 1 runs `leave` (which leaves a daemon
    behind and writes its pid to $TREB_RUN_DIR/stray), then fails (rank 0 succeeds: a
    failure first would stop rank 1); attempt 1's ranks say whether that daemon still
    runs (`stray-alive`): it must be gone before them. What each rank printed."""
    from trebuchet.runtime.job import link as agent_link

    run_dir = tmp_path / "run"
    for attempt in (0, 1):  # as the controller writes them before each attempt
        (run_dir / f"attempt-{attempt}").mkdir(parents=True)
        (run_dir / f"attempt-{attempt}" / "attempt.json").write_text(
            json.dumps({"job_id": "77", "attempt": attempt}))  # fmt: skip
    runtime = ship(run_dir)
    srun = ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    show = ('echo "$TREB_ATTEMPT $SLURM_PROCID $PPID"; [ "$TREB_ATTEMPT" = 1 ] && '
            '{ s=$(cut -d" " -f3 "/proc/$(cat "$TREB_RUN_DIR/stray")/stat" 2>/dev/null); '
            '[ -n "$s" ] && [ "$s" != Z ] && echo stray-alive; exit 0; }; '
            f'[ "$SLURM_PROCID" = 1 ] && {{ {leave}; exit 3; }}; exit 0')  # fmt: skip
    job = task_job(run_dir, tmp_path, "native", 2, ["bash", "-c", show], srun=srun, grace=1,
                   max_attempts=2)  # fmt: skip
    r, w = os.pipe()
    hub = agent_link.Hub(w)
    try:
        hub.expect(0, 1)
        env = {
            "PATH": os.environ["PATH"], "HOME": str(tmp_path), "TREB_RUN_DIR": str(run_dir),
            "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": "0", "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NNODES": "1", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1", agent_link.ENV: hub.address("127.0.0.1"), "TREB_RUN_ID": "r1",
            agent_link.PARK_ENV: "1",
        }  # fmt: skip
        agent = subprocess.Popen([sys.executable, "-S", str(runtime), "task", str(job)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 60
        while hub.ended() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hub.ended() == 3 and agent.poll() is None  # attempt 0 failed; the agent waits
        # its `ended` may come before its sweep of the attempt's leftovers and its records'
        # fsync (done while the controller decides): both before the next word is read
        assert hub.resume(1, 1)
        while hub.ended() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert hub.ended() == 0
        hub.release()
        assert agent.wait(timeout=30) == 0, agent.communicate()
    finally:
        hub.close()
        os.close(r)
        os.close(w)
        stray_file = run_dir / "stray"
        if stray_file.exists() and alive(int(stray_file.read_text())):
            os.kill(int(stray_file.read_text()), 9)  # this test's own daemon, by its pid
    said = {(a, rank): (run_dir / f"attempt-{a}" / f"rank-{rank}.log").read_text().split()
            for a in (0, 1) for rank in (0, 1)}  # fmt: skip
    assert {k: v[:2] for k, v in said.items()} == {(a, r): [str(a), str(r)] for a, r in said}
    recs = {a: json.loads((run_dir / f"attempt-{a}" / "rank-1.json").read_text()) for a in (0, 1)}
    assert recs[0]["exit_code"] == 3 and recs[1]["exit_code"] == 0
    assert recs[1]["attempt"] == 1
    return said


def test_a_parked_node_agent_runs_the_next_attempt_in_its_step(tmp_path: Path) -> None:
    """The same process starts both attempts' ranks; a daemon that left its rank's process
    group (setsid) is ended before the next attempt's ranks start."""
    said = parked_run(tmp_path, 'setsid sleep 300 & echo $! > "$TREB_RUN_DIR/stray"')
    assert "stray-alive" not in said[1, 0] + said[1, 1], "a leftover outlived its attempt"
    assert not alive(int((tmp_path / "run" / "stray").read_text()))
    assert len({v[2] for v in said.values()}) == 1  # one agent started all four


def test_a_daemon_that_double_forked_and_cleared_its_environment_is_ended(
    tmp_path: Path,
) -> None:
    """A daemon that double-forked (its parent exited: an orphan), left the session
    (setsid) and cleared its environment (env -i: no TREB_RUN_ID to find it by) is still
    ended before the next attempt: the agent adopts its ranks' orphans (a subreaper)."""
    # the rank ends once the daemon's environment is empty (env -i has run)
    leave = (
        '( setsid env -i sleep 300 & echo $! > "$TREB_RUN_DIR/stray" ); '
        'while grep -qa TREB_RUN_ID "/proc/$(cat "$TREB_RUN_DIR/stray")/environ"; do '
        "sleep 0.01; done"
    )
    said = parked_run(tmp_path, leave)
    assert "stray-alive" not in said[1, 0] + said[1, 1], "a leftover outlived its attempt"
    pid = int((tmp_path / "run" / "stray").read_text())
    assert not alive(pid)


def test_another_nodes_process_of_the_run_survives_the_sweep(tmp_path: Path) -> None:
    """On the test cluster every Slurm "node" shares one PID space: a process of the same
    run on another node (TREB_RUN_ID=r1, NODE_RANK=1, not this agent's descendant) is
    not this node's to end, neither is one of the same node rank outside the agent's tree
    (a process the agent did not start: its sweep ends only what its ranks left)."""
    others = [
        subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"], "TREB_RUN_ID": "r1",
                                                "NODE_RANK": node, "SLURM_NODEID": node})
        for node in ("1", "0")
    ]  # fmt: skip
    try:
        said = parked_run(tmp_path, 'setsid sleep 300 & echo $! > "$TREB_RUN_DIR/stray"')
        assert "stray-alive" not in said[1, 0] + said[1, 1]
        assert [o.poll() for o in others] == [None, None], "the sweep ended another's process"
    finally:
        for o in others:
            o.kill()
            o.wait()


def test_which_steps_park_their_agents_for_the_next_attempt() -> None:
    """One node agent per node parks (native, torchrun, none); not with pre/post (their
    steps need the CPUs a parked step holds), not one agent per rank (slurm.mpi: PMIx wires
    up a task once), not mpirun."""
    from trebuchet.runtime.slurm.step import parks

    per_node = ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--whole"]
    per_rank = ["--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--mpi=pmix"]
    cases = [({"launcher": "native", "srun": per_node}, True),
             ({"launcher": "native", "srun": per_rank}, False),
             ({"launcher": "torchrun", "srun": per_node}, True),
             ({"launcher": "none", "srun": per_node}, True),
             ({"launcher": "mpirun", "srun": per_node}, False),
             ({"launcher": "native", "srun": per_node, "pre": "echo hi"}, False),
             ({"launcher": "torchrun", "srun": per_node, "post": "echo bye"}, False)]  # fmt: skip
    for job, expected in cases:
        assert parks(job) is expected, job  # type: ignore[arg-type]


ROOT = """
import json, os, subprocess, sys
from trebuchet.runtime.process import procs
assert procs.become_subreaper()
helper = subprocess.Popen(["sleep", "300"])  # the agent's own (squeue, scontrol): its session
rank = subprocess.Popen(["bash", "-c", "( setsid sleep 300 >/dev/null & echo $! ); "
                         "sleep 300 >/dev/null & echo $!"],
                        start_new_session=True, stdout=subprocess.PIPE, text=True)
daemon, child = int(rank.stdout.readline()), int(rank.stdout.readline())
rank.wait()  # the rank ended; its daemon and its child are now this process's orphans
tree = procs.left_in_tree(os.getpid())
procs._children_file = lambda pid: None  # a kernel without the children files
by_ppid = procs.left_in_tree(os.getpid())
for pid in (helper.pid, daemon, child):
    os.kill(pid, 9)
helper.wait()
print(json.dumps({"tree": tree, "by_ppid": by_ppid, "helper": helper.pid, "left": [daemon, child]}))
"""


def test_the_sweep_finds_the_orphans_in_the_tree_and_leaves_the_agents_own_helpers() -> None:
    """procs.left_in_tree, as a subreaper agent calls it: its ranks' orphans (one out of
    the rank's session) are found, its own helper (in its session) is not, and one pass
    over /proc by ppid finds the same where the kernel has no children files."""
    root = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", ROOT], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert sorted(got["tree"]) == sorted(got["left"]) and got["helper"] not in got["tree"]
    assert sorted(got["by_ppid"]) == sorted(got["tree"])


HOPPER = """
import json, os, subprocess, sys, time
from trebuchet.runtime.node.per_node import end_strays
from trebuchet.runtime.process import procs
assert procs.become_subreaper()
# a daemon that never stays put: it forks, its parent exits at once, the child calls setsid
# and does it again (for 20 s at most); each hop holds the pipe on its stderr, whose end
# says whether one still lives. Beside it a rank that left 300 sleeping children.
hop = ("import os, sys, time\\nend = time.monotonic() + 20\\nprint(os.getpid(), flush=True)\\n"
       "os.close(1)\\nwhile time.monotonic() < end:\\n    if os.fork():\\n        os._exit(0)\\n"
       "    os.setsid()\\n")
rank = subprocess.Popen([sys.executable, "-S", "-c", hop], start_new_session=True,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
wide = subprocess.Popen(["bash", "-c", "for i in $(seq 300); do sleep 300 & done"],
                        start_new_session=True, stdout=subprocess.DEVNULL)
rank.stdout.readline()
rank.wait()
wide.wait()
time.sleep(0.3)
killed = end_strays("r", 0, tree=True)
left = [p for p in procs.left_in_tree(os.getpid()) if not procs.zombie(p)]
os.set_blocking(rank.stderr.fileno(), False)
try:
    hopping = os.read(rank.stderr.fileno(), 1) != b""
except BlockingIOError:  # a hop still holds the pipe
    hopping = True
survived = hopping
end = time.monotonic() + 20
while hopping and time.monotonic() < end:  # what the failed sweep left, ended for good
    for pid in procs.left_in_tree(os.getpid()):
        procs.signal_pid(pid, 9)
    procs.reap(procs.left_in_tree(os.getpid()))
    try:
        hopping = os.read(rank.stderr.fileno(), 1) != b""
    except BlockingIOError:
        pass
print(json.dumps({"killed": len(killed), "left": left, "hopping": survived}))
"""


def test_the_sweep_ends_a_daemon_that_keeps_forking_and_a_rank_with_hundreds_of_children() -> None:
    """A leftover that forks a child and exits over and over (each hop a new pid, a new
    session) is not outrun by the sweep: it goes on until nothing is left (at most 5 s), not
    for 8 passes, nor ends at a pass that found only a parent that had just exited."""
    root = Path(__file__).resolve().parents[2]
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", HOPPER], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(root)})  # fmt: skip
        assert res.returncode == 0, res.stderr
        got = json.loads(res.stdout)
        assert got["left"] == [] and not got["hopping"] and got["killed"] >= 300, got


def test_a_parked_agent_and_a_spares_new_step_run_the_attempt_with_the_new_placement(
    tmp_path: Path,
) -> None:
    """Issue 36, a lost node's spare: the survivor's agent, parked in its step as node 1 of
    2 (tn2; node 0 was lost), is told its new place in the `next` word (node 0 of 2, a new
    master); the spare's agent (tn3) runs in a step of its own, whose SLURM_NODEID is 0 and
    SLURM_PROCID 0 as the parked one's: TREB_PLACEMENT gives its node rank, its step id
    tells the two apart on the link (same id: the go never comes). Every rank of the
    attempt once, with the attempt's rank contract, from the real `task` verb."""
    from trebuchet.runtime.job import link as agent_link

    run_dir = tmp_path / "run"
    for attempt in (0, 1):
        (run_dir / f"attempt-{attempt}").mkdir(parents=True)
        (run_dir / f"attempt-{attempt}" / "attempt.json").write_text(
            json.dumps({"job_id": "77", "attempt": attempt}))  # fmt: skip
    runtime = ship(run_dir)
    srun = ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    show = ['bash', '-c', 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $NODE_RANK $SLURM_NODEID '
            '$MASTER_ADDR $MASTER_PORT"']  # fmt: skip
    job = task_job(run_dir, tmp_path, "native", 2, show, srun=srun, grace=1, max_attempts=2)
    r, w = os.pipe()
    hub = agent_link.Hub(w)
    agents: list[subprocess.Popen[bytes]] = []

    def agent(host: str, step: str, node: str, nodes: str, attempt: int, **more: str) -> None:
        env = {
            "PATH": os.environ["PATH"], "HOME": str(tmp_path), "TREB_RUN_DIR": str(run_dir),
            "TREB_WORKDIR": str(tmp_path), "TREB_ATTEMPT": str(attempt), "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": step, "SLURM_NODEID": node, "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NNODES": nodes, "SLURMD_NODENAME": host,
            "MASTER_ADDR": "localhost", "MASTER_PORT": "1", "TREB_RUN_ID": "r1",
            agent_link.ENV: hub.address("127.0.0.1"), agent_link.PARK_ENV: "1", **more,
        }  # fmt: skip
        agents.append(subprocess.Popen([sys.executable, "-S", str(runtime), "task", str(job)],
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))  # fmt: skip

    def ended(code: int) -> None:
        deadline = time.monotonic() + 60
        while hub.ended() is None and time.monotonic() < deadline:
            assert all(a.poll() is None for a in agents), [a.communicate() for a in agents]
            time.sleep(0.02)
        assert hub.ended() == code

    try:
        hub.expect(0, 1)  # attempt 0: this agent alone speaks (the lost tn1's is gone)
        agent("tn2", "0", "1", "2", 0)
        ended(0)
        assert agents[0].poll() is None  # parked
        assert hub.resume_on(1, ["tn2", "tn3"], "127.0.0.2", "2345") == ["tn3"]
        agent("tn3", "1", "0", "1", 1, MASTER_ADDR="127.0.0.2", MASTER_PORT="2345",
              TREB_PLACEMENT="2;tn3=1")  # fmt: skip
        ended(0)
        hub.release()
        assert agents[0].wait(timeout=30) == 0, agents[0].communicate()
        assert agents[1].wait(timeout=30) == 0, agents[1].communicate()
    finally:
        hub.close()
        os.close(r)
        os.close(w)
        for a in agents:
            if a.poll() is None:
                a.kill()
    said = {(a, rank): (run_dir / f"attempt-{a}" / f"rank-{rank}.log").read_text().split()
            for a, rank in [(0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]}  # fmt: skip
    assert said[0, 2] == ["2", "0", "4", "1", "1", "localhost", "1"]  # node 1 of 2 before
    assert said[0, 3] == ["3", "1", "4", "1", "1", "localhost", "1"]
    for rank in range(4):  # the attempt's contract on both agents: every rank once
        node, local = divmod(rank, 2)
        assert said[1, rank] == [str(rank), str(local), "4", str(node), str(node),
                                 "127.0.0.2", "2345"], said  # fmt: skip
    recs = {r: json.loads((run_dir / "attempt-1" / f"rank-{r}.json").read_text()) for r in range(4)}
    assert [recs[r]["host"] for r in range(4)] == [os.uname().nodename] * 4  # this machine
    assert [recs[r]["step_id"] for r in range(4)] == ["0", "0", "1", "1"]
    assert not (run_dir / "attempt-1" / "rank-4.json").exists()

"""`treb run --on ssh` on two real sshd hosts (tests/ssh_hosts/hosts.sh: network namespaces
ts1, ts2 with their own addresses and hostnames, each running Debian's sshd).

The hosts share this machine's filesystem and PID space, so "nothing left behind" is
checked by listing every process that carries the run's TREB_RUN_ID (the agents, the
ranks and their children, on both hosts), not by trusting the records. Most tests force
the copy path (ssh.shared_dir: none) so the no-shared-filesystem code runs; one lets the
engine detect the shared run directory. Locally they skip without the hosts; in CI
(`make test` starts them) a missing host is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, in_ci, needs, status_json, write_spec
from trebuchet.runtime.process.procs import processes_of_run
from trebuchet.store.files import read_events

pytestmark = [pytest.mark.integration, pytest.mark.ssh]

HOSTS = REPO / "tests" / "ssh_hosts" / "hosts.sh"
PY = sys.executable  # has torch; absolute, so ~/.bashrc on the hosts cannot shadow it


@pytest.fixture(scope="session")
def ssh_config() -> str:
    conf = os.environ.get("TREB_SSH_CONFIG")
    if not conf:
        out = subprocess.run(["bash", str(HOSTS), "env"], capture_output=True, text=True)
        conf = out.stdout.split("TREB_SSH_CONFIG=")[-1].split()[0] if out.stdout else ""
    res = subprocess.run(["bash", str(HOSTS), "status"], capture_output=True, text=True,
                         env={**os.environ, "TREB_SSH_CONFIG": conf}, timeout=60)  # fmt: skip
    if res.returncode != 0 or not Path(conf).is_file():
        msg = f"ssh test hosts not up: {res.stdout.strip()} (start them: {HOSTS} up)"
        if in_ci():
            pytest.fail(f"CI needs the ssh test hosts: {msg}")
        pytest.skip(msg)
    return conf


def spec(tmp_path: Path, conf: str, command: str, extra: str = "", copy: bool = True) -> Path:
    shared = f"shared_dir: none, remote_dir: {tmp_path / 'remote'}, " if copy else ""
    return write_spec(tmp_path / "job", f"""\
name: ssh-test
command: {json.dumps(command)}
nodes: 2
procs_per_node: 2
grace_period: 2
ssh: {{hosts: [ts1, ts2], config_file: {conf}, {shared}}}
{extra}""")  # fmt: skip


def logs_of(run_dir: Path, rank: int) -> str:
    return (run_dir / "attempt-0" / f"rank-{rank}.log").read_text()


def wait_for(cond, timeout: float = 60.0, what: str = "") -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def assert_nothing_left(run_id: str) -> None:
    """No process with the run's id on either host (they share this PID space)."""
    wait_for(lambda: not processes_of_run(run_id), 30, f"the processes of run {run_id} to end")


def ranks_started(run_id: str) -> bool:
    """The 2 agents and 4 `sleep` ranks run (what carries the run's id, on both hosts)."""
    return len(processes_of_run(run_id)) >= 6


def detached(treb: TrebFn, path: Path) -> str:
    res = treb("run", str(path), "--on", "ssh", "--detach")
    assert res.returncode == 0, res.stderr
    return status_json(treb)["id"]


def test_digits_ddp_two_hosts_two_ranks(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    job = REPO / "examples" / "digits-ddp" / "job.yaml"
    res = treb(
        "run", str(job), "--on", "ssh", "-o", "nodes=2", "-o", "ssh.hosts=[ts1, ts2]",
        "-o", f"ssh.config_file={ssh_config}", "-o", "ssh.shared_dir=none",
        "-o", f"ssh.remote_dir={tmp_path / 'remote'}", "-o", "env.GLOO_SOCKET_IFNAME=eth0",
        "-o", f"command={PY} train.py --epochs 2",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    run_dir = Path(st["run_dir"])
    # the run's own events know its supervisor as the index did (pid, start time, host):
    # an index rebuilt from them does not take a reused pid for it
    [began] = [e for e in read_events(run_dir) if e["event"] == "run_started"]
    assert began["pid"] > 0 and began["start"] and began["host"] == socket.gethostname(), began
    # the code went to each host's per-run folder (here the same disk, one folder)
    assert (tmp_path / "remote" / st["id"] / "code" / "train.py").is_file()
    hosts = {json.loads((run_dir / "attempt-0" / f"rank-{r}.json").read_text())["host"]
             for r in range(4)}  # fmt: skip
    assert hosts == {"ts1", "ts2"}
    assert "accuracy:" in (run_dir / "attempt-0" / "rank-0.log").read_text()
    assert "code copied to 2 host(s) by rsync" in res.stderr
    logs = treb("logs", "--rank", "3")
    assert logs.returncode == 0 and "Traceback" not in logs.stdout
    # the metrics the agents parsed on the hosts came back with the records
    printed = re.findall(r"^epoch (\d+) loss ([0-9.]+)$", logs_of(run_dir, 0), re.M)
    got = json.loads(treb("metrics", "--json").stdout)["metrics"]
    assert {int(s): v for s, v, _ in got["loss"]["points"]} == {
        int(e): float(v) for e, v in printed}  # fmt: skip
    assert len(printed) == 2


@pytest.mark.parametrize("launcher", ["torchrun", "none"])
def test_hello_contract_under_torchrun_and_none(
    launcher: str, treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """examples/hello checks every rank's contract and talks through MASTER_ADDR:PORT, on
    2 hosts (code copied): under torchrun (started by each host's agent, found on the PATH
    that ssh.setup sets) and with one process per node (`none`)."""
    if launcher == "torchrun":
        needs("torch")
    job = REPO / "examples" / "hello" / "job.yaml"
    setup = json.dumps([f"export PATH={Path(PY).parent}:$PATH"])
    res = treb(
        "run", str(job), "--on", "ssh", "-o", f"launcher={launcher}", "-o", "ssh.hosts=[ts1, ts2]",
        "-o", f"ssh.config_file={ssh_config}", "-o", "ssh.shared_dir=none",
        "-o", f"ssh.remote_dir={tmp_path / 'remote'}", "-o", f"ssh.setup={setup}",
        "-o", f"command={PY} hello.py", "-o", "timeout=5m",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    adir = Path(st["run_dir"]) / "attempt-0"
    if launcher == "none":  # one process per node: node-<n>.log
        assert "ok" in (adir / "node-0.log").read_text() + (adir / "node-1.log").read_text()
    else:
        assert "all 4 ranks said hello" in (adir / "rank-0.log").read_text()
        for r in range(4):
            assert f"rank {r} ok" in (adir / f"rank-{r}.log").read_text()
    assert "CONTRACT FAIL" not in res.stdout + res.stderr
    assert_nothing_left(st["id"])


def test_timeout_ends_the_run_on_both_hosts(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    res = treb("run", str(spec(tmp_path, ssh_config, "exec sleep 120", "timeout: 3s\n")),
               "--on", "ssh")  # fmt: skip
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    assert st["state"] == "TIMEOUT", st
    assert_nothing_left(st["id"])


def test_failing_rank_on_second_host_is_named(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    cmd = 'if [ "$RANK" = 3 ]; then sleep 1; echo boom >&2; exit 7; fi; exec sleep 120'
    res = treb("run", str(spec(tmp_path, ssh_config, cmd)), "--on", "ssh")
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    ff = st["first_failure"]
    assert (ff["rank"], ff["host"], ff["exit_code"]) == (3, "ts2", 7), ff
    assert "rank 3 (node 1, local rank 1) on ts2 exited with code 7" in res.stderr
    assert "boom" in Path(ff["log"]).read_text()  # the exact log, fetched from the host
    assert_nothing_left(st["id"])


def test_retries_and_log_policies_as_locally(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """Rank 3 (on ts2) fails once per attempt: attempt 0 with a port in use (the shipped
    retry policy grants an attempt), attempt 1 plainly (`retries: 1` allows one more),
    attempt 2 with a CUDA OOM (no_retry: final, although nothing else would stop it)."""
    cmd = (
        'if [ "$RANK" = 3 ]; then case "$TREB_ATTEMPT" in '
        "0) echo 'RuntimeError: Address already in use' >&2;; "
        "1) echo 'plain failure' >&2;; "
        "*) echo 'torch.OutOfMemoryError: CUDA out of memory' >&2;; esac; exit 3; fi; "
        "exec sleep 120"
    )
    path = spec(tmp_path, ssh_config, cmd, "retries: 1\n")
    res = treb("run", str(path), "--on", "ssh")
    assert res.returncode == 1, res.stderr
    st = status_json(treb)
    assert st["state"] == "FAILED"
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [
        ("FAILED", "port-in-use: retry"), ("FAILED", "failure"),
        ("FAILED", "gpu-oom: no_retry")]  # fmt: skip
    assert st["max_attempts"] == 3
    assert "log policy gpu-oom (no_retry) matched" in res.stderr
    assert_nothing_left(st["id"])


def test_hang_is_found_and_retried_with_every_ranks_stack(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """hang_timeout on ssh: each host's agent watches its ranks (runtime/node/per_node.py); rank 3
    on ts2 sleeps while the others wait in all_reduce. on_hang: retry sends the checkpoint
    signal, tears the attempt down after the grace period and retries; the stacks of all 4
    ranks come back from both hosts (copy path), and the diagnosis sees the whole run."""
    needs("torch")
    from tests.integration.test_hangs import SCRIPT, assert_hang_diagnosis
    from trebuchet.diagnose.hang import hang_lines

    work = tmp_path / "job"
    work.mkdir()
    shutil.copy(SCRIPT, work / "hang_ddp.py")
    # stacks by faulthandler (HANG_STACKS): py-spy is not on the hosts' PATH
    extra = ("hang_timeout: 10s\non_hang: retry\nretries: 1\nenv: {HANG_RANK: '3', "
             "HANG_CKPT: '1', HANG_STACKS: '1', GLOO_SOCKET_IFNAME: eth0}\n")  # fmt: skip
    res = treb("run", str(spec(tmp_path, ssh_config, f"exec {PY} hang_ddp.py", extra)),
               "--on", "ssh", timeout=400)  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [
        ("FAILED", "hang"), ("SUCCEEDED", None)]  # fmt: skip
    adir = Path(st["run_dir"]) / "attempt-0"
    stacks = sorted(p.name for p in (adir / "stacks").glob("rank-*.txt"))
    assert stacks == [f"rank-{r}.txt" for r in range(4)]
    assert_hang_diagnosis("\n".join(hang_lines(adir)))
    # the late rank's checkpoint handler ran on ts2, before the teardown
    remote = tmp_path / "remote" / st["id"]
    assert (remote / "ckpt-rank-3").read_text() == "attempt 0\n"
    assert_nothing_left(st["id"])


def test_cancel_leaves_nothing_on_either_host(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    rid = detached(treb, spec(tmp_path, ssh_config, "sleep 300 & wait"))
    wait_for(lambda: ranks_started(rid), 60, "4 ranks")
    res = treb("stacks", rid)  # the hosts keep their copies of the run directory
    assert res.returncode == 2 and "keep to themselves" in res.stderr, res.stderr
    res = treb("cancel", rid)
    assert res.returncode == 0, res.stderr
    assert status_json(treb, rid)["state"] == "CANCELLED"
    assert_nothing_left(rid)


SLEEPER = """\
import time
from trebuchet.dist import enable_stacks
enable_stacks()
print("ready", flush=True)
while True:
    time.sleep(0.5)  # SLEEP-LINE
"""


def test_stacks_of_a_running_run_on_a_shared_run_directory(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    """The run directory is shared with the hosts (detected): `treb stacks` asks every
    host's agent through it and prints the 4 ranks' stacks; the run goes on."""
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "sleeper.py").write_text(SLEEPER)
    rid = detached(treb, spec(tmp_path, ssh_config, f"exec {PY} sleeper.py", copy=False))
    adir = treb_home / "runs" / rid / "attempt-0"

    def ready() -> bool:
        logs = [adir / f"rank-{r}.log" for r in range(4)]
        return all(p.is_file() and "ready" in p.read_text() for p in logs)

    wait_for(ready, 60, "4 ranks ready")
    res = treb("stacks", rid)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "stacks of 4 of 4 ranks" in res.stdout, res.stdout
    assert "sleeper.py" in res.stdout
    assert status_json(treb, rid)["state"] == "RUNNING"
    assert treb("cancel", rid).returncode == 0
    assert_nothing_left(rid)


def test_connection_drop_stops_both_hosts(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    rid = detached(treb, spec(tmp_path, ssh_config, "exec sleep 300"))
    wait_for(lambda: ranks_started(rid), 60, "4 ranks")
    sup = status_json(treb, rid)["supervisor_pid"]
    # node 1's session: the supervisor's ssh child that talks to ts2
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(sup)], capture_output=True,
                         text=True).stdout  # fmt: skip
    pids = [int(line.split()[0]) for line in out.splitlines() if " ts2 bash -c " in line]
    assert len(pids) == 1, out
    os.kill(pids[0], signal.SIGKILL)
    wait_for(lambda: status_json(treb, rid)["state"] == "FAILED", 60, "the run to fail")
    ff = status_json(treb, rid)["first_failure"]
    assert ff["host"] == "ts2" and "connection to ts2 was lost" in ff["message"], ff
    assert_nothing_left(rid)


def test_submitter_killed_leaves_nothing(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    rid = detached(treb, spec(tmp_path, ssh_config, "exec sleep 300", copy=False))
    wait_for(lambda: ranks_started(rid), 60, "4 ranks")
    os.kill(status_json(treb, rid)["supervisor_pid"], signal.SIGKILL)
    assert_nothing_left(rid)  # each agent saw its session's stdin end
    events = (treb_home / "runs" / rid / "events.jsonl").read_text()
    assert "nothing copied" in events  # the shared run directory was detected


def test_hostile_values_travel_intact(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    canary = tmp_path / "injected"
    hostile = f"a b 'q' \"d\" $(touch {canary}); `touch {canary}` ;touch {canary}\nline2 \\ $HOME"
    cmd = f'printf "%s|%s" "$WEIRD" "$TOKEN" > {tmp_path}/out-$RANK'
    extra = f"env: {{WEIRD: {json.dumps(hostile)}}}\nsecrets: [TOKEN]\n"
    path = spec(tmp_path, ssh_config, cmd, extra)
    res = treb("run", str(path), "--on", "ssh", env={"TOKEN": hostile + "-secret"})
    assert res.returncode == 0, res.stderr
    for r in range(4):
        assert (tmp_path / f"out-{r}").read_text() == f"{hostile}|{hostile}-secret"
    assert not canary.exists()
    rid = status_json(treb)["id"]
    for name in ("ssh.json", "job.json", "events.jsonl", "spec.yaml"):  # never on disk
        assert "-secret" not in (treb_home / "runs" / rid / name).read_text()

"""The ssh engine's parts that need no host (issue 25): the session's script run by a local
bash (ssh.setup under bash with errexit and pipefail, the failing item named with its
output, the agent's stdin left alone), `treb check --on ssh` (hosts beyond `nodes`, setup
lines bash cannot parse), `treb render --on ssh` (the MASTER_ADDR and MASTER_PORT the run
uses), the engine's refusals with their line, the node agent's end of what the ranks left
behind (TREB_RUN_ID and NODE_RANK), its clock from the attempt's start, and the diagnosis of a
failed setup. The same on real sshd hosts: tests/integration/test_ssh_setup.py."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TrebFn, write_spec
from trebuchet.backends.ssh import engine
from trebuchet.backends.ssh import run as session
from trebuchet.backends.ssh import script as node_side
from trebuchet.backends.ssh.nodes import setup_text
from trebuchet.diagnose.report import diagnose_run, two_lines
from trebuchet.runtime.node import barrier
from trebuchet.runtime.node import per_node as node_verb
from trebuchet.runtime.process.procs import processes_of_run


def _info(tmp_path: Path, setup: list[str]) -> dict:
    """ssh.json as placed for a run whose files are in `tmp_path/run` (code in `code/`)."""
    run = tmp_path / "run"
    (run / "code").mkdir(parents=True, exist_ok=True)
    return {
        "run_id": "abcd1234", "run_dir": str(run), "hosts": ["h0", "h1"], "ssh": ["ssh"],
        "shared": "none", "remote_root": str(tmp_path), "workdir": str(run / "code"),
        "runtime": "treb-runtime.pyz", "master_addr": "10.0.0.1", "master_port": 16000,
        "env": {"WEIRD": "a 'b' $(touch x)"}, "setup": setup,
        "setup_where": [f"job.yaml:{7 + i}" for i in range(len(setup))],
        "remote_run_dir": str(run), "remote_workdir": "code", "nodes": 2,
    }  # fmt: skip


def _run_script(tmp_path: Path, setup: list[str]) -> tuple[int, list[str], Path]:
    """The node script of node 0 run by bash here, as the host's login shell would: a fake
    python3 stands for the agent (it prints what it got and its stdin's first line)."""
    info = _info(tmp_path, setup)
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "python3").write_text('#!/bin/sh\necho "agent: X=$SETUP_X WEIRD=$WEIRD" '
                                  '"ELAPSED=$TREB_ATTEMPT_ELAPSED"\nhead -n 1\n')  # fmt: skip
    (fake / "python3").chmod(0o755)
    script = node_side.node_script(info, 0, 0, elapsed=1.5)
    res = subprocess.run(
        ["sh", "-c", node_side.remote_command(script)], input='{"TOKEN": "s"}\n', text=True,
        capture_output=True, timeout=60,
        env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    return res.returncode, res.stdout.splitlines(), Path(info["run_dir"])


def test_setup_runs_in_bash_and_holds_for_the_agent(tmp_path: Path) -> None:
    """`source` (not in dash) works, what it sets reaches the agent, the agent's stdin still
    starts with the secrets' line (setup reads /dev/null), setup's output is in its log."""
    (tmp_path / "activate").write_text("export SETUP_X=from-activate\n")
    setup = [f"source {shlex.quote(str(tmp_path / 'activate'))}", "cat; echo set up"]
    rc, out, run = _run_script(tmp_path, setup)
    assert rc == 0, out
    assert out[0].startswith(f"{node_side.SESSION} ") and out[0].split()[1].isdigit(), out
    assert out[1:] == [node_side.SETUP_DONE, "agent: X=from-activate WEIRD=a 'b' $(touch x) "
                       "ELAPSED=1.500", '{"TOKEN": "s"}']  # fmt: skip
    assert (run / "attempt-0" / "setup-node-0.log").read_text() == "set up\n"


@pytest.mark.parametrize(
    "setup,item,code",
    [
        (["true", "source /nonexistent/treb/activate", "echo never"], 2, 1),
        (["false | true"], 1, 1),  # pipefail
        (["f() { false; echo not here; }", "f"], 2, 1),  # errexit inside a function
        (["echo before", "exit 0"], 2, 0),  # setup that ends the shell is no success
        (["(exit 7)"], 1, 7),
    ],
)
def test_a_failing_setup_item_stops_the_node_before_the_agent(
    tmp_path: Path, setup: list[str], item: int, code: int
) -> None:
    rc, out, run = _run_script(tmp_path, setup)
    assert rc == (code or 1), out
    assert node_side.SETUP_DONE not in out and not any(o.startswith("agent:") for o in out), out
    failed = [o for o in out if o.startswith(node_side.SETUP_FAILED)]
    assert failed == [f"{node_side.SETUP_FAILED} {item} {code}"], out
    node = session.Node(0, "h0", None, None)  # type: ignore[arg-type]
    for line in out:
        node.marker(line.encode() + b"\n")
    assert node.setup_failed == (item, code) and node.pgid
    if setup[1:2] == ["source /nonexistent/treb/activate"]:
        assert any("/nonexistent/treb/activate: No such file" in o for o in node.setup_output)
        log = (run / "attempt-0" / "setup-node-0.log").read_text()
        assert "No such file" in log and "never" not in log


def test_setup_text_names_the_item_and_its_line(tmp_path: Path) -> None:
    info = _info(tmp_path, ["true", "source /x/activate\necho more"])
    n = session.Node(1, "h1", None, None)  # type: ignore[arg-type]
    n.setup_failed = (2, 1)
    assert (
        setup_text(info, n)
        == "ssh.setup failed at job.yaml:8 (`source /x/activate ...`), exit code 1"
    )
    n.setup_failed = (2, 0)
    assert setup_text(info, n) == ("ssh.setup ended the shell at job.yaml:8 (`source /x/activate "
                                 "...`) before the node agent started")  # fmt: skip
    n.setup_failed = (0, 1)
    assert setup_text(info, n) == "ssh.setup could not start (exit code 1)"


SPEC = """\
name: s
command: python train.py
nodes: {nodes}
ssh:
  hosts: [gpu1, gpu2, gpu3]
  setup:
{setup}
{extra}"""


def _spec(tmp_path: Path, nodes: int = 2, setup: tuple[str, ...] = ("true",), extra: str = "",
          ) -> Path:  # fmt: skip
    items = "\n".join(f"    - {json.dumps(s)}" for s in setup)
    return write_spec(tmp_path, SPEC.format(nodes=nodes, setup=items, extra=extra))


def test_check_names_hosts_beyond_nodes(treb: TrebFn, tmp_path: Path) -> None:
    res = treb("check", str(_spec(tmp_path)), "--on", "ssh")
    assert "Traceback" not in res.stderr
    assert (f"{tmp_path / 'job.yaml'}:5: warning: 3 hosts are listed but nodes is 2: only the "
            "first 2 run the job; gpu3 goes unused") in res.stdout, res.stdout  # fmt: skip
    assert "[ssh-hosts-unused]" in res.stdout
    res = treb("check", str(_spec(tmp_path, nodes=3)), "--on", "ssh")
    assert "ssh-hosts-unused" not in res.stdout, res.stdout


def test_hosts_from_a_hostfile_beyond_nodes_are_named_at_their_line(
    treb: TrebFn, tmp_path: Path
) -> None:
    (tmp_path / "hosts.txt").write_text("# ours\ngpu1 slots=8\ngpu2\n")
    spec = write_spec(tmp_path, "name: s\ncommand: x\nssh: {hostfile: hosts.txt}\n")
    res = treb("check", str(spec), "--on", "ssh")
    assert f"{tmp_path / 'hosts.txt'}:3: warning: 2 hosts are listed but nodes is 1" in res.stdout


def test_check_parses_setup_with_bash(treb: TrebFn, tmp_path: Path) -> None:
    spec = _spec(tmp_path, nodes=3, setup=("module load x", "if [ -d /x ]; then", "echo y",
                                           "fi )"))  # fmt: skip
    res = treb("check", str(spec), "--on", "ssh")
    assert res.returncode == 1, res.stdout
    assert (f"{spec}:10: error: ssh.setup: bash cannot parse item 4 ('fi )'): syntax error "
            "near unexpected token `)'") in res.stdout, res.stdout  # fmt: skip
    assert "[ssh-setup-syntax]" in res.stdout
    run = treb("run", str(spec), "--on", "ssh")  # refused before anything starts
    assert run.returncode == 2 and "ssh-setup-syntax" in run.stderr, run.stderr
    fine = _spec(tmp_path, nodes=3, setup=("if [ -d /x ]; then", "echo y", "fi", "a | b"))
    res = treb("check", str(fine), "--on", "ssh")
    assert "ssh-setup-syntax" not in res.stdout, res.stdout


def test_render_shows_the_address_and_port_the_run_uses(treb: TrebFn, tmp_path: Path) -> None:
    conf = tmp_path / "ssh_config"
    conf.write_text("Host gpu1\n  HostName 10.9.8.7\n")
    spec = _spec(tmp_path)
    spec.write_text(spec.read_text().replace("ssh:\n", f"ssh:\n  config_file: {conf}\n"))
    res = treb("render", str(spec), "--on", "ssh")
    assert res.returncode == 0, res.stderr
    assert "export MASTER_ADDR=10.9.8.7" in res.stdout and "MASTER_ADDR=''" not in res.stdout
    assert "export MASTER_PORT=RUN_PORT" in res.stdout
    assert "RUN_PORT: MASTER_PORT, 15000 + (the run id, hex) % 10000" in res.stdout
    assert "bash -c SCRIPT" in res.stdout and " sh -c " not in res.stdout
    res = treb("render", str(spec), "--on", "ssh", "-o", "master_port=23456")
    assert "export MASTER_PORT=23456" in res.stdout and "RUN_PORT" not in res.stdout
    assert engine.master_port(type("S", (), {"fixed_port": None})(), "0000abcd") == (
        15000 + 0xABCD % 10000)  # fmt: skip


@pytest.mark.parametrize(
    "line,expected",
    [
        ("launcher: mpirun", "job.yaml:3: launcher: mpirun is not rendered for ssh"),
        ("gpus_per_node: -1", "job.yaml:3: gpus_per_node: -1 (all visible) has no ssh"),
    ],
)
def test_ssh_refusals_name_the_line(treb: TrebFn, tmp_path: Path, line: str,
                                    expected: str) -> None:  # fmt: skip
    spec = write_spec(tmp_path, f"name: s\ncommand: x\n{line}\nssh: {{hosts: [a]}}\n")
    res = treb("run", "--no-check", str(spec), "--on", "ssh")
    assert res.returncode == 2 and expected in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "treb-home" / "runs").exists()


def test_connect_timeout_is_the_one_ssh_applies() -> None:
    assert node_side.connect_timeout(["ssh", "-o", "BatchMode=yes"]) == node_side.CONNECT_TIMEOUT_S
    argv = ["ssh", "-o", "ConnectTimeout=3", "-o", "ConnectTimeout=20"]
    assert node_side.connect_timeout(argv) == 3.0


def test_the_controller_holds_the_timeout_the_agents_warn(tmp_path: Path) -> None:
    """ssh's job.json is the one the agents read and the controller's settings come from:
    the agents watch for hangs and send the warning, the controller holds the timeout."""
    from trebuchet.backends.ssh.engine import ssh_job
    from trebuchet.runtime.job.life import settings
    from trebuchet.spec.load import load_spec

    (tmp_path / "job.yaml").write_text("command: x\ntimeout: 5s\ntimeout_warning: 2s\n"
                                       "hang_timeout: 3s\ngrace_period: 1.5s\nretries: 2\n")  # fmt: skip
    job = ssh_job(load_spec(tmp_path / "job.yaml").spec, "RUN", tmp_path / "run")
    assert (job["timeout"], job["warning"], job["hang_timeout"]) == (5.0, 2.0, 3.0)  # agents'
    s = settings(job)
    assert (s.timeout, s.warning, s.hang_timeout) == (5.0, None, None)
    assert (s.retries, s.grace, s.run_dir) == (2, 1.5, str(tmp_path / "run"))


def _sleeper(run_id: str, node: int) -> subprocess.Popen:
    env = {**os.environ, "TREB_RUN_ID": run_id, "NODE_RANK": str(node)}
    return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)


def test_the_node_agent_ends_what_its_ranks_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon of node 0 (its own session: out of every process group) is killed; node 1's
    on the same machine (or PID space) and another run's are not."""
    rid = f"t{os.getpid():x}"
    mine, other_node, other_run = _sleeper(rid, 0), _sleeper(rid, 1), _sleeper(rid + "x", 0)
    try:
        assert set(processes_of_run(rid, node=0)) == {mine.pid}
        assert set(processes_of_run(rid)) == {mine.pid, other_node.pid}
        assert node_verb.end_strays(rid, 0) == [mine.pid]
        assert mine.wait(10) == -signal.SIGKILL
        assert other_node.poll() is None and other_run.poll() is None
    finally:
        for p in (mine, other_node, other_run):
            p.kill()
            p.wait()


def test_the_node_agent_ends_strays_over_ssh_only(tmp_path: Path) -> None:
    """The node verb end to end, started as the ssh engine starts it (TREB_NODE_STDIN): a
    rank's `setsid sleep &` does not outlive it; started as on SkyPilot it is left (the
    node's end is the engine's)."""
    rid = f"s{os.getpid():x}"
    job = {"run_id": rid, "launcher": "native", "nodes": 1, "ppn": 1, "grace": 1,
           "command": ["bash", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & sleep 1; echo ok"],
           "checkpoint_signal": "SIGUSR2", "secrets": [], "spec_env": []}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "NODE_RANK": "0", "NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29999", "TREB_RUN_ID": rid, "TREB_RUN_DIR": str(tmp_path / "run"),
           "TREB_ATTEMPT": "0"}  # fmt: skip
    argv = [sys.executable, "-m", "trebuchet.runtime", "node", str(tmp_path / "job.json")]
    try:
        agent = subprocess.Popen(argv, env={**env, "TREB_NODE_STDIN": "1"}, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)  # fmt: skip
        assert agent.stdin is not None and agent.stdout is not None
        agent.stdin.write("{}\n")  # the secrets' line; stdin stays open: the session's
        agent.stdin.flush()
        out = ""
        for line in agent.stdout:  # the go once its checks passed, as the supervisor says it
            out += line
            if line.rstrip("\n") == barrier.HEALTHY:
                agent.stdin.write(f"{barrier.GO}\n")
                agent.stdin.flush()
        assert agent.wait(60) == 0, out
        agent.stdin.close()
        assert "1 process(es) the ranks left behind were killed" in out, out
        assert processes_of_run(rid) == []
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert len(processes_of_run(rid)) == 1  # not this verb's to end there
    finally:
        node_verb.end_strays(rid, 0)


def test_the_agents_clock_starts_with_the_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    with open("/proc/uptime") as fh:
        up = float(fh.read().split()[0])
    monkeypatch.setenv("TREB_ATTEMPT_ELAPSED", "3.0")
    monkeypatch.setenv("TREB_SESSION_UPTIME", str(up - 2.0))
    elapsed = node_verb.elapsed_before()
    assert 5.0 <= elapsed < 7.0
    assert "TREB_ATTEMPT_ELAPSED" not in os.environ and "TREB_SESSION_UPTIME" not in os.environ
    limit = node_verb.Limit({"timeout": 10.0, "warning": 3.0}, "node 0", elapsed)  # type: ignore[typeddict-item]
    assert limit.clock.timeout_at is not None
    assert limit.clock.timeout_at - time.monotonic() < 5.0  # 10 s from the attempt's start
    assert node_verb.elapsed_before() == 0.0  # elsewhere: from the agent's start


def test_a_failed_setup_is_its_own_diagnosis(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    log = adir / "setup-node-1.log"
    log.write_text("loading\nbash: line 9: /opt/venv/bin/activate: No such file or directory\n")
    message = ("ssh.setup failed at job.yaml:9 (`source /opt/venv/bin/activate`), exit code 1 "
               "on ts2 (node 1): bash: line 9: /opt/venv/bin/activate: No such file or "
               "directory")  # fmt: skip
    ff = {"label": "setup", "rank": None, "node": 1, "local_rank": None, "exit_code": 1,
          "signal": None, "ended_at": time.time(), "attempt": 0, "host": "ts2",
          "log": str(log), "message": message}  # fmt: skip
    run = {"id": "abcd1234", "name": "s", "run_dir": str(tmp_path), "state": "FAILED",
           "attempt": 0, "first_failure": ff, "backend": "ssh", "launcher": "native"}  # fmt: skip
    d = diagnose_run(run)
    assert d.category == "setup_failed", d.summary
    assert d.summary == message + " (no rank started)"
    assert any("No such file or directory" in e for e in d.evidence)
    assert d.log == str(log) and d.node == "ts2"
    cause, fix = two_lines(d)
    assert cause.startswith("cause: setup_failed: ssh.setup failed at job.yaml:9") and "fix:" in fix
    from trebuchet.store.states import describe_failure

    assert describe_failure(ff) == message + " (no rank started)"


def test_treb_fault_reads_the_hosts_of_ssh_json(tmp_path: Path) -> None:
    """`treb fault` on ssh finds the attempt's hosts in ssh.json (the engine's facts), the
    spares beyond `nodes` left out."""
    import types

    from trebuchet.backends.ssh import fault

    info = {**_info(tmp_path, []), "hosts": ["h0", "h1", "h2"], "nodes": 2}
    (tmp_path / "run" / "ssh.json").write_text(json.dumps(info))
    assert fault.nodes(types.SimpleNamespace(run_dir=str(tmp_path / "run"))) == ["h0", "h1"]


@pytest.mark.parametrize("host", ["gpu1:2222", "alice@gpu1:2222", "[gpu1]:2222", "[::1]:22"])
def test_a_host_with_a_port_is_refused_at_load_with_how_to_give_it(
    treb: TrebFn, tmp_path: Path, host: str
) -> None:
    """OpenSSH reads `gpu1:2222` as a host NAME (`ssh -G gpu1:2222`: hostname gpu1:2222,
    port 22): such a spec could never connect. A named error, exit 2, that says how."""
    spec = write_spec(tmp_path, f"name: s\ncommand: x\nssh:\n  hosts: [gpu0, {json.dumps(host)}]\n"
                      )  # fmt: skip
    (tmp_path / "hosts.txt").write_text(f"gpu0\n{host} slots=1\n")
    spec2 = tmp_path / "two.yaml"
    spec2.write_text("name: s\ncommand: x\nssh: {hostfile: hosts.txt}\n")
    for path, where in ((spec, f"{spec}:4"), (spec2, f"{tmp_path / 'hosts.txt'}:2")):
        for verb, rc, said in ((("check",), 1, f"{where}: error: {host!r}: "),
                               (("run", "--no-check"), 2, f"{where}: {host!r}: ")):  # fmt: skip
            res = treb(*verb, str(path), "--on", "ssh")
            assert res.returncode == rc, (verb, res.stdout, res.stderr)
            assert "Traceback" not in res.stderr
            assert said in res.stderr + res.stdout, res.stderr + res.stdout
            assert "ssh.port" in res.stderr + res.stdout and "Port" in res.stderr + res.stdout
    assert not (tmp_path / "treb-home" / "runs").exists()


def test_ipv6_hosts_are_still_hosts(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: s\ncommand: x\nssh:\n  hosts: ['::1', 'fe80::1%eth0']\n")
    res = treb("check", str(spec), "--on", "ssh")
    assert "is not a host name" not in res.stdout + res.stderr
    assert "ssh.port" not in res.stdout + res.stderr, res.stdout + res.stderr

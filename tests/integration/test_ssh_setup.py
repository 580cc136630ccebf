"""`--on ssh` before and after the ranks, on the two real sshd hosts (issue 25): ssh.setup
under bash with errexit (the docs' own `source .../activate`; a failing line fails its node
before any rank starts, named with its output, on the terminal and in `treb diagnose`), the
attempt's `timeout` and `treb cancel` while setup runs or while a host stalls the ssh
handshake, and what a rank leaves behind on a host (a `setsid` daemon) ended with the
attempt. The hosts share this machine's PID space: a process left on a host is seen here
too, but the check asks the hosts themselves, over ssh. Parts without hosts:
tests/fast/test_ssh_parts.py."""

# ruff: noqa: F811 (ssh_config, a fixture imported from test_ssh_runs, is named as an argument)
from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TrebFn, status_json, write_spec
from tests.integration.test_ssh_runs import (  # noqa: F401 - ssh_config is a fixture
    assert_nothing_left,
    detached,
    spec,
    ssh_config,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.ssh]
GUARD_S = 120  # a hang guard for `treb run`, never a timing assertion


def running(word: str) -> bool:
    """A process whose command line is `sleep <word>` runs (on any host: one PID space)."""
    out = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    return any(line.split() == ["sleep", word] for line in out.splitlines())


def left_on_hosts(conf: str, run_id: str) -> dict[str, str]:
    """Each host's processes that carry the run's TREB_RUN_ID, as the host lists them."""
    found = {}
    for host in ("ts1", "ts2"):
        cmd = f"grep -lsz '^TREB_RUN_ID={run_id}$' /proc/[0-9]*/environ || true"
        res = subprocess.run(["ssh", "-F", conf, host, cmd], capture_output=True, text=True,
                             timeout=60)  # fmt: skip
        assert res.returncode == 0, res.stderr
        found[host] = res.stdout.strip()
    return found


def with_setup(path: Path, setup: list[str]) -> int:
    """Put `setup` into the spec's ssh block; the line that holds it (and its items)."""
    text = path.read_text()
    path.write_text(text.replace("ssh: {", f"ssh: {{setup: {json.dumps(setup)}, "))
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("ssh:"))


def test_setup_sources_an_activate_script(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """The docs' example, `source <venv>/bin/activate`: under sh (dash) it failed and the
    ranks ran with the wrong python; under bash what it sets reaches every rank."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "activate").write_text(f'export TREB_VENV_MARK=on; PATH="{venv}:$PATH"\n')
    (venv / "mytool").write_text("#!/bin/sh\necho tool-ok\n")
    (venv / "mytool").chmod(0o755)
    path = spec(tmp_path, ssh_config, 'test "$TREB_VENV_MARK" = on && mytool')
    with_setup(path, [f"source {venv / 'activate'}"])
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    for r in range(4):
        assert "tool-ok" in (Path(st["run_dir"]) / "attempt-0" / f"rank-{r}.log").read_text()
    # setup's output is kept per node, fetched from the host
    assert (Path(st["run_dir"]) / "attempt-0" / "setup-node-1.log").is_file()


def test_a_failing_setup_line_fails_its_node_before_any_rank(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """On ts2 a setup line fails: its node's ranks never start (its later lines do not run
    either), the run FAILS (it used to SUCCEED), and the line with its output is on the
    terminal, in `treb status` and in `treb diagnose` (setup_failed)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    setup = [
        "echo preparing",
        '[ "$(hostname)" != ts2 ] || source /nonexistent/treb-venv/bin/activate',
        f"touch {marks}/after-setup-$(hostname)",
    ]
    path = spec(tmp_path, ssh_config, f"touch {marks}/rank-$RANK; exec sleep 120")
    at = with_setup(path, setup)
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    out = res.stdout + res.stderr
    assert res.returncode == 1, out[-3000:]
    st = status_json(treb)
    assert st["state"] == "FAILED", st
    ff = st["first_failure"]
    assert (ff["label"], ff["host"], ff["node"], ff["exit_code"]) == ("setup", "ts2", 1, 1), ff
    assert f"ssh.setup failed at {path}:{at} (`[ \"$(hostname)\" != ts2 ] || source " in (
        ff["message"])  # fmt: skip
    assert "/nonexistent/treb-venv/bin/activate: No such file or directory" in ff["message"]
    # on the terminal, as it happened: the node, the line, its output
    assert "node 1 (ts2): ssh.setup failed at" in out, out[-3000:]
    assert "ts2: bash: line" in out and "No such file or directory" in out
    # nothing of ts2's ranks ran, nor its later setup line; ts1's ranks were stopped
    assert not (marks / "after-setup-ts2").exists()
    assert not (marks / "rank-2").exists() and not (marks / "rank-3").exists()
    diag = treb("diagnose", st["id"])
    assert diag.returncode == 0, diag.stderr
    assert "setup_failed" in diag.stdout and "No such file or directory" in diag.stdout
    assert "cause:    setup_failed: ssh.setup failed at" in diag.stdout, diag.stdout
    assert_nothing_left(st["id"])


def test_timeout_holds_while_setup_runs(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """A setup that sleeps 60 s under `timeout: 5s` ends TIMEOUT (it used to run the ranks
    to success after it), and the setup is ended on the hosts."""
    path = spec(tmp_path, ssh_config, "echo ran", "timeout: 5s\n")
    with_setup(path, ["sleep 987"])
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "TIMEOUT", st
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("TIMEOUT", "timeout")]
    assert not any((Path(st["run_dir"]) / "attempt-0").glob("rank-*.json"))  # none started
    wait_for(lambda: not running("987"), 30, "the setup's sleep to end on the hosts")


def test_timeout_holds_while_pre_runs(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """The attempt's clock starts before `pre`, as on every engine: a `pre` that outlasts
    `timeout` ends the attempt TIMEOUT (no rank starts) and is ended on the hosts."""
    path = spec(tmp_path, ssh_config, "echo ran", "timeout: 5s\npre: sleep 989\n")
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "TIMEOUT", st
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("TIMEOUT", "timeout")]
    assert not any((Path(st["run_dir"]) / "attempt-0").glob("rank-*.json"))
    wait_for(lambda: not running("989"), 30, "pre's sleep to end on the hosts")


def test_cancel_holds_while_setup_runs(
    treb: TrebFn, ssh_config: str, tmp_path: Path, treb_home: Path
) -> None:
    path = spec(tmp_path, ssh_config, "echo ran")
    with_setup(path, ["sleep 988"])
    rid = detached(treb, path)
    wait_for(lambda: running("988"), 60, "the setup to run on the hosts")
    res = treb("cancel", rid, timeout=GUARD_S)
    assert res.returncode == 0, res.stderr
    wait_for(lambda: status_json(treb, rid)["state"] != "RUNNING", 60, "the run to end")
    st = status_json(treb, rid)
    assert st["state"] == "CANCELLED", st
    wait_for(lambda: not running("988"), 30, "the setup's sleep to end on the hosts")
    assert_nothing_left(rid)


class Stalling:
    port = 0
    held: list[socket.socket]


@pytest.fixture
def stalling_host() -> Iterator[Stalling]:
    """A port that accepts, sends an ssh banner, then says nothing (the connections are
    held open until the test ends)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(b"SSH-2.0-x\r\n")
            held.append(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    found = Stalling()
    found.port, found.held = server.getsockname()[1], held
    try:
        yield found
    finally:
        done.set()
        t.join(5)
        for c in held:
            c.close()
        server.close()


def _stalling_spec(tmp_path: Path, port: int) -> Path:
    return write_spec(tmp_path / "job", f"""\
name: stall
command: echo never
ssh: {{hosts: [127.0.0.1], port: {port}, options: [ConnectTimeout=2]}}
""")  # fmt: skip


def test_a_host_that_stalls_after_its_banner_fails_the_run(
    treb: TrebFn, tmp_path: Path, stalling_host: Stalling, ssh_config: str
) -> None:
    res = treb("run", str(_stalling_spec(tmp_path, stalling_host.port)), "--on", "ssh",
               timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 1, res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "FAILED", st
    why = "cannot connect to 127.0.0.1: no ssh login within 7s (ConnectTimeout 2s"
    assert why in st["first_failure"]["message"], st["first_failure"]
    assert why in res.stderr


def test_cancel_holds_while_a_host_stalls(
    treb: TrebFn, tmp_path: Path, stalling_host: Stalling, ssh_config: str, treb_home: Path
) -> None:
    spec_path = _stalling_spec(tmp_path, stalling_host.port)
    spec_path.write_text(spec_path.read_text().replace("ConnectTimeout=2", "ConnectTimeout=60"))
    rid = detached(treb, spec_path)
    wait_for(lambda: stalling_host.held, 60, "the supervisor to connect")
    assert treb("cancel", rid, timeout=GUARD_S).returncode == 0
    wait_for(lambda: status_json(treb, rid)["state"] != "RUNNING", 30, "the run to end")
    assert status_json(treb, rid)["state"] == "CANCELLED"


def test_what_a_rank_leaves_behind_is_ended_on_every_host(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """Each rank starts a daemon out of its process group (`setsid sleep 1000 &`): when the
    run has ended no process with its TREB_RUN_ID is left on either host (200 were)."""
    cmd = "setsid sleep 1000 </dev/null >/dev/null 2>&1 & sleep 1; echo started"
    res = treb("run", str(spec(tmp_path, ssh_config, cmd)), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert st["state"] == "SUCCEEDED"
    assert left_on_hosts(ssh_config, st["id"]) == {"ts1": "", "ts2": ""}
    assert "process(es) the ranks left behind were killed" in res.stderr


def test_a_failing_post_fails_the_attempt(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """`post` that fails turns a successful attempt into a failed one, as locally (ssh
    called it SUCCEEDED)."""
    path = spec(tmp_path, ssh_config, "echo ran", "post: 'echo post; exit 3'\n")
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    st = status_json(treb)
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [("FAILED", "post")]
    assert st["state"] == "FAILED"

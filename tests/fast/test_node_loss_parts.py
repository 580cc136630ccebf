"""Node loss's parts that need no test host (issue 23): the node agent's heartbeat and last
word on its stdout as the ssh engine reads them (a real node verb process), the lost
node's record and exclusion, and which nodes the next attempt gets (spares, MIN:MAX).
The ssh hosts' end to end is tests/integration/test_ssh_node_loss.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from trebuchet.backends.ssh.run import Node
from trebuchet.runtime.job import nodeloss, nodeset
from trebuchet.runtime.node import barrier
from trebuchet.runtime.rundir.records import first_failure


def agent(tmp_path: Path, command: str, **extra: object) -> subprocess.Popen[bytes]:
    """The runtime's node verb, started as the ssh engine starts it (TREB_NODE_STDIN)."""
    rid = f"b{os.getpid():x}"
    job = {"run_id": rid, "launcher": "native", "nodes": 1, "ppn": 1, "grace": 1,
           "command": ["bash", "-c", command], "checkpoint_signal": "SIGUSR2", "secrets": [],
           "spec_env": [], **extra}  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "NODE_RANK": "0", "NUM_NODES": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29998", "TREB_RUN_ID": rid, "TREB_RUN_DIR": str(tmp_path / "run"),
           "TREB_ATTEMPT": "0", "TREB_NODE_STDIN": "1"}  # fmt: skip
    argv = [sys.executable, "-m", "trebuchet.runtime", "node", str(tmp_path / "job.json")]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(b"{}\n")  # the secrets' line; stdin stays open (the session)
    proc.stdin.flush()
    return proc


def session(proc: subprocess.Popen[bytes], tmp_path: Path) -> tuple[Node, list[bytes]]:
    """The engine's view of the session: every stdout line through Node.hear, as the ssh
    supervisor's reader takes them; every line, in order."""
    node = Node(0, "h1", proc, open(tmp_path / "ssh-0.log", "wb"))  # noqa: SIM115
    node.setup_done = True  # the script's markers came before the agent
    assert proc.stdout is not None and proc.stdin is not None
    lines = []
    for line in proc.stdout:  # the go once its checks passed, as the supervisor says it
        lines.append(line)
        node.hear(line)
        if line.rstrip(b"\n") == barrier.HEALTHY.encode():
            proc.stdin.write(f"{barrier.GO}\n".encode())
            proc.stdin.flush()
    node.returncode = proc.wait(30)
    node.log.close()
    return node, lines


def test_the_agent_beats_and_says_it_ended_on_its_stdout(tmp_path: Path) -> None:
    """A rank that runs 4.5 s: heartbeats come between the log copy's whole lines, the
    last word says the code, and a session that ended with it is no lost node."""
    proc = agent(tmp_path, "for i in 1 2 3; do echo line-$i; sleep 1.5; done")
    node, lines = session(proc, tmp_path)
    assert node.ended == 0 and node.returncode == 0 and not node.lost
    assert lines[-1] == b"treb-ended 0\n", lines
    assert [ln for ln in lines if b"line-" in ln] == [b"[0:0] line-%d\n" % i for i in (1, 2, 3)]
    beats = [ln for ln in lines if nodeloss.BEAT.encode() in ln]
    assert len(beats) >= 2 and set(beats) == {b"treb-beat\n"}, lines  # whole lines only


def test_the_agent_beats_while_the_health_checks_run(tmp_path: Path) -> None:
    """The spec's health_check runs before the log copy starts (and may take longer than
    node_timeout): the agent beats meanwhile, so a slow check is no lost node."""
    proc = agent(tmp_path, "echo ranks-ran", health_check="sleep 4.5",
                 health_check_timeout=60.0)  # fmt: skip
    node, lines = session(proc, tmp_path)
    assert node.ended == 0 and not node.lost, lines
    first_rank_line = next(i for i, ln in enumerate(lines) if b"ranks-ran" in ln)
    assert lines[:first_rank_line].count(b"treb-beat\n") >= 2, lines


def test_an_agent_killed_without_its_last_word_is_a_lost_node(tmp_path: Path) -> None:
    proc = agent(tmp_path, "echo started; exec sleep 300")
    assert proc.stdout is not None
    assert proc.stdout.readline().rstrip() in (b"[0:0] started", nodeloss.BEAT.encode())
    os.killpg(proc.pid, signal.SIGKILL)  # the agent and its rank, as a node's death
    node, _ = session(proc, tmp_path)
    assert node.ended is None and node.lost


def test_a_lost_node_is_recorded_first_and_excluded(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "attempt-0").mkdir(parents=True)
    msg = nodeloss.silent("ts2", 5.0, 1_700_000_000.0)
    assert msg.startswith("node_lost: ts2 (no heartbeat for 5s, last seen ") and msg.endswith(")")
    rec = nodeloss.record(str(run_dir), 0, 1, "ts2", msg, 1_700_000_000.0)
    on_file = json.loads((run_dir / "attempt-0" / "lost-1.json").read_text())
    assert on_file == rec and rec["label"] == "node_lost" and rec["host"] == "ts2"
    rank = {"label": "rank 0", "rank": 0, "exit_code": 1, "ended_at": 1.0}  # its peer, earlier
    assert first_failure([rank, on_file]) == on_file  # type: ignore[list-item]
    assert nodeset.excluded(str(run_dir)) == {"ts2": msg}
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["host"], e["attempt"]) for e in events] == [("node_lost", "ts2", 0)]


def test_the_next_attempt_takes_a_spare_then_fewer_nodes_then_none(tmp_path: Path) -> None:
    run = str(tmp_path)
    held = ["ts1", "ts2", "ts3"]
    assert nodeloss.next_nodes(run, held, 2, None).hosts == ["ts1", "ts2"]
    nodeset.exclude(run, "ts1", "node_lost: ts1")  # node 0 lost: the master moves
    assert nodeloss.next_nodes(run, held, 2, None).hosts == ["ts2", "ts3"]
    nodeset.exclude(run, "ts3", "node_lost: ts3")
    assert nodeloss.next_nodes(run, held, 2, 1).hosts == ["ts2"]  # nodes: "1:2"
    final = nodeloss.next_nodes(run, held, 2, None)
    assert final.hosts == [] and "excluded: ts1, ts3" in final.why_not, final

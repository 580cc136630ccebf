"""The node agent's stop sequences on real processes (runtime agent: teardown): SIGTERM
then SIGKILL after the grace; an interrupt (SIGINT, torchrun's way of handing Ctrl+C on)
SIGINT first, SIGTERM after one grace, SIGKILL after another; a second stop during an
interrupt is a SIGTERM now."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from trebuchet.runtime.node.agent import Agent, Proc

# Notes each stop signal it gets, never ends on its own: only SIGKILL ends it.
STUBBORN = """\
import signal, sys, time
out = sys.argv[1]
def note(signum, frame):
    with open(out, "a") as fh:
        fh.write(signal.Signals(signum).name + "\\n")
for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, note)
open(out + ".up", "w").close()
while True:
    time.sleep(0.02)
"""


def _agent(tmp_path: Path, grace: float = 0.3) -> tuple[Agent, Path]:
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    out = tmp_path / "signals"
    argv = [sys.executable, str(tmp_path / "stubborn.py"), str(out)]
    proc = Proc("rank-0", "0:0", argv, {"PATH": "/usr/bin:/bin"}, rank=0)
    agent = Agent([proc], str(tmp_path), str(tmp_path), grace)
    agent.start_all()
    deadline = time.monotonic() + 60
    while not Path(str(out) + ".up").exists():
        assert time.monotonic() < deadline, "the process never started"
        time.sleep(0.02)
    return agent, out


def _run_out(agent: Agent) -> None:
    deadline = time.monotonic() + 60  # a hang guard, no timing assertion
    while agent.poll():
        assert time.monotonic() < deadline, "the agent never ended its process"
        time.sleep(0.02)


def test_an_interrupt_is_sigint_then_sigterm_then_sigkill(tmp_path: Path) -> None:
    agent, out = _agent(tmp_path)
    agent.teardown(signal.SIGINT)
    _run_out(agent)
    assert out.read_text() == "SIGINT\nSIGTERM\n"
    p = agent.procs[0]
    assert p.returncode == -signal.SIGKILL and p.stopped


def test_a_plain_stop_is_sigterm_then_sigkill(tmp_path: Path) -> None:
    agent, out = _agent(tmp_path)
    agent.teardown()
    _run_out(agent)
    assert out.read_text() == "SIGTERM\n"
    assert agent.procs[0].returncode == -signal.SIGKILL


def test_a_stop_during_an_interrupt_sends_sigterm_once(tmp_path: Path) -> None:
    agent, out = _agent(tmp_path, grace=2.0)
    agent.teardown(signal.SIGINT)
    deadline = time.monotonic() + 60  # a hang guard
    while "SIGINT" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, "SIGINT never came"
        agent.poll()
        time.sleep(0.02)
    agent.teardown(signal.SIGINT)  # a second Ctrl+C, or a SIGTERM: escalates now
    _run_out(agent)
    assert out.read_text() == "SIGINT\nSIGTERM\n"  # the SIGTERM step is not sent again

# ruff: noqa: F811 (fixtures imported from the support modules are named as arguments)
"""Ctrl+C on an attached `treb run` reaches the ranks as torchrun delivers it: SIGINT to each
rank's process group (a Python rank's `except KeyboardInterrupt:` saves its checkpoint),
SIGTERM to what is still alive after the grace period, SIGKILL after another one. Real
`treb run` processes, sent SIGINT as a terminal sends it: to the whole foreground group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_ssh_runs import ssh_config, wait_for  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

# A rank that saves on KeyboardInterrupt (then dies of it, as an uncaught one does), or, when
# STUBBORN lists its rank, one that shrugs KeyboardInterrupt off and notes every stop signal
# it gets: the first rank listed ends on SIGTERM, the others ignore SIGTERM too (only SIGKILL
# ends them).
RANK_PY = """\
import os, signal, sys, time
from pathlib import Path

rank, out = os.environ["RANK"], Path(os.environ["OUT"])
stubborn = os.environ.get("STUBBORN", "").split(",")

def note(what):
    with open(out / f"signals-{rank}", "a") as fh:
        fh.write(what + "\\n")

if rank in stubborn:
    def on_term(signum, frame):
        note("SIGTERM")
        if rank == stubborn[0]:
            sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
(out / f"up-{rank}").write_text("up")
while True:
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        note("SIGINT")
        if rank not in stubborn:
            (out / f"saved-{rank}").write_text("checkpoint at interrupt\\n")
            raise
"""


def interrupt(cmd: list[str], ready: Callable[[], bool], cwd: Path,
              env: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
    """Start `treb run` in a process group of its own (a terminal's foreground job); once
    `ready()`, SIGINT to the whole group, as a terminal's Ctrl+C; (its exit code, its stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip
    try:
        wait_for(ready, timeout=120, what="the run's ranks")
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    said = err.decode(errors="replace")
    sys.stderr.write(said)
    return proc.returncode, said


def _ctrl_c(
    cmd: list[str], out: Path, ranks: int, env: dict[str, str], cwd: Path, local: bool = True
) -> int:
    """Ctrl+C once every rank is up; treb's exit code."""
    code, said = interrupt(cmd, lambda: len(list(out.glob("up-*"))) == ranks, cwd, env)
    if local:  # what the local supervisor says at once: what comes, and how to skip it
        assert "interrupted: SIGINT to the ranks" in said and "Ctrl+C again" in said, said
    return code


def _local(tmp_path: Path, extra: str = "") -> tuple[Path, list[str]]:
    """The rank program and a 2-rank spec running it: (the ranks' output folder, argv)."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "rank.py").write_text(RANK_PY)
    spec = write_spec(tmp_path, f"command: python rank.py\nprocs_per_node: 2\n{extra}")
    return out, [sys.executable, "-m", "trebuchet", "run", str(spec)]


def test_ctrl_c_is_keyboard_interrupt_in_every_rank(treb, tmp_path: Path) -> None:
    """torchrun's sequence (elastic/multiprocessing/api.py: SIGINT to each worker's group):
    each rank's handler saves its file; treb exits 130 and the run is CANCELLED, the ranks
    stopped by the launcher, dead of the SIGINT they re-raised."""
    out, cmd = _local(tmp_path)
    code = _ctrl_c(cmd, out, 2, {"OUT": str(out)}, tmp_path)
    assert code == 130  # the contract's interrupted (torchrun: 1, its SignalException)
    for rank in (0, 1):
        assert (out / f"saved-{rank}").read_text() == "checkpoint at interrupt\n"
        assert (out / f"signals-{rank}").read_text() == "SIGINT\n"  # once: no SIGTERM
    st = status_json(treb)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    assert [(p["signal"], p["stopped_by_launcher"]) for p in st["procs"]] == [
        ("SIGINT", True),
        ("SIGINT", True),
    ]
    events = [json.loads(ln) for ln in (Path(st["run_dir"]) / "events.jsonl").open()]
    assert any(e.get("kind", e.get("event")) == "teardown" for e in events)


def test_a_rank_that_outlives_sigint_gets_sigterm_then_sigkill(treb, tmp_path: Path) -> None:
    """SIGINT, then SIGTERM after the grace period to what still runs, then SIGKILL after
    another one: rank 0 ends on the SIGTERM, rank 1 (ignoring both) dies of the SIGKILL."""
    out, cmd = _local(tmp_path, "grace_period: 1s\n")
    code = _ctrl_c(cmd, out, 2, {"OUT": str(out), "STUBBORN": "0,1"}, tmp_path)
    assert code == 130
    assert (out / "signals-0").read_text() == "SIGINT\nSIGTERM\n"
    assert (out / "signals-1").read_text() == "SIGINT\nSIGTERM\n"
    st = status_json(treb)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    by_rank = {p["rank"]: p for p in st["procs"]}
    assert by_rank[0]["exit_code"] == 143 and by_rank[0]["signal"] is None
    assert by_rank[1]["signal"] == "SIGKILL"
    assert all(p["stopped_by_launcher"] for p in st["procs"])


def test_ctrl_c_reaches_ranks_under_launcher_torchrun(treb, tmp_path: Path) -> None:
    """launcher: torchrun: SIGINT to torchrun's group; torchrun forwards it to its workers
    (treb's worker wrapper), which hand it on as SIGINT to the rank."""
    if not (Path(sys.executable).parent / "torchrun").exists():
        pytest.skip("torchrun is not installed")
    out, cmd = _local(tmp_path, "launcher: torchrun\n")
    code = _ctrl_c(cmd, out, 2, {"OUT": str(out)}, tmp_path)
    assert code == 130
    for rank in (0, 1):
        assert (out / f"saved-{rank}").read_text() == "checkpoint at interrupt\n"
    assert status_json(treb)["state"] == "CANCELLED"


def test_ctrl_c_reaches_ranks_on_ssh_hosts(treb, ssh_config: str, tmp_path: Path) -> None:
    """--on ssh, run directory not shared: Ctrl+C reaches each host's agent on its session
    (nodeloss.INTERRUPT), which hands it on to its ranks as SIGINT; nothing is left."""
    from tests.integration.test_ssh_runs import PY, assert_nothing_left, spec

    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "rank.py").write_text(RANK_PY)
    job = spec(tmp_path, ssh_config, f"OUT={out} exec {PY} rank.py")
    cmd = [sys.executable, "-m", "trebuchet", "run", str(job), "--on", "ssh"]
    code = _ctrl_c(cmd, out, 4, {}, tmp_path, local=False)
    assert code == 130
    for rank in range(4):
        assert (out / f"saved-{rank}").read_text() == "checkpoint at interrupt\n"
        assert (out / f"signals-{rank}").read_text() == "SIGINT\n"
    st = status_json(treb)
    assert st["state"] == "CANCELLED" and st["first_failure"] is None
    assert_nothing_left(st["id"])


def test_ctrl_c_while_a_retry_is_pending_says_an_attempt_failed(treb, tmp_path: Path) -> None:
    """Attempt 1 fails; Ctrl+C comes while its retry is pending (attempt 2's `pre` runs, no
    rank started): the run is CANCELLED, its first failure stays attempt 1's, attempt 2 is
    recorded as cancelled after attempt 1 failed, and the cause says it (never "nothing
    failed"); treb exits 130."""
    gap = tmp_path / "in-gap"
    spec = write_spec(tmp_path, (
        "command: 'if [ \"$TREB_ATTEMPT\" = 0 ]; then echo failing; exit 3; fi; sleep 60'\n"
        f"retries: 1\npre: 'if [ \"$TREB_ATTEMPT\" = 1 ]; then touch {gap}; sleep 60; fi'\n"
    ))  # fmt: skip
    cmd = [sys.executable, "-m", "trebuchet", "run", str(spec)]
    code, said = interrupt(cmd, gap.exists, tmp_path)
    assert code == 130, said
    assert "nothing failed" not in said.lower() and "pre command failed" not in said, said
    assert "attempt 1 FAILED (rank 0 (node 0) exited with code 3); its retry" in said, said
    assert "cancelled after attempt 1 failed" in said, said
    st = status_json(treb)
    assert st["state"] == "CANCELLED", st
    assert st["first_failure"]["attempt"] == 0 and st["first_failure"]["exit_code"] == 3
    assert [(a["state"], a["reason"]) for a in st["attempts"]] == [
        ("FAILED", "failure"),
        ("CANCELLED", "cancelled after attempt 1 failed, before its ranks started"),
    ]
    res = treb("diagnose", "--json")
    assert "nothing failed" not in res.stdout.lower(), res.stdout
    assert "cancelled after attempt 1 failed" in res.stdout, res.stdout

"""The parts of hang detection on real files and real processes: the agent's log reader
(bounded, never blocking on a FIFO, heartbeats), the hang rule, stacks by faulthandler and
by py-spy through the request files, the grouping into one line, and what the spec
carries into renders and `treb check`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, needs, needs_program
from trebuchet.cli.main import main
from trebuchet.diagnose import hang as dhang
from trebuchet.runtime.watch import activity as progress
from trebuchet.runtime.watch import hung as hang
from trebuchet.runtime.watch import stacks

PY = sys.executable


def test_reader_records_progress_last_line_and_each_line(tmp_path: Path) -> None:
    seen: list[tuple[str, bytes]] = []
    p = progress.Progress(str(tmp_path), on_line=lambda name, line: seen.append((name, line)))
    p.track("rank-0")
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"epoch 1\rloss 2.0\nstep \x1b[31m3")
    p.step(force=True)
    rec = tmp_path / "progress" / "rank-0"
    assert rec.read_bytes() == b"loss 2.0\n"
    assert seen == [("rank-0", b"epoch 1"), ("rank-0", b"loss 2.0")]
    assert abs(rec.stat().st_mtime - time.time()) < 60
    os.utime(rec, (1000.0, 1000.0))
    p.step(force=True)  # nothing new: the record keeps its time
    assert rec.stat().st_mtime == 1000.0
    with open(log, "ab") as fh:
        fh.write(b"\n")
    p.step(force=True)
    assert seen[-1] == ("rank-0", b"step ^[[31m3")  # control characters made visible
    assert rec.stat().st_mtime > 1000.0


def test_reader_skips_a_flood_to_its_end(tmp_path: Path) -> None:
    p = progress.Progress(str(tmp_path))
    p.track("rank-0")
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"x" * (3 * progress.CHUNK) + b"\nlast\n")
    p.step(force=True)
    t = p.tracked[0]
    assert t.offset == log.stat().st_size  # one bounded read, from the end
    assert (tmp_path / "progress" / "rank-0").read_bytes() == b"last\n"


def test_reader_never_blocks_on_a_fifo(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "rank-0.log")
    p = progress.Progress(str(tmp_path))
    p.track("rank-0")
    th = threading.Thread(target=p.step, kwargs={"force": True}, daemon=True)
    th.start()
    th.join(30)
    assert not th.is_alive()
    assert not (tmp_path / "progress" / "rank-0").exists()


def test_heartbeat_is_progress(tmp_path: Path, monkeypatch) -> None:
    from trebuchet.dist import heartbeat

    p = progress.Progress(str(tmp_path))
    beat = p.track("rank-1")
    assert beat == str(tmp_path / "progress" / "rank-1.heartbeat")
    heartbeat()  # outside trebuchet: nothing
    monkeypatch.setenv("TREB_HEARTBEAT", beat)
    heartbeat()
    p.step(force=True)
    assert (tmp_path / "progress" / "rank-1").exists()
    assert p.tracked[0].last_progress is not None


def test_the_rule_takes_the_newest_progress_of_any_rank(tmp_path: Path) -> None:
    folder = tmp_path / "progress"
    folder.mkdir()
    now = time.time()
    for name, age in (("rank-0", 5.0), ("rank-1", 500.0), ("rank-1.heartbeat", 1.0)):
        (folder / name).write_text("x\n")
        os.utime(folder / name, (now - age, now - age))
    last = hang.last_progress(str(tmp_path), now - 1000)
    assert abs(last - (now - 5.0)) < 0.01  # rank 1 is silent, rank 0 progresses
    assert not hang.is_hung(last, 20.0, now)
    assert hang.is_hung(last, 4.0, now)
    assert hang.last_progress(str(tmp_path / "none"), 123.0) == 123.0  # before any: the start


CHILD = """\
import time
from trebuchet.dist import enable_stacks
assert enable_stacks()
print("ready", flush=True)
def wait_for_data():
    time.sleep(120)  # WAIT-LINE
wait_for_data()
"""


def _child(tmp_path: Path, adir: Path) -> subprocess.Popen:
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "TREB_STACKS_FILE": stacks.faulthandler_path(str(adir), "rank-0")}  # fmt: skip
    proc = subprocess.Popen([PY, str(tmp_path / "child.py")], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    # ready, then asleep (state S: the only blocking call left is the sleep)
    deadline = time.monotonic() + 60
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "S":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return proc


def _hang_with_stacks(adir: Path, pid: int) -> dict:
    """A watch with hang_timeout 0 and an agent's Stacks, stepped as their loops do."""
    watch = hang.HangWatch(str(adir), 0.0, "fail", ["rank-0"], started=time.time())
    agent_side = stacks.Stacks(str(adir))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = watch.step()
        if found is not None:
            return found
        agent_side.step({"rank-0": pid})
        time.sleep(0.05)
    raise AssertionError("no hang decided")


@pytest.mark.parametrize("method", ["faulthandler", "py-spy"])
def test_stacks_by_request_then_one_line(tmp_path: Path, monkeypatch, method: str) -> None:
    if method == "py-spy":
        monkeypatch.delenv("TREB_PY_SPY", raising=False)
        spy = stacks.find_py_spy()  # PATH, or beside this Python (the test extra's)
        monkeypatch.setenv("TREB_PY_SPY", spy or needs_program("py-spy"))
    else:
        monkeypatch.setenv("TREB_PY_SPY", "")
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    proc = _child(tmp_path, adir)
    try:
        info = _hang_with_stacks(adir, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert info["stacks"] == ["rank-0"] and info["missing_stacks"] == []
    saved = json.loads((adir / "hang.json").read_text())
    assert saved["expected"] == ["rank-0"] and saved["action"] == "fail"
    text = (adir / "stacks" / "rank-0.txt").read_text()
    assert f" method {method}" in text.splitlines()[0], text
    line = 1 + CHILD.splitlines().index("    time.sleep(120)  # WAIT-LINE")
    [rs] = dhang.read(adir).ranks
    assert (rs.what, rs.where) == ("time.sleep", f"child.py:{line}"), text
    assert dhang.read(adir).line.startswith("hang: all 1 ranks wait in time.sleep (child.py:")


def test_stacks_without_py_spy_or_faulthandler_say_why(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TREB_PY_SPY", "")
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        info = _hang_with_stacks(adir, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    text = (adir / "stacks" / "rank-0.txt").read_text()
    assert info["stacks"] == ["rank-0"]
    assert " method none " in text and "py-spy not found" in text
    assert "enable_stacks()" in text


PYSPY_NATIVE = """\
# request 1.0-1 method py-spy --native pid 10
Process 10: python train.py
Thread 10 (idle): "MainThread"
    0x7f18bdea3f16 (libc.so.6)
    pthread_cond_wait (libc.so.6)
    c10d::Reducer::wait_for_pending_grads (libtorch_cpu.so)
    _engine_run_backward (/venv/lib/python3.11/site-packages/torch/autograd/graph.py:825)
    backward (/venv/lib/python3.11/site-packages/torch/_tensor.py:626)
    train (/work/train.py:88)
    <module> (/work/train.py:120)
Thread 11 (idle): "pt_autograd_0"
    wait (/usr/lib/python3.11/threading.py:320)
"""
FAULTHANDLER = """\
# request 1.0-1 method faulthandler pid 11
Thread 0x00007f0000000002 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
Current thread 0x00007f0000000001 (most recent call first):
  File "/work/data.py", line 41 in __getitem__
  File "/work/train.py", line 80 in train
  File "/work/train.py", line 120 in <module>
"""


def test_two_deciders_sharing_a_run_directory_both_get_the_stacks(tmp_path: Path) -> None:
    """ssh hosts on a shared filesystem: two node agents' watches request stacks in the
    same folder; the later request overwrites the earlier, the agents answer it, and both
    watches must take those answers (a newer stack than asked for), not wait for theirs."""
    adir = str(tmp_path)
    first = stacks.request(adir)
    time.sleep(0.01)
    second = stacks.request(adir)
    folder = Path(stacks.stacks_dir(adir))
    for r in range(2):
        (folder / f"rank-{r}.txt").write_text(f"# request {second} method py-spy pid 1\n")
    (folder / "rank-2.txt").write_text(f"# request {first} method py-spy pid 1\n")
    assert sorted(stacks.answered(adir, first)) == ["rank-0", "rank-1", "rank-2"]
    assert sorted(stacks.answered(adir, second)) == ["rank-0", "rank-1"]  # not older ones
    (folder / "rank-3.txt").write_text("# request junk method py-spy pid 1\n")
    assert "rank-3" not in stacks.answered(adir, first)


def test_grouping_names_the_rank_apart_and_native_frames(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    (adir / "stacks").mkdir(parents=True)
    (adir / "progress").mkdir()
    for r in range(3):
        (adir / "stacks" / f"rank-{r}.txt").write_text(PYSPY_NATIVE)
    (adir / "stacks" / "rank-3.txt").write_text(FAULTHANDLER)
    now = time.time()
    for r, age in ((0, 30.0), (1, 30.0), (2, 30.0), (3, 700.0)):
        (adir / "progress" / f"rank-{r}").write_text("x\n")
        os.utime(adir / "progress" / f"rank-{r}", (now - age, now - age))
    (adir / "hang.json").write_text(json.dumps({
        "detected_at": now, "last_progress": now - 30.0, "hang_timeout": 20.0,
        "action": "fail", "expected": [f"rank-{r}" for r in range(5)],
        "stacks": [f"rank-{r}" for r in range(4)], "attempt_dir": str(adir)}))  # fmt: skip
    h = dhang.read(adir)
    assert h.line == (
        "hang: 3 of 5 ranks wait in _engine_run_backward (train.py:88) "
        "[native: c10d::Reducer::wait_for_pending_grads]; rank 3 is in __getitem__ "
        "(data.py:41), silent for 11m40s; no stacks from rank 4"
    )
    assert h.odd is not None and h.odd.name == "rank-3"
    found = dhang.for_run({"run_dir": str(tmp_path), "attempt": 0, "state": "FAILED"})
    assert found is not None and found["rank"] == 3
    assert dhang.for_run({"run_dir": str(tmp_path), "attempt": 0, "state": "RUNNING"}) is None


def _hang_dir(tmp_path: Path, files: dict[int, str], ages: dict[int, float]) -> Path:
    """An attempt's hang: stack files (rank -> text), progress ages (rank -> seconds)."""
    adir = tmp_path / "attempt-0"
    (adir / "stacks").mkdir(parents=True)
    (adir / "progress").mkdir()
    now = time.time()
    for r, text in files.items():
        (adir / "stacks" / f"rank-{r}.txt").write_text(text)
    for r, age in ages.items():
        (adir / "progress" / f"rank-{r}").write_text("x\n")
        os.utime(adir / "progress" / f"rank-{r}", (now - age, now - age))
    (adir / "hang.json").write_text(json.dumps({
        "detected_at": now, "last_progress": now - 12.0, "hang_timeout": 10.0,
        "action": "fail", "expected": [f"rank-{r}" for r in sorted(ages)],
        "stacks": [f"rank-{r}" for r in sorted(files)], "attempt_dir": str(adir)}))  # fmt: skip
    return adir


NO_SPY = """\
# request 1.0-1 method none pid 12
# host tn2
# tried: py-spy not found (install py-spy on the nodes)
# tried: faulthandler: not registered (call trebuchet.dist.enable_stacks() in the program)
# no stacks: py-spy was not usable and faulthandler not registered
"""


def test_a_node_without_py_spy_is_said_once_and_the_silent_rank_still_named(
    tmp_path: Path,
) -> None:
    """Before: "all 4 ranks wait in no stacks". Now the node that could not dump says why,
    once, and the progress times name the rank that went silent first."""
    ages = {0: 12.0, 1: 12.0, 2: 13.0, 3: 41.0}
    adir = _hang_dir(tmp_path / "all", dict.fromkeys(range(4), NO_SPY), ages)
    h = dhang.read(adir)
    assert h.line == ("hang: no stacks on tn2: py-spy not found there; rank 3 went silent "
                      "first, 41s before the hang was seen (the others 13s or less)")  # fmt: skip
    assert h.odd is not None and h.odd.name == "rank-3"
    found = dhang.for_run({"run_dir": str(adir.parent), "attempt": 0, "state": "FAILED"})
    assert found is not None and found["rank"] == 3
    spied = PYSPY_NATIVE.replace("pid 10\n", "pid 10\n# host tn1\n")
    half = _hang_dir(tmp_path / "half", {0: spied, 1: spied, 2: NO_SPY, 3: NO_SPY}, ages)
    assert dhang.read(half).line == (
        "hang: 2 of 4 ranks wait in _engine_run_backward (train.py:88) "
        "[native: c10d::Reducer::wait_for_pending_grads]; no stacks on tn2 (ranks 2, 3): "
        "py-spy not found there; rank 3 went silent first, 41s before the hang was seen "
        "(the others 13s or less)"
    )
    even = _hang_dir(tmp_path / "even", dict.fromkeys(range(2), NO_SPY), {0: 12.0, 1: 13.0})
    assert dhang.read(even).line == "hang: no stacks on tn2: py-spy not found there"


def test_a_stack_file_names_its_node(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TREB_PY_SPY", "")
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    proc = subprocess.Popen([PY, "-c", "import time; time.sleep(120)"])
    try:
        _hang_with_stacks(adir, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    [rs] = dhang.read(adir).ranks
    assert (rs.host, rs.why) == (os.uname().nodename, "py-spy not found there")


def test_py_spy_comes_with_a_plain_install() -> None:
    """`pip install trebuchet` brings py-spy (manylinux wheels, a single binary), so a
    hang has stacks without an extra; this venv, installed as `make` does, has it."""
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.replace(" ", "").startswith("py-spy>=0.4,<0.5") for d in deps), deps
    assert stacks.find_py_spy() is not None


SPEC = "command: python train.py\nnodes: 2\n"


def _render(tmp_path: Path, capsys, engine: str, text: str) -> str:
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    assert main(["render", str(spec), "--on", engine]) == 0
    return capsys.readouterr().out


def test_renders_carry_hang_timeout_only_when_set(tmp_path: Path, capsys) -> None:
    needs("kubernetes_validate")
    hung = SPEC + "hang_timeout: 10m\non_hang: retry\n"
    out = _render(tmp_path, capsys, "kubernetes", hung + "kubernetes: {image: img}\n")
    job = next(d for d in yaml.safe_load_all(out) if d and d.get("kind") == "Job")
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["securityContext"] == {"capabilities": {"add": ["SYS_PTRACE"]}}
    assert '"hang_timeout": 600.0' in out and '"on_hang": "retry"' in out
    out = _render(tmp_path, capsys, "kubernetes", SPEC + "kubernetes: {image: img}\n")
    assert "SYS_PTRACE" not in out and "hang_timeout" not in out
    out = _render(tmp_path, capsys, "slurm", hung)
    assert '"hang_timeout": 600.0' in out and '"on_hang": "retry"' in out


def test_check_suggests_hang_timeout_for_multi_node_runs(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    assert main(["check", str(spec)]) == 0
    out = capsys.readouterr().out
    assert f"{spec}:2: suggestion: 2 nodes and no hang_timeout" in out
    spec.write_text(SPEC + "hang_timeout: 5m\n")
    assert main(["check", str(spec), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["suggestions"] == []
    spec.write_text("command: python train.py\n")
    assert main(["check", str(spec)]) == 0
    assert "suggestion" not in capsys.readouterr().out


def test_bad_on_hang_is_a_spec_error(tmp_path: Path, capsys) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC + "on_hang: ignore\n")
    assert main(["check", str(spec)]) == 2
    assert "on_hang" in capsys.readouterr().err

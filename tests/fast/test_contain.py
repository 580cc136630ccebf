"""runtime/process/contain.py: finding cgroup v2 from the mount table, and a real cgroup's life
(started inside, kill with or without cgroup.kill, removal) where this host allows it."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from trebuchet.runtime.process import contain

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
52 23 0:38 /a /mnt/with\\040space rw - cgroup2 cgroup2 rw
"""


def test_cgroup2_mounts_are_read_from_mountinfo(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(HYBRID)
    assert contain.cgroup2_mounts(str(info)) == [
        ("/", "/sys/fs/cgroup/unified"),
        ("/a", "/mnt/with space"),  # octal escapes decoded
    ]
    info.write_text(HYBRID.splitlines()[1] + "\n")  # v1 only
    assert contain.cgroup2_mounts(str(info)) == []


def test_own_v2_path_is_the_0_line(tmp_path: Path) -> None:
    f = tmp_path / "cgroup"
    f.write_text("4:memory:/x\n0::/user.slice/session-1.scope\n")
    assert contain.own_v2_path(str(f)) == "/user.slice/session-1.scope"
    f.write_text("4:memory:/x\n")
    assert contain.own_v2_path(str(f)) is None


def test_candidates_map_the_own_cgroup_into_each_mount(tmp_path: Path, monkeypatch) -> None:
    whole, sub = tmp_path / "whole", tmp_path / "sub"
    for d in (whole / "a" / "b", sub / "b"):
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text("")
    other = tmp_path / "other"
    other.mkdir()
    mounts = [("/", str(whole)), ("/a", str(sub)), ("/z", str(other))]
    monkeypatch.setattr(contain, "cgroup2_mounts", lambda: mounts)
    monkeypatch.setattr(contain, "own_v2_path", lambda: "/a/b")
    # /z shows another part of the tree: not a place for this process's children
    assert contain.candidates() == [str(whole / "a" / "b"), str(sub / "b")]
    monkeypatch.setattr(contain, "own_v2_path", lambda: None)
    assert contain.candidates() == []


def test_the_test_variable_forces_the_fallback(monkeypatch) -> None:
    monkeypatch.setenv(contain.NO_CGROUP_ENV, "1")
    path, why = contain.create("treb-never")
    assert path is None and contain.NO_CGROUP_ENV in why


def test_no_cgroup_v2_mount_means_fallback(monkeypatch) -> None:
    monkeypatch.delenv(contain.NO_CGROUP_ENV, raising=False)
    monkeypatch.setattr(contain, "cgroup2_mounts", lambda: [])
    assert contain.create("treb-never") == (None, "no cgroup v2 mount contains this process")


def _writable() -> bool:
    return any(os.access(os.path.join(d, "cgroup.procs"), os.W_OK) for d in contain.candidates())


# A process that leaves a setsid'd grandchild with an empty environment, then waits.
DAEMONIZE = "(setsid env -i sleep 3011 </dev/null >/dev/null 2>&1 &); exec sleep 3011"


def _settled(path: str) -> bool:
    """Two sleeps in the cgroup: the process itself and its daemon (the subshell is gone)."""
    cmds = []
    for pid in contain.members(path):
        try:
            cmds.append(Path(f"/proc/{pid}/cmdline").read_bytes())
        except OSError:
            return False
    return cmds == [b"sleep\x003011\x00"] * 2


@pytest.mark.parametrize("with_cgroup_kill", [True, False])
def test_a_real_cgroup_holds_and_ends_a_daemon(with_cgroup_kill, monkeypatch) -> None:
    if not _writable():
        pytest.skip("no writable cgroup v2 on this host")
    monkeypatch.delenv(contain.NO_CGROUP_ENV, raising=False)
    path, how = contain.create(f"treb-test-{uuid.uuid4().hex[:8]}")
    assert path and how == "cgroup v2"
    with contain.inside(path):  # as the agent starts a run's processes
        proc = subprocess.Popen(["bash", "-c", DAEMONIZE], start_new_session=True)
    assert os.getpid() not in contain.members(path)  # this process moved back out
    try:
        deadline = time.monotonic() + 10
        while not _settled(path) and time.monotonic() < deadline:
            time.sleep(0.02)
        held = contain.members(path)
        assert proc.pid in held and _settled(path)  # the daemon stayed in the cgroup
        if not with_cgroup_kill:  # as on kernels < 5.14: a SIGKILL to each pid
            monkeypatch.setattr(contain, "_write", lambda *_: False)
        assert sorted(contain.kill(path)) == sorted(held)
        proc.wait(timeout=10)
        assert contain.remove(path)
        assert not os.path.exists(path)
    finally:
        for pid in contain.members(path) if os.path.isdir(path) else []:
            os.kill(pid, 9)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        contain.remove(path)


def test_end_run_reads_the_record_and_removes_the_cgroup(tmp_path: Path, monkeypatch) -> None:
    if not _writable():
        pytest.skip("no writable cgroup v2 on this host")
    monkeypatch.delenv(contain.NO_CGROUP_ENV, raising=False)
    path, how = contain.create(f"treb-test-{uuid.uuid4().hex[:8]}")
    contain.record(str(tmp_path), path, how)
    assert contain.recorded(str(tmp_path)) == path
    with contain.inside(path):
        proc = subprocess.Popen(["env", "-i", "sleep", "3013"])
    try:
        found = contain.end_run("nosuchrun", str(tmp_path))
        assert found["cgroup"] == [proc.pid] and found["scan"] == []
        assert proc.wait(timeout=10) == -9
        assert not os.path.exists(path) and contain.recorded(str(tmp_path)) is None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        contain.remove(path)


def test_end_run_without_scan_ends_the_cgroup_and_leaves_the_environment_alone(
    tmp_path: Path, monkeypatch
) -> None:
    """scan=False (the supervisor's last end_run, when the attempt's end scanned already
    and a cgroup holds what started since): the cgroup's processes die, a process outside
    it that carries the run's TREB_RUN_ID is not looked for; the default scan ends it."""
    if not _writable():
        pytest.skip("no writable cgroup v2 on this host")
    monkeypatch.delenv(contain.NO_CGROUP_ENV, raising=False)
    run_id = f"scan{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TREB_RUN_ID": run_id}
    outside = subprocess.Popen(["sleep", "3019"], env=env)
    path, how = contain.create(f"treb-test-{uuid.uuid4().hex[:8]}")
    contain.record(str(tmp_path), path, how)
    with contain.inside(path):
        inside = subprocess.Popen(["sleep", "3021"], env=env)
    try:
        found = contain.end_run(run_id, str(tmp_path), keep=True, scan=False)
        assert found == {"cgroup": [inside.pid], "scan": []}
        assert inside.wait(timeout=10) == -9 and outside.poll() is None
        found = contain.end_run(run_id, str(tmp_path))
        assert found == {"cgroup": [], "scan": [outside.pid]}
        assert outside.wait(timeout=10) == -9
    finally:
        for proc in (inside, outside):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        contain.remove(path)


def test_an_early_move_is_finished_by_inside_or_undone(monkeypatch) -> None:
    """enter_early (the supervisor, while it writes its records) moves this process into the
    cgroup in a thread; `inside` finishes it and starts processes there, and `leave_early`
    undoes it when an attempt fails before its first start, so the cgroup can go."""
    if not _writable():
        pytest.skip("no writable cgroup v2 on this host")
    monkeypatch.delenv(contain.NO_CGROUP_ENV, raising=False)
    started, undone = (contain.create(f"treb-test-{uuid.uuid4().hex[:8]}")[0] for _ in "ab")
    assert started and undone
    proc = None
    try:
        contain.enter_early(started)
        contain.enter_early(started)  # once per path: the second is a no-op
        with contain.inside(started):
            assert os.getpid() in contain.members(started)
            proc = subprocess.Popen(["sleep", "3017"])
        assert contain.members(started) == [proc.pid]  # the process moved back out
        contain.enter_early(undone)
        contain.leave_early(undone)
        assert contain.members(undone) == [] and contain.remove(undone)
        contain.leave_early(undone)  # nothing pending: nothing to undo
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        for path in (started, undone):
            contain.remove(path)

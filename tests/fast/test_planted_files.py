"""A rank runs as the user in its run directory: it can put a FIFO, a link to /dev/zero or
garbage (invalid UTF-8, JSON nested past Python's recursion limit) where treb later reads
one of the run's files. Each reader here, the node-side runtime's and treb's own, runs in a
child process with a timeout (the hang guard) and a memory limit (/dev/zero read whole):
it ends, exit 0, no traceback, as for a missing or unreadable file."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import TrebFn

GUARD_S = 30
PLANTS = ("fifo", "zero", "nested", "binary")


def plant(path: Path, kind: str) -> None:
    """Put a hostile `kind` at `path` (in place of whatever is there)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "nested":
        path.write_text("[" * 200_000)
    else:
        path.write_bytes(b"\xff\xfe\x00\x80garbage\n\xc3")


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def ends(code: str, rc: int = 0) -> str:
    """Run `code` in a child Python; its stdout. Fails when it hangs or raises (or exits
    other than `rc`)."""
    try:
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                             text=True, timeout=GUARD_S, preexec_fn=_limit)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("the reader blocked (a FIFO) or read without end (/dev/zero)")
    assert res.returncode == rc and "Traceback" not in res.stderr, res.stderr[-2000:]
    return res.stdout + res.stderr


@pytest.mark.parametrize("kind", PLANTS)
def test_runtime_readers_of_planted_files_end(tmp_path: Path, kind: str) -> None:
    """The controller's policy-retries, the excluded nodes, the health check's token, a
    rank's requeue request, a rank record (horovod's signal forwarder reads it)."""
    run = tmp_path / "run"
    for name in ("policy-retries", "excluded-nodes", "health-token", "requeue-request",
                 "attempt-0/rank-0.json"):  # fmt: skip
        plant(run / name, kind)
    out = ends(f"""
        import types
        from trebuchet.runtime.job import nodeset, selfrequeue
        from trebuchet.runtime.node import health, horovodrun as horovod
        from trebuchet.runtime.slurm.records import BatchRecords
        run = {str(run)!r}
        print(BatchRecords.granted(types.SimpleNamespace(run_dir=run)))
        print(nodeset.excluded(run))
        where = health.Where(run, run + "/attempt-0", 0, 0, "h", run, {{}})
        print(health.check_shared(where, None, token="t0k"))
        print(selfrequeue.asked(run))
        print(horovod.rank_records(run + "/attempt-0", ["rank-0.json"]))
    """)
    assert "not the shared folder" in out and "[None]" in out, out


@pytest.mark.parametrize("kind", PLANTS)
def test_runtime_job_file_planted_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    """The job file a (requeued) controller or node agent starts from is in the run
    directory: unreadable, it is named (exit 2), never waited on."""
    plant(tmp_path / "job.json", kind)
    out = ends(
        f"from trebuchet.runtime import command_line; command_line._job({str(tmp_path / 'job.json')!r})",
        2,
    )
    assert "cannot read the job file" in out, out


@pytest.mark.parametrize("kind", PLANTS)
def test_treb_readers_of_planted_files_end(tmp_path: Path, kind: str) -> None:
    """treb's own readers of a run directory: the index rebuild, `treb fault`'s node and
    rank records and ssh facts, diagnose's snapshot facts, hang record, error file and job file,
    the Slurm job files, the rank records, the GPU and metrics settings, an engine's node
    log brought up to date (a FIFO there is replaced, never opened)."""
    run = tmp_path / "run"
    for name in ("spec.yaml", "spec.json", "job.json", "events.jsonl", "snapshot.json",
                 "ssh.json", "result.json", "metrics.json", "attempt-0/attempt.json",
                 "attempt-0/rank-0.json", "attempt-0/hang.json", "attempt-0/error.json",
                 "attempt-0/gpu/node-0.json", "attempt-0/node-0.log"):  # fmt: skip
        plant(run / name, kind)
    ends(f"""
        import types
        from pathlib import Path
        from trebuchet.backends.slurm import state
        from trebuchet.backends.ssh import fault as ssh_fault
        from trebuchet.runtime.node import fault
        from trebuchet.diagnose import codepaths
        from trebuchet.launcher import snapshot
        from trebuchet.store import rebuild
        run = Path({str(run)!r})
        print(rebuild._json(run / "attempt-0" / "rank-0.json"), rebuild._events(run),
              rebuild._spec(run))
        print(fault.attempt_file(str(run), "rank-0.json"), fault.attempt_file(str(run), "attempt.json"))
        print(snapshot.why_missing(run, ["No such file or directory: 'x.py'"]))
        print(state.read_job_files(run))
        print(codepaths.CodeMap.for_run(str(run)))
        from trebuchet.diagnose import hang, sources
        from trebuchet.launcher import rank_wrapper
        from trebuchet.runtime.watch import gpu, metric_reader as metrics
        print(hang.read(run / "attempt-0"), hang.warned_lines(str(run), 0))
        print(sources.error_file_lines(str(run / "attempt-0" / "error.json")))
        print(sources.run_dir_case(run))
        print(rank_wrapper.rank_records(run / "attempt-0"))
        print(gpu.idle_settings(str(run)), metrics.read_config(str(run / "attempt-0")),
              gpu.read_states(str(run / "attempt-0")))
        from trebuchet.backends import node_logs
        print(node_logs.write(run, 0, {{"node-0.log": "pod log"}}))
        assert (run / "attempt-0" / "node-0.log").read_text() == "pod log"
        try:
            ssh_fault.nodes(types.SimpleNamespace(run_dir=str(run)))
        except Exception as exc:  # UserError: named, not a traceback
            print(type(exc).__name__, exc)
    """)


@pytest.mark.parametrize("kind", PLANTS)
def test_ssh_hostfile_planted_is_a_clear_error(tmp_path: Path, kind: str, treb: TrebFn) -> None:
    """ssh.hostfile is read by `treb check --on ssh` (and `treb run`): a FIFO or device there
    is refused by name (`treb check` exit 1, an error), never waited on or read without end."""
    plant(tmp_path / "hosts.txt", kind)
    (tmp_path / "job.yaml").write_text("name: h\nssh:\n  hostfile: hosts.txt\n"
                                       "command: [python, -c, 'pass']\n")  # fmt: skip
    try:
        res = treb("check", "--on", "ssh", str(tmp_path / "job.yaml"), timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        pytest.fail("treb check blocked on the hostfile")
    assert res.returncode in (0, 1, 2) and "Traceback" not in res.stderr, res.stderr
    if kind in ("fifo", "zero"):
        assert res.returncode == 1 and "hosts.txt: not a regular file" in res.stdout, res.stdout


def test_planted_run_files_break_no_view(treb: TrebFn, tmp_path: Path) -> None:
    """A failed run whose every record (JSON, YAML, events) a rank replaced, in turn, with a
    FIFO, a link to /dev/zero, deep JSON and binary garbage: each view answers (exit 0, 1
    for a failed run, or 2), without a traceback."""
    (tmp_path / "train.py").write_text("open('absent.txt')\n")
    (tmp_path / "job.yaml").write_text("name: s\nnodes: 1\ncommand: [python, train.py]\n")
    assert treb("run", str(tmp_path / "job.yaml"), cwd=tmp_path).returncode != 0
    run_id = json.loads(treb("ps", "--all", "--json").stdout)[0]["id"]
    run_dir = Path(json.loads(treb("status", run_id, "--json").stdout)["run_dir"])
    names = [p.relative_to(run_dir) for p in (*run_dir.glob("*.*"), *run_dir.glob("attempt-0/*"))
             if p.suffix in (".json", ".jsonl", ".yaml")]  # fmt: skip
    assert "snapshot.json" in map(str, names) and "job.json" in map(str, names), names
    views = (
        ["status", run_id],
        ["status", run_id, "--json"],
        ["ps", "--all"],
        ["diagnose", run_id],
        ["results", run_id],
        ["metrics", run_id],
        ["logs", run_id],
    )
    for kind in PLANTS:
        for name in names:
            plant(run_dir / name, kind)
        for view in views:
            try:
                res = treb(*view, timeout=GUARD_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"treb {' '.join(view)} blocked on a planted {kind}")
            assert res.returncode in (0, 1, 2), (kind, view, res.returncode, res.stderr[-2000:])
            assert "Traceback" not in res.stderr, (kind, view, res.stderr[-2000:])


def test_files_the_agent_writes_planted_do_not_hold_the_run(treb: TrebFn, tmp_path: Path) -> None:
    """The node agent writes into the attempt folder while the ranks run: a rank's progress
    state, its metric points, the next attempt's rank log. A rank that put FIFOs there
    first (opening one for writing waits for a reader) must not hold the run: it ends."""
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""
        import os, sys
        adir = os.path.dirname(os.path.dirname(os.environ["TREB_HEARTBEAT"]))
        run = os.path.dirname(adir)
        for rel in ("progress/rank-0", "metrics/rank-0.jsonl", "../attempt-1/rank-0.log"):
            path = os.path.join(adir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                os.mkfifo(path)
        print("step 1/10", flush=True)
        print('{"loss": 1.5}', flush=True)
        sys.exit(0 if os.environ.get("TREB_ATTEMPT") == "1" else 3)
    """)
    )
    (tmp_path / "job.yaml").write_text(
        "name: w\nnodes: 1\nretries: 1\ncommand: [python, train.py]\n"
    )
    try:
        res = treb("run", str(tmp_path / "job.yaml"), cwd=tmp_path, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("treb run blocked on a FIFO the rank put where the agent writes")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]

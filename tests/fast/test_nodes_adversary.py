"""Attacks on nodes remembered across runs (docs/nodes.md): the spec's own Slurm host
lists merged with the avoided nodes, and an events.jsonl far larger than its node marks."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import TrebFn, write_spec
from tests.fast.test_node_history import NOW, by_host, lost, nodes_json, plant

BASE = "command: python3 train.py\nnodes: 1\n"


def _excludes(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("#SBATCH --exclude")]


def test_a_bad_nodelist_in_sbatch_args_is_a_named_error_not_a_traceback(
    treb: TrebFn, tmp_path: Path
) -> None:
    plant("aaaa0101", [lost("tn2")])
    for bad in ("tn[1-", "tn[1-99999999]", "tn]", "tn[1-\u00b2]", "tn[0-" + "9" * 5000 + "]"):
        spec = BASE + f"slurm:\n  sbatch_args: ['--nodelist={bad}']\n"
        res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
        assert res.returncode == 2, (bad, res.stderr[-2000:])
        assert "Traceback" not in res.stderr and "sbatch_args" in res.stderr, res.stderr
        assert bad[:60] in res.stderr, res.stderr


def test_the_specs_exclude_file_is_merged_by_its_hosts_not_by_its_path(
    treb: TrebFn, tmp_path: Path
) -> None:
    """sbatch reads an --exclude value holding a `/` as a file of host names: `file,tn2`
    names no file, and sbatch refuses the job."""
    plant("aaaa0102", [lost("tn2")])
    hosts = tmp_path / "bad-nodes"
    hosts.write_text("gpu7\ngpu[8-9],gpu[11,13]\n")
    spec = BASE + f"slurm:\n  sbatch_args: ['--exclude={hosts}']\n"
    res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
    assert res.returncode == 0, res.stderr
    assert _excludes(res.stdout)[-1] == "#SBATCH --exclude=gpu7,gpu[8-9],gpu[11,13],tn2", res.stdout
    # a file sbatch could not read either is the spec's error, named, exit 2
    spec = BASE + f"slurm:\n  sbatch_args: ['--exclude={tmp_path}/none']\n"
    res = treb("render", str(write_spec(tmp_path, spec)), "--on", "slurm")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert f"{tmp_path}/none" in res.stderr, res.stderr


def test_a_huge_events_file_is_read_in_bounded_memory(treb_home: Path) -> None:
    """A run's events.jsonl of 160 MiB (one line of it 32 MiB): the marks are found, and the
    reader's memory does not grow with the file (before: the whole file, its text and its
    lines at once, ~5x its size)."""
    run_dir = plant("aaaa0103", [], ran_on={0: ["tn5", "tn6"]})
    pad = json.dumps({"event": "progress", "time": time.time(), "pad": "x" * 400}) + "\n"
    with open(run_dir / "events.jsonl", "a") as fh:
        fh.write('{"event": "node_lost", "pad": "' + "y" * (32 << 20) + '"}\n')
        for _ in range(128):
            fh.write(pad * ((1 << 20) // len(pad)))
        fh.write(json.dumps(lost("tn5")) + "\n")
        unhealthy = {**lost("tn6"), "event": "node_unhealthy", "message": "z" * 200_000}
        fh.write(json.dumps(unhealthy) + "\n")  # a health check's long last line: a mark
    code = (
        "import resource, json; from trebuchet.store.db import Store; "
        "from trebuchet.store.nodes import sync, known_hosts; s = Store(); sync(s); "
        "print(json.dumps([known_hosts(s), "
        "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    hosts, peak_mib = json.loads(out)
    assert hosts == ["tn5", "tn6"]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # this pytest, for scale
    assert peak_mib < 150 + min(base, 150), peak_mib


def test_rows_no_treb_wrote_in_the_nodes_tables_are_skipped_not_a_traceback(
    treb: TrebFn, treb_home: Path, tmp_path: Path
) -> None:
    """The index is a file on a shared TREB_HOME: a row with a time that is text, a host
    with an escape sequence, a kind treb has no weight for, a clear whose time is text, are
    no marks (before: a TypeError traceback from `treb nodes` and from every Slurm
    submission, and the host's ESC written to the terminal)."""
    import sqlite3

    plant("aaaa0104", [lost("tn2")])
    assert treb("nodes").returncode == 0
    conn = sqlite3.connect(treb_home / "runs.db")
    rows = [
        ("k1", "tn9", "lost", "abc"),
        ("k2", "ev\x1b]0;x\x07il", "lost", NOW),
        ("k3", "tn8", "weird", NOW),
        ("k4", "tn7", "lost", float("inf")),
        ("k5", "tn6", "lost", b"\x00"),
    ]
    conn.execute("INSERT INTO node_events VALUES ('r\x1b[2J', 'k6', 'tn5', 'lost', ?, "
                 "'\x1b]0;t\x07\u2028')", (NOW - 30,))  # fmt: skip
    conn.executemany("INSERT INTO node_events VALUES ('zz', ?, ?, ?, ?, NULL)", rows)
    conn.execute("INSERT INTO node_clears VALUES ('tn2', 'yesterday')")
    conn.commit()
    conn.close()
    res = treb("nodes")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert "\x1b" not in res.stdout and not {"tn9", "tn8", "tn7", "tn6"} & set(res.stdout.split())
    assert [n["host"] for n in nodes_json(treb)["nodes"]] == ["tn5", "tn2"]
    res = treb("render", str(write_spec(tmp_path, BASE)), "--on", "slurm")
    assert res.returncode == 0, res.stderr
    assert _excludes(res.stdout) == ["#SBATCH --exclude=tn5,tn2"], res.stdout
    assert "\x1b" not in res.stderr and "\u2028" not in res.stderr, res.stderr


def test_a_fifo_or_dev_zero_in_place_of_the_clears_file_neither_hangs_nor_fills_memory(
    treb: TrebFn, treb_home: Path
) -> None:
    """TREB_HOME/nodes-cleared.jsonl as a FIFO: `treb nodes --clear` waited forever for a
    reader and `treb doctor --rebuild-index` for a writer; as a link to /dev/zero the
    rebuild read it to the end of memory. Now: the clear is a named error (exit 2) and
    nothing is cleared, the rebuild reads no clears from it."""
    import os

    plant("aaaa0105", [lost("tn2")])
    clears = treb_home / "nodes-cleared.jsonl"
    os.mkfifo(clears)
    res = treb("nodes", "--clear", "tn2", timeout=30)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "nodes-cleared.jsonl" in res.stderr, res.stderr
    assert by_host(nodes_json(treb))["tn2"]["cleared"] is None  # nothing half-done
    res = treb("doctor", "--rebuild-index", timeout=30)
    assert "Traceback" not in res.stderr, res.stderr
    clears.unlink()
    clears.symlink_to("/dev/zero")
    limit = (3 << 30, 3 << 30)  # address space: before, /dev/zero was read until it ran out
    res = treb("doctor", "--rebuild-index", timeout=30,
               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, limit))  # fmt: skip
    assert "Traceback" not in res.stderr and "MemoryError" not in res.stderr, res.stderr
    assert by_host(nodes_json(treb))["tn2"]["excluded"] is True


def test_a_bad_node_setting_stops_a_slurm_run_before_it_is_recorded(
    treb: TrebFn, tmp_path: Path
) -> None:
    """TREB_NODE_THRESHOLD=abc (or a --nodelist that is no hostlist) was found only while
    the job was being submitted, after the run was recorded: exit 2, and a run PENDING in
    `treb ps` forever. Now `treb run` refuses before recording it (the check sbatch needs
    comes after; a stub sbatch stands in where this machine has none)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "sbatch"
    stub.write_text("#!/bin/sh\necho 'sbatch: stub: no cluster here' >&2\nexit 1\n")
    stub.chmod(0o755)
    import os

    path = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    plant("aaaa0106", [lost("tn2")])
    spec = str(write_spec(tmp_path, BASE + "snapshot: false\n"))
    res = treb("run", spec, "--on", "slurm", env={**path, "TREB_NODE_THRESHOLD": "abc"})
    assert res.returncode == 2 and "TREB_NODE_THRESHOLD" in res.stderr, res.stderr
    bad = BASE + "snapshot: false\nslurm:\n  sbatch_args: ['--nodelist=tn[1-']\n"
    res = treb("run", str(write_spec(tmp_path, bad)), "--on", "slurm", env=path)
    assert res.returncode == 2 and "sbatch_args" in res.stderr, res.stderr
    listed = json.loads(treb("ps", "--json").stdout)
    assert [r["id"] for r in listed] == ["aaaa0106"], listed  # no run left PENDING


def test_an_attempt_folder_numbered_in_other_digits_is_no_attempt(treb: TrebFn) -> None:
    """`attempt-²` passes str.isdigit() but not int(): a rank making that folder (with a
    failing record and an Xid in its log) broke `treb nodes` and every submission with a
    ValueError traceback. Only ASCII digits number an attempt."""
    from trebuchet.runtime.rundir.records import FIRST

    run_dir = plant("aaaa0107", [], ran_on={1: ["tn4"]})
    for name in ("attempt-\u00b2", "attempt-\u0663", "attempt-1"):
        adir = run_dir / name
        adir.mkdir(exist_ok=True)
        rec = {"label": "rank 0", "rank": 0, "node": 0, "exit_code": 1, "ended_at": NOW,
               "host": "tn4", "state": "ENDED"}  # fmt: skip
        (adir / FIRST).write_text(json.dumps(rec))
        (adir / "rank-0.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79\n")
    res = treb("nodes", "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    node = by_host(json.loads(res.stdout))["tn4"]
    assert node["counts"]["hardware"] == 1 and node["last"]["detail"].startswith("attempt 1,")


def test_a_no_progress_count_in_other_digits_reads_as_none(tmp_path: Path) -> None:
    """runtime/job/life.py's no-progress file is in the run directory, which a rank can
    write: `²` passed str.isdigit() and int() raised, in a requeued job's controller."""
    from trebuchet.runtime.job.life import NO_PROGRESS_FILE, no_progress_count

    for text, want in (("\u00b2", 0), ("\u0663", 0), ("3", 3), ("9" * 9, 0)):
        (tmp_path / NO_PROGRESS_FILE).write_text(text)
        assert no_progress_count(str(tmp_path)) == want, text


def test_a_run_marks_a_node_at_most_once_per_attempt_it_had(treb: TrebFn) -> None:
    """The attempt number of a mark comes from the events (or a folder's name), which a
    rank can write: 50 `node_lost` for attempts 0..49 of a one-attempt run counted 50
    times (score 100: the node kept out for seven half-lives, not one). Only the attempts
    the index says the run had count."""
    run_dir = plant("aaaa0108", [lost("tn3", attempt=a) for a in range(50)], attempts=1)
    from trebuchet.runtime.rundir.records import FIRST

    for a in (0, 7):  # attempt-7 of a one-attempt run: a folder a rank made
        adir = run_dir / f"attempt-{a}"
        adir.mkdir(exist_ok=True)
        rec = {"rank": 0, "node": 0, "exit_code": 1, "ended_at": NOW, "host": "tn3"}
        (adir / FIRST).write_text(json.dumps(rec))
        (adir / "rank-0.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79\n")
    node = by_host(nodes_json(treb))["tn3"]
    assert node["counts"] == {"lost": 1, "unhealthy": 0, "hardware": 1, "straggler": 0}, node
    assert node["score"] < 4.0, node


def test_a_stop_signal_the_moment_the_watchdog_starts_does_not_end_it(tmp_path: Path) -> None:
    """launcher/watchdog.py ignores the stop signals from its shell's first command on;
    a TERM of everything (or a Ctrl+C) sent before that command ran ended it (40 of 40
    here), and with it the cleanup it is there for if the supervisor then dies."""
    import os
    import signal
    import uuid

    from trebuchet.launcher.watchdog import Watchdog

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP) * 4:
        wd = Watchdog(uuid.uuid4().hex[:8], str(tmp_path))
        os.kill(wd.pid, sig)
        wd.done()
        wd.wait()
        assert wd.proc.returncode == 0, (sig, wd.proc.returncode)

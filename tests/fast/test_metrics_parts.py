"""Metrics, part by part on real files: the line parser (every format, nothing evaluated),
the agent's hook on the real log reader, the bounded writer, the store's incremental and
bounded ingestion, `treb metrics` (table, --json, --csv) and the spec's `metrics:` block."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from pathlib import Path

import pytest

from trebuchet.cli.main import main
from trebuchet.runtime.watch import activity as progress
from trebuchet.runtime.watch import metric_reader as rm
from trebuchet.store import lifecycle
from trebuchet.store import metrics as sm
from trebuchet.store.db import RunRecord, Store


@pytest.mark.parametrize(
    "line, step, values",
    [
        (b"performance: 1234.5 samples_per_second", None, {"samples_per_second": 1234.5}),
        (b"[2] performance: 95.2/s, tokens_per_sec", None, {"tokens_per_sec": 95.2}),
        (b'{"step": 10, "loss": 2.1, "done": true, "tag": "x"}', 10, {"loss": 2.1}),
        (b'INFO 12:00 {"global_step": 3, "lr": 1e-4}', 3, {"lr": 1e-4}),
        (b"{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.5}", 0.5,
         {"loss": 2.1, "learning_rate": 5e-05, "epoch": 0.5}),
        (b" 10%|#  | 5/50 [00:01<00:10, 4.1it/s]{'loss': 1.5, 'grad_norm': 0.25}", None,
         {"loss": 1.5, "grad_norm": 0.25}),
        (b"^[[32m{\"loss\": 1}^[[0m", None, {"loss": 1.0}),
        (b'{"loss": NaN, "acc": Infinity}', None, {}),
        (b"{'a': __import__('os').system('touch /tmp/x')}", None, {}),
        (b"{'a': (1).__class__}", None, {}),
        (b"hello {world}", None, {}),
        (b"loss=2.0 but no prefix configured", None, {}),
        (b"", None, {}),
    ],
)  # fmt: skip
def test_parse_formats_with_the_default_config(line: bytes, step, values) -> None:
    assert rm.parse(line, rm.Config()) == (step, values)


def test_parse_prefix_pairs_and_patterns() -> None:
    c = rm.Config(prefix="metrics:", patterns=[r"epoch (?P<step>\d+) loss (?P<loss>[0-9.]+)"])
    assert rm.parse(b"x metrics: step=5 loss=0.3 acc: 0.9 name=foo v=1.2.3", c) == (
        5.0,
        {"loss": 0.3, "acc": 0.9},
    )
    assert rm.parse(b"loss=0.3 without the marker", c) == (None, {})
    assert rm.parse(b"epoch 3 loss 0.4321", c) == (3.0, {"loss": 0.4321})
    assert rm.parse(b"epoch 3 loss .", c) == (None, {})  # not a number: nothing


def test_literal_is_bounded_and_never_evaluated(tmp_path: Path) -> None:
    marker = tmp_path / "evaluated"
    big = b"{'x': [" + b"1, " * (rm.LITERAL_MAX // 3) + b"1], 'loss': 1.0}"
    assert rm.parse(big) == (None, {})  # over LITERAL_MAX: not even parsed
    deep = b"{'a': " + b"[" * 5000 + b"]" * 5000 + b", 'loss': 2.0}"
    assert rm.parse(deep) == (None, {})  # too deep for the parser: skipped, no crash
    evil = f"{{'a': open({str(marker)!r}, 'w')}}".encode()
    assert rm.parse(evil) == (None, {}) and not marker.exists()


def test_config_chooses_ranks() -> None:
    assert rm.Config().wants("rank-0") and not rm.Config().wants("rank-1")
    assert rm.Config(ranks="all").wants("rank-7") and rm.Config(ranks="all").wants("node-1")
    assert rm.Config(ranks=[1, 3]).wants("rank-3") and not rm.Config(ranks=[1, 3]).wants("rank-0")
    assert not rm.Config(ranks=[]).enabled
    assert not rm.Config(ranks="all").wants("pre-node-0")


def write_config(run_dir: Path, data: dict | None) -> Path:
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    if data is not None:
        (run_dir / rm.CONFIG_FILE).write_text(json.dumps(data))
    return adir


def points(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_hook_on_the_real_reader_writes_the_chosen_ranks_points(tmp_path: Path) -> None:
    adir = write_config(tmp_path, {"ranks": [0, 1], "prefix": "m:"})
    hook = rm.hook(str(adir))
    reader = progress.Progress(str(adir), on_line=hook)
    for r in (0, 1, 2):
        reader.track(f"rank-{r}")
        (adir / f"rank-{r}.log").write_bytes(
            b"starting\n"
            b'{"step": 1, "loss": 2.5}\n'
            b"m: loss=2.0\r"  # a progress bar's redraw: a line of its own
            b"{'eval_loss': 1.5, 'epoch': 1.0}\n"
            b"performance: 10 samples_per_second\n"
            b'{"step": 2, "loss": 1.'  # not finished yet
        )
    reader.step(force=True)
    got = points(adir / "metrics" / "rank-0.jsonl")
    assert [(p["s"], p["m"]) for p in got] == [
        (1, {"loss": 2.5}),
        (1, {"loss": 2.0}),  # no step on the line: the rank's last one
        (1, {"eval_loss": 1.5, "epoch": 1.0}),
        (1, {"samples_per_second": 10.0}),
    ]
    assert all(abs(p["t"] - time.time()) < 60 for p in got)
    assert (adir / "metrics" / "rank-1.jsonl").exists()
    assert not (adir / "metrics" / "rank-2.jsonl").exists()  # not asked for
    with open(adir / "rank-0.log", "ab") as fh:
        fh.write(b"5}\n")
    reader.step(force=True)
    assert points(adir / "metrics" / "rank-0.jsonl")[-1]["m"] == {"loss": 1.5}


def test_hook_defaults_and_off(tmp_path: Path) -> None:
    adir = write_config(tmp_path / "a", None)
    hook = rm.hook(str(adir))
    assert hook is not None and hook.config.wants("rank-0")
    (tmp_path / "a" / rm.CONFIG_FILE).write_text("{not json")
    assert rm.hook(str(adir)) is not None  # unreadable: the defaults
    off = write_config(tmp_path / "b", {"ranks": []})
    assert rm.hook(str(off)) is None


def test_stepless_points_count_per_name(tmp_path: Path) -> None:
    w = rm.Writer(str(tmp_path / "rank-0.jsonl"))
    for v in (3.0, 2.0):
        w.add(None, {"loss": v}, 1.0)
    w.add(None, {"eval_loss": 1.0}, 2.0)
    w.close()
    assert [p["s"] for p in points(tmp_path / "rank-0.jsonl")] == [0, 1, 0]


def test_writer_thins_past_the_soft_cap_and_stops_at_the_hard_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rm, "SOFT_MAX", 2000)
    monkeypatch.setattr(rm, "HARD_MAX", 4000)
    path = tmp_path / "rank-0.jsonl"
    w = rm.Writer(str(path))
    for i in range(1000):  # one point a second of wall time
        w.add(float(i), {"loss": 1.0 / (i + 1)}, 1000.0 + i)
    w.close()
    got = points(path)
    assert os.path.getsize(path) < 4000 + 100
    steps = [p["s"] for p in got]
    dense = [s for s, p in zip(steps, got, strict=True) if p["t"] < got[-1]["t"]]
    assert steps[:5] == [0, 1, 2, 3, 4]
    late = steps[steps.index(dense[-1]) - 3 :]
    gaps = {b - a for a, b in zip(late, late[1:], strict=False)}
    assert gaps and min(gaps) >= rm.THIN_S  # one point a name every THIN_S past the soft cap
    assert steps[-1] < 999  # stopped at the hard cap


def make_run(store: Store, run_dir: Path, rid: str = "r1") -> RunRecord:
    rec = RunRecord(
        id=rid, name="m", backend="local", launcher="native", state="RUNNING", nodes=1,
        procs_per_node=2, run_dir=str(run_dir), created_at=time.time(),
    )  # fmt: skip
    store.insert_run(rec)
    return rec


def ended_run(treb_home: Path, run_dir: Path, rid: str) -> RunRecord:
    """A SUCCEEDED run `rid` in a new store, its metrics to be written under `run_dir`."""
    treb_home.mkdir()
    store = Store()
    rec = make_run(store, run_dir, rid=rid)
    lifecycle.ended(store, rec.id, "SUCCEEDED")
    return rec


def jsonl(path: Path, rows: list[tuple[float, dict]], partial: bytes = b"") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as fh:
        for s, m in rows:
            fh.write(json.dumps({"t": 100.0 + s, "s": s, "m": m}).encode() + b"\n")
        fh.write(partial)


def test_ingest_is_incremental_and_keeps_ranks_apart(treb_home: Path, tmp_path: Path) -> None:
    treb_home.mkdir()
    store = Store()
    assert store.metrics("nope") == {}  # no table yet
    rec = make_run(store, tmp_path / "run")
    f0 = tmp_path / "run" / "attempt-0" / "metrics" / "rank-0.jsonl"
    jsonl(f0, [(1, {"loss": 2.0, "acc": 0.5}), (2, {"loss": 1.0})], partial=b'{"t": 1, "s"')
    jsonl(tmp_path / "run" / "attempt-0" / "metrics" / "rank-1.jsonl", [(1, {"loss": 9.0})])
    assert sm.ingest(store, rec) == 4
    assert sm.ingest(store, rec) == 0  # nothing new; the partial line waits
    with open(f0, "ab") as fh:
        fh.write(b': 3, "t": 103.0, "m": {"loss": 0.5}}\n')
    jsonl(tmp_path / "run" / "attempt-1" / "metrics" / "rank-0.jsonl", [(4, {"loss": 0.25})])
    assert sm.ingest(store, rec) == 2
    got = store.metrics(rec.id)
    assert got["loss"] == [(1, 2.0, 101.0), (2, 1.0, 102.0), (3, 0.5, 103.0), (4, 0.25, 104.0)]
    assert got["acc"] == [(1, 0.5, 101.0)]
    assert store.metrics(rec.id, ["acc"]) == {"acc": [(1, 0.5, 101.0)]}
    assert store.metrics(rec.id, rank=1) == {"loss": [(1, 9.0, 101.0)]}


def test_ingest_is_bounded_evenly_and_keeps_the_last_point(
    treb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sm, "MAX_POINTS", 100)
    monkeypatch.setattr(sm, "CHUNK", 4096)  # many transactions, as a big file would take
    treb_home.mkdir()
    store = Store()
    rec = make_run(store, tmp_path / "run")
    f = tmp_path / "run" / "attempt-0" / "metrics" / "rank-0.jsonl"
    jsonl(f, [(i, {"loss": float(i)}) for i in range(1001)])
    assert sm.ingest(store, rec) == 1001
    pts = store.metrics(rec.id)["loss"]
    stored = store.conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    assert 50 <= stored <= 100
    assert pts[0][0] == 0 and pts[-1] == (1000, 1000.0, 1100.0)  # first and exact last
    steps = [p[0] for p in pts[:-1]]
    gaps = {b - a for a, b in zip(steps, steps[1:], strict=False)}
    assert len(gaps) == 1  # evenly spread over the whole history
    assert sm.latest(store, rec.id)["loss"]["points"] == 1001


def test_treb_metrics_table_json_csv(
    treb_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ended_run(treb_home, tmp_path / "run", "abcd1234")
    jsonl(
        tmp_path / "run" / "attempt-0" / "metrics" / "rank-0.jsonl",
        [(i, {"loss": 1.0 / i, "lr": 0.001}) for i in range(1, 51)],
    )
    assert main(["metrics", "abcd"]) == 0
    out = capsys.readouterr().out
    loss = next(line for line in out.splitlines() if line.startswith("loss"))
    assert loss.split()[1:4] == ["0.02", "50", "50"] and "█" in loss and "▁" in loss
    assert main(["metrics", "abcd", "loss", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["metrics"]) == ["loss"]
    assert data["metrics"]["loss"]["last"]["value"] == 0.02
    assert data["metrics"]["loss"]["points"][0] == [1, 1.0, 101.0]
    assert main(["metrics", "abcd", "lr", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 50 and rows[0] == {
        "run_id": "abcd1234", "name": "lr", "step": "1", "value": "0.001", "time": "101.000",
    }  # fmt: skip
    assert main(["metrics", "abcd", "nosuch"]) == 1
    assert "no metric nosuch (has: loss, lr)" in capsys.readouterr().err


def test_spec_metrics_block_errors(treb, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("command: echo hi\nmetrics:\n  patterns:\n    - 'loss (\\d+'\n")
    res = treb("render", str(spec), "--on", "local")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        "job.yaml:3: metrics.patterns" in res.stderr
        and "not a valid regular expression" in res.stderr
    )
    spec.write_text("command: echo hi\nmetrics:\n  patterns: ['loss (\\d+)']\n")
    res = treb("render", str(spec), "--on", "local")
    assert res.returncode == 2 and "no named group" in res.stderr
    spec.write_text("command: echo hi\nmetrics: {ranks: most}\n")
    res = treb("render", str(spec), "--on", "local")
    assert res.returncode == 2 and "metrics.ranks" in res.stderr


HOSTILE = [  # (line, values kept, values dropped as not finite)
    (b'{"loss": 1' + b"0" * 400 + b"}", {}, 1),  # an int no float holds: OverflowError
    (b'{"a": ' + b"[" * 1100 + b"]" * 1100 + b"}", {}, 0),  # 2 KB, 1,100 deep: RecursionError
    (b"[" * 1100 + b"]" * 1100, {}, 0),
    (b"{'a': " + b"(" * 1100 + b")" * 1100 + b", 'loss': 1.0}", {}, 0),  # a deep literal
    (b"{'loss': 1" + b"0" * 5000 + b"}", {}, 1),  # past the int's digit limit: counted
    (b"performance: 1e999 samples_per_second", {}, 1),
    (b"performance: 1" + b"0" * 400 + b" tokens", {}, 1),
    (b'{"loss": NaN, "acc": Infinity, "lr": -Infinity, "ok": 2}', {"ok": 2.0}, 3),
    (b'{"step": 1e999, "loss": 0.5}', {"loss": 0.5}, 0),  # the step: none, not inf
    (b'{"step": NaN, "loss": 0.5}', {"loss": 0.5}, 0),
    (b'{"a": {"b": ' * 20 + b"1" + b"}" * 40, {}, 0),  # nested but shallow: decoded, no number
    (b'{"s": "' + b"[" * 100 + b'", "loss": 3}', {}, 0),  # brackets in a string count too
]  # fmt: skip


@pytest.mark.parametrize("line, values, dropped", HOSTILE)
def test_parse_is_total_on_hostile_lines(line: bytes, values: dict, dropped: int) -> None:
    """Whatever a rank prints, a line yields finite points or nothing: never an exception
    (the reader runs in the node agent; an OverflowError there made the run LOST)."""
    step, got, n = rm.read(line, rm.Config(prefix="m:"))
    assert (got, n) == (values, dropped)
    assert step is None or math.isfinite(step)
    assert rm.parse(line) == (step, got)


def test_parse_non_finite_from_patterns_and_pairs_is_dropped() -> None:
    c = rm.Config(prefix="m:", patterns=[r"epoch (?P<step>\S+) loss (?P<loss>\S+)"])
    assert rm.read(b"epoch 1e999 loss 1e999", c) == (None, {}, 1)
    assert rm.read(b"x m: step=1e999 loss=1e999 acc=0.5", c) == (None, {"acc": 0.5}, 1)


def test_writer_caps_names_and_carries_what_it_dropped(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.jsonl"
    w = rm.Writer(str(path))
    w.add(1.0, {f"m{i}": 1.0 for i in range(rm.MAX_NAMES - 1)}, 1.0)
    w.add(2.0, {"m0": 2.0, "new1": 1.0, "new2": 1.0, "new3": 1.0}, 2.0, nonfinite=2)
    w.add(3.0, {"late": 1.0}, 3.0)  # past the cap, nothing else: not written
    w.add(4.0, {}, 4.0, nonfinite=1)
    w.close()  # what is left to say goes out in a last line
    got = points(path)
    assert len({k for p in got for k in p["m"]}) == rm.MAX_NAMES
    assert got[1]["m"] == {"m0": 2.0, "new1": 1.0} and got[1]["x"] == {"nonfinite": 2, "names": 2}
    assert got[-1]["m"] == {} and got[-1]["x"] == {"nonfinite": 1, "names": 1}


def test_ingest_never_stores_non_finite_and_caps_names_once(
    treb_home: Path, tmp_path: Path
) -> None:
    """An older runtime's file (Infinity, NaN as json.dumps writes them) and more names
    than a run keeps: finite points only, the rest counted, one `metrics_capped` event."""
    treb_home.mkdir()
    store = Store()
    rec = make_run(store, tmp_path / "run")
    metrics = tmp_path / "run" / "attempt-0" / "metrics"
    metrics.mkdir(parents=True)
    (metrics / "rank-0.jsonl").write_text(
        '{"t": 1, "s": 1, "m": {"loss": Infinity, "acc": NaN, "lr": 0.1}}\n'
        '{"t": 2, "s": Infinity, "m": {"loss": 1.0}}\n'
        '{"t": 3, "s": 3, "m": {"loss": 0.5}, "x": {"nonfinite": 4, "names": 7}}\n'
    )
    names = {f"r0_{i}": float(i) for i in range(200)}
    jsonl(metrics / "rank-1.jsonl", [(1, names)])
    assert sm.ingest(store, rec) == 2 + 200
    jsonl(metrics / "rank-2.jsonl", [(1, {f"r2_{i}": 1.0 for i in range(100)} | {"lr": 0.2})])
    sm.ingest(store, rec)
    got = store.metrics(rec.id)
    assert got["loss"] == [(3, 0.5, 3.0)] and "acc" not in got
    assert len(sm.latest(store, rec.id)) == rm.MAX_NAMES
    kept_r2 = sm.MAX_NAMES - 2 - 200  # loss and lr, then rank 1's 200 names
    assert sm.dropped(store, rec.id) == {"nonfinite": 2 + 1 + 4, "names": 7 + 100 - kept_r2}
    jsonl(metrics / "rank-2.jsonl", [(2, {"r2_99": 1.0})])
    sm.ingest(store, rec)  # capped again: counted, not said again
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").open()]
    assert [e["max_names"] for e in events if e["event"] == "metrics_capped"] == [256]
    values = store.conn.execute("SELECT value, last_value FROM metrics, metric_series").fetchall()
    assert all(math.isfinite(v) for row in values for v in row)


def test_a_stored_infinity_never_crashes_a_verb(
    treb_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An index written before values were checked holds inf: `treb metrics` (table,
    --json, --csv), `treb results` (with --metric) and the summary read it without a
    traceback, showing no value for it."""
    from trebuchet.cli.report import metrics_lines
    from trebuchet.results import collect

    treb_home.mkdir()
    store = Store()
    rec = make_run(store, tmp_path / "run", rid="inf01234")
    lifecycle.ended(store, rec.id, "SUCCEEDED")
    jsonl(tmp_path / "run" / "attempt-0" / "metrics" / "rank-0.jsonl",
          [(1, {"loss": 2.0, "perf": 3.0}), (2, {"loss": 1.0, "perf": 4.0})])  # fmt: skip
    sm.ingest(store, rec)
    with store.transaction() as c:  # as the old ingest stored `performance: 1e999`
        c.execute("UPDATE metrics SET value = 9e999 WHERE name = 'loss' AND step = 1")
        c.execute("UPDATE metric_series SET last_value = 9e999 WHERE name = 'perf'")
        c.execute("DROP TABLE metric_dropped")  # and had no such table
    collect.collect(store, store.get(rec.id))
    with store.transaction() as c:
        c.execute("UPDATE results SET performance = 9e999, status = 'SUCCESS'")
    for argv in (["metrics", "inf0"], ["metrics", "inf0", "--json"], ["metrics", "inf0", "--csv"],
                 ["results", "inf0", "-m", "loss", "-m", "perf"], ["results", "--json"]):  # fmt: skip
        assert main(argv) == 0, argv
        out = capsys.readouterr().out
        assert "inf" not in out.lower().replace("inf0", ""), (argv, out)
    assert metrics_lines(store, store.get(rec.id)) == ["metrics: loss 1 (`treb metrics inf01234`)"]

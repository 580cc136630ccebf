"""Metrics, part by part on real files: the line parser (every format, nothing evaluated),
the agent's hook on the real log reader, the bounded writer, the store's incremental and
bounded ingestion, `treb metrics` (table, --json, --csv) and the spec's `metrics:` block."""

from __future__ import annotations

import csv
import io
import json
import os
import time
from pathlib import Path

import pytest

from trebuchet.cli.main import main
from trebuchet.runtime import metrics as rm
from trebuchet.runtime import progress
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
        (b"{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.5}", None,
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
    treb_home.mkdir()
    store = Store()
    rec = make_run(store, tmp_path / "run", rid="abcd1234")
    lifecycle.ended(store, rec.id, "SUCCEEDED")
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

"""Reading what workloads report: madengine's `performance:` semantics, the HuggingFace
fallback, results CSVs, rank aggregation, relative change and the perf.csv header."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from trebuchet.results import collect, parse, perfcsv


def first(tmp_path: Path, text: str):
    log = tmp_path / "rank-0.log"
    log.write_text(text)
    return parse.performance(log)


@pytest.mark.parametrize(
    "line,value,metric",
    [
        ("performance: 1234.5 samples_per_second", 1234.5, "samples_per_second"),
        ("performance: -3 ms", -3.0, "ms"),
        ("performance: +2.5e3 tokens_per_second", 2500.0, "tokens_per_second"),
        ("performance: 1.5E-2 s", 0.015, "s"),
        ("performance: .75 ratio", 0.75, "ratio"),
        ("performance: 42/s, images_per_sec", 42.0, "images_per_sec"),
        ("performance: 42, images_per_sec", 42.0, "images_per_sec"),
        ("[0:0] step 9 performance:   17 samples/s", 17.0, "samples/s"),
    ],
)
def test_performance_line(tmp_path: Path, line: str, value: float, metric: str) -> None:
    got = first(tmp_path, f"epoch 1\n{line}\n")
    assert got is not None and (got.value, got.metric) == (value, metric)


def test_first_match_wins_and_lines_across_chunks(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parse, "CHUNK", 64)
    text = "x" * 100 + "\nperformance: 10 a\nperformance: 20 b\n"
    got = first(tmp_path, text)
    assert (got.value, got.metric) == (10.0, "a")
    assert first(tmp_path, "performance: n/a\nno number here\n") is None


def test_hugging_face_fallback(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("{'train_runtime': 12.1, 'train_samples_per_second': 4.23, 'epoch': 1.0}\n")
    got = parse.hf_samples_per_second(log)
    assert got is not None and (got.value, got.metric) == (4.23, "samples_per_second")


def test_results_csv_keeps_extra_columns(tmp_path: Path) -> None:
    path = tmp_path / "results.csv"
    path.write_text("\ufeffModel,performance,metric,batch_size,dataname\n"
                    "bs32,812.5,samples_per_second,32,digits\nbs64,oops,samples_per_second,64,\n")  # fmt: skip
    rows = parse.results_csv(path)
    assert [(r.model, r.value) for r in rows] == [("bs32", 812.5), ("bs64", None)]
    assert rows[0].extra == {"batch_size": "32", "dataname": "digits"}
    path.write_text("name,perf\nx,1\n")
    with pytest.raises(ValueError, match="model, performance, metric"):
        parse.results_csv(path)


def test_rank_aggregation() -> None:
    vals = {
        r: parse.Value(v, "items_per_second", "") for r, v in {0: 10.0, 1: 12.0, 2: 14.0}.items()
    }
    assert collect.aggregate(vals, "rank0")[:2] == (10.0, "items_per_second")
    assert collect.aggregate(vals, "sum")[0] == 36.0
    assert collect.aggregate(vals, "mean")[0] == 12.0
    no_zero = {1: vals[1], 2: vals[2]}
    assert collect.aggregate(no_zero, "rank0")[2].startswith("rank 1")
    assert collect.aggregate({}, "sum") is None


def test_options_are_read_defensively() -> None:
    assert collect.options({}) == ("results.csv", "rank0")
    assert collect.options({"results": {"file": "perf.csv", "ranks": "sum"}}) == ("perf.csv", "sum")
    assert collect.options({"results": {"ranks": "median"}}) == ("results.csv", "rank0")
    spec = SimpleNamespace(results=SimpleNamespace(file="r.csv", ranks="mean"))
    assert collect.options(spec) == ("r.csv", "mean")
    assert collect.options(SimpleNamespace()) == ("results.csv", "rank0")  # no field yet


def test_relative_change_and_madengine_header(tmp_path: Path) -> None:
    rows = [
        {"model": "m", "metric": "x", "performance": 100.0, "status": "SUCCESS", "backend": "local"},
        {"model": "m", "metric": "x", "performance": None, "status": "FAILURE"},
        {"model": "m", "metric": "x", "performance": 110.0, "status": "SUCCESS",
         "extra": {"batch_size": "32"}},
    ]  # fmt: skip
    assert perfcsv.relative_changes(rows) == [None, None, pytest.approx(10.0)]
    n = perfcsv.write(rows, tmp_path / "perf.csv")
    with open(tmp_path / "perf.csv") as fh:
        reader = csv.DictReader(fh)
        got = list(reader)
    assert n == 3
    assert reader.fieldnames[: len(perfcsv.MADENGINE)] == perfcsv.MADENGINE
    assert reader.fieldnames[-1] == "batch_size"
    assert [r["relative_change"] for r in got] == ["", "", "10.00"]
    assert got[0]["deployment_type"] == "local" and got[2]["batch_size"] == "32"
    assert got[0]["performance"] == "100"

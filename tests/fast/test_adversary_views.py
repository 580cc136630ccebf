"""The adversary's second pass on issue 33's fixes (views, metrics, print-spec, commands):
each test is an attack that broke something before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fast.test_metrics_parts import jsonl, make_run
from trebuchet.cli.main import main
from trebuchet.runtime import metrics as rm
from trebuchet.store import lifecycle
from trebuchet.store import metrics as sm
from trebuchet.store.db import Store


def test_a_planted_metrics_file_with_a_huge_rank_number_breaks_no_view(
    treb_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank runs in its run directory: it can plant `attempt-0/metrics/rank-<20 digits>.jsonl`,
    whose number SQLite cannot store. Such a file is not the agent's and is not read; the
    views still show the real rank's metrics."""
    treb_home.mkdir()
    store = Store()
    rec = make_run(store, tmp_path / "run", rid="abcd1234")
    lifecycle.ended(store, rec.id, "SUCCEEDED")
    folder = tmp_path / "run" / "attempt-0" / "metrics"
    jsonl(folder / "rank-0.jsonl", [(1, {"loss": 1.5})])
    for name in ("rank-99999999999999999999.jsonl", "gpu-18446744073709551616.jsonl"):
        jsonl(folder / name, [(1, {"evil": 1.0})])
    assert main(["metrics", "abcd", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["metrics"]) == ["loss"]
    assert main(["status", "abcd"]) == 0
    assert sm.files(str(tmp_path / "run")) == [("attempt-0/metrics/rank-0.jsonl", 0)]


@pytest.mark.parametrize(
    "line",
    [
        b'{"step": 3, "loss": 1.5, "big": ' + b"9" * 5000 + b"}",
        b'{"step": 3, "loss": 1.5, "big": -' + b"9" * 5000 + b"}",
        b"{'step': 3, 'loss': 1.5, 'big': " + b"9" * 5000 + b"}",
        b"{'step': 3, 'loss': 1.5, 'big': -" + b"9" * 5000 + b"}",
    ],
)
def test_an_integer_past_pythons_digit_limit_loses_only_itself(line: bytes) -> None:
    """Python refuses to read an integer of more than 4,300 digits (ValueError): the whole
    line, `loss` included, was lost. It is a value that is no finite float: dropped and
    counted, the line's other values stay (docs/metrics.md)."""
    assert rm.read(line) == (3.0, {"loss": 1.5}, 1)

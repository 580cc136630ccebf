"""The adversary's second pass on issue 33's fixes (views, metrics, print-spec, commands):
each test is an attack that broke something before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fast.test_metrics_parts import jsonl, make_run
from trebuchet.cli.main import main
from trebuchet.runtime.watch import metric_reader as rm
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


def test_planted_gpu_and_metrics_config_files_break_no_view(treb, tmp_path: Path) -> None:
    """A rank runs in its run directory: it can put a FIFO where the run's metrics.json is
    (which `treb status` read with a plain open: it waited forever for a writer), and GPU
    samples of its own under attempt-0/gpu/ (`util: "x"`: a ValueError in `treb status`;
    an error text with ESC went out raw). Every view answers, as text a terminal shows."""
    import os

    (tmp_path / "job.yaml").write_text("name: g\nnodes: 1\ncommand: [python, -c, 'pass']\n")
    assert treb("run", str(tmp_path / "job.yaml")).returncode == 0
    run_id = json.loads(treb("ps", "--all", "--json").stdout)[0]["id"]
    run_dir = Path(json.loads(treb("status", run_id, "--json").stdout)["run_dir"])
    (run_dir / "metrics.json").unlink(missing_ok=True)
    os.mkfifo(run_dir / "metrics.json")
    (run_dir / "progress.json").unlink(missing_ok=True)
    gpu = run_dir / "attempt-0" / "gpu"
    gpu.mkdir(exist_ok=True)
    os.mkfifo(gpu / "node-0.json")
    hostile = {"node": "\x1b]0;T\x07", "samples": [{"index": [], "util": "x", "mem": "y",
               "mem_total": {}}, 5], "busy": "z", "error": "\x1b[2J"}  # fmt: skip
    (gpu / "node-1.json").write_text(json.dumps(hostile))
    (gpu / "node-2.json").write_text(json.dumps({"node": 2, "error": "\x1b[2J\u202e"}))
    for view in (["status", run_id], ["status", run_id, "--json"], ["ps", "--all"]):
        res = treb(*view, timeout=60)
        assert res.returncode == 0 and "Traceback" not in res.stderr, (view, res.stderr)
        assert "\x1b" not in res.stdout and "\u202e" not in res.stdout, (view, res.stdout)
        if "--json" in view:
            json.loads(res.stdout)

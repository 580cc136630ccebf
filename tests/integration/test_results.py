"""Results of real runs: examples/digits-ddp's `performance:` line, two runs compared, a
madengine perf.csv, a results CSV a workload writes, sum/mean over ranks, the HuggingFace
fallback, and FAILURE rows for runs that failed or printed no number."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, needs, status_json, write_spec

pytestmark = pytest.mark.integration
PY = sys.executable
DIGITS = REPO / "examples" / "digits-ddp" / "job.yaml"


def results(treb, *args: str) -> list[dict]:
    res = treb("results", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_digits_ddp_two_runs_compared_and_perf_csv(treb, tmp_path: Path) -> None:
    needs("torch")
    needs("sklearn")
    ids = []
    for _ in range(2):
        res = treb("run", str(DIGITS), "-o", "command=python train.py --epochs 2", timeout=300)
        assert res.returncode == 0, res.stderr
        assert re.search(r"  performance: [\d.]+ samples_per_second \(digits-ddp, rank 0\)",
                         res.stderr)  # fmt: skip
        ids.append(status_json(treb)["id"])
    rows = results(treb, *ids)
    assert [r["run_id"] for r in rows] == ids
    for r in rows:
        assert r["status"] == "SUCCESS" and r["metric"] == "samples_per_second"
        assert r["performance"] > 0 and r["source"] == "rank 0"
        assert (r["workload"], r["backend"], r["launcher"]) == ("digits-ddp", "local", "native")
        assert (r["nnodes"], r["procs_per_node"], r["environment"]) == (1, 2, "current")
        assert re.fullmatch(r"[0-9a-f]{40}", r["git_commit"] or ""), r["git_commit"]
        assert r["machine_name"] and r["test_duration"] > 0
    expected = (rows[1]["performance"] - rows[0]["performance"]) / rows[0]["performance"] * 100
    assert rows[1]["relative_change"] == pytest.approx(expected)
    out = treb("results", *ids, "--csv", str(tmp_path / "perf.csv"))
    assert f"({ids[1]} vs {ids[0]})" in out.stdout and "change: " in out.stdout
    with open(tmp_path / "perf.csv") as fh:
        reader = csv.DictReader(fh)
        got = list(reader)
    assert reader.fieldnames[:4] == ["model", "n_gpus", "nnodes", "gpus_per_node"]
    assert {"performance", "metric", "relative_change", "status", "git_commit",
            "machine_name", "test_duration", "build_duration"} <= set(reader.fieldnames)  # fmt: skip
    assert [g["model"] for g in got] == ["digits-ddp"] * 2
    assert got[0]["relative_change"] == "" and got[1]["relative_change"] != ""
    assert got[1]["status"] == "SUCCESS" and float(got[1]["performance"]) > 0
    # the table, and the run dir's own copy
    table = treb("results").stdout
    assert "PERFORMANCE" in table and ids[0] in table and ids[1] in table
    run_dir = Path(status_json(treb, ids[1])["run_dir"])
    assert json.loads((run_dir / "results.json").read_text())[0]["metric"] == "samples_per_second"


def test_results_csv_written_by_the_workload(treb, tmp_path: Path) -> None:
    (tmp_path / "bench.py").write_text(
        "import csv, os\n"
        "if os.environ['RANK'] == '0':\n"
        "    with open('results.csv', 'w', newline='') as fh:\n"
        "        w = csv.writer(fh)\n"
        "        w.writerow(['model', 'performance', 'metric', 'batch_size'])\n"
        "        w.writerow(['bs32', '812.5', 'samples_per_second', '32'])\n"
        "        w.writerow(['bs64', '1410', 'samples_per_second', '64'])\n"
        "print('performance: 1 ignored_when_a_csv_exists')\n"
    )
    spec = write_spec(tmp_path, f"name: bench\ncommand: [{PY}, bench.py]\nprocs_per_node: 2\n")
    assert treb("run", str(spec)).returncode == 0
    rows = results(treb, status_json(treb)["id"])
    assert [(r["model"], r["performance"], r["status"]) for r in rows] == [
        ("bench_bs32", 812.5, "SUCCESS"), ("bench_bs64", 1410.0, "SUCCESS")]  # fmt: skip
    assert rows[0]["extra"] == {"batch_size": "32"}
    treb("results", "--csv", str(tmp_path / "perf.csv"))
    with open(tmp_path / "perf.csv") as fh:
        got = [r for r in csv.DictReader(fh) if r["workload"] == "bench"]
    assert [r["batch_size"] for r in got] == ["32", "64"]


RANKED = "import os\nr = int(os.environ['RANK'])\nprint(f'performance: {10 * (r + 1)} items_per_second')\n"


def test_sum_and_mean_over_ranks(treb, treb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "ranked.py").write_text(RANKED)
    from trebuchet.spec.model import Spec

    field = "results" in Spec.model_fields
    spec_text = f"name: ranked\ncommand: [{PY}, ranked.py]\nprocs_per_node: 3\n"
    spec = write_spec(tmp_path, spec_text + ("results: {ranks: sum}\n" if field else ""))
    assert treb("run", str(spec)).returncode == 0
    st = status_json(treb)
    rows = results(treb, st["id"])
    assert rows[0]["performance"] == (60.0 if field else 10.0)
    # Recompute as the run's resolved spec says, for each aggregation: spec.json, and
    # spec.yaml for a run recorded before spec.json existed (the spec.yaml of a run recorded
    # before the `results:` block existed has none: rank 0 then).
    from trebuchet.results.collect import collect
    from trebuchet.store.db import Store

    run_dir = Path(st["run_dir"])
    recorded = json.loads((run_dir / "spec.json").read_text())
    assert recorded == yaml.safe_load((run_dir / "spec.yaml").read_text())
    cases = [("json", "sum", 60.0), ("json", "mean", 20.0), ("yaml", "mean", 20.0),
             ("yaml", "rank0", 10.0), ("yaml", None, 10.0)]  # fmt: skip
    for form, how, want in cases:
        data = dict(recorded)
        if how is None:
            data.pop("results")
        else:
            data["results"] = {"file": "results.csv", "ranks": how}
        if form == "json":
            (run_dir / "spec.json").write_text(json.dumps(data))
        else:
            (run_dir / "spec.json").unlink(missing_ok=True)
            (run_dir / "spec.yaml").write_text(yaml.safe_dump(data))
        store = Store(treb_home / "runs.db")
        (row,) = collect(store, store.get(st["id"]), force=True)
        store.close()
        assert (row["performance"], row["aggregation"]) == (want, how or "rank0"), form


def test_hugging_face_fallback_and_failure_rows(treb, tmp_path: Path) -> None:
    hf = write_spec(tmp_path / "hf", "name: hf\ncommand: ['echo', \"{'train_runtime': 3.2, "
                    "'train_samples_per_second': 4.23, 'epoch': 1.0}\"]\n")  # fmt: skip
    assert treb("run", str(hf)).returncode == 0
    (row,) = results(treb, status_json(treb)["id"])
    assert (row["performance"], row["metric"], row["status"]) == (4.23, "samples_per_second",
                                                                   "SUCCESS")  # fmt: skip
    quiet = write_spec(tmp_path / "quiet", "name: quiet\ncommand: 'echo trained'\n")
    assert treb("run", str(quiet)).returncode == 0
    (row,) = results(treb, status_json(treb)["id"])
    assert (row["performance"], row["status"], row["run_state"]) == (None, "FAILURE", "SUCCEEDED")
    broken = write_spec(tmp_path / "broken",
                        "name: broken\ncommand: 'echo performance: 99 items_per_second; exit 2'\n")  # fmt: skip
    assert treb("run", str(broken)).returncode == 1
    (row,) = results(treb, status_json(treb)["id"])
    assert (row["performance"], row["status"]) == (99.0, "FAILURE")

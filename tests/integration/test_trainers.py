"""Issue 38 with the real trainers, pinned, on CPU (2 ranks, gloo): the HuggingFace Trainer
of transformers 5.25.0 (with and without its bars) and of the last 4.x, 4.57.6 (its own venv,
.venv-hf4: `make test` builds it, TREB_HF4_PYTHON names its python), Lightning 2.6.6's bar
and an Accelerate 1.16.0 loop. What a user sees: `treb metrics` holds the values each
printed, `treb results` a SUCCESS row with its samples/s, `treb status` the training loop's
steps while it runs (never a checkpoint writer's 1/1 bar) and a stalled run as stalled.
The model: a 2-layer GPT-2 from its config (no model hub here), random tokens."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import in_ci, needs, status_json, write_spec

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).resolve().parent / "scripts"
REPO = Path(__file__).resolve().parents[2]


def job(tmp_path: Path, script: str, text: str) -> Path:
    shutil.copy(SCRIPTS / script, tmp_path / script)
    return write_spec(tmp_path, text)


def printed(log: str, key: str) -> list[float]:
    """The values of `key` in the Trainer's dicts, as printed (5: '4.559'; 4: 4.5587)."""
    return [float(v) for v in re.findall(rf"'{key}': '?([-0-9.e]+)'?", log)]


def metric(treb, run: str, name: str) -> list[tuple[float, float]]:
    got = json.loads(treb("metrics", run, "--json").stdout)["metrics"]
    return [(s, v) for s, v, _ in got[name]["points"]]


def result_row(treb, run: str) -> dict:
    return json.loads(treb("results", run, "--json").stdout)[0]


def watch(treb, run: str, until, timeout: float = 150) -> list[dict]:
    """`treb status --json` sampled until `until(samples)` holds; the samples."""
    seen: list[dict] = []
    end = time.monotonic() + timeout
    while not until(seen):
        if time.monotonic() > end:
            raise AssertionError(f"timed out; saw {seen[-3:]}")
        seen.append(status_json(treb, run))
        time.sleep(0.4)
    return seen


def ended(seen: list[dict]) -> bool:
    return bool(seen) and seen[-1]["state"] not in ("PENDING", "RUNNING", "RETRYING")


def start(treb, tmp_path: Path, script: str, text: str, *args: str) -> str:
    """`treb run -d` of a spec beside a copy of the script; the run's id."""
    spec = job(tmp_path, script, text)
    res = treb("run", "-d", *args, str(spec))
    assert res.returncode == 0, res.stderr
    return res.stdout.split()[0]


def attached(treb, tmp_path: Path, script: str, text: str) -> tuple[str, str]:
    """`treb run` (attached) of a spec beside a copy of the script: (run id, its output)."""
    res = treb("run", str(job(tmp_path, script, text)))
    assert res.returncode == 0, res.stderr
    return json.loads(treb("ps", "--json").stdout)[0]["id"], res.stdout


def check_trainer_run(treb, run: str, seen: list[dict], total: int) -> list[dict]:
    """A Trainer run of transformers 5 that ended: SUCCEEDED, its progress the Trainer's
    steps only (never a shard writer's 1/1), its loss series and results row as printed;
    the progress readings seen."""
    assert seen[-1]["state"] == "SUCCEEDED", seen[-1]
    progress = [s["progress"] for s in seen if s["progress"]]
    assert progress and all(p["total"] == total for p in progress), progress
    assert progress[-1]["step"] == total
    log = (Path(seen[-1]["run_dir"]) / "attempt-0" / "rank-0.log").read_text()
    assert "'loss': '" in log  # transformers 5 prints its values as strings
    assert [v for _, v in metric(treb, run, "loss")] == printed(log, "loss")
    assert metric(treb, run, "loss")[0][0] == printed(log, "epoch")[0]  # the dict's epoch
    row = result_row(treb, run)
    assert row["status"] == "SUCCESS" and row["metric"] == "samples_per_second"
    assert row["performance"] == printed(log, "train_samples_per_second")[0]
    return progress


def test_transformers_5_without_bars_metrics_results_and_progress(treb, tmp_path: Path) -> None:
    """disable_tqdm=True with log_level info: the Trainer's `Total optimization steps = 60`
    and a dict every 5 steps are the progress; a checkpoint every 10 steps draws its 1/1
    bar, which is not."""
    needs("transformers")
    run = start(treb, tmp_path, "hf_train.py", "name: hf5\nprocs_per_node: 2\n"
                "command: python hf_train.py 60 --no-tqdm --save 10 --sleep 0.25\n")  # fmt: skip
    progress = check_trainer_run(treb, run, watch(treb, run, ended), 60)
    midway = [p for p in progress if 0 < p["step"] < 60 and p["eta_s"] is not None]
    assert midway and all(p["step"] % 5 == 0 for p in progress), progress


def test_transformers_5_bar_progress_then_a_hang_is_stalled(treb, tmp_path: Path) -> None:
    """The Trainer's bar is the progress (not the shard writer's bar of each save); when
    rank 0 stops at step 20 the progress stays there and says stalled, no ETA to 0 s."""
    needs("transformers")
    run = start(treb, tmp_path, "hf_train.py", "name: hf5bar\nprocs_per_node: 2\n"
                "command: python hf_train.py 60 --save 10 --sleep 0.2 --hang-at 20\n")  # fmt: skip
    try:
        seen = watch(treb, run, lambda s: bool(s) and (s[-1]["progress"] or {}).get("stalled_s"))
        progress = [s["progress"] for s in seen if s["progress"]]
        assert all(p["total"] == 60 for p in progress), progress
        assert any(0 < p["step"] < 20 and p["eta_s"] and p["rate"] for p in progress), progress
        # the bar as last drawn (tqdm redraws at most every 0.1 s) before step 20 hung
        assert 15 <= progress[-1]["step"] <= 20 and progress[-1]["eta_s"] is None
        text = treb("status", run).stdout
        assert re.search(r"^  progress \d+% \d+/60, .*stalled: no step for \d+s$", text, re.M), text
    finally:
        treb("cancel", run)


def hf4_python() -> str:
    py = os.environ.get("TREB_HF4_PYTHON") or str(REPO / ".venv-hf4" / "bin" / "python")
    if not os.path.exists(py):
        if in_ci():
            pytest.fail(f"{py} missing (make test builds .venv-hf4)")
        pytest.skip(f"{py} missing (make .venv-hf4)")
    return py


def test_transformers_4_metrics_and_results(treb, tmp_path: Path) -> None:
    py = hf4_python()
    run, log = attached(treb, tmp_path, "hf_train.py", f"name: hf4\nprocs_per_node: 2\n"
                        f"command: {py} hf_train.py 40 --save 20\n")  # fmt: skip
    assert "'loss': 4." in log  # 4.x prints floats
    assert [v for _, v in metric(treb, run, "loss")] == printed(log, "loss")
    row = result_row(treb, run)
    assert row["status"] == "SUCCESS"
    assert row["performance"] == printed(log, "train_samples_per_second")[0]
    p = status_json(treb, run)["progress"]
    assert p["step"] == p["total"] == 40


def test_lightning_bar_metrics_and_progress(treb, tmp_path: Path) -> None:
    """Lightning's TQDMProgressBar: the metrics logged with prog_bar=True, at the global
    batch; the progress is the epoch bar's, not the validation bar's."""
    needs("lightning")
    run, out = attached(treb, tmp_path, "lightning_train.py", "name: pl\nprocs_per_node: 2\n"
                        "command: python lightning_train.py 3 0.05 tqdm\n")  # fmt: skip
    last = re.findall(r"Epoch 2: 100%.*? 8/8 \[.*?train_loss=([0-9.]+), val_loss=([0-9.]+)\]",
                      out)[-1]  # fmt: skip
    assert metric(treb, run, "train_loss")[-1] == (24, float(last[0]))  # epoch 2 x 8 + 8
    assert metric(treb, run, "val_loss")[-1] == (24, float(last[1]))
    p = status_json(treb, run)["progress"]
    assert p["total"] == 8 and p["step"] == 8


def test_accelerate_log_without_tracker_and_its_printed_lines(treb, tmp_path: Path) -> None:
    """Accelerator.log with no tracker prints nothing; the dicts the loop prints beside it
    (with their step) and the examples' `epoch N: {...}` are the metrics."""
    needs("accelerate")
    run, out = attached(treb, tmp_path, "accelerate_train.py", "name: acc\nprocs_per_node: 2\n"
                        "command: python accelerate_train.py 40\n")  # fmt: skip
    steps = {int(s): float(v) for s, v in re.findall(
        r"\{'step': (\d+), 'train_loss': ([-0-9.e]+),", out)}  # fmt: skip
    assert sorted(steps) == list(range(5, 45, 5))
    assert dict(metric(treb, run, "train_loss")) == steps
    epochs = {int(e): float(v) for e, v in re.findall(r"epoch (\d+): \{'loss': ([0-9.]+)\}",
                                                      out)}  # fmt: skip
    assert dict(metric(treb, run, "loss")) == epochs and len(epochs) == 3

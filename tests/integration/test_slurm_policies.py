"""Log policies on the real 2-node Slurm cluster: the job itself decides, as locally.

Why: the same spec must behave the same with `--on slurm`: a CUDA out-of-memory error is
final whatever `retries` says, and a policy's `retry` grants attempts beyond `retries`,
bounded. Only the job sees its failures between attempts, so the batch script applies
the policies (grep -P over the attempt's logs); these check it on slurmd, with ranks on
both nodes.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import slurm_conf, status, streb  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def _events(run_dir: str) -> list[dict]:
    text = (Path(run_dir) / "events.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_gpu_oom_on_node_two_is_final_despite_retries(streb, tmp_path: Path) -> None:
    cmd = ('if [ "$RANK" = 1 ]; then echo "torch.OutOfMemoryError: CUDA out of memory. '
           'Tried to allocate 2.00 GiB" >&2; exit 1; fi; sleep 120')  # fmt: skip
    spec = write_spec(tmp_path, f"name: oom\ncommand: '{cmd}'\nnodes: 2\nretries: 3\n")
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 1, res.stderr
    st = status(streb)
    assert st["state"] == "FAILED" and st["first_failure"]["host"] == "tn2"
    assert [a["state"] for a in st["attempts"]] == ["FAILED"], st["attempts"]
    assert st["attempts"][0]["reason"] == "gpu-oom: no_retry"
    batch = (Path(st["run_dir"]) / "batch.log").read_text()
    assert "log policy gpu-oom (no_retry) matched: torch.OutOfMemoryError: CUDA out" in batch
    (event,) = [e for e in _events(st["run_dir"]) if e["event"] == "log_policy"]
    assert (event["policy"], event["action"], event["attempt"]) == ("gpu-oom", "no_retry", 0)


def test_retry_policy_goes_past_retries_but_is_bounded(streb, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "name: flaky\ncommand: 'echo \"attempt $TREB_ATTEMPT: flaky interconnect\"; exit 1'\n"
        "nodes: 2\nretries: 1\nlog_policies:\n"
        "  - {name: flaky, pattern: 'flaky\\s+interconnect$', action: retry, max_retries: 2}\n",
    )
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 1, res.stderr
    st = status(streb)
    # 1 + 2 granted by the policy + 1 of `retries`, exactly as the local supervisor does
    assert [a["state"] for a in st["attempts"]] == ["FAILED"] * 4, st["attempts"]
    assert [a["reason"] for a in st["attempts"]] == ["flaky: retry"] * 4
    assert st["max_attempts"] == 4 and st["state"] == "FAILED"
    grants = [e for e in _events(st["run_dir"]) if e["event"] == "log_policy"]
    assert [e["attempt"] for e in grants] == [0, 1, 2, 3]


def test_a_policy_that_does_not_match_leaves_retries_alone(streb, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "name: plain\ncommand: 'test \"$TREB_ATTEMPT\" -ge 1 || exit 4'\nnodes: 2\nretries: 1\n"
        "log_policies:\n  - {pattern: 'never printed', action: no_retry}\n",
    )
    res = streb("run", str(spec), "--on", "slurm", timeout=300)
    assert res.returncode == 0, res.stderr
    st = status(streb)
    assert [a["state"] for a in st["attempts"]] == ["FAILED", "SUCCEEDED"]
    # the first rank that failed, not srun's code (the highest of its tasks: 143 of a rank
    # that srun stopped after the failure)
    assert re.fullmatch(r"rank [01] on tn[12] exited with code 4", st["attempts"][0]["reason"])

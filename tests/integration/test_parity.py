"""One spec, one outcome, on every engine that runs here: the same cases locally (2
simulated nodes), over ssh (the 2 test hosts) and on Slurm (the 2-node test cluster), each
asserted against one table: the attempts' states in order, the run's final state, the first
failing rank and the diagnosis' category.

Why: each engine used to carry its own job controller, and they had drifted apart (a
`timeout` Slurm did not hold per attempt, log policies it skipped after `pre`, ssh that ran
no `pre` at all). The job's life is decided once now (runtime/job/life.py); this matrix
keeps it so. The cases of an engine run at once (detached), so the matrix costs about as
long as its slowest case. A hang with `on_hang: retry` is in the same matrix by other
tests, each asserting [FAILED (hang), SUCCEEDED]: test_hangs.py (local),
test_ssh_runs.py::test_hang_is_found_and_retried_with_every_ranks_stack and
test_slurm_hangs.py::test_on_hang_retry_checkpoints_then_retries_on_two_nodes (they need
torch and py-spy; here every rank is a shell).
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TrebFn, write_spec
from tests.integration.slurm_support import slurm_conf  # noqa: F401
from tests.integration.test_ssh_runs import ssh_config  # noqa: F401

pytestmark = pytest.mark.integration

FAIL_ON_FIRST = 'if [ "$TREB_ATTEMPT" = 0 ] && [ "$RANK" = 1 ]; then echo "{line}"; exit 3; fi; '
CASES: dict[str, str] = {
    # a log policy grants the retry (the shipped port-in-use), not `retries`
    "policy": "command: '" + FAIL_ON_FIRST.format(line="OSError: [Errno 98] Address already "
                                                       "in use") + "echo done'\n",
    "retried": "command: '" + FAIL_ON_FIRST.format(line="boom") + "echo done'\nretries: 1\n",
    "fails": "command: 'if [ \"$RANK\" = 1 ]; then echo \"ValueError: bad batch\"; exit 3; fi; "
             "sleep 30'\nretries: 1\n",
    "pre": "command: 'echo never'\npre: 'echo no data; exit 4'\n",
    "timeout": "command: 'echo up; sleep 60'\ntimeout: 4s\n",
    "cancel": "command: 'echo up; sleep 600'\n",
    # the checkpoint signal before the timeout, to the ranks that handle it: they save, end
    "checkpoint": "command: 'trap \"echo checkpoint saved; exit 0\" USR2; echo up; "
                  "while :; do sleep 0.2; done'\ntimeout: 10s\ntimeout_warning: 6s\n",
}  # fmt: skip
# (attempt states, final state, first failing rank, diagnosis category), the same everywhere
EXPECTED: dict[str, tuple[list[str], str, int | None, str | None]] = {
    "policy": (["FAILED", "SUCCEEDED"], "SUCCEEDED", None, None),
    "retried": (["FAILED", "SUCCEEDED"], "SUCCEEDED", None, None),
    "fails": (["FAILED", "FAILED"], "FAILED", 1, "python_exception"),
    "pre": (["FAILED"], "FAILED", None, "unknown"),  # diagnose has no rule for pre (yet)
    "timeout": (["TIMEOUT"], "TIMEOUT", None, "time_limit"),
    "cancel": (["CANCELLED"], "CANCELLED", None, "cancelled"),
    "checkpoint": (["SUCCEEDED"], "SUCCEEDED", None, None),
}


def outcome(st: dict[str, Any]) -> tuple[list[str], str, int | None, str | None]:
    root = (
        ((st.get("diagnosis") or {}).get("root_cause") or {}) if st["state"] != "SUCCEEDED" else {}
    )
    first = st.get("first_failure") or {}
    return ([a["state"] for a in st["attempts"]], st["state"], first.get("rank"),
            root.get("category"))  # fmt: skip


def engine_lines(engine: str, request: pytest.FixtureRequest) -> str:
    """What the spec says for the engine, with its service up (a failure in CI if not)."""
    if engine == "ssh":
        conf = request.getfixturevalue("ssh_config")
        return f"ssh: {{hosts: [ts1, ts2], config_file: {conf}}}\n"
    if engine == "slurm":
        conf = request.getfixturevalue("slurm_conf")
        request.getfixturevalue("monkeypatch").setenv("SLURM_CONF", conf)
    return ""


def status(treb: TrebFn, run: str) -> dict[str, Any]:
    res = treb("status", run, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def wait_until(cond: Any, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.5)


@pytest.mark.parametrize(
    "engine", ["local", pytest.param("ssh", marks=pytest.mark.ssh),
               pytest.param("slurm", marks=pytest.mark.slurm)],
)  # fmt: skip
def test_the_same_spec_ends_the_same_way_on_every_engine(
    engine: str, treb: TrebFn, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    extra = engine_lines(engine, request)
    runs: dict[str, str] = {}
    try:
        for case, text in CASES.items():
            spec = write_spec(tmp_path / case, f"name: parity-{case}\nnodes: 2\n"
                              f"procs_per_node: 1\ngrace_period: 2s\n{text}{extra}")  # fmt: skip
            res = treb("run", str(spec), "--on", engine, "--detach")
            assert res.returncode == 0, f"{case}: {res.stderr}"
            runs[case] = res.stdout.strip()
        cancel = runs["cancel"]
        wait_until(lambda: "up" in treb("logs", cancel, "--rank", "1").stdout, 120,
                   "the cancel case's ranks")  # fmt: skip
        assert treb("cancel", cancel).returncode == 0
        got = {}
        for case, run in runs.items():
            wait_until(lambda run=run: status(treb, run)["state"] not in
                       ("PENDING", "RUNNING", "RETRYING"), 240, f"case {case}")  # fmt: skip
            got[case] = outcome(status(treb, run))
    finally:
        for run in runs.values():
            treb("cancel", run)
    assert got == EXPECTED, {c: (got[c], EXPECTED[c]) for c in got if got[c] != EXPECTED[c]}
    log = treb("logs", runs["checkpoint"], "--rank", "0").stdout
    assert "checkpoint saved" in log, log

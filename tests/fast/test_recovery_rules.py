"""Issue 23's health checks and retry by cause, in milliseconds: the spec's new fields
(bad input named by file, line and field, exit 2), the one rule's exit-code branch
(runtime/lifecycle.next_step with runtime/job/retry_codes.py), and each node health check
(runtime/node/health.py) on this machine. The same on the real engines: test_recovery_local.py
(local runs, faults), tests/integration/test_node_health.py (Slurm, ssh).

No GPU exists here: the GPU check runs against a STAND-IN `nvidia-smi` (a shell script
written by the test, first on PATH) that lists the GPUs the test says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import write_spec
from trebuchet.runtime.job import life as lifecycle
from trebuchet.runtime.job import retry_codes
from trebuchet.runtime.job.life import END, RETRY, next_step
from trebuchet.runtime.node import health
from trebuchet.runtime.watch import log_policies as policies

PORT = {"name": "port_in_use", "pattern": "Address already in use", "action": "retry",
        "max_retries": 2}  # fmt: skip


def log(tmp_path: Path, text: str) -> list[Path]:
    path = tmp_path / "rank-0.log"
    path.write_text(text + "\n")
    return [path]


# -- the spec --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "field", "said"),
    [
        ("no_retry_exit_codes: [3, 256]", "no_retry_exit_codes[1]", "between 0 and 255"),
        ("no_retry_exit_codes: [-1]", "no_retry_exit_codes[0]", "between 0 and 255"),
        ("retry_exit_codes: [1e400]", "retry_exit_codes[0]", "exit codes"),
        ("retry_exit_codes: [true]", "retry_exit_codes[0]", "exit codes"),
        ("retry_exit_codes: 3", "retry_exit_codes", "a list"),
        ('health_check: "echo \\0"', "health_check", "NUL"),
        ("health_check_timeout: NaN", "health_check_timeout", ""),
        ("health_check: [1, 2]", "health_check", "shell command"),
    ],
)
def test_bad_recovery_fields_are_named_with_file_and_line(
    treb, tmp_path: Path, line: str, field: str, said: str
) -> None:
    spec = write_spec(tmp_path, f"name: t\ncommand: python3 -c pass\n{line}\n")
    res = treb("check", str(spec))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"{spec}:3: {field}:" in res.stderr and said in res.stderr
    assert "Traceback" not in res.stderr


def test_the_fields_reach_every_engines_job_file(treb, tmp_path: Path) -> None:
    """Slurm's job.json (what its controller reads) carries the rules and the checks."""
    spec = write_spec(tmp_path, "name: t\ncommand: python3 -c pass\nnodes: 2\n"
                      "no_retry_exit_codes: [3, 4]\nretry_exit_codes: []\n"
                      "health_check: ./check.sh\nhealth_check_timeout: 5s\n")  # fmt: skip
    res = treb("render", str(spec), "--on", "slurm")
    assert res.returncode == 0, res.stderr
    for key, value in (("no_retry_exit_codes", [3, 4]), ("retry_exit_codes", []),
                       ("health_check", "./check.sh"), ("health_check_timeout", 5.0)):  # fmt: skip
        assert f'"{key}": {json.dumps(value)}' in res.stdout


# -- the one rule ----------------------------------------------------------------------------
def test_a_no_retry_code_ends_the_run_before_retries_and_policies(tmp_path: Path) -> None:
    logs = log(tmp_path, "RuntimeError: Address already in use")  # a retry policy matches
    got = next_step("FAILED", 0, 5, [PORT], logs, {}, exit_code=3, no_retry_codes=[3])
    assert (got.action, got.verdict) == (END, lifecycle.EXIT_CODE)
    assert got.policy == {"name": "no_retry_exit_codes", "action": "no_retry"}
    assert "exit code 3 is in no_retry_exit_codes" in got.line
    other = next_step("FAILED", 0, 5, [PORT], logs, {}, exit_code=4, no_retry_codes=[3])
    assert (other.action, other.verdict) == (RETRY, policies.RETRY)


def test_retry_exit_codes_retry_only_those(tmp_path: Path) -> None:
    logs = log(tmp_path, "boom")
    kept = next_step("FAILED", 0, 2, [], logs, {}, exit_code=75, retry_codes=[75])
    assert kept.action == RETRY
    out = next_step("FAILED", 0, 2, [], logs, {}, exit_code=1, retry_codes=[75])
    assert (out.action, out.policy and out.policy["name"]) == (END, "retry_exit_codes")
    assert "exit code 1 is not in retry_exit_codes (75)" in out.line
    # retries still count: a code that passes the rules is not retried past them
    assert next_step("FAILED", 2, 2, [], logs, {}, exit_code=75, retry_codes=[75]).action == END
    # an empty list retries nothing
    assert next_step("FAILED", 0, 2, [], logs, {}, exit_code=75, retry_codes=[]).action == END


def test_no_program_exit_no_rule(tmp_path: Path) -> None:
    """A lost node (no exit code of a program), a timeout or a hang: the rules say nothing."""
    logs = log(tmp_path, "x")
    assert next_step("FAILED", 0, 1, [], logs, {}, exit_code=None, retry_codes=[]).action == RETRY
    assert next_step("TIMEOUT", 0, 1, [], logs, {}, exit_code=3, no_retry_codes=[3]).action \
        == RETRY  # fmt: skip
    hung = next_step("FAILED", 0, 1, [], logs, {}, on_hang="retry", exit_code=3,
                     no_retry_codes=[3])  # fmt: skip
    assert hung.action == RETRY


def test_the_code_judged_is_the_first_failures(tmp_path: Path) -> None:
    """From the attempt's records when the controller holds no cause (Slurm's agents
    write them); a cascade (stopped by the teardown) is not it; a lost node has none."""
    adir = tmp_path / "attempt-0"
    adir.mkdir()
    rank = {"label": "rank 1", "rank": 1, "node": 0, "exit_code": 3, "ended_at": 2.0}
    cascade = {"label": "rank 0", "rank": 0, "node": 0, "exit_code": 143, "ended_at": 3.0,
               "stopped_by_launcher": True}  # fmt: skip
    (adir / "rank-1.json").write_text(json.dumps(rank))
    (adir / "rank-0.json").write_text(json.dumps(cascade))
    (adir / "health-0.json").write_text(json.dumps({"healthy": True, "node": 0}))
    assert retry_codes.cause_code(None, str(adir)) == 3
    lost = {"label": "node_unhealthy", "exit_code": 1, "node": 1, "rank": None}
    (adir / "lost-1.json").write_text(json.dumps(lost))
    assert retry_codes.cause_code(None, str(adir)) is None  # the node's, not a program's
    assert retry_codes.cause_code({"label": "rank 2", "exit_code": 9}, str(adir)) == 9  # type: ignore[typeddict-item]


# -- the node checks -------------------------------------------------------------------------
def where(tmp_path: Path, env: dict[str, str] | None = None, node: int = 0) -> health.Where:
    run_dir = tmp_path / "run"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True, exist_ok=True)
    base = {"PATH": os.environ["PATH"], "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1",
            "NODE_RANK": str(node)}  # fmt: skip
    return health.Where(str(run_dir), str(adir), 0, node, f"node-{node}", str(tmp_path),
                        {**base, **(env or {})})  # fmt: skip


def test_disk_space_under_the_threshold_is_unhealthy(tmp_path: Path) -> None:
    ok, said = health.check_disk({"run dir": str(tmp_path)})
    assert ok, said
    ok, said = health.check_disk({"run dir": str(tmp_path)}, min_free=1 << 62)
    assert not ok and f"run dir {tmp_path}" in said and "MiB free" in said
    # a checkpoint dir not made yet: the folder above it, where it will be made
    ok, said = health.check_disk({"checkpoint dir": str(tmp_path / "a" / "b")})
    assert ok, said


def test_the_master_resolved_or_not() -> None:
    """Resolution and route only: nothing connects to the master's port
    (tests/fast/test_health_master.py has a listening rank)."""
    ok, said = health.check_master("127.0.0.1", "29500")
    assert ok and "resolves and is routable" in said
    ok, said = health.check_master("no-such-host.invalid", "29500", wait=0.0)
    assert not ok and "does not resolve" in said
    assert not health.check_master("", "")[0]


def test_the_shared_run_dir(tmp_path: Path) -> None:
    w = where(tmp_path)
    adir = Path(w.adir)
    ok, said = health.check_shared(w, "77")
    assert not ok and "not the shared one" in said
    (adir / "attempt.json").write_text(json.dumps({"job_id": "76", "attempt": 0}))
    ok, said = health.check_shared(w, "77")
    assert not ok and "another run directory" in said
    (adir / "attempt.json").write_text(json.dumps({"job_id": "77", "attempt": 0}))
    assert health.check_shared(w, "77")[0]
    (Path(w.run_dir) / health.TOKEN_FILE).write_text("abc\n")
    assert health.check_shared(w, None, token="abc")[0]
    assert not health.check_shared(w, None, token="abd")[0]


STAND_IN_SMI = """#!/bin/sh
# STAND-IN for nvidia-smi (tests/fast/test_recovery_rules.py): no GPU exists here.
n=0
while [ "$n" -lt "$STANDIN_GPUS" ]; do
  echo "GPU $n: NVIDIA H100 80GB HBM3 (UUID: GPU-0000000$n)"; n=$((n + 1))
done
"""


def test_the_gpus_asked_for_are_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}/usr/bin:/bin")
    ok, said = health.check_gpus(2)
    assert ok and said.startswith("not checked") and "neither nvidia-smi nor rocm-smi" in said
    smi = bin_dir / "nvidia-smi"
    smi.write_text(STAND_IN_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("STANDIN_GPUS", "4")
    assert health.check_gpus(4) == (True, "4 GPU(s) visible (nvidia-smi), 4 asked")
    monkeypatch.setenv("STANDIN_GPUS", "3")
    assert health.check_gpus(4) == (False, "3 GPU(s) visible (nvidia-smi), 4 asked")


def test_the_users_check_with_its_output_kept(tmp_path: Path) -> None:
    w = where(tmp_path, node=1)
    ok, said = health.check_user('echo "node $NODE_RANK sick"; exit 5', w, 10.0)
    assert not ok and said == "health_check exited with code 5: node 1 sick"
    assert (Path(w.adir) / "health-1.log").read_text() == "node 1 sick\n"
    ok, said = health.check_user("echo slow; sleep 30", w, 0.5)
    assert not ok and "past its timeout (0.5s): slow" in said
    assert health.check_user("true", w, 10.0)[0]


def test_an_unhealthy_node_is_recorded_as_a_lost_one(tmp_path: Path) -> None:
    """health-<node>.json always; when unhealthy the lost node's one path (nodeloss.record):
    lost-<node>.json labelled node_unhealthy, the event, the exclusion."""
    w = where(tmp_path, node=1)
    assert health.gate(w, {}) is None
    rec = json.loads((Path(w.adir) / "health-1.json").read_text())
    assert rec["healthy"] and [c["name"] for c in rec["checks"]] == [
        "runtime", "disk", "shared", "master"]  # fmt: skip
    assert "exit_code" not in rec  # never read as a process's failure
    why = health.gate(w, {"health_check": "exit 3", "gpus_per_node": 0})
    assert why == "node_unhealthy: node-1 (user: health_check exited with code 3)"
    lost = json.loads((Path(w.adir) / "lost-1.json").read_text())
    assert (lost["label"], lost["node"], lost["host"], lost["message"]) == (
        "node_unhealthy",
        1,
        "node-1",
        why,
    )
    from trebuchet.runtime.job import nodeset

    assert nodeset.excluded(w.run_dir) == {"node-1": why}
    events = [json.loads(ln) for ln in (Path(w.run_dir) / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "node_unhealthy" and events[-1]["host"] == "node-1"
    from trebuchet.store.states import describe_failure

    assert describe_failure(lost).startswith(why)


def test_treb_check_nodes_locally(treb, tmp_path: Path) -> None:
    """`treb check --nodes N`: the same checks on demand, exit 0 / 1 / 2."""
    ok = treb("check", "--nodes", "2", "--json")
    assert ok.returncode == 0, ok.stderr
    got = json.loads(ok.stdout)
    assert got["ok"] and [n["host"] for n in got["nodes"]] == ["node-0", "node-1"]
    sick = "health_check: '[ \"$NODE_RANK\" != 1 ] || { echo sick; exit 9; }'\n"
    spec = write_spec(tmp_path, f"name: t\ncommand: python3 -c pass\n{sick}")
    bad = treb("check", str(spec), "--nodes", "2")
    assert bad.returncode == 1, bad.stderr
    assert "node 1 node-1: UNHEALTHY" in bad.stdout
    assert "user     FAILED health_check exited with code 9: sick" in bad.stdout
    assert "1 of 2 node(s) unhealthy" in bad.stdout
    for args, said in ((["--nodes", "0"], "at least 1"), (["--nodes", "2", "--on", "ssh"],
                       "--on local or slurm"), ([], "a SPEC (or --nodes N")):  # fmt: skip
        res = treb("check", *args)
        assert res.returncode == 2 and said in res.stderr, res.stderr

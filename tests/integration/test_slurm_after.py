"""`--after` and `notify:` on the real Slurm test cluster.

Why: between two Slurm runs the waiting is Slurm's own (`--dependency` in the sbatch
script, `--kill-on-invalid-dep=yes`), so it only counts if Slurm really holds B until A
succeeded and really ends B when A failed, which treb must then call CANCELLED with the
reason. A local run waiting for a Slurm run polls the index (its supervisor asks the
engine). And the webhooks are sent from the batch step, on a node, with the key from the
submitting environment (sbatch --export=ALL), never from a file.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.integration.slurm_support import slurm_conf, status, streb, wait_for  # noqa: F401
from tests.integration.test_notify import KEY, Receiver

pytestmark = [pytest.mark.integration, pytest.mark.slurm]


def submit(treb, spec: Path, *args: str, env: dict | None = None) -> str:
    res = treb("run", str(spec), *args, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


def gated(tmp_path: Path, name: str = "first") -> tuple[Path, Path]:
    """A Slurm run that ends when the test writes its exit code into `gate`."""
    gate = tmp_path / f"{name}.gate"
    spec = write_spec(tmp_path, f"""\
name: {name}
command: 'while [ ! -e {gate} ]; do sleep 0.2; done; exit "$(cat {gate})"'
""", f"{name}.yaml")  # fmt: skip
    return spec, gate


def test_slurm_holds_b_until_a_succeeded(streb, tmp_path: Path) -> None:
    spec_a, gate = gated(tmp_path)
    spec_b = write_spec(tmp_path, "name: second\ncommand: echo second ran\n", "second.yaml")
    a = submit(streb, spec_a, "--on", "slurm", "--detach")
    job_a = wait_for(streb, a, {"RUNNING"})["backend_id"]
    b = submit(streb, spec_b, "--on", "slurm", "--after", a)
    st = status(streb, b)
    script = (Path(st["run_dir"]) / "submit.sbatch").read_text()
    assert f"#SBATCH --dependency=afterok:{job_a}\n" in script, script
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in script
    st = wait_for(streb, b, {"PENDING"})
    deadline = time.monotonic() + 60  # squeue says Dependency once slurmctld looked at it
    while st["waiting"] is None or st["waiting"].get("reason") != "Dependency":
        assert time.monotonic() < deadline, st
        time.sleep(1)
        st = status(streb, b)
    assert st["state"] == "PENDING" and f"run {a} (first) to succeed" in st["waiting"]["meaning"]
    gate.write_text("0")
    assert wait_for(streb, a, {"SUCCEEDED", "FAILED"})["state"] == "SUCCEEDED"
    st = wait_for(streb, b, {"SUCCEEDED", "FAILED", "CANCELLED", "LOST"})
    assert st["state"] == "SUCCEEDED", st
    assert streb("logs", b).stdout == "second ran\n"


def test_slurm_ends_b_when_a_failed_and_treb_says_why(streb, tmp_path: Path) -> None:
    spec_a, gate = gated(tmp_path)
    spec_b = write_spec(tmp_path, "name: second\ncommand: echo never\n", "second.yaml")
    a = submit(streb, spec_a, "--on", "slurm", "--detach")
    wait_for(streb, a, {"RUNNING"})
    b = submit(streb, spec_b, "--on", "slurm", "--after", f"{a}:ok")
    gate.write_text("3")
    assert wait_for(streb, a, {"SUCCEEDED", "FAILED"})["state"] == "FAILED"
    st = wait_for(streb, b, {"SUCCEEDED", "FAILED", "CANCELLED", "LOST"})
    assert st["state"] == "CANCELLED", st
    assert st["attempts"][0]["reason"] == f"dependency {a} failed", st["attempts"]
    assert not list(Path(st["run_dir"]).glob("attempt-0/rank-*.log"))  # it never ran
    # and a run submitted after A already failed is not even queued
    res = streb("run", str(spec_b), "--on", "slurm", "--after", a)
    assert res.returncode == 1 and f"not submitted: dependency {a} failed" in res.stderr
    st = status(streb, res.stdout.strip())
    assert st["state"] == "CANCELLED" and st["backend_id"] is None, st


def test_a_local_run_waits_for_a_slurm_run(streb, tmp_path: Path) -> None:
    spec_a, gate = gated(tmp_path)
    spec_b = write_spec(tmp_path, "name: here\ncommand: echo here ran\n", "here.yaml")
    a = submit(streb, spec_a, "--on", "slurm", "--detach")
    wait_for(streb, a, {"RUNNING"})
    b = submit(streb, spec_b, "--after", a)  # local: its supervisor polls the index
    assert status(streb, b)["state"] == "PENDING"
    gate.write_text("0")
    # nobody else refreshes A: B's supervisor asks the Slurm engine itself
    deadline = time.monotonic() + 120
    while (st := status(streb, b))["state"] == "PENDING":
        assert time.monotonic() < deadline, st
        time.sleep(1)
    st = wait_for(streb, b, {"SUCCEEDED", "FAILED", "CANCELLED", "LOST"})
    assert st["state"] == "SUCCEEDED", st


def test_webhooks_are_sent_from_the_batch_step(streb, slurm_conf: str, tmp_path: Path) -> None:
    conf = Path(slurm_conf).read_text()
    found = re.search(r"^SlurmctldHost=[^(]+\(([0-9.]+)\)", conf, re.M)
    assert found, conf  # the bridge's address: the nodes reach this machine there
    receiver = Receiver(host="0.0.0.0")
    url = receiver.url.replace("0.0.0.0", found.group(1))
    try:
        spec = write_spec(tmp_path, f"""\
name: hooked
command: echo on the node
notify:
  - url: {url}/slurm
    on: [started, succeeded]
    secret: TREB_TEST_HOOK_KEY
""")  # fmt: skip
        res = streb("run", str(spec), "--on", "slurm", env={"TREB_TEST_HOOK_KEY": KEY})
        assert res.returncode == 0, res.stderr
        st = status(streb)
        assert [b["event"] for b in receiver.got("/slurm")] == ["started", "succeeded"]
        assert all(p["signed"] for p in receiver.posts), receiver.posts
        assert receiver.got("/slurm")[-1]["run_id"] == st["id"]
        assert KEY not in (Path(st["run_dir"]) / "submit.sbatch").read_text()
    finally:
        receiver.close()

"""`treb run B.yaml --after RUN[:ok|:any]` on this machine: B is recorded PENDING with what
it waits for (`treb ps`, `treb status`), its detached supervisor starts it once RUN ended
as asked, or records it CANCELLED with the reason when RUN cannot.

Why: a run that waits must survive the `treb run` that started it, start exactly when
its dependency allows, and never start after a dependency that failed (real runs; the
waits are hang guards, the outcomes are what is asserted). Slurm's side is in
test_slurm_after.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import write_spec

pytestmark = pytest.mark.integration


def status(treb, run: str) -> dict:
    res = treb("status", run, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def wait_end(treb, run: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = status(treb, run)
        if st["state"] not in ("PENDING", "RUNNING", "RETRYING"):
            return st
        assert time.monotonic() < deadline, f"run {run} still {st['state']}: {st}"
        time.sleep(0.3)


def submit(treb, spec: Path, *args: str, env: dict | None = None) -> str:
    res = treb("run", str(spec), *args, env=env)
    assert res.returncode == 0, res.stderr
    return res.stdout.strip().splitlines()[-1]


@pytest.fixture
def specs(tmp_path: Path) -> dict[str, Path]:
    gate = tmp_path / "gate"
    return {
        # the first run ends when the test says so (a file appears), with the given code
        "first": write_spec(
            tmp_path,
            f"""\
name: first
command: 'while [ ! -e {gate} ]; do sleep 0.1; done; exit "$(cat {gate})"'
""",
            "first.yaml",
        ),  # fmt: skip
        "second": write_spec(tmp_path, "name: second\ncommand: echo second ran\n", "second.yaml"),
        "gate": gate,
    }


def test_b_waits_pending_then_starts_when_a_succeeded(treb, specs) -> None:
    a = submit(treb, specs["first"], "--detach")
    b = submit(treb, specs["second"], "--after", a)  # returns at once: B is detached
    st = status(treb, b)
    assert st["state"] == "PENDING" and st["waiting"]["reason"] == f"after {a}"
    shown = treb("status", b).stdout
    assert f"waiting for run {a} (first) to succeed" in shown, shown
    ps = treb("ps").stdout
    assert f"PENDING (after {a})" in ps, ps
    specs["gate"].write_text("0")
    assert wait_end(treb, a)["state"] == "SUCCEEDED"
    st = wait_end(treb, b)
    assert st["state"] == "SUCCEEDED", st
    assert treb("logs", b).stdout == "second ran\n"


def test_b_is_cancelled_with_the_reason_when_a_failed(treb, specs, tmp_path: Path) -> None:
    from tests.integration.test_notify import Receiver

    receiver = Receiver()
    told = write_spec(tmp_path, f"""\
name: told
command: echo never
notify:
  - url: {receiver.url}/told
    on: [started, cancelled]
""", "told.yaml")  # fmt: skip
    a = submit(treb, specs["first"], "--detach")
    ok = submit(treb, told, "--after", f"{a}:ok")
    whatever = submit(treb, specs["second"], "--after", f"{a}:any")
    specs["gate"].write_text("3")
    assert wait_end(treb, a)["state"] == "FAILED"
    st = wait_end(treb, ok)
    assert st["state"] == "CANCELLED" and st["started_at"] is None, st
    assert st["attempts"][0]["reason"] == f"dependency {a} failed", st["attempts"]
    shown = treb("status", ok).stdout
    assert f"before it started: dependency {a} failed" in shown, shown
    assert not (Path(st["run_dir"]) / "attempt-0").exists()  # nothing of it ran
    got = receiver.got("/told")
    receiver.close()
    assert [(b["event"], b["cause"]) for b in got] == [("cancelled", f"dependency {a} failed")]
    assert wait_end(treb, whatever)["state"] == "SUCCEEDED"  # :any starts after any end


def test_several_dependencies_and_an_ended_one(treb, specs, tmp_path: Path) -> None:
    done = submit(treb, specs["second"], "--detach")
    wait_end(treb, done)
    a = submit(treb, specs["first"], "--detach")
    b = submit(treb, specs["second"], "--after", f"{done},{a}:any")
    assert status(treb, b)["state"] == "PENDING"  # `done` ended, `a` not yet
    specs["gate"].write_text("1")
    assert wait_end(treb, b)["state"] == "SUCCEEDED"


def test_a_waiting_run_can_be_cancelled(treb, specs) -> None:
    a = submit(treb, specs["first"], "--detach")
    b = submit(treb, specs["second"], "--after", a)
    res = treb("cancel", b)
    assert res.returncode == 0, res.stderr
    assert status(treb, b)["state"] == "CANCELLED"
    specs["gate"].write_text("0")
    wait_end(treb, a)
    time.sleep(1.5)  # a supervisor still waiting would start B now: it must not
    st = status(treb, b)
    assert st["state"] == "CANCELLED" and st["started_at"] is None


@pytest.mark.parametrize(
    ("after", "why"),
    [("nosuchrun", "no run matches 'nosuchrun'"), ("{a}:maybe", "must be :ok or :any")],
)
def test_a_bad_after_is_refused_before_anything_is_recorded(treb, specs, after, why) -> None:
    a = submit(treb, specs["second"], "--detach")
    wait_end(treb, a)
    res = treb("run", str(specs["second"]), "--after", after.format(a=a))
    assert res.returncode == 2 and why in res.stderr, res.stderr
    assert len(json.loads(treb("ps", "--json").stdout)) == 1

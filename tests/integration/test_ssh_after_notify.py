"""`--after` and `notify:` on the ssh engine (two real sshd hosts): the same job controller
and the same waiting supervisor as locally, with the ranks on the hosts.

Why: the controller's end of the run sends the webhooks on every engine it runs on; over
ssh it is the submitting machine's detached supervisor, which must also wait for a
dependency before it opens any session.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec
from tests.integration.test_notify import KEY, Receiver
from tests.integration.test_ssh_runs import spec, ssh_config  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration


def wait_end(treb, run: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        st = json.loads(treb("status", run, "--json").stdout)
        if st["state"] not in ("PENDING", "RUNNING", "RETRYING"):
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.5)


def test_an_ssh_run_waits_then_notifies(treb, ssh_config: str, tmp_path: Path) -> None:  # noqa: F811
    gate = tmp_path / "gate"
    first = write_spec(tmp_path, f"name: first\ncommand: 'while [ ! -e {gate} ]; do sleep 0.1; "
                       "done'\n", "first.yaml")  # fmt: skip
    res = treb("run", str(first), "--detach")
    assert res.returncode == 0, res.stderr
    a = res.stdout.strip()
    receiver = Receiver()
    try:
        extra = (f"notify:\n  - url: {receiver.url}/ssh\n    on: [started, succeeded]\n"
                 "    secret: TREB_TEST_HOOK_KEY\n")  # fmt: skip
        path = spec(tmp_path, ssh_config, "echo on $(hostname)", extra)
        res = treb("run", str(path), "--on", "ssh", "--after", a,
                   env={"TREB_TEST_HOOK_KEY": KEY})  # fmt: skip
        assert res.returncode == 0, res.stderr
        b = res.stdout.strip()
        assert status_json(treb, b)["state"] == "PENDING"
        assert receiver.posts == []  # nothing started yet
        gate.write_text("")
        st = wait_end(treb, b)
        assert st["state"] == "SUCCEEDED", st
        assert [x["event"] for x in receiver.got("/ssh")] == ["started", "succeeded"]
        assert all(p["signed"] for p in receiver.posts)
    finally:
        receiver.close()

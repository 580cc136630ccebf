"""Issue 28: torchrun's variables under every launcher (runtime/contracts/rank_env.py), a rank's @record
error file in the diagnosis (diagnose/errorfile.py), and trainers that requeue their own
Slurm job: the `scontrol` the ranks find first (runtime/job/selfrequeue.py) and the preflight
warning (preflight/requeue.py). The real runs are in tests/integration/test_torchelastic.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import write_spec
from trebuchet.backends import get_backend
from trebuchet.diagnose import errorfile
from trebuchet.preflight import preflight
from trebuchet.runtime.contracts import rank_env as contract
from trebuchet.runtime.job import selfrequeue
from trebuchet.spec.load import load_spec

STACK = (
    "Traceback (most recent call last):\n"
    '  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, '
    "in wrapper\n    return f(*args, **kwargs)\n           ^^^^^^^^^\n"
    '  File "/code/train.py", line 40, in main\n    step(batch)\n'
    '  File "/code/train.py", line 12, in step\n    loss = model(x)\n'
    '  File "/code/model.py", line 7, in forward\n    raise ValueError("bad shape")\n'
    "ValueError: bad shape\n"
)


def _record(path: Path, data: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_elastic_vars_and_attempt_part() -> None:
    assert contract.elastic_vars("ab12", 3) == {
        "TORCHELASTIC_RUN_ID": "ab12", "TORCHELASTIC_MAX_RESTARTS": "3", "ROLE_NAME": "default",
    }  # fmt: skip
    env = {**contract.elastic_vars("ab12", 3), "TREB_ATTEMPT": "2"}
    got = contract.attempt_elastic_vars(env, "/r/attempt-2", "rank-5")
    assert got == {
        "TORCHELASTIC_ERROR_FILE": "/r/attempt-2/errors/rank-5.json",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
    }
    # srun's ranks (Slurm, native): no run id, so Lightning keeps its SLURMEnvironment; the
    # rest all the same
    srun = {**contract.elastic_vars(None, 1), "TREB_ATTEMPT": "1"}
    assert "TORCHELASTIC_RUN_ID" not in srun and srun["TORCHELASTIC_MAX_RESTARTS"] == "1"
    assert contract.attempt_elastic_vars(srun, "/r/attempt-1", "rank-0")[
        "TORCHELASTIC_ERROR_FILE"] == "/r/attempt-1/errors/rank-0.json"  # fmt: skip
    # torchrun's own count and a user's NCCL setting stay; none of torchrun's: nothing
    env.update(TORCHELASTIC_RESTART_COUNT="0", TORCH_NCCL_ASYNC_ERROR_HANDLING="3")
    got = contract.attempt_elastic_vars(env, "/r/attempt-2", "rank-5")
    assert got["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert got["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
    assert contract.attempt_elastic_vars({"TREB_ATTEMPT": "1"}, "/r/attempt-1", "node-0") == {}
    assert "TORCHELASTIC_USE_AGENT_STORE" not in {**contract.elastic_vars("x", 0), **got}


def test_error_file_message_and_last_frames(tmp_path: Path) -> None:
    path = _record(Path(contract.error_file(str(tmp_path), "rank-3")), {"message": {
        "message": "ValueError: bad shape",
        "extraInfo": {"py_callstack": STACK, "timestamp": "1764680000"}}})  # fmt: skip
    err = errorfile.for_rank(tmp_path, 3)
    assert err is not None
    assert err.message == "ValueError: bad shape" and err.file == str(path)
    assert err.timestamp == 1764680000
    assert err.frames == [  # the last three; @record's own wrapper frame left out
        "/code/train.py:40 in main: step(batch)",
        "/code/train.py:12 in step: loss = model(x)",
        '/code/model.py:7 in forward: raise ValueError("bad shape")',
    ]
    assert errorfile.for_rank(tmp_path, 4) is None


@pytest.mark.parametrize("content", [
    b"", b"not json", b"[1, 2]", b'{"message": 7}', b'{"message": {"message": ""}}',
    b"[" * 100_000, b"{\"message\": \"" + b"x" * (2 << 20) + b"\"}",
])  # fmt: skip
def test_error_file_that_is_not_torchs_is_ignored(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "errors" / "rank-0.json"
    path.parent.mkdir()
    path.write_bytes(content)
    assert errorfile.read(path) is None


def test_error_file_hostile_values_are_shown_not_obeyed(tmp_path: Path) -> None:
    msg = "RuntimeError: \x1b[2Jboom\x00" + "y" * 5000
    path = _record(tmp_path / "e.json", {"message": {"message": msg, "extraInfo": {
        "py_callstack": 12, "timestamp": "9" * 5000}}})  # fmt: skip
    err = errorfile.read(path)
    assert err is not None and err.frames == [] and err.timestamp is None
    assert "\x1b" not in err.message and "\\x1b[2Jboom\\x00" in err.message
    assert len(err.message) <= errorfile.MESSAGE_MAX
    os.unlink(path)
    os.mkfifo(path)  # a FIFO in its place never blocks the diagnosis
    assert errorfile.read(path) is None
    plain = _record(tmp_path / "p.json", {"message": "ValueError: two\nlines"})
    assert errorfile.read(plain).message == "ValueError: two | lines"  # type: ignore[union-attr]


def _shim(tmp_path: Path) -> tuple[Path, dict[str, str], Path]:
    """The shim installed in a run dir, with a stand-in for the real scontrol that logs its
    arguments (the real one is exercised on the Slurm test cluster)."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    log = tmp_path / "real.log"
    real = real_dir / "scontrol"
    real.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    real.chmod(0o755)
    run_dir = tmp_path / "run dir"
    run_dir.mkdir()
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{real_dir}:{old}"
    try:
        found = selfrequeue.install(str(run_dir))
        path = os.environ["PATH"]
    finally:
        os.environ["PATH"] = old
    assert found == str(real) and path.startswith(f"{run_dir}/bin:")
    env = {"PATH": path, "SLURM_JOB_ID": "41", "RANK": "0"}
    return run_dir, env, log


def test_scontrol_requeue_of_this_job_becomes_a_request(tmp_path: Path) -> None:
    run_dir, env, log = _shim(tmp_path)
    res = subprocess.run(["scontrol", "requeue", "41"], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and "handed to trebuchet's job controller" in res.stderr
    assert not log.exists()  # the real scontrol was not asked
    who = selfrequeue.asked(str(run_dir))
    assert who is not None and who.startswith("rank 0 on ")
    assert selfrequeue.asked(str(run_dir)) is None  # taken once
    for args in (["requeue", "42"], ["show", "hostnames", "tn[1-2]"], ["requeue"]):
        assert subprocess.run(["scontrol", *args], env=env).returncode == 0
    assert log.read_text().splitlines() == ["requeue 42", "show hostnames tn[1-2]", "requeue"]
    assert selfrequeue.asked(str(run_dir)) is None
    array = {**env, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}
    assert subprocess.run(["scontrol", "requeue", "40_3"], env=array).returncode == 0
    assert selfrequeue.asked(str(run_dir)) is not None


PREFLIGHT_ENV = {"PATH": "/nonexistent", "HOME": "/home/alice", "TREB_HOME": "/shared/treb"}


def _findings(tmp_path: Path, script: str, spec: str, backend: str = "slurm") -> list:
    (tmp_path / "proj").mkdir(exist_ok=True)
    (tmp_path / "proj" / "train.py").write_text(script)
    path = write_spec(tmp_path / "proj", "command: python train.py\n" + spec)
    loaded = load_spec(path, (), environ=PREFLIGHT_ENV)
    found = preflight(loaded, get_backend(backend), environ=PREFLIGHT_ENV)
    return [f for f in found if f.id == "trainer-requeues-itself"]


LIGHTNING = "import lightning as L\n\ntrainer = L.Trainer(devices=2)\n"


def test_preflight_names_a_trainer_that_requeues_itself(tmp_path: Path) -> None:
    both = _findings(tmp_path, LIGHTNING, "procs_per_node: 2\n")
    assert [f.where.rsplit(":", 1)[1] for f in both] == ["1", "1"]  # defaults: the command
    assert "SIGUSR1" in both[0].message and "checkpoint_signal: SIGUSR1" in both[0].fix
    assert "retries: 0" in both[1].message
    good = "checkpoint_signal: SIGUSR1\nretries: 2\n"
    assert _findings(tmp_path, LIGHTNING, good) == []
    usr2 = _findings(tmp_path, LIGHTNING, "retries: 1\ncheckpoint_signal: SIGUSR2\n")
    assert len(usr2) == 1 and usr2[0].where.endswith(":3")  # the field that says it
    pl = "import pytorch_lightning as pl\nfrom pytorch_lightning.plugins.environments import " \
         "SLURMEnvironment\nenv = SLURMEnvironment(requeue_signal=signal.SIGUSR2)\n"  # fmt: skip
    assert _findings(tmp_path, pl, "checkpoint_signal: SIGUSR2\nretries: 1\n") == []
    off = LIGHTNING + "plugins = [SLURMEnvironment(auto_requeue=False)]\n"
    assert _findings(tmp_path, off, "") == []
    assert _findings(tmp_path, LIGHTNING, "", backend="local") == []  # no Slurm, no requeue
    assert _findings(tmp_path, "import torch\n", "") == []
    sub = _findings(tmp_path, "import submitit\n", "retries: 1\ncheckpoint_signal: SIGUSR1\n")
    assert len(sub) == 1 and "SIGUSR2" in sub[0].message

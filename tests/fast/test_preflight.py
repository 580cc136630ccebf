"""Preflight checks: one spec per finding (id, severity, file:line, silenced by ignore_checks).

Checks run against a controlled environment: HOME, TREB_HOME and PATH are the test's, so
the real machine's sinfo or home never decide a result (except in the Slurm-cluster test).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_spec
from trebuchet.backends import get_backend
from trebuchet.backends.slurm import checks as partition_mod
from trebuchet.cli.main import main
from trebuchet.errors import SpecError
from trebuchet.preflight import CHECKS, enforce, preflight
from trebuchet.spec.load import load_spec

SINFO_ROWS = "gpu*|4|gpu:a100:8(S:0-1)\nmixed|2|gpu:8\nmixed|4|gpu:4\ncpu|10|(null)\n"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A submitting environment: a home that is not under /tmp, a shared TREB_HOME, no sinfo."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return {"PATH": str(bin_dir), "HOME": "/home/alice", "TREB_HOME": "/shared/treb"}


def fake_sinfo(env: dict[str, str], body: str) -> None:
    exe = Path(env["PATH"]) / "sinfo"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def printf(text: str) -> str:
    """A shell builtin that prints `text` (PATH holds nothing but the fake sinfo)."""
    return f"printf '%s' '{text}'"


def run_checks(tmp_path: Path, text: str, backend: str, env: dict, overrides=()) -> tuple:
    path = write_spec(tmp_path / "proj", text)
    loaded = load_spec(path, overrides, environ=env)
    return preflight(loaded, get_backend(backend), environ=env), str(path)


# (finding id, spec text, backend, extra environment, severity, line of the finding)
CASES = [
    ("node-local-cache", "command: python t.py\nnodes: 2\nenv:\n  HF_HOME: /tmp/hf\n",
     "slurm", {}, "warning", 4),
    ("node-local-cache", "command: python t.py\nnodes: 2\nenv:\n  A: 1\n  NEMO_HOME: ~/.cache/nemo\n",
     "slurm", {}, "warning", 5),
    ("node-local-cache", "command: python t.py\nnodes: 2\nenv:\n  DATA: /shared/d:/dev/shm/x\n",
     "skypilot", {}, "warning", 4),
    ("node-local-cache", "command: python t.py\nnodes: 2\nenv:\n  X: 1\n",
     "slurm", {"HF_DATASETS_CACHE": "/home/alice/.cache/ds"}, "warning", 3),
    ("node-local-cache", "command: python t.py\nnodes: 2\nenvironment:\n  image: img\n"
     "  mounts: ['/lustre:/lustre']\nenv:\n  HF_HOME: /root/.cache/huggingface\n",
     "slurm", {}, "warning", 7),
    ("node-local-workdir", "command: python t.py\nworkdir: .\nsnapshot: false\n",
     "slurm", {"HOME": "@proj-parent"}, "warning", 2),
    ("node-local-treb-home", "command: python t.py\n", "slurm",
     {"TREB_HOME": "/tmp/treb"}, "warning", 1),
    ("mount-missing", "command: python t.py\nenvironment:\n  image: img\n  mounts:\n"
     "    - /no/such/treb-dir:/data\n", "local", {}, "error", 5),
    ("secret-unset", "command: python t.py\nsecrets:\n  - HF_TOKEN\n  - WANDB_KEY\n",
     "local", {"HF_TOKEN": "x"}, "error", 4),
    ("time-limit-short", "command: python t.py\ntimeout: 30s\n", "local", {}, "warning", 2),
    ("time-limit-short", "command: python t.py\ntimeout: 10m\ntimeout_warning: 9m30s\n",
     "local", {}, "warning", 2),
    ("time-limit-short", "command: python t.py\ntimeout_warning: 5m\nslurm:\n  time: '00:08:00'\n",
     "slurm", {}, "warning", 4),
    ("time-limit-short", "command: python t.py\ntimeout: 2h\nslurm:\n  time: '0:50'\n",
     "slurm", {}, "warning", 4),
    ("partition-too-small", "command: python t.py\nnodes: 5\ngpus_per_node: 8\n",
     "slurm", {"sinfo": SINFO_ROWS}, "error", 2),
    ("partition-too-small", "command: python t.py\ngpus_per_node: 16\nslurm:\n  partition: gpu\n",
     "slurm", {"sinfo": SINFO_ROWS}, "error", 2),
    ("partition-too-small", "command: python t.py\nnodes: 3\ngpus_per_node: 8\n"
     "slurm:\n  partition: mixed\n", "slurm", {"sinfo": SINFO_ROWS}, "error", 2),
    ("partition-too-small", "command: python t.py\ngpus_per_node: 1\n"
     "slurm:\n  sbatch_args: [-p, cpu]\n", "slurm", {"sinfo": SINFO_ROWS}, "error", 2),
    ("unknown-partition", "command: python t.py\nslurm:\n  partition: gpus\n",
     "slurm", {"sinfo": SINFO_ROWS}, "warning", 3),
    ("parallel-size-mismatch", "command: >-\n  python pretrain_gpt.py\n"
     "  --tensor-model-parallel-size 4 --pipeline-model-parallel-size=3\n"
     "nodes: 2\nprocs_per_node: 8\n", "local", {}, "error", 1),
    ("parallel-size-mismatch", "nodes: 3\nprocs_per_node: 2\n"
     "command: python run.py model.tensor_model_parallel_size=4\n", "slurm", {}, "error", 3),
    ("parallel-size-mismatch", "nodes: 1\nprocs_per_node: 8\nenv:\n  TP: 3\n"
     "command: python t.py --tp ${TP} --cp 1\n", "local", {}, "error", 5),
    ("parallel-size-mismatch", "nodes: 1\nprocs_per_node: 8\n"
     "command: python t.py --tensor-model-parallel-size 2 --expert-model-parallel-size 3\n",
     "local", {}, "error", 3),
    ("parallel-size-mismatch", "launcher: none\nnodes: 2\n"
     "command: torchrun --nnodes 2 --nproc_per_node 6 t.py --pipeline-model-parallel-size 8\n",
     "slurm", {}, "error", 3),
    ("torchrun-nnodes-mismatch", "launcher: none\nnodes: 2\n"
     "command: torchrun --nnodes=4 --nproc_per_node=8 t.py\n", "slurm", {}, "error", 3),
    ("launcher-in-command", "procs_per_node: 8\ncommand: torchrun --nproc_per_node=8 t.py\n",
     "slurm", {}, "error", 2),
    ("launcher-in-command", "command: uv run python -m torch.distributed.run t.py\n",
     "local", {}, "warning", 1),
    ("launcher-in-command", "procs_per_node: 2\ncommand: bash train.sh\n",
     "slurm", {"script": "#!/bin/bash\n# comment\nexec torchrun --nproc_per_node 2 t.py\n"},
     "error", 2),
    ("launcher-in-torchrun", "launcher: torchrun\nprocs_per_node: 4\n"
     "command: [torchrun, --nproc_per_node, '4', t.py]\n", "local", {}, "error", 3),
    ("no-launcher-for-procs", "launcher: none\nprocs_per_node: 4\ncommand: python t.py\n",
     "slurm", {}, "warning", 1),
]  # fmt: skip


def _prepare(tmp_path: Path, env: dict, extra: dict) -> dict:
    extra = dict(extra)
    if "sinfo" in extra:
        fake_sinfo(env, printf(extra.pop("sinfo")))
    if "script" in extra:
        (tmp_path / "proj").mkdir(exist_ok=True)
        (tmp_path / "proj" / "train.sh").write_text(extra.pop("script"))
    if extra.get("HOME") == "@proj-parent":  # the workdir under ~/.cache: node-local
        home = tmp_path.resolve() / "home"
        extra["HOME"] = str(home)
        return {**env, **extra, "_spec_dir": str(home / ".cache" / "proj")}
    return {**env, **extra}


def _run_case(tmp_path: Path, text: str, backend: str, env: dict) -> tuple:
    spec_dir = env.pop("_spec_dir", None)
    path = write_spec(Path(spec_dir) if spec_dir else tmp_path / "proj", text)
    loaded = load_spec(path, (), environ=env)
    return preflight(loaded, get_backend(backend), environ=env), str(path)


@pytest.mark.parametrize(
    "check_id,text,backend,extra,severity,line", CASES,
    ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)],
)  # fmt: skip
def test_each_finding_has_id_severity_line_and_can_be_silenced(
    tmp_path, env, check_id, text, backend, extra, severity, line
) -> None:
    full = _prepare(tmp_path, env, extra)
    findings, path = _run_case(tmp_path, text, backend, dict(full))
    mine = [f for f in findings if f.id == check_id]
    assert mine, f"no {check_id} in {findings}"
    f = mine[0]
    assert (f.severity, f.where) == (severity, f"{path}:{line}")
    assert f.message and f.fix and check_id in CHECKS
    silenced, _ = _run_case(tmp_path, text + f"ignore_checks: [{check_id}]\n", backend, dict(full))
    assert check_id not in {x.id for x in silenced}
    assert "unknown-check-id" not in {x.id for x in silenced}


# Specs that must not be reported (each would be a false alarm users learn to silence).
CLEAN = [
    ("node-local cache, one node", "command: x\nenv:\n  HF_HOME: /tmp/hf\n", "slurm"),
    ("node-local cache, local backend", "command: x\nnodes: 2\nenv:\n  HF_HOME: /tmp/hf\n", "local"),
    ("compile cache local by design", "command: x\nnodes: 2\nenv:\n  TRITON_CACHE_DIR: /tmp/t\n  TMPDIR: /tmp\n", "slurm"),
    ("shared paths", "command: x\nnodes: 2\nenv:\n  HF_HOME: /lustre/hf\n  NEMO_HOME: /home/alice/nemo\n", "slurm"),
    ("mounted cache", "command: x\nnodes: 2\nenvironment:\n  image: i\n  mounts: ['/usr:/root/.cache/huggingface']\nenv:\n  HF_HOME: /root/.cache/huggingface\n", "slurm"),
    ("image code path", "command: x\nnodes: 2\nenvironment:\n  image: i\nenv:\n  PYTHONPATH: /opt/Megatron-LM\n", "slurm"),
    ("long timeout", "command: x\ntimeout: 2h\n", "local"),
    ("slurm minutes", "command: x\ntimeout: 10s\nslurm:\n  time: '30'\n", "slurm"),
    ("slurm unlimited", "command: x\nslurm:\n  time: UNLIMITED\n", "slurm"),
    ("slurm time on local", "command: x\nslurm:\n  time: '0:30'\n", "local"),
    ("default warning, 2 minutes", "command: x\ntimeout: 2m\n", "local"),
    ("sizes divide", "command: python t.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 2\nnodes: 2\nprocs_per_node: 8\n", "local"),
    ("size unknown", "command: python t.py --tensor-model-parallel-size $TP\nprocs_per_node: 2\n", "local"),
    ("launcher none with torchrun", "launcher: none\nnodes: 2\ngpus_per_node: 0\ncommand: torchrun --nnodes $NUM_NODES --nproc_per_node 8 t.py\n", "slurm"),
    ("deepspeed flag is not a launcher", "command: python t.py --deepspeed ds.json\nprocs_per_node: 2\n", "local"),
    ("launcher none, one process (JAX)", "launcher: none\ngpus_per_node: 0\ncommand: python t.py\n", "slurm"),
    ("torchrun launcher, plain command", "launcher: torchrun\nprocs_per_node: 2\ncommand: python t.py\n", "local"),
    ("partition fits", "command: x\nnodes: 4\ngpus_per_node: 8\nslurm:\n  partition: gpu\n", "slurm"),
]  # fmt: skip


@pytest.mark.parametrize("what,text,backend", CLEAN, ids=[c[0] for c in CLEAN])
def test_sound_specs_have_no_findings(tmp_path, env, what, text, backend) -> None:
    fake_sinfo(env, printf(SINFO_ROWS))
    findings, _ = run_checks(tmp_path, text, backend, env)
    assert findings == []


def test_workdir_missing_after_loading(tmp_path, env) -> None:
    path = write_spec(tmp_path / "proj", "command: x\nworkdir: code\n")
    (tmp_path / "proj" / "code").mkdir()
    loaded = load_spec(path, (), environ=env)
    (tmp_path / "proj" / "code").rmdir()
    [f] = preflight(loaded, get_backend("local"), environ=env)
    assert (f.id, f.severity, f.where) == ("workdir-missing", "error", f"{path}:2")


def test_unknown_ignore_id_is_reported_and_can_itself_be_silenced(tmp_path, env) -> None:
    text = "command: x\nignore_checks:\n  - node-local-cahce\n"
    [f] = run_checks(tmp_path, text, "local", env)[0]
    assert (f.id, f.severity) == ("unknown-check-id", "warning")
    assert f.where.endswith(":3") and "node-local-cahce" in f.message
    text += "  - unknown-check-id\n"
    assert run_checks(tmp_path, text, "local", env)[0] == []


def test_override_is_named_as_the_source(tmp_path, env) -> None:
    findings, _ = run_checks(tmp_path, "command: x\nenv:\n  HF_HOME: /tmp/hf\n", "slurm", env,
                             ["nodes=2"])  # fmt: skip
    assert [f.where for f in findings] == [f"{tmp_path / 'proj' / 'job.yaml'}:3"]
    findings, _ = run_checks(tmp_path, "command: x\nnodes: 2\n", "slurm", env,
                             ["env.UV_CACHE_DIR=/var/tmp/uv"])  # fmt: skip
    assert [(f.id, f.where) for f in findings] == [
        ("node-local-cache", "-o env.UV_CACHE_DIR=/var/tmp/uv")
    ]


@pytest.mark.parametrize(
    "body",
    ["exit 1", "echo 'garbage without pipes'", "while :; do :; done"],
    ids=["fails", "garbage", "hangs"],
)
def test_sinfo_trouble_gives_no_finding(tmp_path, env, monkeypatch, body) -> None:
    monkeypatch.setattr(partition_mod, "SINFO_TIMEOUT_S", 0.5)
    fake_sinfo(env, body)
    assert run_checks(tmp_path, "command: x\nnodes: 50\n", "slurm", env)[0] == []


def test_without_sinfo_there_is_no_capacity_finding(tmp_path, env) -> None:
    assert run_checks(tmp_path, "command: x\nnodes: 50\n", "slurm", env)[0] == []


def test_gres_parsing() -> None:
    gg = partition_mod.gres_gpus
    assert gg("(null)") == 0
    assert gg("gpu:8") == 8 and gg("gpu:a100:8(S:0-1)") == 8
    assert gg("gpu:a100:4(S:0,1),gpu:v100:2(S:1)") == 6
    assert gg("gpu:tesla:2,mps:200") == 2


def _cluster_env() -> dict[str, str] | None:
    script = REPO / "tests" / "slurm_cluster" / "cluster.sh"
    try:
        ok = subprocess.run([str(script), "status"], capture_output=True, timeout=20)
        out = subprocess.run([str(script), "env"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if ok.returncode != 0 or out.returncode != 0:
        return None
    env = dict(os.environ)
    for line in out.stdout.splitlines():
        key, sep, value = line.removeprefix("export ").partition("=")
        if sep:
            env[key.strip()] = value.strip().strip("'\"")
    return env


@pytest.mark.integration  # `make test` runs it with the cluster up (not in its first part)
@pytest.mark.slurm
def test_real_slurm_cluster_partition(tmp_path) -> None:
    """Read-only against the 2-node test cluster (tests/slurm_cluster), when it is up."""
    env = _cluster_env()
    if env is None:
        pytest.skip("the Slurm test cluster is not up (tests/slurm_cluster/cluster.sh up)")
    env["TREB_HOME"] = "/shared/treb"
    found, _ = run_checks(tmp_path, "command: x\nnodes: 3\n", "slurm", env)
    [f] = [f for f in found if f.id == "partition-too-small"]
    assert "only 2 node(s)" in f.message and f.where.endswith("job.yaml:2")
    found, _ = run_checks(tmp_path, "command: x\nnodes: 2\n", "slurm", env)
    assert "partition-too-small" not in {f.id for f in found}


def _cli(tmp_path, monkeypatch, capsys, text: str, *args: str) -> tuple[int, str]:
    path = write_spec(tmp_path / "cli", text)
    monkeypatch.setenv("TREB_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))  # no sinfo, no sbatch
    code = main(["check", str(path), *args])
    return code, capsys.readouterr().out


def test_cli_json(tmp_path, monkeypatch, capsys) -> None:
    text = "command: torchrun t.py\nprocs_per_node: 2\ntimeout: 20s\n"
    code, out = _cli(tmp_path, monkeypatch, capsys, text, "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["backend"] == "local"
    assert (data["errors"], data["warnings"]) == (1, 1)
    assert [(f["id"], f["severity"]) for f in data["findings"]] == [
        ("launcher-in-command", "error"), ("time-limit-short", "warning")]  # fmt: skip
    assert set(data["findings"][0]) == {"id", "severity", "message", "fix", "where"}
    assert data["findings"][0]["where"].endswith("job.yaml:1")


def test_cli_exit_codes(tmp_path, monkeypatch, capsys) -> None:
    code, out = _cli(tmp_path, monkeypatch, capsys, "command: x\ntimeout: 20s\n")
    assert code == 0 and "[time-limit-short]" in out and "1 warning" in out
    code, out = _cli(tmp_path, monkeypatch, capsys, "command: x\n")
    assert code == 0 and "no problems found" in out
    code, out = _cli(tmp_path, monkeypatch, capsys, "command: torchrun x\nprocs_per_node: 2\n")
    assert code == 1 and "error" in out and "fix:" in out
    code, out = _cli(tmp_path, monkeypatch, capsys, "command: x\nslurm:\n  partition: p\n")
    assert code == 0 and "`--on slurm` adds the checks" in out
    assert _cli(tmp_path, monkeypatch, capsys, "command: x\nnodes: zero\n")[0] == 2
    assert _cli(tmp_path, monkeypatch, capsys, "command: x\n", "--on", "nowhere")[0] == 2


def test_cli_reports_what_the_backend_refuses(tmp_path, monkeypatch, capsys) -> None:
    text = "command: x\nlauncher: mpirun\n"  # the local backend refuses mpirun
    code, out = _cli(tmp_path, monkeypatch, capsys, text, "--json")
    [f] = json.loads(out)["findings"]
    assert code == 1 and f["id"] == "backend-refuses" and f["where"].endswith("job.yaml:2")


def test_check_imports_neither_torch_nor_rich(tmp_path) -> None:
    path = write_spec(tmp_path, "command: x\n")
    probe = (
        "import json, sys\nfrom trebuchet.cli.main import main\n"
        f"main(['check', {str(path)!r}])\n"
        "print(json.dumps([m for m in ('torch', 'rich') if m in sys.modules]))"
    )
    env = {**os.environ, "TREB_HOME": str(tmp_path / "home")}
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=env, check=True)  # fmt: skip
    assert json.loads(res.stdout.strip().splitlines()[-1]) == []


def test_enforce_returns_warnings_and_refuses_errors(tmp_path, env, capsys) -> None:
    """What `treb run` does with the findings (before anything is recorded): the runner
    hands each warning to the CLI, which prints it; an error stops everything (exit 2)."""
    from trebuchet import runner
    from trebuchet.cli.run_cmd import warn

    path = write_spec(tmp_path / "proj", "command: python t.py\ntimeout: 20s\n")
    found = enforce(load_spec(path, (), environ=env), get_backend("local"), env)
    assert [f.id for f in found] == ["time-limit-short"]
    checked = runner.check(path, "local", warn=warn)
    assert checked.warnings == [found[0].text()]
    err = capsys.readouterr().err
    assert err.startswith(f"treb: {path}:2: warning: ") and "treb:   fix: " in err
    path = write_spec(
        tmp_path / "proj", "command: torchrun t.py\nprocs_per_node: 2\ntimeout: 20s\n"
    )
    with pytest.raises(SpecError) as exc:
        enforce(load_spec(path, (), environ=env), get_backend("local"), env)
    assert exc.value.exit_code == 2 and "[time-limit-short]" not in str(exc.value)
    first, fix, last = exc.value.problems
    assert first.startswith(f"{path}:1: error: ") and first.endswith("[launcher-in-command]")
    assert fix.startswith("  fix: ") and "nothing was started" in last and "--no-check" in last


def test_docs_table_lists_every_check() -> None:
    doc = (REPO / "docs" / "preflight.md").read_text()
    for check_id in [*CHECKS, "backend-refuses"]:
        assert f"| `{check_id}` |" in doc, check_id


def test_parallel_message_names_the_sizes_and_a_shape_that_fits(tmp_path, env) -> None:
    text = ("command: python p.py --tensor-model-parallel-size 4 --pipeline-model-parallel-size 3\n"
            "nodes: 2\nprocs_per_node: 8\n")  # fmt: skip
    [f] = run_checks(tmp_path, text, "local", env)[0]
    assert "TP 4 x PP 3 = 12 does not divide the world size 16 (2 node(s) x 8)" in f.message
    assert "a multiple of 12 (e.g. nodes: 3)" in f.fix
    [f] = run_checks(tmp_path, "command: python p.py --tp 3\nprocs_per_node: 2\n", "local", env)[0]
    assert "TP 3 does not divide the world size 2 (1 node(s) x 2)" in f.message

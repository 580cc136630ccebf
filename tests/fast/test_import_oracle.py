"""`treb import sbatch` with bash as the oracle (issue 24): each script of the corpus
(tests/fixtures/sbatch: minimal scripts for each construct, and reproductions of public
multi-node scripts, named in each file's header) imports, renders to a batch script bash
accepts, and gives the ranks the arguments the script gave them; the sandbox contains the
script; hostile files get a named error."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trebuchet.cli.main import main
from trebuchet.spec.load import load_spec

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "sbatch"
SEEDS = Path(__file__).resolve().parent.parent / "fixtures" / "import"
SCRIPTS = sorted(CORPUS.glob("*.sbatch")) + sorted(SEEDS.glob("*.sbatch"))
HOME = os.environ.get("HOME", "/root")

# What probe.py receives in each rank: the argv the original script gives its program
# (worked out by hand from bash's rules, not from the importer), and the launcher.
EXPECTED = {
    "array-oneline": ("native", ["--total_epochs", "500", "--save_every", "50", "--name", "two words"]),
    "array-multiline-torchrun": ("torchrun", ["--total_epochs", "500", "--save_every", "50",
                                 "--batch_size", "32", "--checkpoint_path", "./snapshot.pt"]),
    "hostnames-arith": ("torchrun", ["50", "10", "--grad-acc", "8"]),
    "default-expansion": ("native", ["--model", "llama 3", "--lr", "3e-4", "--out", f"{HOME}/out"]),
    "conditional-export": ("native", ["--mode", "multi"]),
    "heredoc-read": ("native", ["--epochs", "3", "--tag", "a b"]),
    "heredoc-cat": ("native", ["--prompt", "hello world", "--n", "2"]),
    "quoted-args": ("native", ["--data", "/data/my set", "--json", '{"a": [1, 2]}', "--empty", "",
                    "--price", "$5", "--name", "run one", "plain"]),
    "venv-torchrun": ("torchrun", ["--cfg", "a.yaml"]),
    "chdir-dollar": ("native", ["--here"]),
    "container-array": ("native", ["--steps", "10"]),
    "deepspeed-env": ("native", ["--deepspeed", "--deepspeed_config", "ds_config.json",
                      "--local_rank", "0"]),
    "tee-pipefail": ("native", ["--log", "logs/train_4242.log"]),
    "megatron-gpt-args": ("torchrun", ["--num-layers", "24", "--hidden-size", "1024",
                          "--num-attention-heads", "16", "--seq-length", "1024", "--lr",
                          "0.00015", "--log-interval", "100", "--save-interval", "10000",
                          "--save", "/ckpt/gpt"]),
    "nanotron-style": ("torchrun", ["--config-file", "examples/config_tiny_llama.yaml"]),
    "torchtitan-multinode": ("torchrun", ["--job.config_file", "./train_configs/llama3_8b.toml"]),
}  # fmt: skip


def do_import(capsys, path: Path, tmp_path: Path) -> tuple[dict, list[str], Path]:
    code = main(["import", "sbatch", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.err
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(out.out)
    return yaml.safe_load(out.out), out.err.splitlines(), spec_path


def probe_argv(command: str, env: dict[str, str] | None, tmp_path: Path) -> list[str]:
    """The argv the imported command gives the program, as the node's bash would run it
    (python replaced by a function that writes what follows the script's name; a leading
    `cd DIR &&` into a cluster directory skipped)."""
    out = tmp_path / "argv"
    fn = 'python() { [[ $1 == -u ]] && shift; shift; printf "%s\\0" "$@" >"$ARGV_OUT"; exit 0; }\n'
    command = re.sub(r"^cd '[^']*' && ", "", command)
    command = re.sub(r"(^|&& |\n)\S*/python ", r"\1python ", command)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "4242", "SLURM_LOCALID": "0",
           **(env or {}), "ARGV_OUT": str(out)}  # fmt: skip
    subprocess.run(["bash", "-c", fn + command], capture_output=True, env=env, timeout=30)
    return out.read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_every_script_imports_and_renders_to_bash_that_parses(
    script: Path, capsys, tmp_path, monkeypatch
) -> None:
    for secret in ("HF_TOKEN", "GH_TOKEN", "WANDB_API_KEY"):
        monkeypatch.setenv(secret, "x")
    data, err, spec_path = do_import(capsys, script, tmp_path)
    for line in err:  # every note names the file, and never a sandbox marker or path
        assert line.startswith(f"treb import: {script}"), line
        assert "TREBSECRET" not in line and "TREB^PH" not in line, line
    assert main(["render", str(spec_path), "--on", "slurm"]) == 0
    rendered = capsys.readouterr().out.split("\n# ---- ", 1)[0]
    for text in [rendered, data["command"], *data.get("slurm", {}).get("setup", [])]:
        check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        assert check.returncode == 0, (text, check.stderr)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_ranks_get_the_arguments_the_script_gave(name: str, capsys, tmp_path) -> None:
    data, err, spec_path = do_import(capsys, CORPUS / f"{name}.sbatch", tmp_path)
    launcher, want = EXPECTED[name]
    assert data["launcher"] == launcher
    load_spec(spec_path, environ={})  # loads with nothing from the submitting shell
    assert probe_argv(data["command"], data.get("env"), tmp_path) == want


def test_each_construct_as_the_script_meant_it(capsys, tmp_path) -> None:
    def imp(name: str) -> tuple[dict, list[str]]:
        data, err, _ = do_import(capsys, CORPUS / f"{name}.sbatch", tmp_path)
        return data, err

    data, err = imp("array-multiline-torchrun")  # torchrun flags from an array
    assert data["procs_per_node"] == 2 and data["nodes"] == 2
    assert data["env"] == {"IMP_LOGLEVEL": "INFO"}
    data, err = imp("conditional-export")  # only the branch the allocation takes
    assert data["env"] == {"IMP_MODE": "multi", "IMP_NCCL_IB_DISABLE": "1"}
    data, err = imp("venv-torchrun")  # the venv's python, not the one on PATH
    assert data["command"] == "./venv/bin/python probe.py --cfg a.yaml"
    assert data["slurm"]["setup"] == ["source ./venv/bin/activate"]
    assert any(":6: note: source ./venv/bin/activate: not a file" in e for e in err)
    data, err = imp("container-array")  # container flags from an array, $HOME expanded
    assert data["environment"] == {
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "mounts": [f"{HOME}/data:/data", "/fsx:/fsx"],
    }
    assert any("--no-container-mount-home" in e and "not carried over" in e for e in err)
    Path("/tmp/treb-import-pwned").unlink(missing_ok=True)
    data, err = imp("chdir-dollar")  # never evaluated: a quoted literal directory
    assert data["command"].startswith("cd '/tmp/$(touch${IFS}/tmp/treb-import-pwned)/x' && ")
    assert not Path("/tmp/treb-import-pwned").exists()
    data, err = imp("accelerate-launcher")  # one task per node starting its own launcher
    assert data["launcher"] == "none" and data["gpus_per_node"] == 4
    argv = shlex.split(data["command"])
    assert argv[:3] == ["accelerate", "launch", "--num_processes"] and argv[3] == "8"
    assert '--main_process_ip "${MASTER_ADDR}"' in data["command"]
    assert any(":14: not carried over: LAUNCHER=" in e for e in err)
    data, err = imp("deepspeed-env")
    assert data["master_port"] == 29512 and "MASTER_ADDR" not in data.get("env", {})
    assert any(":6: not carried over: MASTER_ADDR=" in e for e in err)
    data, err = imp("tee-pipefail")  # mkdir kept for the batch script, echo after named
    assert data["slurm"]["setup"] == ["mkdir -p logs"]
    assert any(":9: not carried over: echo done (after the main srun)" in e for e in err)
    data, err = imp("torchtitan-multinode")
    assert data["procs_per_node"] == 8 and data["nodes"] == 4
    assert data["slurm"]["setup"] == ["dcgmi profile --pause"]
    assert any(":31: not carried over: dcgmi profile --resume" in e for e in err)
    data, err = imp("nanotron-style")
    assert data["slurm"]["setup"] == ["module load cuda/12.1", "conda activate nanotron"]
    assert any("--max-restarts=0" in e and "not carried over" in e for e in err)
    assert any("--tee=3" in e and "not carried over" in e for e in err)
    data, err = imp("no-srun-mpirun")
    assert data["launcher"] == "none" and "mpirun -np $SLURM_NTASKS" in data["command"]


def test_a_variable_the_script_sets_is_never_reported_unset(capsys, tmp_path) -> None:
    for script in SCRIPTS:
        code = main(["import", "sbatch", str(script)])
        err = capsys.readouterr().err
        assert code == 0, err
        for ref in re.findall(r"\$(\w+) is not set by the script", err):
            text = script.read_text()
            assert not re.search(rf"(^|[\s;(]|export |declare -a )({ref})=", text, re.M), (
                script,
                ref,
            )


def test_a_command_that_expands_to_nothing_is_refused(capsys, tmp_path) -> None:
    for body in ('cmd=""\nsrun bash -c "${cmd}"\n', "EMPTY=\nsrun $EMPTY\n"):
        script = tmp_path / "empty.sbatch"
        script.write_text("#!/bin/bash\n#SBATCH --nodes=1\n" + body)
        assert main(["import", "sbatch", str(script)]) == 2
        err = capsys.readouterr().err
        assert re.search(r"empty.sbatch:4: .*(expands to nothing|srun without a command)", err), err


def test_the_sandbox_keeps_the_script_from_writing_or_connecting(capsys, tmp_path) -> None:
    target = tmp_path / "written-by-the-script"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    script = tmp_path / "hostile.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\n"
        f"echo pwned > {target}\n"
        f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo connected\n"
        f'{sys.executable} -c \'open("{target}", "w")\'\n'
        "srun python probe.py\n"
    )
    assert main(["import", "sbatch", str(script)]) == 0
    err = capsys.readouterr().err
    assert not target.exists()
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing reached the port
    listener.close()
    # the write succeeded in the sandbox's copy-on-write view of the folder, and was dropped
    assert "Read-only file system" not in err and "Traceback" not in err


def test_no_sandbox_no_run(tmp_path) -> None:
    """A machine where user namespaces are disabled: here a stand-in `unshare` that fails
    the way util-linux's does there (a double: this machine has them)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text(
        "#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n"
    )
    (fake / "unshare").chmod(0o755)
    marker = tmp_path / "ran"
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH --nodes=1\ntouch {marker}\nsrun python t.py\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-m", "trebuchet", "import", "sbatch", str(script)],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "cannot make its sandbox" in done.stderr and "Operation not permitted" in done.stderr
    assert "Traceback" not in done.stderr and not marker.exists()


@pytest.mark.parametrize(
    "make,why",
    [
        (lambda p: Path("/dev/zero"), "not a regular file"),
        (lambda p: p.write_bytes(b"#!/bin/bash\nsrun x\0y\n") and p, ":2: a NUL byte"),
        (lambda p: p.write_bytes(b"#!/bin/bash\n" + b"#" * (2 << 20)) and p, "larger than 1024 KiB"),
        (lambda p: p.write_bytes(b"#!/bin/bash\nsrun \xff\xfe\n") and p, ":2: not UTF-8"),
        (lambda p: p.write_text("#!/bin/bash\nsrun bash -c 'unterminated\n") and p,
         "cannot read the script"),
    ],
)  # fmt: skip
def test_hostile_files_get_a_named_error(make, why, capsys, tmp_path) -> None:
    path = make(tmp_path / "bad.sbatch")
    assert main(["import", "sbatch", str(path)]) == 2
    err = capsys.readouterr().err
    assert why in err and "Traceback" not in err


def test_a_long_line_is_read_by_bash_not_by_a_parser(capsys, tmp_path) -> None:
    script = tmp_path / "long.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1\nX=" + "a" * 900_000 + "\nsrun python t.py ${#X}\n"
    )
    data, err, _ = do_import(capsys, script, tmp_path)
    assert data["command"] == "python t.py 900000"

"""Environment recipes and GPU masks: pure rules, no builds (see integration/test_envs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trebuchet.cli.main import main
from trebuchet.envs import gpus
from trebuchet.envs.build import conda_commands, run_prefix
from trebuchet.envs.recipe import Recipe, safe_name, stamp, vendor_file

DEV = [str(i) for i in range(8)]


@pytest.mark.parametrize(
    "requested,mask,detected,nodes,expected",
    [
        (-1, None, DEV[:4], 1, [["0", "1", "2", "3"]]),  # every detected device
        (-1, ["3", "5"], DEV, 1, [["3", "5"]]),  # keeps the mask already exported
        (-1, None, DEV[:4], 2, [["0", "1"], ["2", "3"]]),  # simulated nodes split them
        (2, None, DEV[:4], 1, [["0", "1"]]),  # 0..N-1
        (2, ["6", "4", "2"], DEV, 1, [["6", "4"]]),  # the first N of the mask
        (2, None, DEV[:4], 2, [["0", "1"], ["2", "3"]]),
        (0, None, DEV, 2, [[], []]),
        (-1, None, [], 1, [[]]),  # no GPUs at all: nothing to hand out
        (-1, [], DEV, 1, [[]]),  # an empty mask hides every device
    ],
)
def test_gpu_mask_rules(requested, mask, detected, nodes, expected) -> None:
    assert gpus.node_masks(requested, mask, detected, nodes) == expected


@pytest.mark.parametrize(
    "requested,mask,detected,nodes",
    [(3, None, DEV[:2], 1), (2, None, DEV[:4], 3), (1, ["0"], DEV, 2), (-1, None, DEV[:1], 2)],
)
def test_gpu_requests_beyond_the_machine_are_errors(requested, mask, detected, nodes) -> None:
    with pytest.raises(gpus.GpuError):
        gpus.node_masks(requested, mask, detected, nodes)


def test_gpu_env_per_vendor() -> None:
    assert gpus.gpu_env("nvidia", ["0", "1"], 2) == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "TREB_NGPUS": "2",
    }
    amd = gpus.gpu_env("amd", ["2"], -1)
    assert amd == {"HIP_VISIBLE_DEVICES": "2", "ROCR_VISIBLE_DEVICES": "2", "TREB_NGPUS": "1"}
    assert gpus.gpu_env("nvidia", [], 0) == {"TREB_NGPUS": "0"}
    assert gpus.existing_mask("nvidia", {"CUDA_VISIBLE_DEVICES": "3, 5"}) == ["3", "5"]
    assert gpus.existing_mask("amd", {"ROCR_VISIBLE_DEVICES": "1"}) == ["1"]
    assert gpus.existing_mask("nvidia", {}) is None


@pytest.mark.parametrize(
    "hostile", ["../../etc", "a/b c", "..", "", "/abs/path", "x/../../y", "..."]
)
def test_env_names_stay_one_safe_segment(hostile: str, tmp_path: Path) -> None:
    name = safe_name(hostile)
    assert name and "/" not in name and ".." not in name and name not in (".", "..")
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def test_vendor_files_and_stamps(tmp_path: Path) -> None:
    req = tmp_path / "requirements.txt"
    req.write_text("six\n")
    assert vendor_file(req, "nvidia") == req
    (tmp_path / "requirements.nvidia.txt").write_text("six\nnumpy\n")
    assert vendor_file(req, "nvidia").name == "requirements.nvidia.txt"
    assert vendor_file(req, "amd") == req
    r = Recipe(kind="venv", name="x", prefix="/p", requirements_file=str(req), tool="uv")
    first = stamp(r)
    assert stamp(r) == first
    req.write_text("six==1.16.0\n")
    assert stamp(r) != first
    r.tool = "pip"
    assert stamp(Recipe(**{**r.to_json(), "tool": "uv"})) != stamp(r)


def test_conda_command_lines() -> None:
    """No conda channel is reachable here: the exact commands are the contract."""
    r = Recipe(kind="conda", name="m", prefix="/e/m", python="3.11", conda_bin="/opt/micromamba",
               requirements_file="/w/req.txt", setup="/w/setup.sh")  # fmt: skip
    assert conda_commands(r, Path("/e/m")) == [
        ["/opt/micromamba", "create", "--yes", "-p", "/e/m", "python=3.11", "pip"],
        [
            "/opt/micromamba",
            "run",
            "-p",
            "/e/m",
            "python",
            "-m",
            "pip",
            "install",
            "-r",
            "/w/req.txt",
        ],
        ["/opt/micromamba", "run", "-p", "/e/m", "bash", "/w/setup.sh"],
    ]
    r2 = Recipe(kind="conda", name="m", prefix="/e/m", conda_bin="/usr/bin/conda",
                environment_file="/w/environment.yml")  # fmt: skip
    assert conda_commands(r2, Path("/e/m")) == [
        ["/usr/bin/conda", "env", "create", "--yes", "-p", "/e/m", "-f", "/w/environment.yml"]
    ]
    assert run_prefix(r2) == ["/usr/bin/conda", "run", "-p", "/e/m", "--no-capture-output"]
    r3 = Recipe(
        kind="conda", name="m", prefix="/e/m", conda_bin="/x/mamba", environment_file="/w/e.yml"
    )
    assert conda_commands(r3, Path("/e/m"))[0][:3] == ["/x/mamba", "create", "--yes"]
    assert run_prefix(r3)[-1] == "--no-capture-output"


def _render(tmp_path: Path, text: str, capsys, *args: str) -> tuple[int, str, str]:
    spec = tmp_path / "job.yaml"
    spec.write_text(text)
    code = main(["render", str(spec), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_render_splits_fake_gpus_over_simulated_nodes(
    tmp_path, treb_home, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("TREB_FAKE_GPUS", "nvidia:4")  # stands in for nvidia-smi: no GPU here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    code, out, _ = _render(tmp_path, "command: x\nnodes: 2\ngpus_per_node: 2\n", capsys)
    assert code == 0
    assert out.count("CUDA_VISIBLE_DEVICES=0,1") == 2 and out.count("CUDA_VISIBLE_DEVICES=2,3") == 2
    assert out.count("TREB_NGPUS=2") == 4
    code, _, err = _render(tmp_path, "command: x\nnodes: 2\ngpus_per_node: 3\n", capsys)
    assert code == 2 and "job.yaml:3: gpus_per_node: 3 x 2 node(s) needs 6" in err


def test_render_minus_one_uses_the_existing_mask(tmp_path, treb_home, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TREB_FAKE_GPUS", "nvidia:8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6,7")
    code, out, _ = _render(tmp_path, "command: x\ngpus_per_node: -1\n", capsys)
    assert code == 0
    assert "3 process(es)" in out and out.count("CUDA_VISIBLE_DEVICES=5,6,7") == 3


def test_render_image_passes_values_by_name_only(tmp_path, treb_home, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_never_in_argv")
    text = ("command: python t.py\nsecrets: [HF_TOKEN]\nenvironment:\n"
            "  image: nvcr.io/nvidia/pytorch:24.05-py3\n  mounts: ['/data:/data:ro']\n")  # fmt: skip
    code, out, _ = _render(tmp_path, text, capsys)
    assert code == 0 and "hf_never_in_argv" not in out
    cmd = next(line for line in out.splitlines() if line.startswith("  $ "))
    assert " run --rm --init --name treb-RUN_ID-r0 " in cmd
    assert "-v /data:/data:ro" in cmd and "-e HF_TOKEN" in cmd and "-e RANK" in cmd
    assert cmd.endswith("nvcr.io/nvidia/pytorch:24.05-py3 bash -c 'python t.py'")


def test_render_mpirun_and_horovod(tmp_path, treb_home, capsys) -> None:
    code, out, _ = _render(
        tmp_path, "command: python t.py\nnodes: 2\nprocs_per_node: 2\nlauncher: mpirun\n", capsys
    )
    assert code == 0  # render needs no mpirun on this machine
    cmd = next(line for line in out.splitlines() if line.startswith("  $ "))
    assert cmd.startswith("  $ mpirun -np 4 -H localhost:4 --bind-to none -x LOCAL_WORLD_SIZE")
    # each rank runs the runtime's worker, which maps OpenMPI's variables onto the contract
    assert re.search(r"/treb-runtime-\d+-[0-9a-f]+\.pyz worker --grace 5\.0 --mpi 2 -- ", cmd)
    assert cmd.endswith("-- bash -c 'python t.py'")
    from trebuchet.launcher.plan import mpi_argv

    assert mpi_argv("horovod", 16, ["localhost", "128.140.2.4"], 8, {}) == [
        "horovodrun", "-np", "16", "-H", "localhost:8,128.140.2.4:8",
        "--start-timeout", "120", "--gloo", "--gloo-timeout-seconds", "120",
    ]  # fmt: skip

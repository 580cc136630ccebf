"""`treb render` of a sweep shows every point's launch, as `treb run` would start them.

Why: a user checks `treb render job.yaml --sweep -o lr=1e-3,3e-4` before spending an allocation;
showing the literal "1e-3,3e-4" (one run) would misstate what `treb run` does with it.
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import write_spec

SPEC = "name: sw\ncommand: 'echo $LR'\nprocs_per_node: 1\n"


def test_local_render_has_one_section_per_point(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SPEC)
    res = treb("render", str(spec), "--sweep", "-o", "env.LR=1e-3,3e-4", "-o", "env.BS=32,64")
    assert res.returncode == 0, res.stderr
    heads = [x for x in res.stdout.splitlines() if x.startswith("# ==== sweep point")]
    assert heads == [
        "# ==== sweep point 0 (of 4): env.LR=1e-3 env.BS=32",
        "# ==== sweep point 1 (of 4): env.LR=1e-3 env.BS=64",
        "# ==== sweep point 2 (of 4): env.LR=3e-4 env.BS=32",
        "# ==== sweep point 3 (of 4): env.LR=3e-4 env.BS=64",
    ]
    sections = res.stdout.split("# ==== sweep point")[1:]
    assert "LR=3e-4" in sections[3] and "LR=1e-3" not in sections[3]
    assert "1e-3,3e-4" not in res.stdout


def test_a_comma_without_sweep_is_one_value(treb, tmp_path: Path) -> None:
    """Issue 25: `-o env.NCCL_IB_HCA=mlx5_0,mlx5_1` silently started a two-run sweep."""
    spec = write_spec(tmp_path, SPEC)
    res = treb("render", str(spec), "-o", "env.NCCL_IB_HCA=mlx5_0,mlx5_1", "-o", "env.X=a\\,b")
    assert res.returncode == 0, res.stderr
    assert "# ==== sweep point" not in res.stdout
    assert "  NCCL_IB_HCA=mlx5_0,mlx5_1\n" in res.stdout
    assert "  X=a,b\n" in res.stdout  # an escaped comma: a comma, with or without --sweep
    res = treb("render", str(spec), "-m", "-o", "env.NCCL_IB_HCA=mlx5_0,mlx5_1")
    assert res.stdout.count("# ==== sweep point") == 2


def test_run_help_says_how_to_sweep(treb) -> None:
    for verb, flags in (("run", "--sweep, --multirun"), ("render", "--sweep, -m, --multirun")):
        text = " ".join(treb(verb, "--help").stdout.split())
        assert flags in text, text  # treb run's -m is torchrun's --module
        assert "`sweep:` block" in text and "a comma is part of the value" in text


def test_sweep_block_renders_too(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SPEC + "sweep:\n  env.LR: [0.1, 0.2]\n")
    res = treb("render", str(spec))
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("# ==== sweep point") == 2


def test_slurm_render_says_job_array_and_renders_each_script(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SPEC + "sweep_parallel: 1\n")
    res = treb("render", str(spec), "--on", "slurm", "--sweep", "-o", "env.LR=1,2")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("# sweep: 2 runs, submitted as one Slurm job array, at most 1")
    assert res.stdout.count("#!/bin/bash") == 2
    assert "export LR=1\n" in res.stdout and "export LR=2\n" in res.stdout


def test_slurm_sweep_of_a_resource_is_refused_as_by_run(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SPEC)
    res = treb("render", str(spec), "--on", "slurm", "-m", "-o", "nodes=1,2")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "nodes differs between points" in res.stderr


def test_sweep_on_kubernetes_is_refused(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, SPEC)
    res = treb("render", str(spec), "--on", "kubernetes", "--multirun", "-o", "env.LR=1,2")
    assert res.returncode == 2 and "sweeps run on the local and slurm backends" in res.stderr


def test_points_print_as_the_user_wrote_them() -> None:
    from trebuchet.spec.sweep import point_text

    assert point_text({"env.LR": "0.1", "env.BS": "32"}) == "env.LR=0.1 env.BS=32"
    assert point_text({"nodes": 2, "env.X": "a b", "env.Y": ""}) == 'nodes=2 env.X="a b" env.Y=""'
    assert point_text({"env.L": [1, 2]}) == "env.L=[1, 2]"

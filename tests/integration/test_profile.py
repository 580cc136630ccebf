"""profile: nsys wraps the selected ranks under every launcher; profile: torch sets the
trace directory. Nsight Systems needs an NVIDIA GPU stack that cannot exist here, so a
stand-in `nsys` records its arguments and runs the profiled command (said so here)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import needs, status_json, write_spec

pytestmark = pytest.mark.integration

FAKE_NSYS = """#!/bin/bash
# Stand-in for `nsys profile ... -o OUT cmd...`: records the call, writes OUT.nsys-rep, runs cmd.
[ "$1" = profile ] || exit 2; shift
while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift 2;; --*) shift;; *) break;; esac; done
echo "$out" >> "$FAKE_NSYS_LOG"
touch "$out.nsys-rep"
exec "$@"
"""


@pytest.fixture
def fake_nsys(tmp_path: Path) -> dict[str, str]:
    exe = tmp_path / "bin" / "nsys"
    exe.parent.mkdir()
    exe.write_text(FAKE_NSYS)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{exe.parent}{os.pathsep}{os.environ['PATH']}",
            "FAKE_NSYS_LOG": str(tmp_path / "nsys-calls.log")}  # fmt: skip


@pytest.mark.parametrize("launcher,ranks", [("native", [0, 1, 2, 3]), ("torchrun", [0, 1, 2, 3]),
                                            ("none", ["node0", "node1"])])  # fmt: skip
def test_nsys_wraps_every_rank(launcher, ranks, treb, fake_nsys, tmp_path: Path) -> None:
    if launcher == "torchrun":
        needs("torch")
    spec = write_spec(
        tmp_path,
        f"command: 'echo ran $RANK'\nnodes: 2\nprocs_per_node: 2\nlauncher: {launcher}\nprofile: nsys\n",
    )
    res = treb("run", str(spec), env=fake_nsys)
    assert res.returncode == 0, res.stderr
    run_dir = Path(status_json(treb)["run_dir"])
    assert f"profiles (nsys) in {run_dir / 'profile'}" in res.stderr
    reports = sorted(p.name for p in (run_dir / "profile" / "attempt-0").iterdir())
    # under launcher none the reports are node-<n>: one process per node
    names = [f"node-{r[4:]}" if str(r).startswith("node") else f"rank-{r}" for r in ranks]
    assert reports == sorted(f"{n}.nsys-rep" for n in names)


def test_profile_ranks_selects_ranks(treb, fake_nsys, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path,
        "command: 'echo ran $RANK'\nprocs_per_node: 3\nprofile: nsys\nprofile_ranks: [1]\n",
    )
    res = treb("run", str(spec), env=fake_nsys)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("ran ") == 3  # every rank ran, one under nsys
    calls = Path(fake_nsys["FAKE_NSYS_LOG"]).read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith("/profile/attempt-0/rank-1")


def test_missing_nsys_is_refused_before_launch(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: x\nprofile: nsys\n")
    res = treb(
        "run", str(spec), env={"PATH": str(Path(os.sys.executable).parent) + ":/usr/bin:/bin"}
    )
    assert res.returncode == 2 and "job.yaml:2: profile: nsys is not on PATH" in res.stderr


def test_profile_torch_sets_the_trace_dir(treb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'echo $TREB_TORCH_PROFILE_DIR'\nprofile: torch\n")
    res = treb("run", str(spec))
    assert res.returncode == 0
    assert res.stdout.strip().endswith(
        str(Path(status_json(treb)["run_dir"]) / "profile" / "torch")
    )

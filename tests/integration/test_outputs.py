"""Files a rank writes by a relative path are where the user looks (issue 35, item 2;
launcher/outputs.py): a spec-less `treb run -n 2 train.py` runs in the folder it was typed
in, as torchrun does; a run with a code snapshot runs in `<run dir>/code`, and the end of
the run and `treb status` name each file it wrote there. Real runs, locally and on the
Slurm test cluster."""

# ruff: noqa: F811 (fixtures imported from the support modules are named as arguments)
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TrebFn, status_json, write_spec
from tests.integration.slurm_support import slurm_conf, streb  # noqa: F401 (fixtures)
from tests.integration.test_ssh_runs import ssh_config  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration
GUARD_S = 300  # a hang guard for `treb run`, never a timing assertion

# Writes out-<rank>.txt and checkpoints/step-<rank>.pt by relative paths; with STALE_CHECK,
# fails when out-0.txt is already there at its start (an earlier run's output).
WRITER = """\
import os, sys
rank = os.environ["RANK"]
if os.environ.get("STALE_CHECK") and os.path.exists("out-0.txt"):
    sys.exit("stale out-0.txt from an earlier run")
with open(f"out-{rank}.txt", "w") as fh:
    fh.write(f"rank {rank}\\n")
os.makedirs("checkpoints", exist_ok=True)
with open(f"checkpoints/step-{rank}.pt", "w") as fh:
    fh.write("weights\\n")
print("cwd=" + os.getcwd(), flush=True)
"""


def project(tmp_path: Path) -> Path:
    w = tmp_path / "proj"
    w.mkdir()
    (w / "train.py").write_text(WRITER)
    return w


def written_here(folder: Path) -> list[str]:
    return sorted(
        str(p.relative_to(folder))
        for p in folder.rglob("*")
        if p.is_file() and p.name != "train.py"
    )


@pytest.mark.parametrize("form", [["train.py"], ["-m", "train"]])
def test_specless_run_writes_in_the_folder_it_was_typed_in(
    form: list[str], treb: TrebFn, tmp_path: Path
) -> None:
    """`treb run -n 2 train.py` and `treb run -n 2 -m train` (torchrun's --module): the ranks'
    working directory is the user's folder, as under torchrun; no code snapshot, nothing said
    about outputs (-m ran in `<run dir>/code` before)."""
    w = project(tmp_path)
    res = treb("run", "-n", "2", *form, cwd=w, timeout=GUARD_S)
    assert res.returncode == 0, res.stderr
    assert f"cwd={w}" in res.stdout
    assert written_here(w) == [
        "checkpoints/step-0.pt", "checkpoints/step-1.pt", "out-0.txt", "out-1.txt"]  # fmt: skip
    st = status_json(treb)
    assert not (Path(st["run_dir"]) / "code").exists() and st["outputs"] is None
    assert "outputs:" not in res.stderr
    spec = json.loads((Path(st["run_dir"]) / "spec.json").read_text())
    assert spec["snapshot"] is False


def test_snapshot_run_names_every_file_it_wrote(treb: TrebFn, tmp_path: Path) -> None:
    """With a spec (snapshot: true, the default) the ranks run in <run dir>/code; the user's
    folder is left as it was, and the end of the run and `treb status` name the files."""
    w = project(tmp_path)
    (w / "data.txt").write_text("input\n")
    spec = write_spec(w, "command: python train.py\nprocs_per_node: 2\n")
    res = treb("run", str(spec), cwd=w, timeout=GUARD_S)
    assert res.returncode == 0, res.stderr
    assert written_here(w) == ["data.txt", "job.yaml"]  # nothing written into the user's folder
    st = status_json(treb)
    code = Path(st["run_dir"]) / "code"
    assert f"cwd={code}" in res.stdout
    out = st["outputs"]
    assert out["dir"] == str(code) and out["source"] == str(w)
    assert out["new"] == ["checkpoints/step-0.pt", "checkpoints/step-1.pt", "out-0.txt",
                          "out-1.txt"] and out["changed"] == [] and out["count"] == 4  # fmt: skip
    said = [ln for ln in res.stderr.splitlines() if "outputs:" in ln or str(code) in ln]
    assert said[0].lstrip().startswith("outputs: 4 file(s) written by relative path are in the "
                              f"code snapshot the ranks ran in, not in {w}")  # fmt: skip
    assert f"    {code}/checkpoints/ (2 files)" in res.stderr
    assert f"    {code}/out-0.txt" in res.stderr
    text = treb("status", st["id"]).stdout
    assert f"{code}/checkpoints/ (2 files)" in text and "outputs: 4 file(s)" in text


def test_retries_share_the_snapshot_and_a_rerun_starts_clean(treb: TrebFn, tmp_path: Path) -> None:
    """Every attempt of a run works in the same snapshot (attempt 1 finds what attempt 0
    wrote there: a checkpoint by relative path resumes); a rerun runs the earlier run's code
    but not its outputs."""
    w = project(tmp_path)
    cmd = ("python train.py && if [ \"$TREB_ATTEMPT\" = 0 ]; then exit 3; fi; "
           "test -f out-0.txt && echo found-earlier-attempt")  # fmt: skip
    spec = write_spec(w, f"command: '{cmd}'\nretries: 1\n")
    res = treb("run", str(spec), cwd=w, timeout=GUARD_S)
    assert res.returncode == 0, res.stderr
    assert "found-earlier-attempt" in res.stdout
    first = status_json(treb)
    assert first["outputs"]["new"] == ["checkpoints/step-0.pt", "out-0.txt"]
    again = treb("rerun", first["id"], env={"STALE_CHECK": "1"}, timeout=GUARD_S)
    assert again.returncode == 0, again.stdout + again.stderr  # no stale out-0.txt
    second = status_json(treb)
    assert second["id"] != first["id"]
    assert second["outputs"]["new"] == ["checkpoints/step-0.pt", "out-0.txt"]


def test_slurm_snapshot_run_names_its_outputs(streb: TrebFn, tmp_path: Path) -> None:
    """On Slurm from a folder on this host's /tmp (a node-local disk on a real cluster) a
    spec-less launch keeps its snapshot in the shared TREB_HOME; the ranks on the nodes
    write there and the end of the run names every file with its path."""
    w = project(tmp_path)
    res = streb("run", "-n", "2", "--nnodes", "2", "--on", "slurm", "train.py", cwd=w,
                timeout=GUARD_S)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert written_here(w) == []
    st = status_json(streb)
    code = Path(st["run_dir"]) / "code"
    assert st["outputs"]["new"] == [
        "checkpoints/step-0.pt", "checkpoints/step-1.pt", "checkpoints/step-2.pt",
        "checkpoints/step-3.pt", "out-0.txt", "out-1.txt", "out-2.txt", "out-3.txt",
    ]  # fmt: skip
    assert f"    {code}/checkpoints/ (4 files)" in res.stderr
    assert "outputs: 8 file(s)" in streb("status", st["id"]).stdout


def test_ssh_without_a_shared_run_dir_names_each_hosts_copy(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """--on ssh, run directory copied (not shared): each host ran in its own copy of the
    code, and the end of the run and `treb status` name those (host:path); the test hosts
    share this machine's files, so the files are checked there."""
    from tests.integration.test_ssh_runs import PY, spec

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(WRITER)
    job = spec(tmp_path, ssh_config, f"exec {PY} train.py")
    res = treb("run", str(job), "--on", "ssh", timeout=GUARD_S)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    st = status_json(treb)
    remote = tmp_path / "remote" / st["id"] / "code"
    assert st["outputs"]["remote"] == [f"ts1:{remote}", f"ts2:{remote}"]
    assert f"so files they wrote by relative paths are there: ts1:{remote}, ts2:{remote}" in (
        res.stderr
    )
    assert sorted(p.name for p in remote.glob("out-*.txt")) == [f"out-{r}.txt" for r in range(4)]
    assert written_here(tmp_path / "job") == ["job.yaml"]

"""`--after` on Slurm, as rendered: Slurm's own `--dependency=afterok:<job>` / `afterany`
and `--kill-on-invalid-dep=yes` in the sbatch script (golden file; UPDATE_GOLDEN=1
rewrites), and the dependencies Slurm cannot wait for refused (exit 2).

Why: between two Slurm runs the waiting is Slurm's, so the script is the whole of it. The
runs waited for are rows of the run index written here (a record, not a stand-in for
behaviour: render only reads their job ids); test_slurm_after.py runs the real thing.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from tests.fast.test_slurm_render import GOLDEN, _render
from trebuchet.store.db import RunRecord, Store


def _run(store: Store, rid: str, name: str, backend: str, job: str | None) -> None:
    store.insert_run(RunRecord(id=rid, name=name, backend=backend, launcher="native",
                               state="RUNNING", nodes=1, procs_per_node=1,
                               run_dir=f"/nowhere/{rid}", created_at=time.time(),
                               backend_id=job))  # fmt: skip


def test_render_shows_slurms_own_dependency(tmp_path: Path, treb_home: Path) -> None:
    store = Store()
    _run(store, "1a2b3c4d", "prep", "slurm", "4242")
    _run(store, "5e6f7a8b", "eval", "slurm", "4243")
    _run(store, "9c0d1e2f", "more", "slurm", "4244")
    store.close()
    spec = "name: train\ncommand: python train.py\nnodes: 2\n"
    rc, out, err = _render(tmp_path, spec, "--after", "prep,1a2b3c4d", "--after", "5e6f:any",
                           "--after", "9c0d1e2f:ok")  # fmt: skip
    assert rc == 0, err
    normal = out.replace(str(treb_home), "$TREB_HOME").replace(str(tmp_path / "work"), "$WORKDIR")
    normal = re.sub(r"treb-runtime-\d+-[0-9a-f]{12}\.pyz", "treb-runtime-VERSION-HASH.pyz", normal)
    golden = GOLDEN / "slurm-after.sh"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(normal)
    assert normal == golden.read_text()
    assert "#SBATCH --dependency=afterany:4243,afterok:4242:4244\n" in out
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in out


def test_a_slurm_run_waits_for_slurm_runs_only(tmp_path: Path, treb_home: Path) -> None:
    store = Store()
    _run(store, "0badc0de", "local-one", "local", None)
    _run(store, "0dd0dd00", "unsent", "slurm", None)
    store.close()
    for ref, why in (("0badc0de", "a Slurm run waits for Slurm runs only"),
                     ("0dd0dd00", "that run has no Slurm job")):  # fmt: skip
        rc, _, err = _render(tmp_path, "name: t\ncommand: x\n", "--after", ref)
        assert rc == 2 and why in err and "Traceback" not in err, err


def test_a_sweep_cannot_wait(tmp_path: Path, treb_home: Path) -> None:
    store = Store()
    _run(store, "1a2b3c4d", "prep", "slurm", "4242")
    store.close()
    rc, _, err = _render(tmp_path, "name: t\ncommand: x\nsweep: {env.A: [1, 2]}\n",
                         "--after", "1a2b3c4d")  # fmt: skip
    assert rc == 2 and "--after applies to one run" in err, err

"""`--resume-from RUN`: a new run starts with an earlier run's checkpoints.

TREB_CHECKPOINT_DIR stays the new run's own `<run dir>/checkpoints` (the contract: one
directory per run, the same across attempts), and at submission it is filled with a copy
of the earlier run's. A copy, not a link or a reference: the new run overwrites files in
place (torch.save truncates the file it writes), which through a hard link or a shared
directory would change the earlier run's checkpoints, and `treb rm` of the earlier run
must not take the new run's away. Where the filesystem can, the copy is a reflink
(`cp --reflink=auto`: copy-on-write, instant, no space until a file changes); elsewhere
a full copy. Refused (exit 2, before anything is recorded): an active earlier run (its
checkpoints may be half-written), one with no checkpoints, and an engine whose ranks do
not see the submitting host's run directory (SkyPilot, Kubernetes)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.errors import UserError

if TYPE_CHECKING:
    from trebuchet.backends.base import Backend
    from trebuchet.store.db import Store


def source(store: Store, ref: str, engine: Backend) -> tuple[str, Path]:
    """(the earlier run's id, its checkpoint directory), or UserError saying why not."""
    from trebuchet.store.paths import run_dir

    if not ref.strip():
        raise UserError("--resume-from '': give a run id, prefix or name")
    if engine.remote and not engine.shared_run_dir:
        raise UserError(f"--resume-from: --on {engine.name} ranks do not see the run "
                        "directory written here; resume from checkpoints in a bucket or "
                        "volume instead")  # fmt: skip
    rec = store.resolve(ref)
    if rec.active:
        raise UserError(f"--resume-from {ref}: run {rec.id} is still {rec.state}; its "
                        "checkpoints may be half-written (wait for it, or cancel it)")  # fmt: skip
    ckpt = run_dir(rec.id) / "checkpoints"
    if not ckpt.is_dir() or not any(ckpt.iterdir()):
        raise UserError(f"--resume-from {ref}: run {rec.id} has no checkpoints ({ckpt} is "
                        "empty or gone); ranks write them to $TREB_CHECKPOINT_DIR")  # fmt: skip
    return rec.id, ckpt


def copy(src: Path, dest: Path) -> None:
    """src's contents into dest (which exists): reflinks where the filesystem allows."""
    try:
        res = subprocess.run(["cp", "-a", "--reflink=auto", f"{src}/.", f"{dest}/"],
                             capture_output=True, text=True, timeout=None)  # fmt: skip
        ok = res.returncode == 0
    except OSError:  # no GNU cp
        ok = False
    if not ok:
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)

"""Everything a run needs before an engine starts it: id, run directory, records."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from trebuchet.errors import SpecError, UserError
from trebuchet.launcher.outputs import MANIFEST, manifest
from trebuchet.launcher.snapshot import earlier_run, reuse, take, venv_note
from trebuchet.plain import asdict, field, record
from trebuchet.runtime.rundir.records import sync
from trebuchet.spec import resolved
from trebuchet.spec.duration import parse_size
from trebuchet.spec.load import LoadedSpec
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event, write_atomic, write_json
from trebuchet.store.paths import run_dir
from trebuchet.store.states import PENDING


@record
class Submission:
    """A recorded, not yet started run."""

    loaded: LoadedSpec
    record: RunRecord
    run_dir: Path
    store: Store
    warnings: list[str] = field(default_factory=list)
    # The run directory's files written without their fsync (prepare(durable=False)): the
    # local supervisor syncs them while its cgroup move waits, off the launch's serial path.
    unsynced: list[str] = field(default_factory=list)

    def sync(self) -> None:
        """Make the files written so far durable (records.sync), once."""
        sync(self.unsynced)
        self.unsynced = []


def new_run_id() -> str:
    return os.urandom(4).hex()  # the secrets module's source, without its imports


def check_secrets(loaded: LoadedSpec, environ: dict[str, str] | os._Environ) -> None:
    hooks = getattr(loaded.spec, "notify", None)
    if hooks:  # a webhook's URL kept in a secret: what the controller will send to
        from trebuchet.runtime.publish.webhooks import unsendable

        bad = [(i, unsendable(h.url, environ)) for i, h in enumerate(hooks)]
        located = loaded.located
        if any(why for _, why in bad):
            raise SpecError([
                f"{located.where(('notify', i, 'url')) if located else loaded.source}: "
                f"notify[{i}].url: {hooks[i].url}: {why}" for i, why in bad if why
            ])  # fmt: skip
    missing = [n for n in loaded.spec.secrets if n not in environ]
    if missing:
        raise UserError(
            f"{loaded.where('secrets')}: secrets: {', '.join(missing)} not set in this shell "
            "(secrets are read from the submitting environment at launch)"
        )


def prepare(
    loaded: LoadedSpec,
    backend: str,
    store: Store,
    resume: tuple[str, Path] | None = None,
    durable: bool = True,
) -> Submission:
    """Create the run directory (private to the user) and the PENDING record; `resume`:
    (run id, checkpoint dir) copied into this run's checkpoints/ first. `durable=False`:
    its files are left for Submission.sync() (the caller's, before the run starts)."""
    check_secrets(loaded, os.environ)
    for _ in range(5):
        rid = new_run_id()
        path = run_dir(rid)
        try:
            path.mkdir(mode=0o700)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 5 collisions of 32 random bits
        raise UserError("could not allocate a run id")
    try:  # a run directory without its record is never left behind
        return _record(loaded, backend, store, rid, path, resume, durable)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def _record(
    loaded: LoadedSpec,
    backend: str,
    store: Store,
    rid: str,
    path: Path,
    resume: tuple[str, Path] | None = None,
    durable: bool = True,
) -> Submission:
    spec = loaded.spec
    (path / "checkpoints").mkdir(mode=0o700)
    warnings: list[str] = []
    git_commit, git_dirty = None, None
    if spec.snapshot:
        earlier, source = earlier_run(loaded.workdir), str(loaded.workdir)
        if earlier:  # a rerun: the same code as the earlier run
            snap, source = reuse(earlier, path / "code")
        else:
            snap = take(loaded.workdir, path / "code", parse_size(spec.snapshot_max_size))
        write_json(path / "snapshot.json", {**asdict(snap), "source": source}, durable=False)
        # what the ranks add to it is told apart from it at the end (launcher/outputs.py)
        write_json(path / MANIFEST, manifest(Path(snap.path)), durable=False)
        git_commit, git_dirty = snap.git_commit, snap.git_dirty
        if snap.venvs and not earlier:
            warnings.append(venv_note(snap.venvs))
        if snap.skipped:
            shown = ", ".join(f"{f} ({why})" for f, why in list(snap.skipped.items())[:5])
            more = len(snap.skipped) - 5
            warnings.append(
                f"{len(snap.skipped)} file(s) left out of the code snapshot: {shown}"
                f"{f' and {more} more' if more > 0 else ''}"
            )
        loaded.origin, loaded.workdir = loaded.workdir, Path(snap.path)
    if resume:
        from trebuchet.launcher.resume import copy

        try:  # prepare() removes the run directory on any failure
            copy(resume[1], path / "checkpoints")
        except OSError as exc:
            raise UserError(
                f"--resume-from {resume[0]}: copying {resume[1]} failed: {exc}"
            ) from None
    write_atomic(path / "spec.yaml", resolved.text(loaded), durable=False)  # as it will run
    write_json(path / "spec.json", resolved.data(loaded), durable=False)  # results/collect.py
    from trebuchet.spec.readers import reader_config

    write_json(path / "metrics.json", reader_config(spec), durable=False)  # runtime/metrics, gpu
    # fsynced together: the first one's journal commit carries the others (records.sync)
    names = ("snapshot.json", MANIFEST, "spec.yaml", "spec.json", "metrics.json")
    written = [str(path / n) for n in names]
    if durable:
        sync(written)
        written = []
    append_event(path, "submitted", backend=backend)
    if resume:
        append_event(path, "resumed", from_run=resume[0])
    rec = RunRecord(
        id=rid, name=spec.name, backend=backend, launcher=spec.launcher, state=PENDING,
        nodes=spec.nodes, procs_per_node=spec.ranks_per_node, run_dir=str(path),
        created_at=time.time(), max_attempts=spec.retries + 1,
        spec_path=str(loaded.path) if loaded.path else None, git_commit=git_commit,
        git_dirty=None if git_dirty is None else int(git_dirty),
    )  # fmt: skip
    store.insert_run(rec)
    return Submission(loaded=loaded, record=rec, run_dir=path, store=store, warnings=warnings,
                      unsynced=written)  # fmt: skip

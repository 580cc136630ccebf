"""Everything a run needs before an engine starts it: id, run directory, records."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from trebuchet.errors import UserError
from trebuchet.spec.load import LoadedSpec
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.files import append_event, write_atomic
from trebuchet.store.paths import run_dir
from trebuchet.store.states import PENDING


@dataclass
class Submission:
    """A recorded, not yet started run."""

    loaded: LoadedSpec
    record: RunRecord
    run_dir: Path
    store: Store


def new_run_id() -> str:
    return secrets.token_hex(4)


def check_secrets(loaded: LoadedSpec, environ: dict[str, str] | os._Environ) -> None:
    missing = [n for n in loaded.spec.secrets if n not in environ]
    if missing:
        raise UserError(
            f"{loaded.where('secrets')}: secrets: {', '.join(missing)} not set in this shell "
            "(secrets are read from the submitting environment at launch)"
        )


def resolved_spec_yaml(loaded: LoadedSpec) -> str:
    """The spec as it will run: expanded, defaults filled, secrets as names only."""
    data = loaded.spec.model_dump(mode="json")
    data["workdir"] = str(loaded.workdir)
    head = f"# resolved from {loaded.source}\n"
    return head + yaml.safe_dump(data, sort_keys=False, default_flow_style=False)


def prepare(loaded: LoadedSpec, backend: str, store: Store) -> Submission:
    """Create the run directory (private to the user) and the PENDING record."""
    check_secrets(loaded, os.environ)
    spec = loaded.spec
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
    (path / "checkpoints").mkdir(mode=0o700)
    write_atomic(path / "spec.yaml", resolved_spec_yaml(loaded))
    rec = RunRecord(
        id=rid, name=spec.name, backend=backend, launcher=spec.launcher, state=PENDING,
        nodes=spec.nodes, procs_per_node=spec.ranks_per_node, run_dir=str(path),
        created_at=time.time(), max_attempts=spec.retries + 1,
        spec_path=str(loaded.path) if loaded.path else None,
    )  # fmt: skip
    store.insert_run(rec)
    append_event(path, "submitted", backend=backend)
    return Submission(loaded=loaded, record=rec, run_dir=path, store=store)

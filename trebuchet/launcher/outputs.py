"""Where the files a run's ranks wrote by relative paths are: said at the end of the run
and by `treb status`, so that a torchrun user's `out.txt` or `checkpoints/` never vanish.

A rank's working directory is the workdir itself (`snapshot: false`, and a spec-less
`treb run train.py` on an engine whose nodes see this folder), so a relative path lands
where the user launched from, as under torchrun; or the run's code snapshot,
`<run dir>/code`, so a queued or retried run executes the code as it was at submission.
trebuchet never writes into the user's folder, so it does not copy anything back: it
lists what the ranks added to the snapshot (or changed in it) instead. The snapshot's own
files are known from `snapshot-files.json` (path -> size and mtime, written with the copy):
a file not listed, or listed with another size or mtime, was written by the run (or by
whatever wrote into the run directory since). Over ssh without a shared run directory the
ranks ran in each host's own copy, which is named, not listed (it is not on this machine).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from trebuchet.runtime.rundir.records import read_json

MANIFEST = "snapshot-files.json"
MAX_LISTED = 2000  # a run writing more is summed up, never listed in full
MAX_WALKED = 100_000  # entries looked at: a huge tree never stalls status or the summary
SHOWN = 6  # top-level entries named on a line


def manifest(code: Path) -> dict[str, list[int]]:
    """Each file of the snapshot just taken: [size, mtime_ns], as the copy left it."""
    files, _ = _walk(code)
    return {rel: [st.st_size, st.st_mtime_ns] for rel, st in files.items()}


def _walk(code: Path) -> tuple[dict[str, os.stat_result], bool]:
    """Every file under `code` (symlinks as links, never followed), bounded."""
    found: dict[str, os.stat_result] = {}
    seen = 0
    for root, dirs, names in os.walk(code):
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # the imports' bytecode: no output
        rel_root = os.path.relpath(root, code)
        for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            seen += 1
            if seen > MAX_WALKED:
                return found, True
            rel = n if rel_root == "." else f"{rel_root}/{n}"
            try:
                st = os.lstat(os.path.join(root, n))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                found[rel] = st
    return found, False


def written(run_dir: str | Path) -> dict[str, Any] | None:
    """What the ranks wrote where relative paths led them, for a run with a code snapshot:
    {"dir", "source", "new", "changed", "bytes", "truncated"}; or {"remote": [host:path...]}
    where they ran in the hosts' own copies; None without a snapshot (or nothing to say)."""
    run_dir = Path(run_dir)
    snap = read_json(str(run_dir / "snapshot.json"))
    if not isinstance(snap, dict) or not snap.get("path"):
        return None
    ssh = read_json(str(run_dir / "ssh.json"))
    if isinstance(ssh, dict) and ssh.get("remote_root") and ssh.get("remote_run_dir"):
        where = f"{ssh['remote_run_dir'].rstrip('/')}/code"
        hosts = (ssh.get("hosts") or [])[: max(1, int(ssh.get("nodes") or 1))]
        return {"dir": None, "source": snap.get("source"),
                "remote": [f"{h}:{where}" for h in hosts]}  # fmt: skip
    known = read_json(str(run_dir / MANIFEST))
    code = Path(snap["path"])
    if not isinstance(known, dict) or not code.is_dir():
        return None
    files, truncated = _walk(code)
    new: list[str] = []
    changed: list[str] = []
    size = 0
    for rel, st in sorted(files.items()):
        was = known.get(rel)
        if was == [st.st_size, st.st_mtime_ns]:
            continue
        (new if was is None else changed).append(rel)
        size += st.st_size
    listed = len(new) + len(changed)
    return {
        "dir": str(code), "source": snap.get("source"), "new": new[:MAX_LISTED],
        "changed": changed[:MAX_LISTED], "count": listed, "bytes": size,
        "truncated": truncated or listed > MAX_LISTED,
    }  # fmt: skip


def grouped(paths: list[str]) -> list[str]:
    """Top-level entries: `out.txt`, `checkpoints/ (3 files)`."""
    tops: dict[str, int] = {}
    for p in paths:
        head, sep, _ = p.partition("/")
        key = head + "/" if sep else head
        tops[key] = tops.get(key, 0) + 1
    return [k if not k.endswith("/") else f"{k} ({n} file{'s' if n > 1 else ''})"
            for k, n in tops.items()]  # fmt: skip


def lines(run_dir: str | Path) -> list[str]:
    """The summary's and status's lines: where the run's relative-path files are."""
    try:
        found = written(run_dir)
    except OSError as exc:  # the summary must still print
        return [f"outputs: could not look at the code snapshot: {exc.strerror}"]
    if not found:
        return []
    if found.get("remote"):
        return [
            "outputs: the ranks ran in each host's copy of the code (the run directory is not "
            "shared), so files they wrote by relative paths are there: "
            + ", ".join(found["remote"])
        ]
    if not found["count"]:
        return []
    entries = grouped(sorted(found["new"] + found["changed"]))
    out = [
        f"outputs: {found['count']} file(s) written by relative path are in the code snapshot "
        f"the ranks ran in, not in {found['source'] or 'the workdir'} "
        "(`snapshot: false` runs in the workdir itself):"
    ]
    out += [f"  {found['dir']}/{e}" for e in entries[:SHOWN]]
    if len(entries) > SHOWN or found["truncated"]:
        out.append(f"  ... and more: `ls {found['dir']}`")
    return out


NODE_LOCAL = ("/tmp", "/var/tmp", "/dev/shm")  # as preflight's node-local-workdir reads them


def in_place(on: str | None, folder: str) -> dict[str, Any]:
    """A spec-less launch's fields for where its ranks run: in place (`snapshot: false`), as
    torchrun runs them, wherever the nodes see this folder: locally, and on Slurm from a
    folder not on the submitting host's own disk (/tmp, /var/tmp, /dev/shm, ~/.cache: there
    the nodes would not find the code, and the run keeps its snapshot in the shared
    TREB_HOME). Where the code travels (ssh, kubernetes, skypilot) the snapshot stays; the
    end of the run says where the files written by relative path are (lines)."""
    if on in (None, "local"):
        return {"snapshot": False}
    if on != "slurm":
        return {}
    cache = os.path.join(os.path.expanduser("~"), ".cache")
    real = os.path.realpath(folder)
    roots = (*NODE_LOCAL, cache)
    return {} if any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots) else {
        "snapshot": False}  # fmt: skip

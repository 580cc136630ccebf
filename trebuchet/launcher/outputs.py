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
RECORD_LIMIT = 1 << 20  # snapshot.json, ssh.json: treb writes a few KiB; a rank may not
MANIFEST_LIMIT = 64 << 20  # ~100 bytes a file: far past any snapshot's size limit


def manifest(code: Path) -> dict[str, list[int]]:
    """Each file of the snapshot just taken: [size, mtime_ns], as the copy left it."""
    files, _ = _walk(code)
    return {rel: [st.st_size, st.st_mtime_ns] for rel, st in files.items()}


def _walk(code: Path) -> tuple[dict[str, os.stat_result], bool]:
    """Every file under `code` (symlinks as links, never followed), bounded: every entry,
    folders too, counts toward MAX_WALKED (a million empty folders never stall the summary),
    and the walk keeps its own stack (a tree 1200 folders deep made os.walk recurse past
    Python's limit: `treb status` died of a RecursionError)."""
    found: dict[str, os.stat_result] = {}
    seen = 0
    stack = [""]
    while stack:
        rel_root = stack.pop()
        try:
            with os.scandir(os.path.join(code, rel_root)) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_WALKED:
                        return found, True
                    rel = f"{rel_root}/{entry.name}" if rel_root else entry.name
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        if entry.name != "__pycache__":  # the imports' bytecode: no output
                            stack.append(rel)
                    elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        found[rel] = st
        except OSError:  # unreadable, gone, or a path too long: what it holds is not listed
            continue
    return found, False


def written(run_dir: str | Path) -> dict[str, Any] | None:
    """What the ranks wrote where relative paths led them, for a run with a code snapshot:
    {"dir", "source", "new", "changed", "bytes", "truncated"}; or {"remote": [host:path...]}
    where they ran in the hosts' own copies; None without a snapshot (or nothing to say)."""
    run_dir = Path(run_dir)
    snap = read_json(str(run_dir / "snapshot.json"), RECORD_LIMIT)
    if not isinstance(snap, dict) or not snap.get("path"):
        return None
    source = snap.get("source") if isinstance(snap.get("source"), str) else None
    ssh = read_json(str(run_dir / "ssh.json"), RECORD_LIMIT)
    remote = _remote(ssh) if isinstance(ssh, dict) else None
    if remote is not None:
        return {"dir": None, "source": source, "remote": remote}
    known = read_json(str(run_dir / MANIFEST), MANIFEST_LIMIT)
    # the snapshot is always the run's code/: snapshot.json is where a rank can write, and
    # a `path` it forged must not make treb list another folder
    code = run_dir / "code"
    if not isinstance(known, dict) or not code.is_dir() or code.is_symlink():
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
        "dir": str(code), "source": source, "new": new[:MAX_LISTED],
        "changed": changed[:MAX_LISTED], "count": listed, "bytes": size,
        "truncated": truncated or listed > MAX_LISTED,
    }  # fmt: skip


def _remote(ssh: dict[str, Any]) -> list[str] | None:
    """host:path of each host's copy of the code, where ssh ran without a shared run
    directory; None otherwise (or when ssh.json's fields are not what treb wrote)."""
    root, where, hosts = ssh.get("remote_root"), ssh.get("remote_run_dir"), ssh.get("hosts")
    if not (root and isinstance(where, str) and where):
        return None
    hosts = [h for h in hosts if isinstance(h, str)] if isinstance(hosts, list) else []
    if not hosts:
        return None
    nodes = ssh.get("nodes")
    count = nodes if isinstance(nodes, int) and 1 <= nodes <= len(hosts) else len(hosts)
    return [f"{h}:{where.rstrip('/')}/code" for h in hosts[: max(1, count)]]


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
        if found["truncated"]:  # nothing new among the entries looked at; more not looked at
            return [f"outputs: the code snapshot the ranks ran in holds too many entries to "
                    f"look through: `ls {found['dir']}`"]  # fmt: skip
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

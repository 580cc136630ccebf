"""Files the runtime writes into the run directory: never half written (temp file, then
rename), so `treb status` on another machine reads the old record or the new one."""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import math
import os
import re
import signal
import stat
import time

from .regular import NotRegular, read_text

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import Any

    from ..contracts.schema import FirstFailure, Outcome


def now() -> float:
    return time.time()


def write_text(path: str, text: str, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` with `text` in one rename (private to the user: 0600)."""
    write_bytes(path, text.encode(), mode, durable)


_TMP_COUNT = itertools.count()


def write_bytes(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Replace `path` in one rename (not `tempfile`: its imports slow every agent's start).
    `durable=False` skips the fsync, for a record a later one replaces within the run: 32
    ranks' fsyncs were ~0.1 s of a 32-rank start, and after an OS crash such a file is at
    worst unreadable, which readers take as absent."""
    folder, base = os.path.split(path)
    tmp = os.path.join(folder, f".{base}.{os.getpid()}.{next(_TMP_COUNT)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


SYNC_THREADS = 16


def sync(paths: list[str]) -> None:
    """fsync files written with `durable=False` and their folders, from up to SYNC_THREADS
    threads side by side: one after another each waited for a journal commit of its own
    (512 records of a 128-node run: 2.5 s, on the retry's critical path); together one
    commit carries many (0.1-0.2 s). A file that is gone is skipped."""
    _fsync_all([*paths, *sorted({os.path.dirname(p) for p in paths})])


def _fsync_all(paths: list[str]) -> None:
    if len(paths) <= 1:
        _fsync_each(paths)
        return
    import threading  # here: an agent that never syncs many never pays for the import

    n = min(SYNC_THREADS, len(paths))
    threads = [threading.Thread(target=_fsync_each, args=(paths[k::n],)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _fsync_each(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_json(path: str, data: Any, durable: bool = True) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", durable=durable)


def read_json(path: str, limit: int = -1) -> Any:
    """None when absent or unreadable: not a regular file (a rank's FIFO), no JSON, too deep."""
    try:
        return json.loads(read_text(path, limit))
    except (OSError, ValueError, RecursionError):
        return None


def append_event(run_dir: str, event: str, **fields: Any) -> None:
    """One line of `events.jsonl` (O_APPEND: lines of concurrent writers do not mix)."""
    line = json.dumps({"time": now(), "event": event, **fields}, sort_keys=True) + "\n"
    write_regular(os.path.join(run_dir, "events.jsonl"), line.encode())


def write_regular(path: str, data: bytes, truncate: bool = False) -> None:
    """`data` appended to `path` (or in place of what it held), a regular file (writable_fd)."""
    fd = writable_fd(path, truncate)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def writable_fd(path: str, truncate: bool = False) -> int:
    """`path` opened for appending (or emptied), a regular file: a rank can put a FIFO in
    the run directory, whose opening for writing waits forever for a reader. Anything but a
    regular file is removed and the file made again, once; else NotRegular (an OSError)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else os.O_APPEND)
    flags |= os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    for _ in range(2):
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:  # ENXIO: a FIFO without a reader
            if exc.errno != errno.ENXIO:
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    raise NotRegular(f"{path}: not a regular file")


def exit_fields(returncode: int) -> tuple[int, str | None]:
    """A Popen returncode as a shell reports it (128 + n for signal n), and the signal's name."""
    if returncode >= 0:
        return returncode, None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"SIG{-returncode}"
    return 128 - returncode, name


def attempt_logs(adir: str, first: str | None = None) -> list[str]:
    """What the log policies read after a failed attempt, the failing process's (`first`) first."""
    names = sorted(os.listdir(adir))
    logs = [os.path.join(adir, name) for pattern in (r"rank-\d+\.log", r"node-\d+\.log")
            for name in names if re.fullmatch(pattern, name)]  # fmt: skip
    if first in logs:
        logs.insert(0, logs.pop(logs.index(first)))
    return logs


# An outcome record's fields and their types (contracts.Outcome). A rank can reach the
# attempt's folder: what is read back is checked field by field, so a record a rank wrote
# over never reaches a rule, SQLite or a view as anything but what the fields allow.
_INT = (int,)
_FIELDS: dict[str, tuple[type, ...]] = {
    "label": (str,), "rank": _INT, "node": _INT, "local_rank": _INT, "pid": _INT,
    "exit_code": _INT, "signal": (str,), "started_at": (int, float), "ended_at": (int, float),
    "stopped_by_launcher": (bool,), "state": (str,), "log": (str,), "host": (str,),
    "attempt": _INT, "job_id": (str,), "step_id": (str,), "message": (str,),
    "after_first_failure": (bool,), "after_peer": (bool,), "left_first": (bool,),
}  # fmt: skip
_WHO = ("rank", "node", "local_rank", "exit_code", "signal")  # the views read them all
TEXT_MAX = 4096  # a message or path in a record, at most (a cause is one line or a few)
INT_MAX = 1 << 31  # an exit code, rank, node, pid or attempt: what an INTEGER column holds


def _fits(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int):
        return -INT_MAX < value < INT_MAX
    return not isinstance(value, float) or math.isfinite(value)


def outcome(rec: Any) -> Outcome | None:
    """`rec` (JSON read back) as an outcome record, the fields the views name present;
    None when it is no record at all (no label)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("label"), str):
        return None
    out: dict[str, Any] = {}
    for key, value in rec.items():
        kinds = _FIELDS.get(key)
        if kinds is None or not isinstance(value, kinds):
            continue
        if not _fits(value, kinds):
            continue
        out[key] = value[:TEXT_MAX] if isinstance(value, str) else value
    for key in _WHO:
        out.setdefault(key, None)
    return out  # type: ignore[return-value]  # checked field by field above


FIRST = "first-failure"  # an attempt's first failure (JSON), written once (claim_first); not
# a .json name: the readers of an attempt's outcome records (*.json) must not count it twice


def claim_first(adir: str, cause: FirstFailure) -> FirstFailure:
    """The attempt's first failure on record: `cause` unless one was already. link() refuses
    an existing name, so of two writers the first wins, and a reader sees all or none."""
    path = os.path.join(adir, FIRST)
    tmp = os.path.join(adir, f".{FIRST}.{os.getpid()}.{next(_TMP_COUNT)}.tmp")
    try:
        write_json(tmp, cause)
        os.link(tmp, path)
    except FileExistsError:
        return outcome(read_json(path)) or cause
    except OSError:  # the folder is gone (the run removed): the caller's copy stands
        return cause
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return cause


def claimed_first(adir: str) -> FirstFailure | None:
    return outcome(read_json(os.path.join(adir, FIRST)))


def cause(
    label: str,
    exit_code: int,
    attempt: int,
    node: int | None = None,
    message: str | None = None,
    log: str | None = None,
    host: str | None = None,
) -> FirstFailure:
    """A first failure no process record says (an environment build, a full disk, ssh)."""
    ff: FirstFailure = {"label": label, "rank": None, "node": node, "local_rank": None,
                        "exit_code": exit_code, "signal": None, "ended_at": now(),
                        "attempt": attempt}  # fmt: skip
    if message is not None:
        ff["message"] = message
    if log is not None:
        ff["log"] = log
    if host is not None:
        ff["host"] = host
    return ff


def attempt_records(adir: str) -> list[Outcome]:
    try:
        names = sorted(os.listdir(adir))
    except OSError:
        return []
    out: list[Outcome] = []
    for name in names:
        rec = outcome(read_json(os.path.join(adir, name))) if name.endswith(".json") else None
        if rec is not None and name not in ("attempt.json", FIRST):
            out.append(rec)
    return out


AFTER = "after_first_failure"  # a record of a node lost once the attempt had failed


def left_first(records: list[Outcome]) -> FirstFailure | None:
    """Where every failed rank was stopped: the one that left first. A rank that leaves
    (sys.exit) ends horovod for all; its peers fail on that shutdown (`after_peer`), the
    launcher (horovodrun, mpirun) wakes on their exit and stops what still runs: the rank
    that left too, when its own exit is slow (a loaded machine), which loses its exit code.
    The peers' logs say another rank came first; the one stopped rank whose log does not
    is that rank, where it ended after a peer failed (the launcher stopped it on that
    failure): a stop from outside (a cancel, the timeout, the hang watch) that reached it
    before its peers, whose horovod then shut down, names none. None when there is no such
    cascade or more than one such rank."""
    ranks = [r for r in records if r.get("rank") is not None]
    peers = [r.get("ended_at") for r in ranks if r.get("after_peer")]
    if not peers:
        return None
    left = [
        r for r in ranks
        if r.get("exit_code") not in (None, 0) and r.get("stopped_by_launcher")
        and not r.get("after_peer")
    ]  # fmt: skip
    if len(left) != 1:
        return None
    ended, failed = left[0].get("ended_at"), min((t for t in peers if t is not None), default=None)
    if ended is None or failed is None or ended < failed:
        return None
    return {**left[0], "left_first": True}


def left_first_how(ff: Outcome) -> str:
    """How a rank that left first ended, in words (status, webhooks, Slurm's reason)."""
    stop = ff.get("signal") or f"code {ff.get('exit_code')}"
    return f"left first (the others failed on its end), its exit cut short ({stop})"


def first_failure(records: list[Outcome]) -> FirstFailure | None:
    """The earliest non-zero outcome that was no cascade (stopped by the launcher, or a node
    lost after the first failure: AFTER): a lost node's before all (its peers' ranks fail
    because it is gone), then a rank's, then the rank that left first, then a node agent's
    (its launcher's exit only says some rank failed)."""
    records = [  # left_first is this reading's, never a record's own (a rank writes them)
        {k: v for k, v in r.items() if k != "left_first"} if "left_first" in r else r  # type: ignore[misc]
        for r in records
    ]
    failed = [
        r for r in records
        if r.get("exit_code") not in (None, 0) and not r.get("stopped_by_launcher")
        and not r.get(AFTER)
    ]  # fmt: skip
    lost = [r for r in failed if r.get("label") in ("node_lost", "node_unhealthy")]
    ranks = [r for r in failed if r.get("rank") is not None]
    for group in (lost, ranks):
        if group:
            return min(group, key=lambda r: r.get("ended_at") or 0.0)
    left = left_first(records)
    if left is not None or not failed:
        return left
    return min(failed, key=lambda r: r.get("ended_at") or 0.0)

"""`treb logs`: one rank's log as written (on a terminal: controls shown as text, runtime/
lines.py), or all of them prefixed; `-f` follows to the end."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from trebuchet.backends import get_backend
from trebuchet.errors import UserError
from trebuchet.runner import refresh
from trebuchet.runtime.rundir.regular import open_regular
from trebuchet.store.db import RunRecord, Store
from trebuchet.view.follow import Follower, Out, attempt_logs

SYNC_S = 5.0  # -f: how often an engine's API is asked for the logs its nodes keep


def log_files(
    rec: RunRecord, attempt: int, rank: int | None, node: int | None
) -> list[tuple[str, Path]]:
    """(label, path) of the logs of one attempt that match the filters, in rank order."""
    ppn = max(1, rec.procs_per_node)
    found = []
    for kind, num, path in attempt_logs(Path(rec.run_dir) / f"attempt-{attempt}"):
        on = num // ppn if kind == "rank" else num
        label = f"{on}:{num % ppn}" if kind == "rank" else str(num)
        if node is not None and on != node:
            continue
        if rank is not None and (kind, num) != ("rank", rank):
            continue
        found.append((on, kind == "rank", num, label, path))  # a node's log before its ranks'
    return [(label, path) for *_, label, path in sorted(found)]


def main(args: argparse.Namespace) -> int:
    store = Store()
    rec = store.resolve(args.run)
    sync(store, rec)
    # --attempt counts from 1 as `treb status` shows attempts; the folder is attempt-<n-1>
    attempt = rec.attempt if args.attempt is None else args.attempt - 1
    if args.attempt is not None and (
        attempt < 0 or not (Path(rec.run_dir) / f"attempt-{attempt}").is_dir()
    ):
        raise UserError(f"run {rec.id} has no attempt {args.attempt}")
    files = log_files(rec, attempt, args.rank, args.node)
    if not files and not args.follow:
        what = f" for rank {args.rank}" if args.rank is not None else ""
        what += f" for node {args.node}" if args.node is not None else ""
        raise UserError(
            f"run {rec.id} has no logs{what} in attempt {attempt + 1} (state {rec.state})"
        )
    if not args.follow and all(_empty(path) for _, path in files):
        n = len(files)
        what = str(files[0][1]) if n == 1 else f"{n} logs of attempt {attempt + 1}"
        print(f"treb: run {rec.id}: {what}: empty, nothing was written (state {rec.state})",
              file=sys.stderr)  # fmt: skip
        return 0
    out = sys.stdout.buffer
    if getattr(args, "dedup", False) and (len(files) > 1 or len(_ranks(rec, args)) > 1):
        return _dedup(store, rec, files, out, args)
    # one log into a file or pipe: its bytes as written; on a terminal, lines (inert)
    if len(files) == 1 and not args.follow and args.tail is None and not sys.stdout.isatty():
        try:
            fh = open_regular(files[0][1])  # a FIFO or device is never read (regular.py)
        except OSError as exc:
            why = exc.strerror or exc
            raise UserError(f"run {rec.id}: cannot read {files[0][1]}: {why}") from None
        with fh:
            while chunk := fh.read(1 << 20):
                out.write(chunk)
        return 0
    single = len(files) == 1 and (args.rank is not None or not args.follow)
    follower = Follower(out, prefix=(lambda _label: b"") if single else None)
    for label, path in files:
        follower.add(label, path, tail_lines=args.tail)
    follower.pump()
    if args.follow:
        _follow(store, rec, follower, args)
    follower.close()
    return 0


def _dedup(
    store: Store,
    rec: RunRecord,
    files: list[tuple[str, Path]],
    out: Out,
    args: argparse.Namespace,
) -> int:
    """--dedup (view/dedup.py): what is written, merged by position; -f: then the new
    lines, grouped over a window of the time they were read."""
    from trebuchet.view import dedup
    from trebuchet.view.follow import _offset_of_last_lines

    def start(path: Path) -> int:
        return 0 if args.tail is None else _offset_of_last_lines(path, args.tail)

    follow_at = time.monotonic() if args.follow else None
    keys = [dedup.key_of(path) for _, path in files]
    # following a run that just started: its ranks' logs may not all be there yet
    expect = [] if not args.follow or any(k.startswith("n") for k in keys) else _ranks(rec, args)
    ends, grouped = dedup.written(
        out, [(path, start(path)) for _, path in files], follow_at, expect
    )
    if not args.follow:
        return 0

    def label_of(path: Path) -> str:
        key = dedup.key_of(path)
        grouped.know(key)
        return key

    follower = Follower(out, sink=lambda key, lines: grouped.add(key, lines, time.monotonic()))
    for (_, path), end in zip(files, ends, strict=True):
        follower.add(dedup.key_of(path), path)
        follower.tails[path].offset = end  # from where the written part ended
    _follow(store, rec, follower, args, lambda: grouped.flush(time.monotonic()), label_of)
    follower.close()
    grouped.flush(time.monotonic(), final=True)
    return 0


def _ranks(rec: RunRecord, args: argparse.Namespace) -> list[str]:
    """The ranks whose logs `--rank`/`--node` select (as dedup's keys), written yet or not."""
    ppn = max(1, rec.procs_per_node)
    ranks = range(max(1, rec.nodes) * ppn)
    return [str(r) for r in ranks if (args.rank is None or r == args.rank)
            and (args.node is None or r // ppn == args.node)]  # fmt: skip


def _empty(path: Path) -> bool:
    try:
        return path.stat().st_size == 0
    except OSError:
        return False


def sync(store: Store, rec: RunRecord) -> None:
    """Logs the engine keeps on its nodes (SkyPilot, Kubernetes) into the run directory;
    nothing for an engine whose ranks write there themselves."""
    try:
        engine = get_backend(rec.backend)
    except UserError:  # an engine no longer installed: read what is there
        return
    engine.sync_logs(store, rec)


def _follow(
    store: Store,
    rec: RunRecord,
    follower: Follower,
    args: argparse.Namespace,
    after_pump: Callable[[], None] | None = None,
    label_of: Callable[[Path], str] | None = None,
) -> None:
    """Print new lines until the run ends; picks up new files and new attempts.
    `after_pump`: each time after the follower printed (--dedup's due groups);
    `label_of`: the label of a log found later (default: node:local)."""
    attempt = rec.attempt if args.attempt is None else args.attempt
    next_check = 0.0
    next_sync = time.monotonic() + SYNC_S
    while True:
        follower.pump()
        if after_pump is not None:
            after_pump()
        now = time.monotonic()
        if now >= next_check:
            next_check = now + 0.5
            fresh = store.get(rec.id) or rec
            refresh(store, [fresh])
            fresh = store.get(rec.id) or fresh
            if now >= next_sync or not fresh.active:
                next_sync = now + SYNC_S
                sync(store, fresh)
            if args.attempt is None and fresh.attempt != attempt:
                attempt = fresh.attempt
            for label, path in log_files(fresh, attempt, args.rank, args.node):
                follower.add(label_of(path) if label_of else label, path)
            if not fresh.active:
                follower.pump()
                return
        time.sleep(0.1)

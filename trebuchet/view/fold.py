"""Knock-on tracebacks folded in the attached view: when a rank dies the others fail in their
next collective and print long tracebacks that say nothing of the cause. A traceback of a
rank whose attempt's first failure (runtime/rundir/records.claim_first) is another rank's
is shown as its last line and a note; the rank log keeps it all. A traceback is held until
it ends (a non-traceback line or HOLD_S of quiet) and decided then; with no first failure
recorded by then it is shown whole: only one known to follow another's failure is folded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

HOLD_S = 0.5  # after a traceback's last line, the time the first failure's record may take
MAX_HELD = 400  # lines: a traceback longer than this is shown as it comes
RANK_LOG = re.compile(r"^rank-(\d+)\.log$")
PREFIX = re.compile(rb"^\[(?:rank|default)\d+\]:\s?")  # torch's `[rank0]: ` before each line
HEAD = b"Traceback (most recent call last):"
CHAIN = (b"During handling of the above exception", b"The above exception was the direct cause")


def _text(line: bytes) -> bytes:
    return PREFIX.sub(b"", line)


class _Held:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.ended_at: float | None = None  # when its exception line came


class Fold:
    """Per log: lines pass through, a traceback is held until it ends, then shown whole or
    folded. `feed` and `due` return the lines to show now."""

    def __init__(self) -> None:
        self.held: dict[Path, _Held] = {}

    def feed(self, path: Path, lines: list[bytes], now: float) -> list[bytes]:
        if path not in self.held and HEAD not in b"\n".join(lines):
            return lines  # the common case, at C speed: a flood costs one join
        out: list[bytes] = []
        for line in lines:
            h = self.held.get(path)
            text = _text(line)
            if h is None:
                if text.strip() == HEAD:
                    self.held[path] = h = _Held()
                    h.lines.append(line)
                else:
                    out.append(line)
                continue
            if h.ended_at is None:  # inside: frames, code, carets, blank lines
                h.lines.append(line)
                if text[:1] not in (b" ", b"\t") and text.strip() and text.strip() != HEAD:
                    h.ended_at = now  # the exception line
                if len(h.lines) > MAX_HELD:
                    out += self._release(path, fold=False)
                continue
            if text.strip() == HEAD or text.strip().startswith(CHAIN) or not text.strip():
                h.lines.append(line)  # a chained traceback goes on
                h.ended_at = None if text.strip() == HEAD else h.ended_at
                continue
            out += self._release(path, fold=None)
            out += self.feed(path, [line], now)
        return out

    def due(self, now: float) -> list[tuple[Path, list[bytes]]]:
        """Tracebacks quiet for HOLD_S since their end, decided now."""
        ready = [p for p, h in self.held.items()
                 if h.ended_at is not None and now - h.ended_at >= HOLD_S]  # fmt: skip
        return [(p, self._release(p, fold=None)) for p in ready]

    def flush(self) -> list[tuple[Path, list[bytes]]]:
        """At the end: what is held, decided with what is known."""
        return [(p, self._release(p, fold=None)) for p in list(self.held)]

    def _release(self, path: Path, fold: bool | None) -> list[bytes]:
        h = self.held.pop(path)
        first = knock_on(path) if fold is None else None
        if first is None or not h.lines:
            return h.lines
        last = next((ln for ln in reversed(h.lines) if _text(ln).strip()), h.lines[-1])
        run = path.parent.parent.name
        rank = RANK_LOG.match(path.name)
        mine = f" --rank {rank.group(1)}" if rank else ""
        note = (f"[treb: a knock-on failure: rank {first} failed first; {len(h.lines) - 1} "
                f"traceback lines folded (`treb logs {run}{mine}`)]")  # fmt: skip
        return [last, note.encode()]


def knock_on(path: Path) -> int | None:
    """The rank that failed first in the attempt of rank log `path`, when it is another
    rank than `path`'s; None when none is on record, or it is this one, or either rank is
    unknown (never fold what may be the cause)."""
    from trebuchet.runtime.rundir.records import claimed_first

    mine = RANK_LOG.match(path.name)
    if mine is None:
        return None
    first = claimed_first(os.fspath(path.parent))
    rank = first.get("rank") if first else None
    if not isinstance(rank, int) or isinstance(rank, bool) or rank == int(mine.group(1)):
        return None
    return rank

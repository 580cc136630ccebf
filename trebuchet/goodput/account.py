"""Goodput: a run's wall time split by where it went, from its recorded timeline.

Pure functions over plain records (timeline.py reads them from a run's folder), linear in
their input: each attempt's marks are walked once. The split is a partition: every second
of the run's wall time (submission to its end, or now) goes to exactly one cause, so the
parts add up to `wall_s` (docs/goodput.md says what each one means).
"""

from __future__ import annotations

from typing import Any

# The causes, in the order of a run's life (docs/goodput.md)
PRODUCTIVE = "productive"
QUEUED = "queued"
ENVIRONMENT = "environment"
STARTUP = "startup"
REDONE = "redone"
RESTART = "restart"
HANG = "hang"
NODE_LOSS = "node_loss"
TEARDOWN = "teardown"
OTHER = "other"
LOST_CAUSES = (QUEUED, ENVIRONMENT, STARTUP, REDONE, RESTART, HANG, NODE_LOSS, TEARDOWN, OTHER)
ENDED_BADLY = ("FAILED", "TIMEOUT", "LOST", "CANCELLED")


class Attempt:
    """One attempt as recorded: its window, how it ended, and what its ranks marked.
    (Plain classes, not dataclasses: the end-of-run line must not import them, a second
    `treb run` imports no more than it needs: test_spec_cache.)"""

    def __init__(
        self, n: int, start: float, end: float | None, state: str = "RUNNING",
        steps: list[float] | None = None, checkpoints: list[float] | None = None,
        failed_at: float | None = None, node: str | None = None,
        hang_from: float | None = None, hang_acted: float | None = None,
        lost_from: float | None = None, lost_detected: float | None = None,
    ) -> None:  # fmt: skip
        self.n, self.start, self.end, self.state = n, start, end, state  # end None: running
        self.steps = steps if steps is not None else []  # step times, any order
        self.checkpoints = checkpoints if checkpoints is not None else []  # any order
        self.failed_at = failed_at  # the first failure's end (a rank's death)
        self.node = node  # the node of the first failure (or the lost one)
        self.hang_from, self.hang_acted = hang_from, hang_acted  # last progress, acted on
        self.lost_from, self.lost_detected = lost_from, lost_detected  # last seen, declared


class Timeline:
    """A run as recorded (timeline.py): submission, environment build, attempts, end."""

    def __init__(
        self, run: str, submitted: float, ended: float | None, environment_s: float = 0.0,
        attempts: list[Attempt] | None = None, name: str = "", state: str = "",
    ) -> None:  # fmt: skip
        self.run, self.submitted = run, submitted
        self.ended = ended  # None: still going (accounted up to `now`)
        self.environment_s = environment_s
        self.attempts = attempts if attempts is not None else []
        self.name, self.state = name, state
        # hang and node_lost events by attempt, until the attempts are known (timeline.py)
        self.pending: dict[int, list[dict[str, Any]]] = {}


class Goodput:
    """The split of one run's wall time (seconds by cause) and where the losses were."""

    def __init__(
        self, run: str, wall_s: float, seconds: dict[str, float], by_node: dict[str, float],
        attempts: int, name: str = "", state: str = "", marks: bool = False,
    ) -> None:  # fmt: skip
        self.run, self.wall_s, self.attempts = run, wall_s, attempts
        self.seconds = seconds  # every cause, PRODUCTIVE included; they add up to wall_s
        self.by_node = by_node  # lost seconds a node's failure caused (redone, hang, ...)
        self.name, self.state = name, state
        self.marks = marks  # steps were seen (else each attempt's window stands for them)

    @property
    def productive_s(self) -> float:
        return self.seconds[PRODUCTIVE]

    @property
    def ettr(self) -> float:
        """Effective training time ratio: training kept / wall time (0 for no time)."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def lost(self) -> dict[str, float]:
        return {c: self.seconds[c] for c in LOST_CAUSES}

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run, "name": self.name, "state": self.state,
            "wall_s": round(self.wall_s, 3), "productive_s": round(self.productive_s, 3),
            "ettr": round(self.ettr, 4), "attempts": self.attempts, "steps_seen": self.marks,
            "lost": {c: round(v, 3) for c, v in self.lost.items()},
            "lost_by_node": {n: round(v, 3) for n, v in sorted(self.by_node.items())},
        }  # fmt: skip


class _Split:
    """Seconds by cause, filled by walking boundaries forward (each clamped between the
    last one and the window's end, so no part is negative and they add up)."""

    def __init__(self, start: float) -> None:
        self.at = start
        self.seconds = dict.fromkeys((PRODUCTIVE, *LOST_CAUSES), 0.0)
        self.by_node: dict[str, float] = {}

    def to(self, when: float | None, cause: str, limit: float, node: str | None = None) -> None:
        """The time from the last boundary to `when` (clamped to [last, limit]) is `cause`."""
        if when is None:
            return
        until = min(max(when, self.at), max(limit, self.at))
        spent = until - self.at
        self.seconds[cause] += spent
        if node is not None and cause != PRODUCTIVE and spent > 0:
            self.by_node[node] = self.by_node.get(node, 0.0) + spent
        self.at = until


def _attempt(split: _Split, a: Attempt, end: float, first_attempt: bool, last: bool) -> None:
    """Account one attempt's window [a.start, end] (see docs/goodput.md)."""
    lead = STARTUP if first_attempt else RESTART
    steps = [t for t in a.steps if a.start <= t <= end]
    if not steps:  # no step seen: the attempt's window stands for its training
        steps = [a.start, end]
    first, final = min(steps), max(steps)
    split.to(first, lead, end)
    if a.state not in ENDED_BADLY or a.end is None:  # succeeded, or still running: kept
        split.to(final if a.end is not None else end, PRODUCTIVE, end)
        split.to(end, TEARDOWN if last else RESTART, end)
        return
    # a failed attempt: the training up to its last checkpoint is kept, the rest redone
    stop = a.hang_from if a.hang_from is not None else a.lost_from
    if stop is None:
        stop = a.failed_at if a.failed_at is not None else final
    saved = max((t for t in a.checkpoints if first <= t <= stop), default=None)
    if saved is not None:
        split.to(saved, PRODUCTIVE, end)
    split.to(stop, REDONE, end, a.node)
    if a.hang_from is not None:
        split.to(a.hang_acted, HANG, end, a.node)
    elif a.lost_from is not None:
        split.to(a.lost_detected, NODE_LOSS, end, a.node)
    split.to(end, TEARDOWN if last else RESTART, end)  # a retry's stop counts to its restart


def account(tl: Timeline, now: float) -> Goodput:
    """Where the run's wall time went (linear in the attempts and their marks)."""
    end = tl.ended if tl.ended is not None else now
    split = _Split(tl.submitted)
    attempts = sorted(tl.attempts, key=lambda a: a.n)
    if attempts:
        env_until = min(attempts[0].start, tl.submitted + max(0.0, tl.environment_s))
        queued_until = attempts[0].start - (env_until - tl.submitted)
        split.to(queued_until, QUEUED, end)
        split.to(attempts[0].start, ENVIRONMENT, end)
    for i, a in enumerate(attempts):
        nxt = attempts[i + 1].start if i + 1 < len(attempts) else end
        a_end = a.end if a.end is not None else nxt
        split.to(a.start, RESTART if i else QUEUED, end)  # between attempts: restarting
        _attempt(split, a, min(max(a_end, split.at), end), i == 0, i + 1 == len(attempts))
    if not attempts:
        split.to(end, QUEUED, end)
    split.to(end, TEARDOWN, end)  # the run's end after its last attempt
    return Goodput(
        run=tl.run, wall_s=max(0.0, end - tl.submitted), seconds=split.seconds,
        by_node=split.by_node, attempts=len(attempts), name=tl.name, state=tl.state,
        marks=any(a.steps for a in attempts),
    )  # fmt: skip


def total(items: list[Goodput]) -> Goodput:
    """Several runs as one (`treb goodput --by cause` over many)."""
    seconds = dict.fromkeys((PRODUCTIVE, *LOST_CAUSES), 0.0)
    by_node: dict[str, float] = {}
    for g in items:
        for c, v in g.seconds.items():
            seconds[c] += v
        for n, v in g.by_node.items():
            by_node[n] = by_node.get(n, 0.0) + v
    return Goodput(run="all", wall_s=sum(g.wall_s for g in items), seconds=seconds,
                   by_node=by_node, attempts=sum(g.attempts for g in items),
                   marks=any(g.marks for g in items))  # fmt: skip


def short(seconds: float) -> str:
    """'12s', '4m' (whole minutes under an hour), then as tables say it ('2h05m'): a
    cause's time in the summary line."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    from trebuchet.spec.duration import human

    return human(s)


WORDS = {QUEUED: "queued", ENVIRONMENT: "environment", STARTUP: "startup",
         REDONE: "redone", RESTART: "restarts", HANG: "hung", NODE_LOSS: "node loss",
         TEARDOWN: "teardown", OTHER: "other"}  # fmt: skip


def largest(g: Goodput, most: int) -> list[tuple[float, str]]:
    """The `most` largest losses of at least a second, (seconds, cause); ties in the order
    of a run's life."""
    found = [(v, c) for c, v in g.lost.items() if v >= 1.0]
    return sorted(found, key=lambda vc: (-vc[0], LOST_CAUSES.index(vc[1])))[:most]


def line(g: Goodput, most: int = 3) -> str:
    """`goodput 91 %: 4m restarts, 2m redone` (the largest losses of at least a second)."""
    pct = int(g.ettr * 100 + 0.5) if g.wall_s > 0 else 0
    losses = largest(g, most)
    text = f"goodput {pct} %"
    if losses:
        text += ": " + ", ".join(f"{short(v)} {WORDS[c]}" for v, c in losses)
    if not g.marks:
        text += " (no steps seen: print step=N or call trebuchet.dist.mark)"
    return text

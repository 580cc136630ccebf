"""What one rank's lines say: its exceptions (with the frame in user code), the causes the
catalog knows, the ranks a timeout names as absent, and its error-looking lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trebuchet.diagnose import catalog
from trebuchet.diagnose.catalog import CASCADE, CAUSE, TIMEOUT
from trebuchet.diagnose.lines import LogLine, number, parse

FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>.+?)\s*$')
NOT_USER = re.compile(r"site-packages|dist-packages|/lib(?:64)?/python\d|<frozen |/torch/")
CHAIN = re.compile(r"^(?:During handling of the above exception|The above exception was the "
                   r"direct cause)")  # fmt: skip
KEYS = re.compile(r"\bkeys?: (\S+/\d+(?:, ?\S+/\d+)*)")
NCCL_FROM = re.compile(r"retr(?:ie|ei)ving ncclUniqueId from \[(\d+)\]")
CRASH_ON = re.compile(r"crash on rank (\d+)")
MONITORED = re.compile(r"Ranks? ([\d, ]+?) failed to pass monitoredBarrier")
MASTER_CONNECT = re.compile(r"client socket has timed out after \S+ while trying to connect to")
WORLD = re.compile(r"\bworld_size[=: ]+(\d+)|\bnranks[= ](\d+)|\bsize=(\d+)\b|\d+/(\d+) clients")
SEQ = re.compile(r"WorkNCCL\(SeqNum=(\d+)|detected by watchdog at work(?: sequence id)?: (\d+)")
ENQUEUED = re.compile(r"last enqueued (?:NCCL )?work: (\d+)")
SUMMARY_MAX = 240


@dataclass
class Hit:
    """One line (or traceback) that explains, or follows from, a failure."""

    category: str  # a catalog category, or "cascade"
    strength: int
    line: LogLine
    summary: str
    evidence: list[str]
    frame: str | None = None  # the innermost frame in user code, for exceptions
    missing: tuple[int, ...] = ()  # ranks a timeout message names as absent
    chained: bool = False  # raised while handling an earlier exception

    @property
    def key(self) -> tuple[int, int, int]:
        return (-self.strength, int(self.chained), self.line.pos)


@dataclass
class Finding:
    """Everything one stream of lines (one rank, or one merged log) says."""

    hits: list[Hit] = field(default_factory=list)
    errors: list[LogLine] = field(default_factory=list)
    world_size: int | None = None
    timeout_seq: int | None = None  # NCCL: the collective this rank timed out in
    last_enqueued: int | None = None

    @property
    def best(self) -> Hit | None:
        return min(self.hits, key=lambda h: h.key) if self.hits else None

    @property
    def strength(self) -> int:
        best = self.best
        return best.strength if best else -1


GLOG_HEAD = re.compile(r"^\[?[IWEF]\d{3,4} [\d:.]+ (?:\d+ )?\S+:\d+\]\s*")


def _trim(text: str) -> str:
    text = GLOG_HEAD.sub("", text.strip())
    return text if len(text) <= SUMMARY_MAX else text[: SUMMARY_MAX - 3] + "..."


def user_frame(frames: list[tuple[str, str, str, str]]) -> tuple[str, str, str, str] | None:
    """The innermost frame outside site-packages, the stdlib and torch."""
    for fr in reversed(frames):
        if not NOT_USER.search(fr[0]):
            return fr
    return None


def _missing(text: str) -> tuple[int, ...]:
    found: list[int | None] = []
    m = KEYS.search(text)
    if m:
        found += [number(k.rsplit("/", 1)[1]) for k in re.split(r", ?", m.group(1)) if "/" in k]
    for rx in (NCCL_FROM, CRASH_ON):
        found += [number(x) for x in rx.findall(text)]
    m = MONITORED.search(text)
    if m:
        found += [number(x) for x in re.findall(r"\d+", m.group(1))]
    if MASTER_CONNECT.search(text):
        found.append(0)  # rank 0 hosts the rendezvous store
    return tuple(n for n in dict.fromkeys(found) if n is not None)


def _is_benign(text: str) -> bool:
    return bool(catalog.BENIGN.search(text)) and "NCCL WARN" not in text


def _line_hit(ln: LogLine, multi_host: bool | None) -> Hit | None:
    text = ln.text.strip()
    if not text or _is_benign(text):
        return None
    rule = catalog.match(text, multi_host)
    if rule is None:
        if catalog.EXCEPTION_LINE.match(text):
            return Hit("python_exception", CAUSE, ln, _trim(text), [ln.raw])
        return None
    missing = _missing(text) if rule.category == "collective_timeout" else ()
    return Hit(rule.category, rule.strength, ln, _trim(text), [ln.raw], missing=missing)


def _exception_hit(
    exc: LogLine, frames: list[tuple[str, str, str, str]], multi_host: bool | None, chained: bool
) -> Hit:
    text = exc.text.strip()
    rule = catalog.match(text, multi_host)
    category, strength = ("python_exception", CAUSE) if rule is None else (
        rule.category, rule.strength)  # fmt: skip
    fr = user_frame(frames)
    evidence: list[str] = []
    frame_text = None
    if fr:
        file, lineno, func, code = fr
        frame_text = f"{file}:{lineno} in {func}" + (f": {code}" if code else "")
        evidence.append(f'File "{file}", line {lineno}, in {func}')
        if code:
            evidence.append(f"    {code}")
    evidence.append(exc.raw)
    missing = _missing(text) if category == "collective_timeout" else ()
    return Hit(category, strength, exc, _trim(text), evidence, frame_text, missing, chained)


EXIT_ABORT = "terminate called without an active exception"
FAULT_DUMP = re.compile(r"^Fatal Python error: Aborted\b")
PY_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')


def exit_abort(lines: list[LogLine], last: list[str] | None = None) -> str | None:
    """Whether an aborted process had finished its program: "certain", "likely" or None.

    The sign is C++'s `terminate called without an active exception` (a thread object
    destroyed while still running: torch's process group torn down with the interpreter)
    as the rank's last words (`last`: the log's final lines, when known). faulthandler
    (PYTHONFAULTHANDLER=1), when on, settles it: the Python stack it dumps at the abort
    is empty (`<no Python frame>`) once main has returned, and has frames when the abort
    came during the work (None). Without the dump it is "likely": a native thread that
    calls std::terminate during the work prints the same words (rare; a Python error
    before it is the cause instead, and is found first)."""
    texts = [ln.text.strip() for ln in lines]
    at = next((i for i in range(len(texts) - 1, -1, -1) if texts[i] == EXIT_ABORT), None)
    if at is None:
        return None
    after = [t for t in texts[at + 1 :] if t]
    dump = next((i for i, t in enumerate(after) if FAULT_DUMP.match(t)), None)
    if dump is not None:
        stack = after[dump + 1 :]
        if any(PY_FRAME.match(t) for t in stack):
            return None
        return "certain" if "<no Python frame>" in stack else None
    tail = [parse(t).text.strip() for t in last] if last is not None else texts
    # the abort's words last (a shell's "Aborted (core dumped)" may follow)
    tail = [t for t in tail if t and not re.search(r"\bAborted\b", t)]
    return "likely" if tail and tail[-1] == EXIT_ABORT else None


TB_HEADER = "Traceback (most recent call last)"


def classify(lines: list[LogLine], multi_host: bool | None = None) -> Finding:
    """Read one stream of lines (in order) into a Finding."""
    out = Finding()
    n = len(lines)
    i = 0
    chained = False
    in_chain_gap = False
    while i < n:
        ln = lines[i]
        text = ln.text
        stripped = text.strip()
        # (or after a progress bar: tqdm's last update has no newline, Python's traceback
        # follows it on its line)
        if stripped.startswith(TB_HEADER) or stripped.endswith(TB_HEADER + ":"):
            frames: list[tuple[str, str, str, str]] = []
            j = i + 1
            while j < n:
                t = lines[j].text
                m = FRAME.match(t)
                if m:
                    code = ""
                    if j + 1 < n and not FRAME.match(lines[j + 1].text):
                        nxt = lines[j + 1].text
                        if (
                            nxt.startswith((" ", "\t"))
                            and nxt.strip()
                            and not set(nxt.strip()) <= set("^~ ")
                        ):
                            code = nxt.strip()
                    frames.append((m["file"], m["line"], m["func"], code))
                    j += 1
                    continue
                if not t.strip() or t.startswith((" ", "\t")) or t.strip() == "...":
                    j += 1
                    continue
                break
            if j < n:
                out.hits.append(_exception_hit(lines[j], frames, multi_host, chained))
                if catalog.errorish(lines[j].text):
                    out.errors.append(lines[j])
            chained = False
            in_chain_gap = True
            i = j + 1
            continue
        if CHAIN.match(stripped) and in_chain_gap:
            chained = True
            i += 1
            continue
        hit = _line_hit(ln, multi_host)
        if hit:
            out.hits.append(hit)
        if stripped and catalog.errorish(stripped):
            out.errors.append(ln)
        if stripped and not hit and not CHAIN.match(stripped):
            in_chain_gap = False
        for m in WORLD.finditer(text):
            size = number(next(g for g in m.groups() if g))
            if size is not None:
                out.world_size = max(out.world_size or 0, size)
        m = SEQ.search(text)
        seq = number(m.group(1) or m.group(2)) if m else None
        if seq is not None:
            out.timeout_seq = max(out.timeout_seq or 0, seq)
        m = ENQUEUED.search(text)
        seq = number(m.group(1)) if m else None
        if seq is not None:
            out.last_enqueued = max(out.last_enqueued or 0, seq)
        i += 1
    return out


__all__ = ["CASCADE", "CAUSE", "TIMEOUT", "Finding", "Hit", "classify", "user_frame"]

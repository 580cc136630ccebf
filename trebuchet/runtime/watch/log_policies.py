"""Log policies applied to a failed attempt's logs: the first policy whose pattern occurs
decides (no_retry: final; retry: another attempt, bounded), the same on every engine.

Python's `re` backtracks (`(a+)+$` is exponential on a line of a's), and there is no re2
where the runtime runs: unsafe_pattern() refuses the exponential forms at validation, and
the search runs in a child interpreter killed after MATCH_TIMEOUT_S, so that no pattern (a
polynomial `.*.*.*x` over a 4 MiB line included) can hold up supervision.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import subprocess
import sys
from typing import TYPE_CHECKING, Any, Iterable

from ..process import procs
from ..rundir.regular import open_regular

if TYPE_CHECKING:
    from os import PathLike

    from ..contracts.schema import LogPolicy

SCAN_BYTES = 4 << 20  # the end of each log holds the error; a huge log is not read whole
MATCH_TIMEOUT_S = 10.0
MAX_PATTERN = 1000  # characters
_BIG_REPEAT = 100  # a repeat allowing more than this many copies counts as unbounded


def unsafe_pattern(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN:
        return f"longer than {MAX_PATTERN} characters"
    try:
        re.compile(pattern, re.M)
    except (re.error, RecursionError, OverflowError) as exc:
        return f"not a valid regular expression: {exc}"
    try:
        tree = regex_tree(pattern, re.M)
    except Exception:  # noqa: BLE001 - compiled above, so only a parser difference
        return None
    if _exponential(tree, inside_unbounded=False):
        return (
            "can backtrack for ever (a repeat inside an unbounded repeat, such as (a+)+, or "
            "a repeated alternation, such as (a|ab)*): write it without the nesting"
        )
    return None


if sys.version_info >= (3, 11):  # by version: mypy reads the condition, not a try
    from re import _parser as sre_parser
else:  # pragma: no cover - the nodes' older interpreters
    import sre_parse as sre_parser

MAXREPEAT = sre_parser.MAXREPEAT  # an unbounded repeat's upper bound


def regex_tree(pattern: str | bytes, flags: int = 0) -> Any:
    """sre's parse tree; a bytes pattern parses as re.compile reads it."""
    return sre_parser.parse(pattern, flags)  # type: ignore[arg-type]


def _exponential(items: Any, inside_unbounded: bool) -> bool:
    for op, av in items:
        name = getattr(op, "name", str(op))
        if name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            if inside_unbounded and av[1] > 1:
                return True
            if _exponential(av[2], inside_unbounded or av[1] > _BIG_REPEAT):
                return True
            continue
        if name == "BRANCH" and inside_unbounded:
            return True
        if any(_exponential(b, inside_unbounded) for b in bodies(name, av)):
            return True
    return False


def bodies(name: str, av: Any) -> list[Any]:
    """The sub-patterns of one parsed item (sre_parse's layout, Python 3.8 to 3.13)."""
    if name == "BRANCH":
        return list(av[1])
    if name == "SUBPATTERN":
        return [av[-1]]
    if name in ("ASSERT", "ASSERT_NOT"):
        return [av[1]]
    if name == "ATOMIC_GROUP":
        return [av]
    if name == "GROUPREF_EXISTS":
        return [b for b in av[1:] if b is not None]
    return []


def _tail(path: str) -> str:
    try:
        with open_regular(path) as fh:  # a rank's FIFO never holds the supervisor
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - SCAN_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def _search(patterns: list[str], paths: list[str]) -> tuple[int, str] | None:
    texts = [_tail(p) for p in paths]
    for i, pattern in enumerate(patterns):
        rx = re.compile(pattern, re.M)
        for text in texts:
            m = rx.search(text)
            if m:
                start = text.rfind("\n", 0, m.start()) + 1
                end = text.find("\n", m.end())
                return i, text[start : end if end >= 0 else len(text)].strip()[:300]
    return None


class Matcher:
    """The child interpreter that searches the logs, one JSON request and answer a line.
    Started ahead (`start`), so that a retry does not wait for a fresh interpreter; killed
    when it does not answer in time."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen(
                procs.python_s(__name__, "_serve"), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def search(self, request: str, timeout: float) -> Any:
        self.start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(request.encode() + b"\n")
            proc.stdin.flush()
            if not select.select([proc.stdout], [], [], timeout)[0]:
                raise TimeoutError(f"no answer within {timeout:g} s")
            line = proc.stdout.readline()  # one write of one short line: whole
            if not line:
                raise OSError("the matcher ended")
            return json.loads(line)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None


def match(
    policies: list[LogPolicy],
    logs: Iterable[str | PathLike[str]],
    timeout: float = MATCH_TIMEOUT_S,
    matcher: Matcher | None = None,
) -> tuple[LogPolicy, str] | None:
    paths = [str(p) for p in logs]
    if not policies or not paths:
        return None
    request = json.dumps({"patterns": [p["pattern"] for p in policies], "paths": paths})
    own = matcher is None
    child = Matcher() if matcher is None else matcher
    try:
        found = child.search(request, timeout)
    except TimeoutError:
        sys.stderr.write(f"treb: log policies: no answer within {timeout:g} s; none applied\n")
        return None
    except (OSError, ValueError) as exc:
        sys.stderr.write(f"treb: log policies could not be matched: {exc}\n")
        return None
    finally:
        if own:
            child.close()
    if not found:
        return None
    return policies[found[0]], found[1]


def _serve() -> None:
    """The child's side: the log policies' {"patterns", "paths"}, or the webhooks' log watch's
    {"patterns", "files": [[path, offset]]}, answered with {"found", "offsets"}."""
    for line in sys.stdin:
        answer: Any = None
        try:
            request = json.loads(line)
            if "files" in request:
                answer = {"found": [], "offsets": []}  # a bad request finds nothing
                found, offsets = search_new(request["patterns"], request["files"])
                answer = {"found": found, "offsets": offsets}
            else:
                answer = _search(request["patterns"], request["paths"])
        except Exception:  # noqa: BLE001 - a bad request gets no match, the child lives on
            pass
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


def search_new(pats: list[str], files: list[list[Any]]) -> tuple[list[Any], list[int]]:
    compiled = [re.compile(p, re.M) for p in pats]
    found: dict[int, str] = {}
    offsets = []
    for path, offset in files:
        offset = int(offset)
        try:
            with open_regular(path) as fh:
                fh.seek(0, 2)
                size = fh.tell()
                offset = max(offset, size - SCAN_BYTES) if size >= offset else 0
                fh.seek(offset)
                data = fh.read(SCAN_BYTES)
        except OSError:
            offsets.append(offset)
            continue
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) < SCAN_BYTES:
            offsets.append(offset)  # no whole line yet
            continue
        chunk = data[: end or len(data)]
        offsets.append(offset + len(chunk))
        text = chunk.decode(errors="replace")
        for i, rx in enumerate(compiled):
            m = None if i in found else rx.search(text)
            if m:
                start = text.rfind("\n", 0, m.start()) + 1
                stop = text.find("\n", m.end())
                found[i] = text[start : stop if stop >= 0 else len(text)].strip()[:300]
    return [[i, line] for i, line in sorted(found.items())], offsets


RETRY, FINAL, EXHAUSTED, NO_MATCH = "retry", "final", "exhausted", "no match"


def decide(
    policies: list[LogPolicy],
    logs: Iterable[str | PathLike[str]],
    granted: dict[str, int],
    matcher: Matcher | None = None,
) -> tuple[str, LogPolicy | None, str]:
    """(verdict, policy, line); `granted` counts the retries each policy granted (the
    caller keeps it across a Slurm requeue). EXHAUSTED: the spec's retries decide."""
    found = match(policies, logs, matcher=matcher)
    if not found:
        return NO_MATCH, None, ""
    policy, line = found
    if policy["action"] != "retry":
        return FINAL, policy, line
    name = policy["name"]
    if granted.get(name, 0) >= int(policy.get("max_retries", 3)):
        return EXHAUSTED, policy, line
    granted[name] = granted.get(name, 0) + 1
    return RETRY, policy, line

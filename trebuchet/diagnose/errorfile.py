"""A rank's structured error: the JSON torch's `@record` writes to TORCHELASTIC_ERROR_FILE,
which trebuchet points at `attempt-<n>/errors/rank-<r>.json` under every launcher.

Why: a log may be cut, interleaved or flooded; the error file holds the exact exception and
traceback. Read defensively: user code writes it (size capped, any shape, controls shown).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.runtime.contracts.rank_env import error_file
from trebuchet.runtime.rundir.regular import open_regular

MAX_BYTES = 1 << 20  # a traceback is a few KiB; anything bigger is cut, not read whole
MESSAGE_MAX = 500
FRAMES = 3  # the traceback's last frames quoted
FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$')
RECORD_WRAPPER = "torch/distributed/elastic/multiprocessing/errors/"  # @record's own frame
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass
class RankError:
    """The exception one rank raised, as its error file says."""

    message: str  # "ValueError: corrupt batch 7"
    frames: list[str] = field(default_factory=list)  # last frames, innermost last
    file: str = ""
    timestamp: int | None = None

    def to_json(self) -> dict[str, object]:
        return {"message": self.message, "frames": self.frames, "file": self.file,
                "timestamp": self.timestamp}  # fmt: skip


def _clean(text: str, limit: int) -> str:
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def frames(stack: str, count: int = FRAMES) -> list[str]:
    """`file:line in func: code` for the last `count` frames of a Python traceback."""
    lines = stack.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        m = FRAME.match(line)
        if not m or RECORD_WRAPPER in m["file"].replace("\\", "/"):
            continue
        code = lines[i + 1].strip() if i + 1 < len(lines) else ""
        code = "" if FRAME.match(code) or code.startswith(("^", "~")) else code
        where = f"{m['file']}:{m['line']} in {m['func'].strip()}"
        out.append(_clean(f"{where}: {code}" if code else where, 300))
    return out[-count:]


def read(path: Path) -> RankError | None:
    """The error in one error file; None when there is none or it is not torch's JSON."""
    try:
        with open_regular(path) as fh:  # a FIFO or a device in its place never blocks
            raw = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(raw) > MAX_BYTES:
        return None
    try:
        data = json.loads(raw.decode(errors="replace"))
    except (ValueError, RecursionError):
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    extra: object = None
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        msg = msg.get("message")
    if not isinstance(msg, str) or not msg.strip():
        return None
    stack = extra.get("py_callstack") if isinstance(extra, dict) else None
    stamp = extra.get("timestamp") if isinstance(extra, dict) else None
    return RankError(
        message=_clean(" | ".join(ln.strip() for ln in msg.strip().splitlines()), MESSAGE_MAX),
        frames=frames(stack) if isinstance(stack, str) else [],
        file=str(path),
        timestamp=int(stamp)
        if isinstance(stamp, str) and stamp.isascii() and stamp.isdigit() and len(stamp) < 16
        else None,
    )


def for_rank(attempt_dir: Path, rank: int) -> RankError | None:
    """Rank `rank`'s error in this attempt, if it wrote one."""
    return read(Path(error_file(str(attempt_dir), f"rank-{rank}")))

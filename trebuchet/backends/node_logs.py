"""The node agents' output, as an engine's API returns it, turned back into per-rank logs.

Why: on SkyPilot and Kubernetes the ranks' log files stay on the nodes; what the engine
keeps is each node agent's stdout, where the agent copies every rank's lines with their
label (`[1:0] text`, runtime/node/logcopy.py). Split back by label, `treb logs`, `diagnose`
and `results` read those runs like any other. Each sync gets the whole output again, so a
file only grows (what it holds is kept, the rest appended): a follower sees new lines.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from trebuchet.runtime.rundir.regular import open_regular

LABEL = re.compile(r"^\[(\d+)(?::(\d+))?\] ?(.*)$")


def split(text: str, ppn: int, node: int | None = None) -> dict[str, str]:
    """{file name: text} from one node agent's output (`node`: the node it came from, when
    the engine keeps one stream per node). Unlabelled lines go to agent-node-<k>.log."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = LABEL.match(line)
        if m and m.group(2) is not None:
            n, local = int(m.group(1)), int(m.group(2))
            name = f"rank-{n * ppn + local}.log"
        elif m:
            name = f"node-{int(m.group(1))}.log"
        else:
            name = f"agent-node-{node if node is not None else 0}.log"
            out.setdefault(name, []).append(line)
            continue
        out.setdefault(name, []).append(m.group(3))
    return {name: "".join(f"{line}\n" for line in lines) for name, lines in out.items()}


def write(run_dir: Path, attempt: int, files: dict[str, str]) -> list[Path]:
    """Bring the files of `attempt-<attempt>/` up to `files`: appended to when they hold a
    beginning of it, rewritten otherwise (the engine's log was cut)."""
    adir = run_dir / f"attempt-{attempt}"
    adir.mkdir(parents=True, exist_ok=True, mode=0o700)
    written = []
    for name, text in files.items():
        path = adir / name
        data = text.encode("utf-8", "replace")
        have: bytes | None
        try:
            with open_regular(path) as fh:
                have = fh.read()
        except FileNotFoundError:
            have = b""
        except OSError:  # not a regular file (a FIFO there): replaced whole, never opened
            have = None
        if have == data:
            continue
        if have is not None and data.startswith(have):
            with open(path, "ab") as fh:
                fh.write(data[len(have) :])
        else:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        written.append(path)
    return written

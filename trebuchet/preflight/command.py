"""Reading the workload's own command: which launcher it starts and with which options.

Heuristics on words, not a shell parser: a check that cannot tell stays silent.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

SEPARATORS = re.compile(r"[\s;&|()`]+")
TORCH_MODULES = ("torch.distributed.run", "torch.distributed.launch")
# Launchers that start several processes per node (or per job) themselves.
SPAWNERS = ("torchrun", "deepspeed", "mpirun", "mpiexec", "srun")
MAX_SCRIPT_BYTES = 200_000


def command_text(command: str | list[str]) -> str:
    return command if isinstance(command, str) else shlex.join(command)


def words(text: str) -> list[str]:
    """Shell words, further split at separators (so `bash -c "torchrun x"` yields torchrun)."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError:  # unbalanced quotes: fall back to plain splitting
        tokens = [t.strip("'\"") for t in text.split()]
    return [w for t in tokens for w in SEPARATORS.split(t) if w]


def launchers(ws: list[str]) -> list[str]:
    """The launchers these words start, as written (`torchrun`, `python -m torch...`)."""
    found: list[str] = []
    for i, w in enumerate(ws):
        prev = ws[i - 1] if i else ""
        base = w.rsplit("/", 1)[-1]
        name = None
        if w in TORCH_MODULES or (w.startswith("-m") and w[2:] in TORCH_MODULES):
            name = f"python -m {w.removeprefix('-m')}"
        elif base in SPAWNERS and not prev.startswith("-"):
            name = base
        elif base == "accelerate" and i + 1 < len(ws) and ws[i + 1] == "launch":
            name = "accelerate launch"
        if name and name not in found:
            found.append(name)
    return found


def is_torchrun(name: str) -> bool:
    return name == "torchrun" or name.startswith("python -m torch.distributed")


def script_bytes(word: str, workdir: Path) -> bytes | None:
    """A script the command names (relative to the workdir); None: no file, or too big to
    be a script."""
    path = Path(word) if Path(word).is_absolute() else workdir / word
    try:
        if path.is_file() and path.stat().st_size <= MAX_SCRIPT_BYTES:
            return path.read_bytes()
    except OSError:
        pass
    return None


def python_script(ws: list[str]) -> str | None:
    """The command's Python script: its first `.py` word."""
    return next((w for w in ws if w.endswith(".py") and not w.startswith("-")), None)


def scripts(ws: list[str], workdir: Path) -> list[tuple[str, str]]:
    """(name, text) of the shell scripts in the workdir that the command runs."""
    out = []
    for w in ws:
        data = script_bytes(w, workdir) if w.endswith(".sh") and not w.startswith("-") else None
        if data is not None:
            out.append((w, data.decode(errors="replace")))
    return out


def option(ws: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `--name V`, `--name=V`, `-name V` among `ws`; names with an
    underscore also match as Hydra-style `key.path.name=V` overrides."""
    value = None
    for i, w in enumerate(ws):
        key, eq, val = w.partition("=")
        bare = key.lstrip("-")
        if key.startswith("-") and bare in names:
            if eq:
                value = val
            elif i + 1 < len(ws):
                value = ws[i + 1]
        elif eq and not key.startswith("-"):
            last = key.lstrip("+").rsplit(".", 1)[-1]
            if "_" in last and last in names:
                value = val
    return value


def as_int(value: str | None, env: dict[str, Any]) -> int | None:
    """An integer option value; `$X` and `${X}` are looked up in the spec's env."""
    if value is None:
        return None
    m = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", value)
    if m:
        value = str(env.get(m.group(1), ""))
    return int(value) if value.isdigit() else None

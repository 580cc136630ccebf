"""`launcher: horovod` here: does the horovod that horovodrun runs have what the spec needs?

A horovod built without PyTorch or without the spec's controller (a pip install without a
toolchain silently leaves MPI or Gloo out) starts and then fails in every hvd.init().
`horovodrun --check-build` imports torch (seconds), so its answer is cached in
~/.cache/trebuchet by horovodrun's path, size and mtime: once per install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import ERROR, Finding


def built(text: str) -> set[str]:
    """The names checked [X] in `horovodrun --check-build`'s output (PyTorch, MPI, Gloo)."""
    section = ""
    out: set[str] = set()
    for line in text.splitlines():
        if line.rstrip().endswith(":"):
            section = line.strip().rstrip(":")
        m = re.match(r"\s*\[X\]\s+(\S+)", line)
        if m and section in ("Available Frameworks", "Available Controllers"):
            out.add(m.group(1))
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "trebuchet"


def check_build_output(exe: str) -> str | None:
    """horovodrun --check-build's output, from the cache when this horovodrun was asked."""
    import hashlib  # here: OpenSSL costs every `treb run` ~4 MiB, only horovod needs it

    from trebuchet.store.files import write_atomic

    st = os.stat(exe)
    key = hashlib.sha256(f"{exe}\0{st.st_mtime_ns}\0{st.st_size}".encode()).hexdigest()[:16]
    path = cache_dir() / f"horovod-check-build-{key}.txt"
    try:
        return path.read_text()
    except OSError:
        pass
    try:
        res = subprocess.run([exe, "--check-build"], capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, res.stdout, durable=False)
    return res.stdout


def horovod_build(ctx: Context) -> list[Finding]:
    spec = ctx.spec
    if spec.launcher != "horovod" or ctx.remote or spec.environment is not None:
        return []  # horovodrun runs elsewhere (or in an environment built later)
    exe = shutil.which("horovodrun", path=ctx.environ.get("PATH"))
    if exe is None:
        return []  # the engine refuses it by name
    text = check_build_output(exe)
    if text is None:
        return []
    have = built(text)
    want = "MPI" if spec.env.get("HOROVOD_CONTROLLER") == "mpi" else "Gloo"
    missing = [name for name in ("PyTorch", want) if name not in have]
    if not missing:
        return []
    return [
        ctx.finding(
            "horovod-build",
            ERROR,
            f"the horovod that {exe} runs was built without {' and '.join(missing)} "
            f"(horovodrun --check-build): every rank would fail in hvd.init()",
            "rebuild it with HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 (HOROVOD_WITH_MPI=1 "
            "for mpi) and a C++17 compiler: docs/horovod.md has the recipe",
            "launcher",
        )
    ]

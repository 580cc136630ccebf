"""The runtime as one file each run carries: `treb-runtime-<version>-<hash>.pyz`.

Why a zipapp: the node agent and the job controller (trebuchet/runtime) must run where
trebuchet is not installed (a Slurm node, a container image, a pod) with nothing but
python3 >= 3.8. The archive is deterministic (fixed timestamps, sorted names), so its name
says exactly which code a run executed, and the same sources always give the same bytes.
"""

from __future__ import annotations

import hashlib
import io
import sys
import zipfile
from functools import lru_cache
from importlib._bootstrap_external import _code_to_hash_pyc  # noqa: PLC2701
from importlib.util import source_hash
from pathlib import Path

from trebuchet import runtime
from trebuchet.store.files import write_atomic_bytes

PACKAGE = "treb_runtime"  # the runtime's name inside the archive (its imports are relative)
# The archive's entry: the package's own __main__.py (it checks the Python version first).
MAIN = 'import runpy\n\nrunpy.run_module("treb_runtime", run_name="__main__", alter_sys=True)\n'


def _sources() -> list[tuple[str, bytes]]:
    folder = Path(runtime.__file__).parent
    return [(p.name, p.read_bytes()) for p in sorted(folder.glob("*.py"))]


def _bytecode(name: str, data: bytes) -> bytes:
    """An unchecked hash-based .pyc of one module, for this interpreter: the nodes' python3
    that matches it skips compiling the runtime at every start (a few ms per agent, which a
    200-point array or 64 agents on a node add up); another version ignores it and
    compiles the .py beside it (zipimport falls back on a magic number it does not know)."""
    code = compile(data, f"{PACKAGE}/{name}", "exec", dont_inherit=True)
    return bytes(_code_to_hash_pyc(code, source_hash(data), False))


@lru_cache(maxsize=1)
def archive() -> tuple[str, bytes]:
    """(file name, bytes) of the runtime archive for the installed sources."""
    sources = _sources()
    digest = hashlib.sha256(sys.implementation.cache_tag.encode())
    for name, data in sources:
        digest.update(name.encode() + b"\0" + data + b"\0")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        entries = [("__main__.py", MAIN.encode())]
        for name, data in sources:
            entries.append((f"{PACKAGE}/{name}", data))
            if name != "__main__.py":  # run as a script by runpy: compiled each time anyway
                entries.append((f"{PACKAGE}/{name[:-3]}.pyc", _bytecode(name, data)))
        for name, data in entries:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    return f"treb-runtime-{runtime.VERSION}-{digest.hexdigest()[:12]}.pyz", buf.getvalue()


def file_name() -> str:
    return archive()[0]


def ship(run_dir: Path) -> Path:
    """Write the archive into the run directory; returns its path."""
    name, data = archive()
    path = run_dir / name
    write_atomic_bytes(path, data)
    return path

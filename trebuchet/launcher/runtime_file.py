"""The runtime as one file each run carries: `treb-runtime-<version>-<hash>.pyz`.

Why a zipapp: the node agent and the job controller (trebuchet/runtime) must run where
trebuchet is not installed (a Slurm node, a container image, a pod) with nothing but
python3 >= 3.8. Its name is a hash of the sources, so it says exactly which code a run
executed; fixed timestamps and sorted names keep the zip stable (the .pyc inside may differ
in marshal's reference flags from one build to the next, which is why it is built once per
set of sources into TREB_HOME/cache and linked into the runs).
"""

from __future__ import annotations

import io
import os
import sys
from functools import lru_cache
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]  # noqa: PLC2701
from importlib.util import source_hash
from pathlib import Path

from trebuchet import runtime
from trebuchet.store.files import write_atomic_bytes
from trebuchet.store.paths import treb_home

PACKAGE = "treb_runtime"  # the runtime's name inside the archive (its imports are relative)
# The archive's entry: the package's own __main__.py (it checks the Python version first).
MAIN = 'import runpy\n\nrunpy.run_module("treb_runtime", run_name="__main__", alter_sys=True)\n'


def _sources() -> list[tuple[str, bytes]]:
    folder = Path(runtime.__file__).parent
    return [(p.relative_to(folder).as_posix(), p.read_bytes()) for p in _files(folder)]


def _files(folder: Path) -> list[Path]:
    """The runtime's modules, its sub-packages' included, in a stable order."""
    return sorted(folder.rglob("*.py"), key=lambda p: p.relative_to(folder).as_posix())


def _bytecode(name: str, data: bytes) -> bytes:
    """An unchecked hash-based .pyc of one module, for this interpreter: the nodes' python3
    that matches it skips compiling the runtime at every start (a few ms per agent, which a
    200-point array or 64 agents on a node add up); another version ignores it and
    compiles the .py beside it (zipimport falls back on a magic number it does not know)."""
    code = compile(data, f"{PACKAGE}/{name}", "exec", dont_inherit=True)
    return bytes(_code_to_hash_pyc(code, source_hash(data), False))


def _build(sources: list[tuple[str, bytes]]) -> tuple[str, bytes]:
    import hashlib  # here: `treb run` with the native launcher never ships a runtime file
    import zipfile

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


def _cache_key() -> str:
    """Names, sizes and mtimes of the installed sources (stat only: building the archive
    compiles every module, ~15 ms that every `treb run` would pay)."""
    import hashlib

    folder = Path(runtime.__file__).parent
    digest = hashlib.sha256(f"{sys.implementation.cache_tag} {runtime.VERSION}".encode())
    for path in _files(folder):
        st = path.stat()
        digest.update(f"{path.relative_to(folder)} {st.st_size} {st.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def cached_path() -> Path | None:
    """The archive in TREB_HOME/cache, built on first use for these sources: the file the
    runs link to (its name: the sources' stat key, then the archive's name). None when the
    cache cannot be written: the callers build the archive in memory instead."""
    cache = treb_home() / "cache"
    key = _cache_key()
    try:
        for found in cache.glob(f"{key}-treb-runtime-*.pyz"):
            return found
        name, data = _built()
        cache.mkdir(mode=0o700, exist_ok=True)  # private to the user, like TREB_HOME
        path = cache / f"{key}-{name}"
        write_atomic_bytes(path, data)
    except OSError:
        return None
    return path


@lru_cache(maxsize=1)
def _built() -> tuple[str, bytes]:
    return _build(_sources())


def archive() -> tuple[str, bytes]:
    """(file name, bytes) of the runtime archive for the installed sources."""
    path = cached_path()
    if path is None:
        return _built()
    return path.name.split("-", 1)[1], path.read_bytes()


def file_name() -> str:
    path = cached_path()
    return _built()[0] if path is None else path.name.split("-", 1)[1]


def ship(run_dir: Path) -> Path:
    """Put the archive into the run directory (a hard link to the cached file where the
    filesystem allows it; else a copy); returns its path."""
    cached = cached_path()
    if cached is None:
        name, data = _built()
        write_atomic_bytes(run_dir / name, data)
        return run_dir / name
    path = run_dir / cached.name.split("-", 1)[1]
    try:
        os.link(cached, path)
    except FileExistsError:
        pass
    except OSError:
        write_atomic_bytes(path, cached.read_bytes())
    return path

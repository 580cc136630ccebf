"""Validated specs, remembered, so that `treb run` of a known spec starts without importing
pydantic and building the models (0.1-0.2 s of a 0.3 s launch).

An entry is used only when all validation read is unchanged (the spec's bytes and path,
the overrides, the workdir, each expanded variable, trebuchet's code, Python and the
installed packages). A damaged entry is a miss, an unwritable cache only costs speed.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

FORMAT = 2  # 2: variables as salted digests (1 kept their values)
MAX_ENTRIES = 256  # the oldest are removed beyond this


class Recording(Mapping[str, str]):
    """The environment as validation sees it, remembering each name it looked up."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        self.seen: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.seen.add(name)
        return self._environ[name]

    def __contains__(self, name: object) -> bool:
        if isinstance(name, str):
            self.seen.add(name)
        return name in self._environ

    def __iter__(self) -> Iterator[str]:  # a listing would depend on every variable
        raise TypeError("the spec cache cannot follow a listing of the environment")

    def __len__(self) -> int:
        return len(self._environ)


def _file_name(key: str) -> str:
    """A checksum of the key names the entry's file (hashlib's OpenSSL alone takes longer to
    import than a lookup); the entry holds the whole key, compared in full."""
    data = key.encode("utf-8", "surrogatepass")
    return f"{zlib.crc32(data):08x}{zlib.adler32(data):08x}{len(data):x}.json"


def _code_stamp() -> list[Any]:
    """trebuchet's modules, the Python version, and the mtime of each site-packages folder
    (installing or removing a package changes it)."""
    pkg = Path(__file__).resolve().parent.parent
    files = []
    for folder, dirs, names in os.walk(pkg):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                st = os.stat(os.path.join(folder, name))
                files.append(f"{folder[len(str(pkg)) :]}/{name}:{st.st_size}:{st.st_mtime_ns}")
    folders = []
    for entry in sys.path:
        if os.path.basename(entry) not in ("site-packages", "dist-packages"):
            continue  # where installed packages (their entry points) are
        try:
            folders.append(f"{entry}:{os.stat(entry).st_mtime_ns}")
        except OSError:
            folders.append(f"{entry}:-")
    return [sys.version, files, folders]


def usable() -> bool:
    """No engine registered in this process (its options would change the model)."""
    from trebuchet import registry

    return registry.generation() == 0 and os.environ.get("TREB_SPEC_CACHE", "1") != "0"


def always() -> bool:
    """TREB_SPEC_CACHE=always: a spec is used as the cache gives it back even the first
    time, so that the test suite tries the cached form in every test."""
    return os.environ.get("TREB_SPEC_CACHE") == "always"


def entry_key(path: Path, text: str, overrides: list[str]) -> str:
    """Everything an entry depends on but the environment, as one string."""
    material = [FORMAT, str(path), os.getcwd(), text, overrides, _code_stamp()]
    return json.dumps(material, ensure_ascii=False)


def _folder() -> Path:
    from trebuchet.store.paths import treb_home

    return treb_home() / "cache" / "specs-2"


def lookup(key: str, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The entry for `key` when the variables it expanded still have the same values."""
    try:
        entry = json.loads((_folder() / _file_name(key)).read_text(errors="surrogatepass"))
        if entry.get("format") != FORMAT or entry.get("key") != key:
            return None
        salt = bytes.fromhex(entry["salt"])
        for name, digest in entry["env"].items():
            if _digest(salt, environ.get(name)) != digest:
                return None
        if not isinstance(entry["data"], dict) or not isinstance(entry["models"], dict):
            return None
        return entry
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _digest(salt: bytes, value: str | None) -> str | None:
    """A salted digest of a variable validation read, never its value (it may hold a
    credential). blake2b from _blake2: hashlib would load OpenSSL (3 ms)."""
    if value is None:
        return None
    from _blake2 import blake2b

    return blake2b(value.encode("utf-8", "surrogatepass"), digest_size=20, salt=salt).hexdigest()


def store(key: str, entry: dict[str, Any], seen: set[str], environ: Mapping[str, str]) -> None:
    """Write the entry (a temporary file, then a rename); failures are ignored."""
    salt = os.urandom(16)
    env = {name: _digest(salt, environ.get(name)) for name in sorted(seen)}
    text = json.dumps(
        {"format": FORMAT, "key": key, "salt": salt.hex(), "env": env, **entry},
        ensure_ascii=False,
    )
    try:
        folder = _folder()
        if not folder.exists():  # format 1's entries held the values of variables
            import shutil

            shutil.rmtree(folder.parent / "specs", ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = _file_name(key)
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
        os.replace(tmp, folder / name)
        _trim(folder)
    except Exception:  # noqa: BLE001 - a full disk, a read-only TREB_HOME: only slower
        return


def _trim(folder: Path) -> None:
    entries = list(os.scandir(folder))
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda e: e.stat().st_mtime)
    for e in entries[: len(entries) - MAX_ENTRIES]:
        try:
            os.unlink(e.path)
        except OSError:
            continue

"""The runtime archive each run carries: built once per set of sources into TREB_HOME/cache,
then linked into every run directory (building it compiles every module: ~15 ms a run)."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from trebuchet.launcher import runtime_file


def test_runs_share_one_cached_archive(treb_home: Path, tmp_path: Path) -> None:
    a, b = tmp_path / "run-a", tmp_path / "run-b"
    a.mkdir()
    b.mkdir()
    first, second = runtime_file.ship(a), runtime_file.ship(b)
    assert first.name == second.name == runtime_file.file_name()
    (cached,) = (treb_home / "cache").glob("*-treb-runtime-*.pyz")
    assert first.stat().st_ino == second.stat().st_ino == cached.stat().st_ino
    assert first.stat().st_mode & 0o777 == 0o600
    assert (treb_home / "cache").stat().st_mode & 0o777 == 0o700
    # the same sources as an archive built in memory: the cache changes nothing but speed
    assert _sources_in(first.read_bytes()) == _sources_in(runtime_file._built()[1])
    assert "treb_runtime/node/agent.py" in _sources_in(first.read_bytes())


def _sources_in(archive: bytes) -> dict[str, bytes]:
    """The .py files of an archive (the .pyc beside them may differ in marshal's
    reference flags from one compile to the next; the code is the same)."""
    with zipfile.ZipFile(io.BytesIO(archive)) as zf:
        return {n: zf.read(n) for n in zf.namelist() if n.endswith(".py")}


def test_an_unwritable_cache_builds_in_memory(
    treb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    treb_home.mkdir(parents=True, exist_ok=True)
    (treb_home / "cache").write_text("a file where the cache folder would be\n")
    run = tmp_path / "run"
    run.mkdir()
    shipped = runtime_file.ship(run)
    assert _sources_in(shipped.read_bytes()) == _sources_in(runtime_file._built()[1])
    assert runtime_file.archive()[0] == shipped.name


def test_changed_sources_get_a_new_archive(
    treb_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = runtime_file.cached_path()
    monkeypatch.setattr(runtime_file, "_cache_key", lambda: "0" * 16)
    monkeypatch.setattr(runtime_file, "_built", lambda: ("treb-runtime-1-abcdefabcdef.pyz", b"x"))
    after = runtime_file.cached_path()
    assert before != after and after.name == f"{'0' * 16}-treb-runtime-1-abcdefabcdef.pyz"

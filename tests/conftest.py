"""Shared fixtures: a fresh TREB_HOME per test and a `treb` runner over real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parent.parent

# Property-based tests: random examples on a developer's machine (new inputs each run find
# new bugs), the same examples in CI (a submission is judged by its change, not by what one
# draw of hypothesis happened to find elsewhere). Set HYPOTHESIS_PROFILE=dev to draw in CI.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("ci" if os.environ.get("CI", "").lower() in ("1", "true", "yes") else "dev")
)
BIN = str(Path(sys.executable).parent)


def run_cgroups() -> set[str]:
    """Every run's cgroup (`treb-<run id>`) on this machine's cgroup2 mounts."""
    from trebuchet.runtime.process.contain import cgroup2_mounts

    found = set()
    for _root, mount in cgroup2_mounts():
        for folder, dirs, _files in os.walk(mount):
            found.update(os.path.join(folder, d) for d in dirs if d.startswith("treb-"))
    return found


def _ours(cgroups: set[str], base: Path) -> set[str]:
    """The cgroups of runs recorded under this pytest process's temporary folder: another
    pytest process running beside this one (make test runs two) has runs of its own."""
    ids = {p.name for p in base.glob("**/runs/*") if p.is_dir()}
    return {c for c in cgroups if os.path.basename(c).removeprefix("treb-") in ids}


@pytest.fixture(scope="session", autouse=True)
def _no_run_cgroup_outlives_the_suite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A run's cgroup left behind is a run whose end escaped its supervisor and watchdog
    (an orphan, or a cleanup path that failed): the suite fails on it. A watchdog may still
    be removing the last run's cgroup, so it gets a few seconds."""
    before = run_cgroups()
    yield
    base = tmp_path_factory.getbasetemp()
    deadline = time.monotonic() + 15
    while (left := _ours(run_cgroups() - before, base)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"run cgroups outlived the tests: {sorted(left)}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the Slurm test cluster or the ssh test hosts is marked so by the
    fixture it asks for, whatever its module says: `make test` runs the integration tests
    that use neither beside those that do, and selects them by these marks."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "slurm_conf" in names:
            item.add_marker(pytest.mark.slurm)
        if "ssh_config" in names:
            item.add_marker(pytest.mark.ssh)


@pytest.fixture(autouse=True)
def _own_treb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test, also one that only loads a spec (the spec cache writes under TREB_HOME),
    has its own TREB_HOME: nothing reaches the user's ~/.trebuchet."""
    monkeypatch.setenv("TREB_HOME", str(tmp_path / "treb-home"))


@pytest.fixture
def treb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "treb-home"
    monkeypatch.setenv("TREB_HOME", str(home))
    # Ranks run in the submitting environment: make it this test interpreter's.
    monkeypatch.setenv("PATH", BIN + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return home


TrebFn = Callable[..., subprocess.CompletedProcess]


@pytest.fixture
def treb(treb_home: Path) -> TrebFn:
    """Run the real `treb` CLI in a child process; returns the CompletedProcess."""

    def run(
        *args: str, timeout: float = 300, env: dict | None = None, **kw
    ) -> subprocess.CompletedProcess:
        full_env = {**os.environ, **(env or {})}
        return subprocess.run(
            [sys.executable, "-m", "trebuchet", *args], capture_output=True, text=True,
            timeout=timeout, env=full_env, **kw,
        )  # fmt: skip

    return run


def in_ci() -> bool:
    """CI=true: what a developer may skip must run (or fail) there."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def needs(module: str):
    """Import an optional test dependency: skipped locally when absent, a failure in CI."""
    if in_ci():
        return __import__(module)
    return pytest.importorskip(module)


def needs_program(name: str) -> str:
    """A program the test needs: skipped locally when absent, a failure in CI."""
    import shutil

    found = shutil.which(name)
    if not found:
        if in_ci():
            pytest.fail(f"{name} is not installed (make test installs it)")
        pytest.skip(f"{name} is not installed")
    return found


def status_json(treb: TrebFn, run: str = "") -> dict:
    res = treb("status", *([run] if run else []), "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def write_spec(directory: Path, text: str, name: str = "job.yaml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path

"""Diagnosis of failures that cannot be produced on a CPU machine (CUDA/HIP out of memory,
NCCL watchdogs and sockets, Slurm oom-kill and node failures).

NOT logs of programs run here: every fixture is a log excerpt quoted in a public bug report,
stored under tests/fixtures/diagnose/ with its source URL in the header and the expected
diagnosis (`# expect: category rank=R node=N missing=a,b`). The categories a CPU can
produce are tested on real failing programs in tests/integration/test_diagnose_*.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "diagnose"
CASES = sorted(FIXTURES.glob("*.log"))


def expectation(path: Path) -> dict[str, str]:
    header = [ln for ln in path.read_text().splitlines() if ln.startswith("#")]
    assert any("public bug report" in ln and "https://" in ln for ln in header), path
    line = next(ln for ln in header if ln.startswith("# expect:"))
    words = line.split(":", 1)[1].split()
    out = {"category": words[0]}
    out.update(w.split("=", 1) for w in words[1:])
    return out


def body(path: Path, tmp_path: Path) -> Path:
    """The quoted excerpt without our header lines."""
    out = tmp_path / path.name
    out.write_text("".join(ln for ln in path.open() if not ln.startswith("#")))
    return out


def test_every_fixture_names_its_source() -> None:
    assert len(CASES) >= 10
    for path in CASES:
        expectation(path)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_public_excerpt(path: Path, tmp_path: Path) -> None:
    from trebuchet.diagnose.report import diagnose_paths

    want = expectation(path)
    d = diagnose_paths([body(path, tmp_path)])
    root = d.root_json()
    assert root is not None
    assert root["category"] == want["category"], root
    if "rank" in want:
        assert str(root["rank"]) == want["rank"], root
    if "node" in want:
        assert root["node"] == want["node"], root
    if "missing" in want:
        assert want["missing"].replace(",", ", ") in root["summary"]
    assert root["evidence"] and root["remedy"]


def test_cli_json_shape_on_a_fixture(tmp_path: Path) -> None:
    log = body(FIXTURES / "cuda_oom_rank3.log", tmp_path)
    res = subprocess.run([sys.executable, "-m", "trebuchet", "diagnose", str(log), "--json"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    data = json.loads(res.stdout)
    assert set(data["root_cause"]) == {"rank", "node", "category", "summary", "remedy", "evidence",
                                       "error"}  # fmt: skip
    assert data["root_cause"]["error"] is None  # no error file beside foreign logs
    assert data["root_cause"]["rank"] == 3
    assert any(r["rank"] == 3 and r["role"] == "root_cause" for r in data["ranks"])
    assert re.search(r"CUDA out of memory", data["root_cause"]["evidence"][0])

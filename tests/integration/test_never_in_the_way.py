"""Issue 35, "never in the user's way", on the real ssh test hosts (ts1, ts2) and the Slurm
test cluster: every node's health checks end before any rank of the attempt starts (a slow
check on one node holds every node's ranks; an unhealthy node is excluded before a single
rank ran anywhere); a program with its own rendezvous on MASTER_PORT (rank 0 accepts
WORLD_SIZE-1 connections, one JSON line each: any probe of the port fails it) succeeds run
after run; ranks see the environment ssh.setup made although a pyenv-style shim started
the agent; every process row of `treb status` says its host. Outcomes only, never times
(bench/own_rendezvous.py runs the rendezvous 30 times per engine).
"""

# ruff: noqa: F811 (pytest fixtures imported from other test modules are named as arguments)
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, TrebFn, status_json, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    records,
    slurm_conf,
    streb,
)
from tests.integration.slurm_support import wait_for as slurm_wait
from tests.integration.test_ssh_runs import spec, ssh_config  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration]
GUARD_S = 180  # a hang guard for `treb run`, never a timing assertion
ENDED = {"FAILED", "SUCCEEDED", "CANCELLED", "TIMEOUT", "LOST"}
RENDEZVOUS = REPO / "tests" / "integration" / "scripts" / "own_rendezvous.py"
PY = sys.executable


def slow_check(marks: Path, sick: bool) -> str:
    """Node 1's check takes 2 s, then fails (`sick`) or passes; each node's check leaves
    its mark when it passed."""
    end = "exit 3" if sick else f"touch {marks}/checked-$NODE_RANK"
    return (f'if [ "$NODE_RANK" = 1 ]; then sleep 2; {end}; '
            f"else touch {marks}/checked-$NODE_RANK; fi")  # fmt: skip


def rank_cmd(marks: Path) -> str:
    """A rank that fails unless every node's check passed before it started."""
    return (f"test -e {marks}/checked-0 && test -e {marks}/checked-1 "
            f"&& touch {marks}/rank-$RANK")  # fmt: skip


def with_health(path: Path, check: str) -> None:
    path.write_text(path.read_text() + f"health_check: {json.dumps(check)}\nretries: 0\n")


# -- ssh ---------------------------------------------------------------------------------
@pytest.mark.ssh
def test_ssh_ranks_wait_for_every_hosts_checks(treb: TrebFn, ssh_config: str,
                                               tmp_path: Path) -> None:  # fmt: skip
    """ts2's check takes 2 s: ts1's ranks wait for it (they used to start at once and find
    no mark of ts2's check). Every process row names its host (`treb status`, --json)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    path = spec(tmp_path, ssh_config, rank_cmd(marks))
    with_health(path, slow_check(marks, sick=False))
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    st = status_json(treb)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert sorted(p.name for p in marks.glob("rank-*")) == [f"rank-{r}" for r in range(4)]
    hosts = {p["rank"]: p.get("host") for p in st["procs"]}
    assert hosts == {0: "ts1", 1: "ts1", 2: "ts2", 3: "ts2"}, st["procs"]
    text = treb("status").stdout
    assert "HOST" in text and "ts2" in text.split("HOST", 1)[1], text


@pytest.mark.ssh
def test_ssh_an_unhealthy_host_stops_every_rank_before_it_starts(
    treb: TrebFn, ssh_config: str, tmp_path: Path
) -> None:
    """ts2's check fails after 2 s: no rank started anywhere (ts1's used to run meanwhile)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    path = spec(tmp_path, ssh_config, f"touch {marks}/rank-$RANK; sleep 60")
    with_health(path, slow_check(marks, sick=True))
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    st = status_json(treb)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    ff = st["first_failure"]
    assert (ff["label"], ff["host"]) == ("node_unhealthy", "ts2"), ff
    assert list(marks.glob("rank-*")) == []


@pytest.mark.ssh
def test_ssh_own_rendezvous_on_master_port(treb: TrebFn, ssh_config: str, tmp_path: Path) -> None:
    """A program with its own rendezvous on MASTER_PORT, with a health check on every
    node: 3 runs, each SUCCEEDED (a probe of the port fails it)."""
    path = spec(tmp_path, ssh_config, f"{PY} {RENDEZVOUS}", copy=False)
    with_health(path, "true")
    for _ in range(3):
        res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
        st = status_json(treb)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert "rendezvous ok" in (Path(st["run_dir"]) / "attempt-0" / "rank-0.log").read_text()


@pytest.mark.ssh
def test_ssh_setup_env_wins_over_a_pyenv_shim(treb: TrebFn, ssh_config: str,
                                              tmp_path: Path) -> None:  # fmt: skip
    """The host's `python3` is a pyenv-style shim (first on PATH): it prepends a folder of
    its own (with another python3 and tool) to PATH, then execs the real interpreter. The
    setup's venv, whose python3 leads to that shim as a venv made from a shim does, must
    be what the ranks find: its tool, its python3, VIRTUAL_ENV (they used to find the
    shim's folder first)."""
    shim, other, venv = tmp_path / "shims", tmp_path / "versions" / "bin", tmp_path / "venv"
    for d in (shim, other, venv / "bin"):
        d.mkdir(parents=True)

    def script(at: Path, body: str) -> None:
        at.write_text("#!/bin/bash\n" + body + "\n")
        at.chmod(0o755)

    script(shim / "python3", f'export PATH="{other}:$PATH"; export PYENV_VERSION=x\n'
                             f'exec {PY} "$@"')  # fmt: skip
    script(other / "python3", "echo shim-python; exit 7")
    script(other / "mytool", "echo shim-tool")
    script(venv / "bin" / "mytool", "echo venv-tool")
    (venv / "bin" / "python3").symlink_to(shim / "python3")
    (venv / "bin" / "activate").write_text(
        f'export VIRTUAL_ENV={venv}; PATH="{venv}/bin:$PATH"\n')  # fmt: skip
    path = spec(tmp_path, ssh_config, 'mytool; command -v python3; echo "venv=$VIRTUAL_ENV"')
    text = path.read_text()
    setup = [f'export PATH="{shim}:$PATH"', f"source {venv}/bin/activate"]
    path.write_text(text.replace("ssh: {", f"ssh: {{setup: {json.dumps(setup)}, "))
    res = treb("run", str(path), "--on", "ssh", timeout=GUARD_S)
    st = status_json(treb)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for r in range(4):
        log = (Path(st["run_dir"]) / "attempt-0" / f"rank-{r}.log").read_text()
        assert log.splitlines()[:3] == ["venv-tool", f"{venv}/bin/python3", f"venv={venv}"], log


# -- Slurm -------------------------------------------------------------------------------
def slurm_run(streb: TrebFn, spec_path: Path) -> dict:
    res = streb("run", str(spec_path), "--on", "slurm", "--detach")
    assert res.returncode == 0, res.stderr
    return slurm_wait(streb, res.stdout.strip(), ENDED, timeout=GUARD_S)


def slurm_spec(tmp_path: Path, name: str, command: str, check: str) -> Path:
    """2 nodes x 2 ranks on the default partition, with `check` as the health_check."""
    path = write_spec(tmp_path / "job", f"name: {name}\nnodes: 2\nprocs_per_node: 2\n"
                      f"command: {json.dumps(command)}\n")  # fmt: skip
    with_health(path, check)
    return path


@pytest.mark.slurm
def test_slurm_ranks_wait_for_every_nodes_checks(streb: TrebFn, tmp_path: Path) -> None:
    """Node 1's check takes 2 s: node 0's rank waits for it; rows name their host."""
    marks = tmp_path / "marks"
    marks.mkdir()
    path = slurm_spec(tmp_path, "slow-check", rank_cmd(marks), slow_check(marks, sick=False))
    st = slurm_run(streb, path)
    assert st["state"] == "SUCCEEDED", (st, (Path(st["run_dir"]) / "batch.log").read_text())
    assert sorted(p.name for p in marks.glob("rank-*")) == [f"rank-{r}" for r in range(4)]
    hosts = {p["rank"]: p.get("host") for p in st["procs"]}
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3] and hosts[0] in ("tn1", "tn2"), hosts
    assert "HOST" in streb("status", st["id"]).stdout


@pytest.mark.slurm
def test_slurm_an_unhealthy_node_stops_every_rank_before_it_starts(
    streb: TrebFn, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    path = slurm_spec(tmp_path, "sick-check", f"touch {marks}/rank-$RANK; sleep 60",
                      slow_check(marks, sick=True))  # fmt: skip
    st = slurm_run(streb, path)
    assert st["state"] == "FAILED", st
    assert st["first_failure"]["label"] == "node_unhealthy", st["first_failure"]
    assert list(marks.glob("rank-*")) == [], records(st["run_dir"])


@pytest.mark.slurm
def test_slurm_own_rendezvous_on_master_port(streb: TrebFn, tmp_path: Path) -> None:
    path = slurm_spec(tmp_path, "own-rdzv", f"{PY} {RENDEZVOUS}", "true")
    for _ in range(3):
        st = slurm_run(streb, path)
        log = Path(st["run_dir"]) / "attempt-0" / "rank-0.log"
        assert st["state"] == "SUCCEEDED", log.read_text() if log.is_file() else st
        assert "rendezvous ok" in log.read_text()

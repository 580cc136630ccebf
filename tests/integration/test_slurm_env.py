"""What a rank sees on the real test cluster: the contract, hostile values, secrets,
init_env() under plain srun, and hostlist expansion checked against Slurm's own.

Why on the cluster: quoting is only proven by a value that went through sbatch, srun and
the node's bash; init_env() and the hostlist parser only by Slurm's own answers.
"""

# ruff: noqa: F811 (pytest fixtures imported from slurm_support are named as arguments)
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_spec
from tests.integration.slurm_support import (  # noqa: F401 (fixtures)
    records,
    slurm,
    slurm_conf,
    status,
    streb,
)
from trebuchet import dist

pytestmark = [pytest.mark.integration, pytest.mark.slurm]
DUMP = REPO / "tests" / "integration" / "scripts" / "dump_env.py"
HOSTILE = 'it\'s "q" $(touch /tmp/treb-pwned) `touch /tmp/treb-pwned2` \\ ; exit 7\nline2 \t$RANK'
CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
            "NUM_NODES", "MASTER_ADDR", "MASTER_PORT")  # fmt: skip


def envs(run_dir: str | Path) -> dict[str, dict]:
    return {p.name.removesuffix(".json"): json.loads(p.read_text())
            for p in (Path(run_dir) / "env").glob("*.json")}  # fmt: skip


def test_native_contract_and_hostile_values_reach_ranks_literally(
    streb, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("MY_TOKEN", "s3cr3t-value")
    spec = {
        "name": "hostile",
        "command": ["python", str(DUMP), HOSTILE, "$RANK", "${SLURM_NODEID}"],
        "nodes": 2,
        "procs_per_node": 2,
        "secrets": ["MY_TOKEN"],
        "env": {"EVIL": HOSTILE, "FROM_SECRET": "Bearer ${MY_TOKEN}", "EXTRA": "from-spec"},
    }
    path = write_spec(tmp_path, json.dumps(spec))
    res = streb("run", str(path), "--on", "slurm", timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    st = status(streb)
    run_dir = Path(st["run_dir"])
    got = envs(run_dir)
    assert sorted(got) == ["0", "1", "2", "3"]
    hosts = {r: records(run_dir)[f"rank-{r}"]["host"] for r in range(4)}
    for r, e in got.items():
        rank = int(r)
        assert e["_argv"] == [HOSTILE, "$RANK", "${SLURM_NODEID}"]  # a list is never expanded
        assert e["EVIL"] == HOSTILE and e["EXTRA"] == "from-spec"
        assert e["MY_TOKEN"] == "s3cr3t-value" and e["FROM_SECRET"] == "Bearer s3cr3t-value"
        assert e["RANK"] == r and e["LOCAL_RANK"] == str(rank % 2)
        assert e["WORLD_SIZE"] == "4" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["NODE_RANK"] == e["GROUP_RANK"] == str(rank // 2) and e["NUM_NODES"] == "2"
        assert e["MASTER_ADDR"] == "tn1"
        assert e["MASTER_PORT"] == str(15000 + int(st["backend_id"]) % 10000)
        assert e["TREB_RUN_ID"] == st["id"] and e["TREB_RUN_DIR"] == str(run_dir)
        assert e["TREB_ATTEMPT"] == "0"
        assert e["TREB_CHECKPOINT_DIR"] == str(run_dir / "checkpoints")
        assert e["PYTHONUNBUFFERED"] == "1"
        cpus = int(e["SLURM_CPUS_ON_NODE"])
        assert e["OMP_NUM_THREADS"] == str(max(1, cpus // 2))
        # the ranks run the snapshot of the workdir taken at submission (same code on requeue)
        assert e["_cwd"] == str(run_dir / "code") and e["TREB_HOME"] == os.environ["TREB_HOME"]
        assert hosts[rank] == ("tn1" if rank < 2 else "tn2")
        # one task per node (issue 36): srun's variables still say which rank this is
        assert (e["SLURM_PROCID"], e["SLURM_LOCALID"]) == (r, str(rank % 2))
        assert e["SLURM_NTASKS"] == "4" and e["SLURM_NODEID"] == str(rank // 2)
    # ... and the node's one agent started both of its ranks
    assert got["0"]["_ppid"] == got["1"]["_ppid"] and got["2"]["_ppid"] == got["3"]["_ppid"]
    assert not Path("/tmp/treb-pwned").exists() and not Path("/tmp/treb-pwned2").exists()
    script = (run_dir / "submit.sbatch").read_text()
    assert "s3cr3t-value" not in script and "MY_TOKEN" in script  # by name only
    assert "s3cr3t-value" not in (run_dir / "spec.yaml").read_text()


def test_string_command_expands_on_the_node(streb, tmp_path: Path) -> None:
    """Seed 004's pitfall: $SLURM_NODEID and $RANK in a quoted command expand per rank."""
    cmd = 'echo "node=${SLURM_NODEID} rank=$RANK host=$(hostname)" > "$TREB_RUN_DIR/out-$RANK"'
    spec = write_spec(tmp_path, json.dumps({"name": "expand", "command": cmd, "nodes": 2,
                                            "procs_per_node": 2}))  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=120)
    assert res.returncode == 0, res.stderr
    run_dir = Path(status(streb)["run_dir"])
    for r in range(4):
        node = r // 2
        text = (run_dir / f"out-{r}").read_text()
        assert text == f"node={node} rank={r} host=tn{node + 1}\n"


def test_hostile_name_is_refused(streb, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'true'\n")
    res = streb("run", str(spec), "--on", "slurm", "--name", 'x"; touch /tmp/treb-pwned #')
    assert res.returncode == 2 and "name" in res.stderr, res.stderr
    assert not Path("/tmp/treb-pwned").exists()


def test_none_and_torchrun_launchers_env(streb, tmp_path: Path) -> None:
    for launcher in ("none", "torchrun"):
        spec = write_spec(tmp_path / launcher, json.dumps({
            "name": launcher, "command": f"python {DUMP}", "launcher": launcher,
            "nodes": 2, "procs_per_node": 2,
        }))  # fmt: skip
        res = streb("run", str(spec), "--on", "slurm", timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        got = envs(status(streb)["run_dir"])
        if launcher == "none":  # once per node
            assert sorted(got) == ["node0", "node1"]
            for n in (0, 1):
                e = got[f"node{n}"]
                assert e["NODE_RANK"] == str(n) and e["NUM_NODES"] == "2"
                assert e["LOCAL_WORLD_SIZE"] == "2" and e["MASTER_ADDR"] == "tn1"
                assert "RANK" not in e and "OMP_NUM_THREADS" not in e
        else:  # torchrun's own rank variables, one agent per node
            assert sorted(got) == ["0", "1", "2", "3"]
            for r, e in got.items():
                assert (
                    e["RANK"] == r
                    and e["WORLD_SIZE"] == "4"
                    and e["GROUP_RANK"] == str(int(r) // 2)
                )
                assert e["MASTER_ADDR"] == "tn1" and e["NODE_RANK"] == str(int(r) // 2)


INIT_ENV_PROBE = """
import json, os, sys
sys.path.insert(0, {repo!r})
from trebuchet.dist import init_env
init_env()
keys = {keys!r}
out = {{k: os.environ.get(k) for k in keys}}
out["SLURM_JOB_ID"] = os.environ["SLURM_JOB_ID"]
with open(os.path.join({out!r}, os.environ["RANK"] + ".json"), "w") as fh:
    json.dump(out, fh)
"""


def test_init_env_under_plain_srun_matches_trebuchet(streb, tmp_path: Path) -> None:
    """A script started by `srun -N2 --ntasks-per-node=2` and calling init_env() gets what
    trebuchet's native launcher gives each rank (same port formula, from its own job id).
    (`-n4` alone would let Slurm place 3 + 1 tasks on nodes of more than 2 CPUs.)"""
    out = tmp_path / "srun"
    out.mkdir()
    probe = tmp_path / "probe.py"
    probe.write_text(INIT_ENV_PROBE.format(repo=str(REPO), keys=CONTRACT, out=str(out)))
    res = slurm("srun", "-N2", "--ntasks-per-node=2", sys.executable, str(probe), timeout=120)
    assert res.returncode == 0, res.stderr
    plain = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    spec = write_spec(tmp_path / "t", json.dumps({"name": "ref", "command": ["python", str(DUMP)],
                                                  "nodes": 2, "procs_per_node": 2}))  # fmt: skip
    res = streb("run", str(spec), "--on", "slurm", timeout=120)
    assert res.returncode == 0, res.stderr
    st = status(streb)
    ours = envs(st["run_dir"])
    assert sorted(plain) == sorted(ours) == ["0", "1", "2", "3"]
    for r in plain:
        for key in CONTRACT:
            if key == "MASTER_PORT":  # the same formula, each from its own job id
                assert plain[r][key] == str(15000 + int(plain[r]["SLURM_JOB_ID"]) % 10000)
                assert ours[r][key] == str(15000 + int(st["backend_id"]) % 10000)
            else:
                assert plain[r][key] == ours[r][key], (r, key, plain[r], ours[r])


def _expressions(n: int, seed: int = 4) -> list[str]:
    """Hostlist expressions of the shapes clusters use: prefixes, zero padding, several
    bracketed ranges, lists inside brackets, suffixes after ranges, plain names, commas."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        items = []
        for _ in range(rng.randint(1, 3)):
            prefix = rng.choice(["node", "gpu-a", "c", "rack1-n", "x", "tn", "dgx.h100-"])
            kind = rng.random()
            if kind < 0.2:
                items.append(f"{prefix}{rng.randint(0, 999)}")
                continue
            parts = []
            for _ in range(rng.randint(1, 3)):
                width = rng.choice([1, 2, 3, 4])
                lo = rng.randint(0, 20)
                hi = lo + rng.randint(0, 12)
                part = f"{lo:0{width}d}-{hi:0{width}d}" if hi > lo else f"{lo:0{width}d}"
                parts.append(part)
            item = f"{prefix}[{','.join(parts)}]"
            if kind > 0.8:
                item += rng.choice(["-ib", "s", ".eth0"])
            if kind > 0.9:
                item += f"[{rng.randint(1, 2)}-{rng.randint(3, 4)}]"
            items.append(item)
        out.append(",".join(items))
    return out


def test_hostlist_expansion_agrees_with_scontrol(slurm_conf: str) -> None:
    hostlist = (
        pytest.importorskip("hostlist") if not os.environ.get("CI") else __import__("hostlist")
    )
    exprs = _expressions(400) + ["tn[1-2]", "nodeA,nodeB[1-3]", "a[01-03,7],b9", "n[8-11]"]
    env = {**os.environ, "SLURM_CONF": slurm_conf}
    mismatches, compared = [], 0
    for expr in exprs:
        res = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True,
                             text=True, env=env, timeout=30)  # fmt: skip
        truth = res.stdout.split()
        if not truth:  # "Invalid hostlist" (22.05 takes no suffix after a range): never a
            continue  # SLURM_JOB_NODELIST, so nothing to agree with
        compared += 1
        # python-hostlist drops a name listed twice unless asked; trebuchet asks.
        for name, got in (("trebuchet.dist", dist.expand_hostlist(expr)),
                          ("builtin", dist._expand_builtin(expr)),
                          ("python-hostlist",
                           hostlist.expand_hostlist(expr, allow_duplicates=True))):  # fmt: skip
            if got != truth:
                mismatches.append((name, expr, got[:5], truth[:5]))
    assert compared >= 300, compared
    assert not mismatches, mismatches[:10]

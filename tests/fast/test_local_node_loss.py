"""A simulated node's agent killed on the local engine (issue 23): the same rules as over
ssh and Slurm (launcher/sim_nodes.py). Each simulated node of a run with more than one
node (or spares) has a keeper process carrying the run's id and its NODE_RANK; killing it
(SIGKILL, as a node's death) loses the node: its ranks are killed, `lost-<node>.json`
names it, it is excluded, and the next attempt runs on the survivor plus a spare,
resuming from the checkpoint. Real processes, seconds; outcomes only."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.conftest import TrebFn, status_json, write_spec
from trebuchet.launcher.sim_nodes import KEEPER

LOOP = """\
import json, os, time
d = os.environ["TREB_CHECKPOINT_DIR"]; os.makedirs(d, exist_ok=True)
ckpt = os.path.join(d, "ckpt.json")
start = json.load(open(ckpt))["step"] + 1 if os.path.exists(ckpt) else 0
rank, attempt = os.environ["RANK"], os.environ["TREB_ATTEMPT"]
json.dump({"node_rank": int(os.environ["NODE_RANK"]), "world": int(os.environ["WORLD_SIZE"]),
           "resumed_from": start}, open(os.path.join(d, f"start-{attempt}-{rank}.json"), "w"))
for step in range(start, 15):
    if rank == "0":
        json.dump({"step": step}, open(ckpt + ".tmp", "w")); os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.2)
"""


def keeper_of(run_id: str, node: int) -> int | None:
    """The pid of the run's keeper of simulated node `node` (its environment says so)."""
    want = {f"TREB_RUN_ID={run_id}".encode(), f"NODE_RANK={node}".encode()}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if KEEPER.encode() in cmd and want <= env:
            return int(name)
    return None


def run_and_kill_node_1(
    treb: TrebFn, tmp_path: Path, extra: str, nodes: str = "2"
) -> tuple[dict, Path]:
    (tmp_path / "loop.py").write_text(LOOP)
    spec = write_spec(tmp_path, f"name: local-loss\ncommand: [{sys.executable}, loop.py]\n"
                                f"nodes: {nodes}\ngrace_period: 1\n{extra}")  # fmt: skip
    res = treb("run", str(spec), "--detach")
    assert res.returncode == 0, res.stderr
    st = status_json(treb)
    rid, ckpt = st["id"], Path(st["run_dir"]) / "checkpoints"
    end = time.time() + 60
    pid = None
    while time.time() < end and pid is None:
        trained = (ckpt / "ckpt.json").is_file()
        pid = keeper_of(rid, 1) if trained else None
        time.sleep(0.1)
    assert pid is not None, "no keeper for node 1 while the ranks trained"
    os.kill(pid, signal.SIGKILL)
    while time.time() < end + 60 and status_json(treb, rid)["state"] not in (
        "SUCCEEDED", "FAILED"):  # fmt: skip
        time.sleep(0.2)
    return status_json(treb, rid), ckpt


def test_a_killed_node_is_replaced_by_the_spare(treb: TrebFn, tmp_path: Path) -> None:
    st, ckpt = run_and_kill_node_1(treb, tmp_path, "spare_nodes: 1\nretries: 1\n")
    assert st["state"] == "SUCCEEDED", st
    first = st["attempts"][0]
    assert first["state"] == "FAILED", first
    assert first["reason"] == ("node_lost: node-1 (its node agent ended without its last word: "
                               "killed by SIGKILL)"), first  # fmt: skip
    run_dir = Path(st["run_dir"])
    lost = json.loads((run_dir / "attempt-0" / "lost-1.json").read_text())
    assert (lost["label"], lost["host"], lost["node"]) == ("node_lost", "node-1", 1)
    assert (run_dir / "excluded-nodes").read_text().startswith("node-1\tnode_lost: node-1")
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    nodes = [(e["attempt"], e["hosts"]) for e in events if e["event"] == "nodes"]
    assert nodes == [(0, ["node-0", "node-1"]), (1, ["node-0", "node-2"])], nodes
    # node 1's rank died with its node (a cascade, not the cause)
    rank1 = json.loads((run_dir / "attempt-0" / "rank-1.json").read_text())
    assert rank1["signal"] == "SIGKILL" and rank1["stopped_by_launcher"], rank1
    starts = [json.loads((ckpt / f"start-1-{r}.json").read_text()) for r in (0, 1)]
    assert [(s["node_rank"], s["world"]) for s in starts] == [(0, 2), (1, 2)]
    assert all(s["resumed_from"] > 0 for s in starts), starts
    assert json.loads((ckpt / "ckpt.json").read_text())["step"] == 14


def test_no_spare_ends_the_run_with_the_lost_node(treb: TrebFn, tmp_path: Path) -> None:
    st, _ = run_and_kill_node_1(treb, tmp_path, "retries: 2\n")
    assert st["state"] == "FAILED" and len(st["attempts"]) == 1, st
    ff = st["first_failure"]
    assert (ff["label"], ff["host"]) == ("node_lost", "node-1"), ff


def test_a_node_range_goes_on_with_fewer_nodes(treb: TrebFn, tmp_path: Path) -> None:
    """nodes: "2:3", no spare: after node 1's loss, nodes 0 and 2 go on, WORLD_SIZE 2."""
    st, ckpt = run_and_kill_node_1(treb, tmp_path, "retries: 1\n", nodes='"2:3"')
    assert st["state"] == "SUCCEEDED", st
    assert st["attempts"][0]["reason"].startswith("node_lost: node-1 ("), st["attempts"]
    starts = sorted(ckpt.glob("start-1-*.json"))
    got = [json.loads(p.read_text()) for p in starts]
    assert [(s["node_rank"], s["world"]) for s in got] == [(0, 2), (1, 2)], got
    assert [json.loads(p.read_text())["world"] for p in ckpt.glob("start-0-*.json")] == [3] * 3


def test_a_lost_node_has_a_diagnosis(treb: TrebFn, tmp_path: Path) -> None:
    """Issue 33: `treb status` and `treb diagnose` name the lost node as the cause, with a
    fix line (not "cause: unknown")."""
    st, _ = run_and_kill_node_1(treb, tmp_path, "retries: 0\n")
    assert st["first_failure"]["label"] == "node_lost", st
    shown = treb("status", st["id"]).stdout
    assert "cause: unknown" not in shown, shown
    assert "cause: node_lost: node-1 (its node agent" in shown, shown
    assert "fix: " in shown and "spare_nodes" in shown, shown
    diag = treb("diagnose", st["id"], "--json")
    got = json.loads(diag.stdout)["root_cause"]
    assert (got["category"], got["node"]) == ("node_lost", "1"), got
    assert "spare_nodes" in got["remedy"], got

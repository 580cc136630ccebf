"""Whose marks count against a node (store/node_events.py, store/nodes.py, docs/nodes.md):
a run's marks only for the hosts that run ran on, as its records say (the others ignored
and said once in its events), so that one rank cannot take a partition out; and an ssh
host written `host:port` is the node its marks name, for marking and for skipping."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import TrebFn
from tests.fast.test_node_history import NOW, by_host, lost, nodes_json, plant
from trebuchet.runtime.rundir.records import FIRST
from trebuchet.store import node_events


def ignored_events(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == "node_marks_ignored"]


def test_a_rank_cannot_mark_hosts_its_run_did_not_run_on(treb: TrebFn) -> None:
    """A 2-node Slurm run on tn1, tn2 whose rank wrote node_lost for 40 hosts, a straggler
    and an Xid first failure on others: only tn1 and tn2 are marked; the rest is said
    once in the run's events, however often the run is read."""
    forged = [lost(f"tn{i}") for i in range(1, 41)]
    forged.append({"event": "straggler", "time": NOW, "host": "tn77", "attempt": 0})
    run_dir = plant("bbbb0001", forged, ran_on={0: ["tn1", "tn2"]}, attempts=1)
    rec = {"rank": 0, "node": 0, "exit_code": 1, "ended_at": NOW, "host": "tn99"}
    (run_dir / "attempt-0" / FIRST).write_text(json.dumps(rec))
    (run_dir / "attempt-0" / "rank-0.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79\n")
    assert sorted(by_host(nodes_json(treb))) == ["tn1", "tn2"]
    said = ignored_events(run_dir)
    assert len(said) == 1 and said[0]["count"] == 40, said  # tn3..tn40, tn77, tn99
    assert len(said[0]["hosts"]) == 20 and "tn1" not in said[0]["hosts"], said  # 20 named
    assert treb("doctor", "--rebuild-index").returncode == 0  # read again: not said again
    assert sorted(by_host(nodes_json(treb))) == ["tn1", "tn2"]
    assert len(ignored_events(run_dir)) == 1


def test_a_rewritten_record_names_no_more_nodes_than_the_run_had(treb: TrebFn) -> None:
    """attempt.json rewritten by a rank to name a whole partition (tn[1-999999999]): an
    attempt counts for as many nodes as the run's index says it had, the first ones, and
    the hostlist is never expanded past them. Over ssh, the first attempt_started of an
    attempt names its hosts; one written after it by a rank does not."""
    run_dir = plant("bbbb0002", [lost(f"tn{i}") for i in range(1, 6)], ran_on={0: ["tn1"]})
    (run_dir / "attempt-0" / "attempt.json").write_text(json.dumps({"nodes": "tn[1-999999999]"}))
    ssh_dir = plant("bbbb0003", [], backend="ssh", ran_on={0: ["me@gpu1", "gpu2"]})
    with open(ssh_dir / "events.jsonl", "a") as fh:
        for ev in ({"event": "attempt_started", "time": NOW, "attempt": 0,
                    "hosts": ["gpu5", "gpu6"]}, lost("gpu5"), lost("gpu1"), lost("gpu2")):  # fmt: skip
            fh.write(json.dumps(ev) + "\n")
    assert sorted(by_host(nodes_json(treb))) == ["gpu1", "gpu2", "tn1", "tn2"]


def test_an_ssh_host_with_a_port_is_marked_and_skipped_as_its_host(
    treb: TrebFn, tmp_path: Path
) -> None:
    """`gpu1:2222` (and `me@gpu1:2222`, `[gpu1]:2222`) in ssh.hosts is gpu1 to the marks: a
    loss of gpu1 skips it, a loss said of `gpu1:2222` marks gpu1, and --clear takes it."""
    from trebuchet.backends.ssh.avoid import choose

    plant("bbbb0004", [lost("gpu1:2222")], backend="ssh", ran_on={0: ["gpu1:2222", "gpu2"]})
    assert sorted(by_host(nodes_json(treb))) == ["gpu1"]
    for written in ("gpu1:2222", "me@gpu1:2222", "[gpu1]:2222"):
        listed = [written, "gpu2", "gpu3"]
        assert choose(listed, listed, 2, [], "job.yaml: ssh.hosts") == ["gpu2", "gpu3"], written
    res = treb("nodes", "--clear", "me@gpu1:2222")
    assert res.returncode == 0 and "node gpu1: history cleared" in res.stdout, res.stderr
    listed = ["gpu1:2222", "gpu2", "gpu3"]
    assert choose(listed, listed, 2, [], "job.yaml: ssh.hosts") == ["gpu1:2222", "gpu2"]


def test_a_clear_forgets_the_marks_it_saw_whatever_the_clocks_say(treb: TrebFn) -> None:
    """The clear and the marks are dated by different machines' clocks. A clear made where
    the clock is an hour fast forgot the next real loss (dated before it); one made where
    it is an hour slow forgot nothing. A clear forgets the marks the index held when it
    was made, and a rebuilt index forgets the same ones."""
    from trebuchet.store.db import Store
    from trebuchet.store.nodes import clear, sync

    plant("cccc0001", [lost("tn2", NOW - 60), lost("tn3", NOW - 60)])
    store = Store()
    sync(store)
    clear(store, ["tn2"], when=NOW + 3600)  # a clock an hour fast
    clear(store, ["tn3"], when=NOW - 3600)  # an hour slow
    store.close()
    plant("cccc0002", [lost("tn2", NOW - 30)])  # lost again, after the clear
    for _ in range(2):
        got = by_host(nodes_json(treb))
        assert got["tn2"]["counts"]["lost"] == 1 and got["tn2"]["excluded"], got["tn2"]
        assert got["tn3"]["counts"]["lost"] == 0 and not got["tn3"]["excluded"], got["tn3"]
        assert treb("doctor", "--rebuild-index").returncode == 0


def test_a_clear_from_before_the_marks_were_kept_still_forgets_by_its_time(
    treb: TrebFn, treb_home: Path
) -> None:
    """An index, or a nodes-cleared.jsonl line, from before a clear kept its marks: the
    clear forgets the marks not later than its time, once (as it did then)."""
    import sqlite3

    plant("cccc0003", [lost("tn5", NOW - 60), lost("tn6", NOW - 60)])
    assert treb("nodes", "--clear", "tn5").returncode == 0
    with sqlite3.connect(treb_home / "runs.db") as db:  # the index as it was before
        db.execute("DROP TABLE node_cleared")
        db.execute("INSERT OR REPLACE INTO node_clears (host, time) VALUES ('tn6', ?)", (NOW,))
    (treb_home / "nodes-cleared.jsonl").write_text("".join(
        json.dumps({"host": h, "time": NOW}) + "\n" for h in ("tn5", "tn6")))  # fmt: skip
    for _ in range(2):
        got = by_host(nodes_json(treb))
        assert got["tn5"]["counts"]["lost"] == 0 and got["tn6"]["counts"]["lost"] == 0, got
        assert treb("doctor", "--rebuild-index").returncode == 0  # from the old line


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="tn09[],-.x", max_size=40) | st.text(max_size=40), st.integers(1, 6))
def test_any_nodelist_gives_at_most_its_width_of_node_names(expr: str, width: int) -> None:
    """A record's `nodes` is whatever a rank wrote: names or nothing, never more than the
    run's nodes, never an exception, never a range expanded past them."""
    names = node_events.hostlist(expr, width)
    assert len(names) <= width and all(node_events.valid_host(n) for n in names), names


def test_a_nodelist_of_many_ranges_is_no_recursion_error() -> None:
    assert node_events.hostlist("tn" + "[0-1]" * 5000, 4) == []
    assert node_events.hostlist("-[1-999999999],tn1", 4) == []  # 4 names, none a node's
    assert node_events.hostlist("tn[1-2]x[3-4]", 3) == ["tn1x3", "tn1x4", "tn2x3"]


def test_attempts_that_never_ran_name_no_nodes(treb: TrebFn, treb_home: Path) -> None:
    """A one-attempt run allowed 1000 (retries: 999) whose rank wrote the records of the
    attempts to come (Slurm: attempt-<n>/attempt.json; ssh: their attempt_started, before
    the controller's) and a loss of each one's node: only the attempt that ran names
    nodes, or one run takes out its width times its retries."""
    forged = [lost("tn1")] + [lost(f"tn{100 + a}", attempt=a) for a in range(1, 31)]
    ran_on = {0: ["tn1"], **{a: [f"tn{100 + a}"] for a in range(1, 31)}}
    plant("dddd0001", forged, ran_on=ran_on, attempts=1000)
    ssh = [lost("gpu1")] + [lost(f"gpu{100 + a}", attempt=a) for a in range(1, 31)]
    ran_on = {0: ["gpu1"], **{a: [f"gpu{100 + a}"] for a in range(1, 31)}}
    plant("dddd0002", ssh, backend="ssh", ran_on=ran_on, attempts=1000)
    with sqlite3.connect(treb_home / "runs.db") as db:  # as the controller left the index
        db.execute("UPDATE runs SET attempt = 0")
    assert sorted(by_host(nodes_json(treb))) == ["gpu1", "tn1"]


def test_a_mark_by_a_nodes_full_name_counts_on_the_name_its_run_knows(treb: TrebFn) -> None:
    """A rank's records name its machine as uname(2) does, an FQDN on many clusters
    (tn1.cluster.example), where Slurm's NodeName is tn1: its hardware failure and its
    straggler mark count against tn1 (the name --exclude takes), not ignored. Over ssh, a
    host listed by its FQDN is marked by that name for a rank that says the short one.
    An address is no name: 10.0.0.1 is not 10.0.0.2."""
    run_dir = plant("eeee0001", [{"event": "straggler", "time": NOW, "attempt": 0,
                                  "host": "tn2.cluster.example"}],
                    ran_on={0: ["tn1", "tn2"]})  # fmt: skip
    rec = {"rank": 0, "node": 0, "exit_code": 1, "ended_at": NOW, "host": "tn1.cluster.example"}
    (run_dir / "attempt-0" / FIRST).write_text(json.dumps(rec))
    (run_dir / "attempt-0" / "rank-0.log").write_text("NVRM: Xid (PCI:0000:3b:00): 79\n")
    plant("eeee0002", [lost("gpu1"), lost("10.0.0.1")], backend="ssh",
          ran_on={0: ["gpu1.example.com", "10.0.0.2"]})  # fmt: skip
    got = by_host(nodes_json(treb))
    assert sorted(got) == ["gpu1.example.com", "tn1", "tn2"], got
    assert got["tn1"]["counts"]["hardware"] == 1 and got["tn2"]["counts"]["straggler"] == 1
    assert not ignored_events(run_dir)


def test_a_clear_after_a_damaged_line_survives_a_rebuild(treb: TrebFn, treb_home: Path) -> None:
    """nodes-cleared.jsonl left with a half line (a crash or a full disk mid-write) or NULs
    (a filesystem's crash): the next clear's line is its own line, and a rebuilt index
    forgets what `treb nodes --clear` forgot. A FIFO in its place: a named error, exit 2."""
    import os

    plant("ffff0001", [lost("tn5", NOW - 60), lost("tn6", NOW - 60)])
    for damage in (b'{"host": "tn9", "ti', b"\0" * 4096):
        (treb_home / "nodes-cleared.jsonl").write_bytes(damage)
        assert treb("nodes", "--clear", "tn5").returncode == 0
        assert treb("doctor", "--rebuild-index").returncode == 0
        got = by_host(nodes_json(treb))
        assert got["tn5"]["counts"]["lost"] == 0, (damage[:4], got["tn5"])
        assert got["tn6"]["counts"]["lost"] == 1, got["tn6"]
    (treb_home / "nodes-cleared.jsonl").unlink()
    os.mkfifo(treb_home / "nodes-cleared.jsonl")
    res = treb("nodes", "--clear", "tn6")
    assert res.returncode == 2 and "nodes-cleared.jsonl" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert by_host(nodes_json(treb))["tn6"]["counts"]["lost"] == 1
    assert treb("doctor", "--rebuild-index").returncode == 0

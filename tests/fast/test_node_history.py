"""Nodes remembered across runs (issue 37, item 2; docs/nodes.md): the marks a run
directory gives (hostile ones give none), the decaying score and its settings, `treb nodes`
(--json, --clear, idempotent over re-reads and an index rebuild), and what a submission
avoids: `treb render --on slurm` (its --exclude line, the spec's own excludes and
nodelist, allow_nodes) and `--on ssh` (hosts skipped, or an error naming them)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TrebFn, write_spec
from trebuchet.errors import UserError
from trebuchet.store import node_events
from trebuchet.store.nodes import HALF_LIFE_S, Settings, decayed, score

NOW = time.time()


def plant(run_id: str, events: list[Any], state: str = "FAILED", raw: bytes = b"",
          backend: str = "slurm", attempts: int = 3,
          ran_on: dict[int, list[str]] | None = None) -> Path:  # fmt: skip
    """A run as an engine leaves it: its directory with events.jsonl, and its index row
    (`attempts`: its max_attempts; a mark of a later attempt does not count; its attempt:
    the last `ran_on` names). `ran_on`:
    each attempt's nodes as the engine records them (Slurm: attempt-<n>/attempt.json's
    `nodes`; ssh: the `attempt_started` event's `hosts`); by default the hosts `events`
    name, each in its attempt (a mark on a host its run did not run on does not count)."""
    from trebuchet.store.db import RunRecord, Store
    from trebuchet.store.paths import runs_dir

    run_dir = runs_dir() / run_id
    run_dir.mkdir()
    if ran_on is None:
        ran_on = {}
        for e in events:
            a = e.get("attempt") if isinstance(e.get("attempt"), int) else 0
            if isinstance(e.get("host"), str) and 0 <= a < attempts:
                ran_on.setdefault(a, []).append(e["host"])
    started = []
    for a, hosts in sorted(ran_on.items()):
        if backend == "ssh":
            started.append({"event": "attempt_started", "time": NOW - 90, "attempt": a,
                            "hosts": hosts})  # fmt: skip
        else:
            (run_dir / f"attempt-{a}").mkdir()
            (run_dir / f"attempt-{a}" / "attempt.json").write_text(
                json.dumps({"attempt": a, "state": state, "nodes": ",".join(dict.fromkeys(hosts))})
            )
    width = max([2, *(len(set(h)) for h in ran_on.values())])
    events = [{"event": "submitted", "time": NOW - 100, "backend": backend}, *started, *events]
    lines = b"".join(json.dumps(e).encode() + b"\n" for e in events)
    (run_dir / "events.jsonl").write_bytes(lines + raw)
    (run_dir / "spec.yaml").write_text(
        f"retries: {attempts - 1}\nnodes: {width}\n"
    )  # a rebuild reads it
    store = Store()
    store.insert_run(RunRecord(id=run_id, name="x", backend=backend, launcher="native",
                               state=state, nodes=width, procs_per_node=1, run_dir=str(run_dir),
                               max_attempts=attempts, attempt=max([0, *ran_on]),
                               created_at=NOW))  # fmt: skip
    store.close()
    return run_dir


def lost(host: Any, when: Any = None, attempt: int = 0) -> dict[str, Any]:
    return {"event": "node_lost", "time": NOW - 60 if when is None else when, "host": host,
            "attempt": attempt, "node": 1}  # fmt: skip


def nodes_json(treb: TrebFn, *args: str, env: dict | None = None) -> dict[str, Any]:
    res = treb("nodes", "--json", *args, env=env)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def by_host(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n["host"]: n for n in data["nodes"]}


# -- the score ---------------------------------------------------------------------------------
def test_a_mark_halves_every_half_life_and_one_loss_keeps_a_node_out_for_one() -> None:
    s = Settings()
    assert decayed(2.0, HALF_LIFE_S, HALF_LIFE_S) == pytest.approx(1.0)
    assert score([("lost", NOW)], NOW, s) == pytest.approx(2.0)
    assert score([("lost", NOW - 0.9 * HALF_LIFE_S)], NOW, s) >= s.threshold
    assert score([("lost", NOW - 1.1 * HALF_LIFE_S)], NOW, s) < s.threshold
    # stragglers: a quarter of a loss each; two lost marks a day apart add up
    assert score([("straggler", NOW)] * 2, NOW, s) == pytest.approx(1.0)
    two = score([("lost", NOW - HALF_LIFE_S), ("lost", NOW)], NOW, s)
    assert two == pytest.approx(3.0)


def test_settings_come_from_the_environment_and_bad_ones_are_named() -> None:
    s = Settings.from_env({"TREB_NODE_HALF_LIFE": "12h", "TREB_NODE_THRESHOLD": "3"})
    assert (s.half_life_s, s.threshold) == (12 * 3600.0, 3.0)
    assert Settings.from_env({"TREB_NODE_HALF_LIFE": "1d2h"}).half_life_s == 26 * 3600.0
    assert Settings.from_env({"TREB_NODE_THRESHOLD": "off"}).threshold == 0.0
    for env in ({"TREB_NODE_HALF_LIFE": "soon"}, {"TREB_NODE_HALF_LIFE": "-5"},
                {"TREB_NODE_HALF_LIFE": "nan"}, {"TREB_NODE_THRESHOLD": "nan"},
                {"TREB_NODE_THRESHOLD": "lots"}):  # fmt: skip
        with pytest.raises(UserError, match="TREB_NODE_"):
            Settings.from_env(env)


# -- hostile records ---------------------------------------------------------------------------
HOSTILE_HOSTS = ["--exclude", "-x", "a\nb", "a\x00b", "tn1,tn2", "tn[1-2]", "tn 1", "../etc",
                 ".hidden", "a" * 129, "", "tn1;rm -rf /", "\u2028", "\x1b]8;;x\x07", "$(id)",
                 "tn1\\", 17, None, ["tn1"], {"h": 1}, True]  # fmt: skip


@pytest.mark.parametrize("host", HOSTILE_HOSTS, ids=range(len(HOSTILE_HOSTS)))
def test_a_host_slurm_could_not_name_gives_no_mark(host: Any) -> None:
    assert node_events.from_events([lost(host)]) == []


@pytest.mark.parametrize("when", [math.nan, math.inf, -1.0, 0, True, "12:00", None, 1e400])
def test_a_time_that_is_no_finite_number_gives_no_mark(when: Any) -> None:
    ev = {"event": "node_lost", "time": when, "host": "tn1", "attempt": 0}
    assert node_events.from_events([ev]) == []


def test_user_at_host_is_the_host_and_a_loss_counts_once_per_attempt() -> None:
    found = node_events.from_events([lost("me@gpu1"), lost("gpu1"), lost("gpu1", attempt=1),
                                     {"event": "straggler", "time": NOW, "host": "gpu2"},
                                     {"event": "straggler", "time": NOW, "host": "gpu2"}])  # fmt: skip
    assert sorted((e.kind, e.host, e.key) for e in found) == [
        ("lost", "gpu1", "lost:0:gpu1"), ("lost", "gpu1", "lost:1:gpu1"),
        ("straggler", "gpu2", "straggler:gpu2")]  # fmt: skip


JSONISH = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
EVENT = st.fixed_dictionaries(
    {"event": st.sampled_from(["node_lost", "node_unhealthy", "straggler", "x"]) | st.text()},
    optional={"host": st.text() | JSONISH, "time": st.floats() | JSONISH,
              "attempt": st.integers() | JSONISH},
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(EVENT, max_size=6))
def test_any_events_give_valid_marks_or_none(events: list[dict[str, Any]]) -> None:
    for ev in node_events.from_events(events):
        assert node_events.HOST_RE.fullmatch(ev.host) and not ev.host.startswith("-")
        assert math.isfinite(ev.time) and ev.kind in node_events.KINDS


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.binary(max_size=600))
def test_any_bytes_in_a_run_directory_read_without_an_exception(
    tmp_path: Path, data: bytes
) -> None:
    """events.jsonl, the first-failure record and the rank's log: whatever a rank wrote."""
    run_dir = tmp_path / "r"
    (run_dir / "attempt-0").mkdir(parents=True, exist_ok=True)
    for name in ("events.jsonl", "attempt-0/first-failure", "attempt-0/rank-0.log",
                 "attempt-0/rank-0.json"):  # fmt: skip
        (run_dir / name).write_bytes(data)
    for ev in node_events.of_run(run_dir):
        assert node_events.HOST_RE.fullmatch(ev.host)


def test_a_rank_failing_with_an_xid_marks_its_host_and_a_record_never_names_the_log(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    adir = run_dir / "attempt-0"
    adir.mkdir(parents=True)
    secret = tmp_path / "elsewhere.log"
    secret.write_text("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n")
    rec = {"label": "rank 1", "rank": 1, "node": 1, "exit_code": 1, "ended_at": NOW,
           "host": "tn2", "log": str(secret), "state": "ENDED"}  # fmt: skip
    (adir / "rank-1.json").write_text(json.dumps(rec))
    (adir / "rank-1.log").write_text("step 3\nRuntimeError: CUDA error: an illegal memory access\n")
    assert node_events.of_run(run_dir) == []  # the record's log path is not read
    (adir / "rank-1.log").write_text("x" * 100_000 + "\nNVRM: Xid (PCI:0000:3b:00): 79\n")
    found = node_events.of_run(run_dir)
    assert [(e.kind, e.host, e.detail) for e in found] == [
        ("hardware", "tn2", "attempt 0, rank 1: xid")
    ]
    (adir / "rank-1.log").unlink()
    os.mkfifo(adir / "rank-1.log")  # a FIFO in its place is not waited on
    assert node_events.of_run(run_dir) == []


# -- treb nodes ------------------------------------------------------------------------------
def test_treb_nodes_counts_each_run_once_and_a_clear_outlives_a_rebuild(treb: TrebFn) -> None:
    plant("aaaa0001", [lost("tn2"), lost("tn2"), lost("tn3", NOW - 3 * HALF_LIFE_S),
                       {"event": "straggler", "time": NOW, "host": "tn4", "rank": 3,
                        "node": 1, "score": 1.7},
                       {"event": "node_unhealthy", "time": NOW, "host": "tn2", "attempt": 1}],
          raw=b"\x00\xff not json\n" + b"{" * 5000 + b"\n")  # fmt: skip
    first = by_host(nodes_json(treb))
    assert first["tn2"]["counts"] == {"lost": 1, "unhealthy": 1, "hardware": 0, "straggler": 0}
    assert first["tn2"]["excluded"] and first["tn2"]["last"]["run"] == "aaaa0001"
    assert not first["tn3"]["excluded"] and 0.2 < first["tn3"]["score"] <= 0.25  # 3 half-lives
    assert not first["tn4"]["excluded"] and first["tn4"]["counts"]["straggler"] == 1
    assert by_host(nodes_json(treb))["tn2"]["counts"] == first["tn2"]["counts"]  # read again
    res = treb("doctor", "--rebuild-index")
    assert res.returncode == 0, res.stdout + res.stderr
    assert by_host(nodes_json(treb))["tn2"]["counts"] == first["tn2"]["counts"]  # rebuilt
    table = treb("nodes")
    assert table.returncode == 0 and "tn2" in table.stdout.splitlines()[1], table.stdout
    res = treb("nodes", "--clear", "tn2")
    assert res.returncode == 0 and "node tn2: history cleared" in res.stdout, res.stderr
    after = by_host(nodes_json(treb))["tn2"]
    assert (after["excluded"], after["score"], after["cleared"] is not None) == (False, 0, True)
    assert treb("doctor", "--rebuild-index").returncode == 0
    assert by_host(nodes_json(treb))["tn2"]["excluded"] is False  # the clear was kept
    cleared = nodes_json(treb, "--clear-all")  # --json stays JSON; the note is on stderr
    assert cleared["nodes"] and not any(n["score"] for n in cleared["nodes"])


def test_a_mark_dated_in_the_future_counts_as_now(treb: TrebFn) -> None:
    plant("aaaa0002", [lost("tn7", 1e15)])
    node = by_host(nodes_json(treb))["tn7"]
    assert node["score"] <= 2.0 and node["excluded"]


def test_a_local_runs_simulated_nodes_are_no_machines_to_remember(treb: TrebFn) -> None:
    """Locally node-0, node-1 are simulated nodes on this machine (launcher/sim_nodes.py):
    `treb fault kill-node` there must not mark a host that Slurm or ssh might have."""
    plant("aaaa0007", [lost("node-1")], backend="local")
    plant("aaaa0008", [lost("tn1")], backend="ssh")
    assert [n["host"] for n in nodes_json(treb)["nodes"]] == ["tn1"]


def test_settings_change_the_score_and_the_verdict(treb: TrebFn) -> None:
    plant("aaaa0003", [lost("tn2", time.time() - 3 * 3600)])  # 3 h ago: 2 * 0.5**(3/24)
    assert by_host(nodes_json(treb))["tn2"]["excluded"]
    out = nodes_json(treb, env={"TREB_NODE_HALF_LIFE": "1h"})  # 2 * 0.5**3 = 0.25, or less
    assert out["half_life_s"] == 3600 and 0 < by_host(out)["tn2"]["score"] <= 0.25
    assert not by_host(out)["tn2"]["excluded"]
    assert not by_host(nodes_json(treb, env={"TREB_NODE_THRESHOLD": "off"}))["tn2"]["excluded"]
    res = treb("nodes", env={"TREB_NODE_HALF_LIFE": "soon"})
    assert res.returncode == 2 and "TREB_NODE_HALF_LIFE='soon'" in res.stderr, res.stderr


@pytest.mark.parametrize("host", ["--x", "tn1\nx", "a" * 200, "tn[1-2]", "tn1,tn2"])
def test_clear_refuses_a_name_no_node_has(treb: TrebFn, host: str) -> None:
    res = treb("nodes", f"--clear={host}")
    assert res.returncode == 2 and "not a node name" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_damaged_index_is_a_named_error(treb: TrebFn, treb_home: Path) -> None:
    plant("aaaa0004", [lost("tn2")])
    (treb_home / "runs.db").write_bytes(b"\x00" * 5000)
    for f in ("runs.db-wal", "runs.db-shm"):
        (treb_home / f).unlink(missing_ok=True)
    res = treb("nodes")
    assert res.returncode == 2 and "runs.db is damaged" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


# -- what a submission avoids ------------------------------------------------------------------
def _render(treb: TrebFn, tmp_path: Path, text: str, *args: str) -> Any:
    return treb("render", str(write_spec(tmp_path, text)), *args)


def test_slurm_excludes_the_avoided_nodes_unless_the_spec_asks_for_them(
    treb: TrebFn, tmp_path: Path
) -> None:
    plant("aaaa0005", [lost("tn2"), lost("tn3", attempt=1), lost("tn9", NOW - 5 * HALF_LIFE_S)])
    base = "command: python3 train.py\nnodes: 1\n"
    res = _render(treb, tmp_path, base, "--on", "slurm")
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --exclude=tn2,tn3\n" in res.stdout, res.stdout
    said = [ln for ln in res.stderr.splitlines() if "avoiding" in ln]
    assert len(said) == 1 and "tn2 (score 2.0: 1 lost" in said[0], res.stderr
    res = _render(treb, tmp_path, base + "allow_nodes: [tn2]\n", "--on", "slurm")
    assert "#SBATCH --exclude=tn3\n" in res.stdout, res.stdout
    res = _render(treb, tmp_path, base, "--on", "slurm", "-o", "allow_nodes=tn2,tn3")
    assert "--exclude" not in res.stdout and "avoiding" not in res.stderr, res.stdout
    res = _render(treb, tmp_path, base, "--on", "slurm", "-o", 'allow_nodes=["*"]')
    assert "--exclude" not in res.stdout, res.stdout
    # the spec's own --exclude is kept in the line that comes last (sbatch takes the last);
    # a node its --nodelist names is never excluded (Slurm would refuse the job)
    spec = base + "slurm:\n  sbatch_args: ['--exclude=gpu[1-2]', '--nodelist=tn3']\n"
    res = _render(treb, tmp_path, spec, "--on", "slurm")
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("#SBATCH --exclude")]
    assert lines == ["#SBATCH --exclude=gpu[1-2]", "#SBATCH --exclude=gpu[1-2],tn2"], lines


def test_ssh_skips_avoided_hosts_when_more_are_listed_and_names_them_when_not(
    treb: TrebFn, tmp_path: Path
) -> None:
    plant("aaaa0006", [lost("gpu1")])
    spec = "command: python3 train.py\nnodes: 2\nssh:\n  hosts: [me@gpu1, gpu2, gpu3]\n"
    res = _render(treb, tmp_path, spec, "--on", "ssh")
    assert res.returncode == 0, res.stderr
    assert "gpu1" not in res.stdout and "gpu3" in res.stdout, res.stdout
    assert res.stderr.count("avoiding 1 node(s)") == 1 and "gpu1 (score" in res.stderr
    res = _render(treb, tmp_path, spec.replace("nodes: 2", "nodes: 3"), "--on", "ssh")
    assert res.returncode == 2, res.stdout
    assert "3 host(s) needed" in res.stderr and "gpu1 (score 2.0" in res.stderr, res.stderr
    res = _render(treb, tmp_path, spec.replace("nodes: 2", "nodes: 3") + "allow_nodes: [gpu1]\n",
                  "--on", "ssh")  # fmt: skip
    assert res.returncode == 0 and "me@gpu1" in res.stdout, res.stderr
    assert treb("nodes", "--clear", "me@gpu1").returncode == 0  # the host, as listed
    res = _render(treb, tmp_path, spec.replace("nodes: 2", "nodes: 3"), "--on", "ssh")
    assert res.returncode == 0 and "avoiding" not in res.stderr, res.stderr

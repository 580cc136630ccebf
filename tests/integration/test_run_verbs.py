"""Real runs for the verbs around runs: rerun, rm / prune, --resume-from, and the paths
shown for user code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import status_json, write_spec

pytestmark = pytest.mark.integration

# Prints the env value and the code's version, then exits with CODE.
TRAIN = 'import os\nprint("v1", os.environ["MSG"])\nraise SystemExit(int(os.environ["CODE"]))\n'


def _workdir(tmp_path: Path) -> Path:
    wd = tmp_path / "proj"
    wd.mkdir()
    (wd / "train.py").write_text(TRAIN)
    write_spec(wd, "command: python train.py\nprocs_per_node: 2\nenv: {MSG: hi}\n")
    return wd


def test_rerun_keeps_overrides_and_code_and_refuses_like_run(treb, tmp_path: Path) -> None:
    wd = _workdir(tmp_path)
    first = treb("run", "-d", str(wd / "job.yaml"), "-o", "env.CODE=3", "-o", "env.MSG=over")
    assert first.returncode == 0, first.stderr
    rid = first.stdout.strip()
    treb("logs", "-f", rid)
    (wd / "train.py").write_text(TRAIN.replace("v1", "v2"))  # edited after the run
    again = treb("rerun", rid)
    assert again.returncode == 1, again.stderr  # same override CODE=3: fails again
    assert "v1 over" in again.stdout  # the earlier run's code and overrides
    new = status_json(treb)
    assert new["id"] != rid and new["state"] == "FAILED" and new["name"] == "job"
    snap = json.loads((Path(new["run_dir"]) / "snapshot.json").read_text())
    assert snap["source"] == str(wd)  # maps back to the user's workdir, not to the old copy
    # More overrides on top, detached: prints the new id; the code taken from the workdir now.
    res = treb("rerun", rid, "-o", "env.CODE=0", "--current-code", "-d")
    assert res.returncode == 0, res.stderr
    third = res.stdout.strip()
    treb("logs", "-f", third)
    st = status_json(treb, third)
    assert st["state"] == "SUCCEEDED"
    assert "v2 over" in treb("logs", third).stdout
    # The same refusals as `treb run`, before anything is recorded.
    count = len(json.loads(treb("ps", "--all", "--json").stdout))
    bad = treb("rerun", rid, "-o", "nodes=0")
    assert bad.returncode == 2 and "-o nodes=0: nodes: must be an integer" in bad.stderr
    bad = treb("rerun", rid, "--on", "nowhere")
    assert bad.returncode == 2 and "unknown engine" in bad.stderr
    assert len(json.loads(treb("ps", "--all", "--json").stdout)) == count
    assert treb("rerun", "zzzz").returncode == 2


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _backdate(home: Path, run_id: str, days: float) -> None:
    import sqlite3
    import time

    with sqlite3.connect(home / "runs.db") as db:
        when = time.time() - days * 86400
        db.execute(
            "UPDATE runs SET created_at = ?, ended_at = ? WHERE id = ?", (when, when, run_id)
        )


def test_rm_refuses_active_runs_unless_forced_and_says_what_it_freed(
    treb, treb_home: Path, tmp_path: Path
) -> None:
    cmd = 'head -c 1048576 /dev/urandom > "$TREB_CHECKPOINT_DIR/ck-$RANK"; sleep 300 & ' \
          'echo $! > "$TREB_RUN_DIR/child-$RANK.pid"; wait'  # fmt: skip
    spec = write_spec(tmp_path, f"command: '{cmd}'\nprocs_per_node: 2\n")
    rid = treb("run", "-d", str(spec)).stdout.strip()
    run_dir = treb_home / "runs" / rid
    import time

    deadline = time.monotonic() + 30
    while len(list(run_dir.glob("child-*.pid"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    children = [int(p.read_text()) for p in run_dir.glob("child-*.pid")]
    assert len(children) == 2
    res = treb("rm", rid)
    assert res.returncode == 2 and "still active" in res.stderr and run_dir.is_dir()
    res = treb("rm", "--force", rid)
    assert res.returncode == 0, res.stderr
    assert not run_dir.exists() and not any(_alive(p) for p in children)
    freed = res.stdout.strip().splitlines()[-1]
    assert freed.startswith("1 run(s), freed 2.") and freed.endswith(" MB")  # 2 checkpoints
    assert treb("status", rid).returncode == 2  # no record left
    assert treb("rm", "").returncode == 2


def test_prune_by_age_and_state_never_escapes_runs(treb, treb_home: Path, tmp_path: Path) -> None:
    ok = write_spec(tmp_path, "command: 'true'\n", "ok.yaml")
    bad = write_spec(tmp_path, "command: 'exit 4'\n", "bad.yaml")
    old_ok, old_bad, new_bad = (treb("run", str(s)) for s in (ok, bad, bad))
    ids = [json.loads(treb("ps", "--json").stdout)[i]["id"] for i in (2, 1, 0)]
    assert [old_ok.returncode, old_bad.returncode, new_bad.returncode] == [0, 1, 1]
    for rid in ids[:2]:
        _backdate(treb_home, rid, 40)
    # A damaged index pointing a run's run_dir elsewhere: only runs/<id> is ever removed.
    victim = tmp_path / "victim"
    victim.mkdir()
    import sqlite3

    with sqlite3.connect(treb_home / "runs.db") as db:
        db.execute("UPDATE runs SET run_dir = ? WHERE id = ?", (str(victim), ids[0]))
    dry = treb("prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert {line.split()[2] for line in dry.stdout.splitlines()[:-1]} == set(ids[:2])
    assert "would free" in dry.stdout and all((treb_home / "runs" / i).is_dir() for i in ids)
    res = treb("prune", "--older-than", "30d", "--state", "failed")
    assert res.returncode == 0 and ids[1] in res.stdout and ids[0] not in res.stdout
    res = treb("prune", "--older-than", "30d")
    assert res.returncode == 0 and ids[0] in res.stdout
    left = [r["id"] for r in json.loads(treb("ps", "--all", "--json").stdout)]
    assert left == [ids[2]] and victim.is_dir()
    assert sorted(p.name for p in (treb_home / "runs").iterdir()) == [ids[2]]
    assert treb("prune", "--older-than", "30d").stdout.strip() == "nothing to prune"
    bad_args = treb("prune", "--older-than", "soon")
    assert bad_args.returncode == 2 and "--older-than soon" in bad_args.stderr
    assert treb("prune", "--older-than", "1d", "--state", "running").returncode == 2


# Rank 0 resumes from $TREB_CHECKPOINT_DIR/step when there is one, and overwrites it in place.
STEPPER = (
    "import os\n"
    "d = os.environ['TREB_CHECKPOINT_DIR']\n"
    "p = os.path.join(d, 'step')\n"
    "if os.environ['RANK'] == '0':\n"
    "    step = int(open(p).read()) if os.path.exists(p) else 0\n"
    "    print('resumed at', step)\n"
    "    with open(p, 'r+' if os.path.exists(p) else 'w') as f:\n"
    "        f.write(str(step + 1))\n"
)


def test_resume_from_copies_the_earlier_checkpoints(treb, treb_home: Path, tmp_path: Path) -> None:
    (tmp_path / "step.py").write_text(STEPPER)
    spec = write_spec(tmp_path, "command: python step.py\nprocs_per_node: 2\n")
    first = treb("run", str(spec))
    assert first.returncode == 0 and "resumed at 0" in first.stdout
    src = status_json(treb)
    second = treb("run", str(spec), "--resume-from", src["id"])
    assert second.returncode == 0, second.stderr
    assert "[0:0] resumed at 1" in second.stdout
    new = status_json(treb)
    assert (Path(new["run_dir"]) / "checkpoints" / "step").read_text() == "2"
    assert (Path(src["run_dir"]) / "checkpoints" / "step").read_text() == "1"  # a copy
    events = (Path(new["run_dir"]) / "events.jsonl").read_text()
    assert f'"from_run": "{src["id"]}"' in events
    # rerun takes it too, and the earlier run may go: the copy stays.
    third = treb("rerun", new["id"], "--resume-from", new["id"])
    assert third.returncode == 0 and "resumed at 2" in third.stdout, third.stderr
    assert treb("rm", src["id"]).returncode == 0
    assert (Path(new["run_dir"]) / "checkpoints" / "step").read_text() == "2"


def test_resume_from_refusals_record_nothing(treb, treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: 'sleep 300'\n")
    empty = write_spec(tmp_path, "command: 'true'\n", "empty.yaml")
    assert treb("run", str(empty)).returncode == 0
    done = status_json(treb)["id"]
    active = treb("run", "-d", str(spec)).stdout.strip()
    try:
        cases = [
            ([done], "has no checkpoints"),
            ([active], "is still"),
            ([""], "give a run id"),
            (["nope"], "no run matches"),
            ([done, "--on", "kubernetes", "-o", "kubernetes.image=x"], "do not see the run"),
        ]
        for args, says in cases:
            res = treb("run", str(empty), "--resume-from", *args)
            assert res.returncode == 2 and says in res.stderr, (args, res.stderr)
            assert "Traceback" not in res.stderr
        assert len(json.loads(treb("ps", "--all", "--json").stdout)) == 2
    finally:
        treb("cancel", active)


CRASH = 'import os\n\ndef step():\n    return {}["missing"]\n\nif os.environ["RANK"] == "1":\n    step()\n'


def test_tracebacks_name_the_users_files(treb, treb_home: Path, tmp_path: Path) -> None:
    wd = tmp_path / "proj"
    wd.mkdir()
    (wd / "train.py").write_text(CRASH)
    spec = write_spec(wd, "command: python train.py\nprocs_per_node: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 1
    mine = f'File "{wd}/train.py", line 4, in step'
    summary = res.stderr
    assert mine in summary and f"(at {wd}/train.py:4 in step" in summary
    assert "/code/train.py" not in summary
    status = treb("status").stdout
    assert f"{wd}/train.py:4 in step" in status and "/code/train.py" not in status
    diag = treb("diagnose").stdout
    assert f"user code: {wd}/train.py:4 in step" in diag and mine in diag
    root = json.loads(treb("diagnose", "--json").stdout)["root_cause"]
    assert mine in "\n".join(root["evidence"])
    # Edited since: the line numbers may be wrong there, so the copy that ran is named.
    (wd / "train.py").write_text("# moved\n" + CRASH)
    diag = treb("diagnose").stdout
    rid = status_json(treb)["id"]
    assert f"user code: {treb_home}/runs/{rid}/code/train.py:4 in step" in diag
    assert f"note: train.py changed in {wd} since the run" in diag

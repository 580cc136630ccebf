"""A newcomer's first hour (issue 35, item 5): what `treb` says to a mistyped verb, a
command that cannot run, two runs of different shapes, a field a spec lacks, and a missing
extra. Each through the real `python -m trebuchet` in a child process."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import TrebFn, status_json, write_spec
from trebuchet.store.db import RunRecord, Store
from trebuchet.store.paths import runs_dir


def test_a_mistyped_verb_gets_did_you_mean_not_the_list_of_verbs(treb: TrebFn) -> None:
    res = treb("stauts")
    assert res.returncode == 2
    assert res.stderr.strip() == "treb: unknown verb 'stauts'; did you mean 'status'?"


def test_a_word_like_no_verb_is_named_with_the_help_pointer(treb: TrebFn) -> None:
    res = treb("zzqx")
    assert res.returncode == 2
    assert "unknown verb 'zzqx'" in res.stderr and "treb --help" in res.stderr
    assert "choose from" not in res.stderr and "Traceback" not in res.stderr


def test_a_spec_where_the_verb_belongs_suggests_treb_run(treb: TrebFn) -> None:
    res = treb("job.yaml")
    assert res.returncode == 2
    assert "did you mean `treb run job.yaml`?" in res.stderr


def _attempts(treb: TrebFn) -> int:
    return len(status_json(treb)["attempts"])


def test_command_not_found_is_not_retried(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "command: no-such-program-h35c --x\nretries: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 1
    assert _attempts(treb) == 1, res.stderr
    assert "127" in res.stderr and "retry_exit_codes" in res.stderr


def test_not_executable_is_not_retried(treb: TrebFn, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)  # not executable: exit 126 from bash
    spec = write_spec(tmp_path, "command: ./run.sh\nretries: 2\n")
    res = treb("run", str(spec))
    assert res.returncode == 1
    assert status_json(treb)["first_failure"]["exit_code"] == 126
    assert _attempts(treb) == 1, res.stderr


def test_retry_exit_codes_asking_for_127_retries_it(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path, "command: no-such-program-h35c\nretries: 2\nretry_exit_codes: [127]\n"
    )
    assert treb("run", str(spec)).returncode == 1
    assert _attempts(treb) == 3


def _result_run(rid: str, nodes: int, ppn: int, value: float, at: float) -> None:
    run = runs_dir() / rid
    (run / "attempt-0").mkdir(parents=True)
    (run / "attempt-0" / "rank-0.log").write_text(f"performance: {value} samples_per_second\n")
    (run / "spec.json").write_text(json.dumps({"name": "bench", "command": "x"}))
    Store().insert_run(RunRecord(
        id=rid, name="bench", backend="local", launcher="native", state="SUCCEEDED",
        nodes=nodes, procs_per_node=ppn, run_dir=str(run), created_at=at, started_at=at,
        ended_at=at + 1,
    ))  # fmt: skip


def test_results_compares_only_runs_of_one_shape(treb: TrebFn) -> None:
    now = time.time() - 100
    _result_run("b1000001", 1, 1, 10.0, now)
    _result_run("b1000002", 1, 2, 26.392, now + 1)
    res = treb("results", "b1000001", "b1000002")
    assert res.returncode == 0, res.stderr
    assert "+163.92%" not in res.stdout
    assert "change:" not in res.stdout
    assert "1x1" in res.stdout + res.stderr and "1x2" in res.stdout + res.stderr
    assert "shape" in (res.stdout + res.stderr).lower()
    rows = json.loads(treb("results", "b1000001", "b1000002", "--json").stdout)
    assert [r["relative_change"] for r in rows] == [None, None]


def test_results_still_compares_two_runs_of_one_shape(treb: TrebFn) -> None:
    now = time.time() - 100
    _result_run("c1000001", 1, 2, 10.0, now)
    _result_run("c1000002", 1, 2, 11.0, now + 1)
    res = treb("results", "c1000001", "c1000002")
    assert "change: +10.00% samples_per_second (c1000002 vs c1000001)" in res.stdout


def test_a_missing_image_is_said_where_it_would_go(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "name: x\ncommand: python train.py\nnodes: 2\n")
    res = treb("render", str(spec), "--on", "kubernetes")
    assert res.returncode == 2
    assert f"{spec}:1:" not in res.stderr, res.stderr  # line 1 is `name:`, not about it
    assert "kubernetes.image" in res.stderr and "no kubernetes: block" in res.stderr


def test_a_missing_image_in_a_kubernetes_block_names_the_block_line(
    treb: TrebFn, tmp_path: Path
) -> None:
    text = "name: x\ncommand: python train.py\nkubernetes:\n  namespace: ml\n"
    spec = write_spec(tmp_path, text)
    res = treb("render", str(spec), "--on", "kubernetes")
    assert res.returncode == 2
    assert f"{spec}:3: kubernetes.image:" in res.stderr, res.stderr
    assert "has no image:" in res.stderr


def test_a_missing_field_of_a_spec_less_run_says_the_override(treb: TrebFn, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    res = treb("run", "-n", "2", "--on", "kubernetes", "train.py", cwd=tmp_path)
    assert res.returncode == 2
    assert "<spec>" not in res.stderr, res.stderr
    assert "kubernetes.image: a pod needs an image" in res.stderr
    assert "-o kubernetes.image=VALUE" in res.stderr


def test_ui_without_its_extra_names_the_extra(treb: TrebFn, tmp_path: Path) -> None:
    shadow = tmp_path / "shadow"  # starlette and uvicorn made unimportable
    for name in ("starlette", "uvicorn"):
        (shadow / name).mkdir(parents=True)
        (shadow / name / "__init__.py").write_text("raise ImportError('hidden')\n")
    import os

    path = os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])
    res = treb("ui", "--port", "0", env={"PYTHONPATH": path}, timeout=60)
    assert res.returncode == 2, res.stderr
    assert "web extra" not in res.stderr
    assert "the ui extra" in res.stderr and "pip install 'trebuchet[ui]'" in res.stderr


def _on_a_terminal(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """What `treb ARGS` writes to a terminal (a pseudo-terminal for stdout and stderr)."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", *args], stdin=subprocess.DEVNULL,
                            stdout=follower, stderr=follower, env={**os.environ, **env},
                            cwd=cwd)  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(leader)
    return b"".join(chunks).decode(errors="replace")


FAILING = "command: python -c 'import sys; sys.exit(\"bad input\")'\n"


def test_the_summary_is_coloured_on_a_terminal(treb_home: Path, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAILING)
    said = _on_a_terminal(["run", str(spec)], {"NO_COLOR": "", "TERM": "xterm"}, tmp_path)
    assert "\x1b[1m\x1b[31mFAILED\x1b[0m after" in said, said
    assert "\x1b[1m\x1b[31mcause:\x1b[0m" in said and "\x1b[1m\x1b[32mfix:\x1b[0m" in said
    ended = said[said.index(") \x1b[1m\x1b[31mFAILED") :].splitlines()[1:]
    assert ended and not any(line.startswith("treb:") for line in ended), ended


def test_no_colour_under_no_color_nor_off_a_terminal(treb: TrebFn, tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FAILING)
    said = _on_a_terminal(["run", str(spec)], {"NO_COLOR": "1", "TERM": "xterm"}, tmp_path)
    assert "FAILED after" in said and "\x1b[" not in said, said
    res = treb("run", str(spec))
    assert res.returncode == 1 and "\x1b[" not in res.stderr
    summary = res.stderr[res.stderr.index(") FAILED after") :].splitlines()
    assert [ln for ln in summary[1:] if ln.startswith("  cause: ")], summary


def test_a_local_node_loss_says_the_new_node_set(treb_home: Path, tmp_path: Path) -> None:
    """recovery.md: after a loss the supervisor says the nodes of the next attempt (as ssh
    did alone): locally too."""
    import os
    import signal
    import subprocess
    import sys

    from tests.fast.test_local_node_loss import LOOP, keeper_of

    (tmp_path / "loop.py").write_text(LOOP)
    spec = write_spec(tmp_path, f"name: local-loss\ncommand: [{sys.executable}, loop.py]\n"
                      "nodes: 2\nspare_nodes: 1\nretries: 1\ngrace_period: 1\n")  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "trebuchet", "run", str(spec)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        end, pid = time.time() + 60, None
        while pid is None and time.time() < end and proc.poll() is None:
            runs = list((treb_home / "runs").glob("*/checkpoints/ckpt.json"))
            pid = keeper_of(runs[0].parent.parent.name, 1) if runs else None
            time.sleep(0.1)
        assert pid is not None, "no keeper for node 1 while the ranks trained"
        os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "treb: nodes now: node-0, node-2 (WORLD_SIZE 2; excluded: node-1)" in err, err


def test_the_one_rule_ends_126_and_127_for_every_engine() -> None:
    """lifecycle.next_step decides for local, ssh and Slurm alike (their JobController)."""
    from trebuchet.runtime.job.life import END, RETRY, next_step

    def step(code: int, only: list[int] | None = None) -> str:
        return next_step("FAILED", 0, 3, [], [], {}, exit_code=code, retry_codes=only).action

    assert step(127) == END and step(126) == END
    assert step(1) == RETRY and step(128 + 9) == RETRY
    assert step(127, [127]) == RETRY and step(126, [127]) == END

"""Hostile input, as a class: every case exits 2 with a message naming the file (and line
and field where the spec has one), prints no traceback and ends. Each case runs the real
`treb` in a child process whose timeout (generous: a hang fails the test, no timing is
asserted) and address-space limit (a YAML bomb fails the test instead of the machine)
bound it."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TrebFn

HANG_S = 60  # far above any answer; only a hang reaches it
MEMORY = 2 << 30  # bytes of address space for the child: a bomb would need far more


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _laughs(levels: int = 9, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "command: x\n" + "\n".join(lines) + f"\nenv: *a{levels - 1}\n"


def _flow_bomb() -> str:
    parts = ["a: &a [x,x,x,x,x,x,x,x,x]"]
    for prev, name in zip("abcdefg", "bcdefgh", strict=True):
        parts.append(f"{name}: &{name} [" + ",".join([f"*{prev}"] * 9) + "]")
    return "{" + ", ".join(parts) + "}"


def _sweep(axes: int, values: int) -> str:
    rows = "".join(
        f"  env.V{i}: [{', '.join(str(j) for j in range(values))}]\n" for i in range(axes)
    )
    return "command: x\nsweep:\n" + rows


DEEP = "[" * 1000 + "]" * 1000
DEEP_MAP = "".join("  " * (i + 1) + f"k{i}:\n" for i in range(1000)) + "  " * 1001 + "v: 1\n"
SL = "command: x\nslurm:\n  sbatch_args: "

# (id, spec text, verb and options before the spec, -o overrides, line or None, fragments)
CASES = [
    # YAML bombs and depth
    ("laughs", _laughs(), "render", [], 2, ["more than 100000 values"]),
    ("laughs-check", _laughs(), "check", [], 2, ["more than 100000 values"]),
    ("laughs-run", _laughs(), "run", [], 2, ["more than 100000 values"]),
    ("laughs-wide", _laughs(5, 40), "render", [], 2, ["more than 100000 values"]),
    ("alias-cycle-seq", "command: x\nenv: &a [*a]\n", "render", [], 2, ["env[0]", "cycle"]),
    ("alias-cycle-map", "command: x\nslurm: &a {x: *a}\n", "render", [], 2, ["slurm.x", "cycle"]),
    ("alias-cycle-deep", "command: x\nenv: &a {A: [[*a]]}\n", "render", [], 2, ["cycle"]),
    ("deep-flow-seq", f"command: x\nenv: {DEEP}\n", "render", [], 2, ["deeper than 50"]),
    ("deep-block-map", "command: x\nslurm:\n" + DEEP_MAP, "render", [], 51, ["deeper than 50"]),
    (
        "deep-flow-map",
        "command: x\nenv: " + "{a: " * 1000 + "1" + "}" * 1000 + "\n",
        "render",
        [],
        2,
        ["deeper than 50"],
    ),  # fmt: skip
    ("deep-check", f"command: x\nenv: {DEEP}\n", "check", [], 2, ["deeper than 50"]),
    (
        "huge-int-literal",
        "command: x\nnodes: " + "9" * 5000 + "\n",
        "render",
        [],
        2,
        ["cannot read the value"],
    ),
    ("complex-key", "command: x\n? [a, b]\n: 1\n", "render", [], 2, ["keys must be plain"]),
    (
        "override-deep",
        "command: x\n",
        "render",
        [f"env.A={DEEP}"],
        None,
        ["-o env.A=", "deeper than 50"],
    ),  # fmt: skip
    (
        "override-bomb",
        "command: x\n",
        "render",
        [f"env={_flow_bomb()}"],
        None,
        ["-o env=", "more than 100000 values"],
    ),  # fmt: skip
    ("override-cycle", "command: x\n", "render", ["env=[&a [*a]]"], None, ["-o env=", "cycle"]),
    # sizes
    (
        "nodes-huge",
        "command: x\nnodes: 99999999999999999999999999999\n",
        "render",
        [],
        2,
        ["nodes: must be an integer between 1 and 100000"],
    ),  # fmt: skip
    (
        "nodes-huge-gpus",
        "command: x\nnodes: 99999999999999999999999999999\ngpus_per_node: 8\n",
        "check",
        [],
        2,
        ["nodes:"],
    ),  # fmt: skip
    ("nodes-over-limit", "command: x\nnodes: 100001\n", "render", [], 2, ["nodes:"]),
    (
        "procs-huge",
        "command: x\nprocs_per_node: 100000000\n",
        "render",
        [],
        2,
        ["procs_per_node: must be an integer between 1 and 1024"],
    ),  # fmt: skip
    ("gpus-huge", "command: x\ngpus_per_node: 100000000\n", "render", [], 2, ["gpus_per_node:"]),
    (
        "world-too-big",
        "command: x\nnodes: 100000\nprocs_per_node: 1000\n",
        "render",
        [],
        2,
        ["nodes:", "more than 1000000 ranks"],
    ),  # fmt: skip
    (
        "retries-huge",
        "command: x\nretries: 99999999999999999999\n",
        "render",
        [],
        2,
        ["retries:"],
    ),  # fmt: skip
    (
        "max-retries-huge",
        "command: x\nlog_policies:\n  - {pattern: a, action: retry, max_retries: 100000}\n",
        "render",
        [],
        3,
        ["log_policies[0].max_retries"],
    ),  # fmt: skip
    (
        "sweep-parallel-huge",
        "command: x\nsweep_parallel: 10000000\n",
        "render",
        [],
        2,
        ["sweep_parallel:"],
    ),  # fmt: skip
    (
        "cpus-per-task-huge",
        "command: x\nslurm:\n  cpus_per_task: 10000000\n",
        "render --on slurm",
        [],
        3,
        ["slurm.cpus_per_task"],
    ),  # fmt: skip
    ("timeout-nan", "command: x\ntimeout: .nan\n", "render", [], 2, ["timeout:"]),
    ("timeout-inf", "command: x\ntimeout: .inf\n", "render", [], 2, ["timeout:", "366 days"]),
    ("timeout-neg-inf", "command: x\ntimeout: -.inf\n", "render", [], 2, ["timeout:"]),
    ("timeout-inf-check", "command: x\ntimeout: .inf\n", "check", [], 2, ["timeout:"]),
    (
        "timeout-huge-days",
        "command: x\ntimeout: 99999999999999999999999d\n",
        "render --on slurm",
        [],
        2,
        ["timeout:", "366 days"],
    ),  # fmt: skip
    (
        "timeout-huge-hms",
        "command: x\ntimeout: '99999999999:00:00'\n",
        "render --on slurm",
        [],
        2,
        ["timeout:"],
    ),  # fmt: skip
    ("timeout-fullwidth", "command: x\ntimeout: '２h'\n", "render", [], 2, ["timeout:"]),
    ("grace-nan", "command: x\ngrace_period: .nan\n", "render", [], 2, ["grace_period:"]),
    (
        "warning-inf",
        "command: x\ntimeout: 1h\ntimeout_warning: .inf\n",
        "render",
        [],
        3,
        ["timeout_warning:"],
    ),  # fmt: skip
    (
        "slurm-time-huge",
        "command: x\nslurm:\n  time: '99999999999-00:00:00'\n",
        "render --on slurm",
        [],
        3,
        ["slurm.time", "366 days"],
    ),  # fmt: skip
    ("sweep-millions", _sweep(5, 30), "render", [], 2, ["sweep:", "more than 10000 points"]),
    (
        "sweep-override-millions",
        "command: x\n",
        "render --sweep",
        [f"env.V{i}=" + ",".join(str(j) for j in range(30)) for i in range(5)],
        None,
        ["sweep:", "24300000 points"],
    ),  # fmt: skip
    (
        "command-too-long",
        "command: " + "a" * 200_000 + "\n",
        "check",
        [],
        1,
        ["command:", "longer than 100000"],
    ),  # fmt: skip
    (
        "command-list-too-long",
        "command: [python, " + "a" * 200_000 + "]\n",
        "render",
        [],
        1,
        ["command:"],
    ),  # fmt: skip
    ("pre-too-long", "command: x\npre: " + "a" * 200_000 + "\n", "render", [], 2, ["pre:"]),
    (
        "env-too-long",
        "command: x\nenv:\n  A: " + "a" * 200_000 + "\n",
        "render",
        [],
        3,
        ["env.A:"],
    ),  # fmt: skip
    (
        "spec-over-1mib",
        "command: " + "a" * (2 << 20) + "\n",
        "check",
        [],
        None,
        ["larger than 1 MiB"],
    ),  # fmt: skip
    (
        "workdir-long",
        "command: x\nworkdir: " + "/a" * 3000 + "\n",
        "render",
        [],
        2,
        ["workdir:"],
    ),  # fmt: skip
    (
        "workdir-long-name",
        "command: x\nworkdir: " + "a" * 300 + "\n",
        "render",
        [],
        2,
        ["workdir:"],
    ),  # fmt: skip
    ("workdir-nul", 'command: x\nworkdir: "a\\0b"\n', "render", [], 2, ["workdir:", "NUL"]),
    (
        "requirements-long-name",
        "command: x\nenvironment:\n  requirements: " + "r" * 300 + "\n",
        "render",
        [],
        3,
        ["environment.requirements:"],
    ),  # fmt: skip
    # values validation used to let through
    ("env-nul", 'command: x\nenv:\n  A: "a\\0b"\n', "run --detach", [], 3, ["env.A:", "NUL"]),
    (
        "env-surrogate",
        'command: x\nenv:\n  A: "\\uD800"\n',
        "run --detach",
        [],
        3,
        ["env.A:", "surrogate"],
    ),  # fmt: skip
    ("env-key-nul", 'command: x\nenv:\n  "A\\0": b\n', "run --detach", [], 3, ["NUL"]),
    ("command-nul", 'command: "echo \\0"\n', "run --detach", [], 1, ["command:", "NUL"]),
    ("command-list-nul", 'command: [echo, "a\\0"]\n', "run --detach", [], 1, ["command"]),
    ("pre-surrogate", 'command: x\npre: "\\udfff"\n', "run --detach", [], 2, ["pre:"]),
    (
        "slurm-account-nul",
        'command: x\nslurm:\n  account: "a\\0"\n',
        "render --on slurm",
        [],
        3,
        ["slurm.account:", "NUL"],
    ),  # fmt: skip
    (
        "override-env-nul",
        "command: x\n",
        "run --detach",
        ['env.A="a\\0b"'],
        None,
        ["-o env.A=", "NUL"],
    ),  # fmt: skip
    (
        "policy-nested",
        "command: x\nlog_policies:\n  - {pattern: '(a+)+$', action: retry}\n",
        "render",
        [],
        3,
        ["log_policies[0].pattern", "backtrack"],
    ),  # fmt: skip
    (
        "policy-star-star",
        "command: x\nlog_policies:\n  - {pattern: '(x*)*y', action: retry}\n",
        "render",
        [],
        3,
        ["log_policies[0].pattern", "backtrack"],
    ),  # fmt: skip
    (
        "policy-alternation",
        "command: x\nlog_policies:\n  - {pattern: '(a|ab)*c', action: no_retry}\n",
        "render",
        [],
        3,
        ["backtrack"],
    ),  # fmt: skip
    (
        "policy-lookahead",
        "command: x\nlog_policies:\n  - {pattern: '(?=(a+)+b)', action: retry}\n",
        "render",
        [],
        3,
        ["backtrack"],
    ),  # fmt: skip
    (
        "policy-uncompilable",
        "command: x\nlog_policies:\n  - {pattern: '(?P<', action: retry}\n",
        "render",
        [],
        3,
        ["log_policies[0].pattern", "not a valid regular expression"],
    ),  # fmt: skip
    (
        "policy-bad-backref",
        "command: x\nlog_policies:\n  - {pattern: '(a)\\9', action: retry}\n",
        "render",
        [],
        3,
        ["log_policies[0].pattern"],
    ),  # fmt: skip
    (
        "policy-too-long",
        "command: x\nlog_policies:\n  - {pattern: " + "a" * 2000 + ", action: retry}\n",
        "render",
        [],
        3,
        ["longer than 1000"],
    ),  # fmt: skip
    (
        "metrics-pattern-huge-repeat",
        "command: x\nmetrics:\n  patterns: ['(?P<a>a{99999999999999999999})']\n",
        "render",
        [],
        3,
        ["metrics.patterns", "not a valid regular expression"],
    ),  # fmt: skip
    (
        "metrics-progress-huge-repeat",
        "command: x\nmetrics:\n  progress: '(?P<step>a{99999999999999999999})'\n",
        "render",
        [],
        3,
        ["metrics.progress", "not a valid regular expression"],
    ),  # fmt: skip
    (
        "port-fullwidth",
        "command: x\nenv:\n  MASTER_PORT: '２９５００'\n",
        "render",
        [],
        3,
        ["env.MASTER_PORT: must be a port number"],
    ),  # fmt: skip
    (
        "port-superscript",
        "command: x\nenv:\n  MASTER_PORT: '²'\n",
        "render",
        [],
        3,
        ["env.MASTER_PORT"],
    ),  # fmt: skip
    (
        "port-arabic-indic",
        "command: x\nenv:\n  MASTER_PORT: '٢٩٥٠٠'\n",
        "render",
        [],
        3,
        ["env.MASTER_PORT"],
    ),  # fmt: skip
    ("nodes-true", "command: x\nnodes: true\n", "render", [], 2, ["nodes:", "got True"]),
    ("procs-false", "command: x\nprocs_per_node: false\n", "render", [], 2, ["procs_per_node"]),
    ("retries-true", "command: x\nretries: true\n", "render", [], 2, ["retries:"]),
    ("master-port-true", "command: x\nmaster_port: true\n", "render", [], 2, ["master_port:"]),
    (
        "profile-ranks-bool",
        "command: x\nprofile_ranks: [true]\n",
        "render",
        [],
        2,
        ["profile_ranks"],
    ),  # fmt: skip
    (
        "sbatch-o-attached",
        SL + "['-o/tmp/x']\n",
        "render --on slurm",
        [],
        3,
        ["slurm.sbatch_args", "--output, set by trebuchet"],
    ),  # fmt: skip
    (
        "sbatch-output-separate",
        SL + "['--output', '/tmp/x']\n",
        "render --on slurm",
        [],
        3,
        ["--output, set by trebuchet"],
    ),  # fmt: skip
    (
        "sbatch-output-space",
        SL + "['--output /tmp/x']\n",
        "render --on slurm",
        [],
        3,
        ["--output, set by trebuchet"],
    ),  # fmt: skip
    (
        "sbatch-outp-prefix",
        SL + "['--outp=/tmp/x']\n",
        "render --on slurm",
        [],
        3,
        ["--output, set by trebuchet"],
    ),  # fmt: skip
    ("sbatch-J-space", SL + "['-J x']\n", "render --on slurm", [], 3, ["--job-name"]),
    ("sbatch-J-cluster", SL + "['-vJx']\n", "render --on slurm", [], 3, ["--job-name"]),
    ("sbatch-t5", SL + "['-t5']\n", "render --on slurm", [], 3, ["--time, set by trebuchet"]),
    ("sbatch-N-attached", SL + "['-N2']\n", "render --on slurm", [], 3, ["--nodes"]),
    (
        "sbatch-tasks-per-node",
        SL + "['--tasks-per-node=2']\n",
        "render --on slurm",
        [],
        3,
        ["procs_per_node"],
    ),  # fmt: skip
    (
        "sbatch-error-prefix",
        SL + "['--err', '/tmp/e']\n",
        "render --on slurm",
        [],
        3,
        ["--error"],
    ),  # fmt: skip
    ("sbatch-chdir-short", SL + "['-D/tmp']\n", "render --on slurm", [], 3, ["--chdir"]),
    ("sbatch-ambiguous", SL + "['--t=1']\n", "render --on slurm", [], 3, ["ambiguous"]),
    ("sbatch-array", SL + "['--array=0-9']\n", "render --on slurm", [], 3, ["--array"]),
    ("sbatch-wait", SL + "['-W']\n", "render --on slurm", [], 3, ["--wait"]),
    ("sbatch-positional", SL + "['/tmp/x']\n", "render --on slurm", [], 3, ["not an option"]),
    (
        "sbatch-export-none",
        SL + "['--export', 'NONE']\n",
        "render --on slurm",
        [],
        3,
        ["--export must keep ALL"],
    ),  # fmt: skip
    (
        "sbatch-override",
        "command: x\n",
        "render --on slurm",
        ["slurm.sbatch_args=[-o/tmp/x]"],
        None,
        ["-o slurm.sbatch_args=", "--output"],
    ),  # fmt: skip
]


def _run(treb: TrebFn, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return treb(*args, timeout=HANG_S, cwd=cwd, preexec_fn=_limit)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_hostile_spec_exit_2(case, tmp_path: Path, treb: TrebFn, treb_home: Path) -> None:
    _, text, verb, overrides, line, fragments = case
    spec = tmp_path / "job.yaml"
    spec.write_text(text, errors="surrogatepass")
    args = [*verb.split(), str(spec)]
    for o in overrides:
        args += ["-o", o]
    res = _run(treb, args, tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    err = res.stderr
    if line is not None:
        assert f"{spec}:{line}:" in err, err[-2000:]
    elif not any(o for o in overrides):
        assert str(spec) in err, err[-2000:]
    for frag in fragments:
        assert frag in err, err[-2000:]
    runs = treb_home / "runs"
    assert not runs.exists() or not any(runs.iterdir()), "bad input must record no run"


def _special_paths(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"command: x\nname: caf\xe9\n")
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    return {"fifo": fifo, "dev-zero": Path("/dev/zero"), "dev-urandom": Path("/dev/urandom"),
            "symlink-loop": loop, "not-utf8": latin1, "directory": folder,
            "name-too-long": tmp_path / ("x" * 300 + ".yaml")}  # fmt: skip


SPECIAL = ["fifo", "dev-zero", "dev-urandom", "symlink-loop", "not-utf8", "directory",
           "name-too-long"]  # fmt: skip


@pytest.mark.parametrize("verb", ["render", "check", "run"])
@pytest.mark.parametrize("kind", SPECIAL)
def test_spec_path_that_is_not_a_spec(kind, verb, tmp_path: Path, treb: TrebFn) -> None:
    """A FIFO or a device would block or never end: refused before reading; the others
    are named with why."""
    path = _special_paths(tmp_path)[kind]
    res = _run(treb, [verb, str(path)], tmp_path)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    assert str(path) in res.stderr


def test_cancel_of_an_empty_id_cancels_nothing(tmp_path: Path, treb: TrebFn) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("command: sleep 60\n")
    started = treb("run", "--detach", str(spec), timeout=HANG_S)
    assert started.returncode == 0, started.stderr
    try:
        for ref in ("", " "):
            res = treb("cancel", ref, timeout=HANG_S)
            assert res.returncode == 2 and "empty RUN" in res.stderr, res.stderr
            assert "Traceback" not in res.stderr
        for verb in ("status", "logs", "diagnose"):
            res = treb(verb, "", timeout=HANG_S)
            assert res.returncode == 2 and "empty RUN" in res.stderr, (verb, res.stderr)
        status = treb("status", "--json", timeout=HANG_S)
        assert '"state": "RUNNING"' in status.stdout or '"state": "PENDING"' in status.stdout
    finally:
        treb("cancel", started.stderr.split("run ")[1].split()[0], timeout=HANG_S)


@pytest.mark.parametrize("flag", ["--tail", "--rank", "--node", "--attempt"])
def test_logs_negative_numbers_are_errors(flag: str, treb: TrebFn) -> None:
    res = treb("logs", flag, "-5", timeout=HANG_S)
    assert res.returncode == 2 and "must be >= 0" in res.stderr, res.stderr


def test_empty_rank_log_says_so(tmp_path: Path, treb: TrebFn) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("command: 'true'\nprocs_per_node: 2\n")
    assert treb("run", str(spec), timeout=HANG_S).returncode == 0
    for args in (["logs"], ["logs", "--rank", "1"]):
        res = treb(*args, timeout=HANG_S)
        assert res.returncode == 0 and res.stdout == ""
        assert "empty, nothing was written" in res.stderr, res.stderr


def test_big_one_word_command_checks_quickly_enough_to_finish(tmp_path: Path, treb: TrebFn):
    """The longest command allowed (100,000 characters in one word) goes through every
    check: `treb check` finishes (the timeout only catches a hang)."""
    spec = tmp_path / "job.yaml"
    spec.write_text("command: " + "a" * 100_000 + "\n")
    res = treb("check", str(spec), timeout=HANG_S)
    assert "Traceback" not in res.stderr and res.returncode in (0, 1), res.stderr[-2000:]


def test_sbatch_args_that_are_fine_pass(tmp_path: Path, treb: TrebFn) -> None:
    """The parse refuses what sbatch would read as a managed option, not everything."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "command: x\nslurm:\n  sbatch_args: ['-p', 'gpu', '--comment=hello world', "
        "'--gres=gpu:2', '--exclusive=user', '--container-image', 'img', '--hint=nomultithread']\n"
    )
    res = treb("render", "--on", "slurm", str(spec), timeout=HANG_S)
    assert res.returncode == 0, res.stderr
    assert "#SBATCH -p\n#SBATCH gpu\n" in res.stdout and '--comment="hello world"' in res.stdout


def test_runtime_policy_match_is_bounded_in_time(tmp_path: Path) -> None:
    """A pattern that slipped past validation (polynomial, or exponential written by hand
    in a job file) cannot hold up the supervisor: the child is killed, no policy applies."""
    from trebuchet.runtime.watch.log_policies import match

    log = tmp_path / "rank-0.log"
    log.write_text("a" * 64 + "b\nCUDA out of memory\n")
    assert match([{"pattern": "(a+)+$"}, {"pattern": "CUDA"}], [log], timeout=1) is None
    found = match([{"pattern": "nope"}, {"pattern": "CUDA out"}], [log])
    assert found == ({"pattern": "CUDA out"}, "CUDA out of memory")


def test_the_controllers_matcher_serves_a_run_and_is_replaced_after_a_timeout(
    tmp_path: Path,
) -> None:
    """The job controller's matcher (started while an attempt runs, so that a retry does
    not wait for an interpreter) answers search after search in one child; a search that
    times out kills it, and the next one starts another; closing it leaves no process."""
    from trebuchet.runtime.watch.log_policies import Matcher, match

    log = tmp_path / "rank-0.log"
    log.write_text("a" * 64 + "b\nOSError: Address already in use\n")
    port = [{"pattern": "Address already in use"}]
    matcher = Matcher()
    matcher.start()
    pid = matcher.pid
    assert match(port, [log], matcher=matcher) == (port[0], "OSError: Address already in use")
    assert match([{"pattern": "nope"}], [log], matcher=matcher) is None
    assert matcher.pid == pid  # the same child both times
    assert match([{"pattern": "(a+)+$"}], [log], timeout=1, matcher=matcher) is None
    assert matcher.pid is None  # killed
    assert match(port, [log], matcher=matcher) is not None and matcher.pid not in (None, pid)
    child = matcher.proc
    matcher.close()
    assert child is not None and child.returncode is not None and matcher.pid is None


def test_battery_is_large_enough() -> None:
    assert len(CASES) + len(SPECIAL) * 3 >= 60


def test_python_api_refuses_a_recursive_dict(tmp_path: Path, treb_home: Path) -> None:
    from trebuchet.errors import SpecError
    from trebuchet.spec.load import load_spec

    data: dict = {"command": "x", "env": {}}
    data["env"]["A"] = data
    with pytest.raises(SpecError, match="deeper than 50"):
        load_spec(data=data)
    assert sys.getrecursionlimit() > 50

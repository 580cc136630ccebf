"""torchrun's argv on `treb run` (cli/torchrun_flags.py): every option string of torch's
own parser is treb's, PET_* fill what is not typed, and each flag becomes the override,
command or note docs/cli.md's table says; any argv: a spec or a named error, exit 2, never
a traceback. The launches themselves: tests/integration/test_torchrun_conformance.py."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.cli import specless, torchrun_flags
from trebuchet.cli.main import build_parser
from trebuchet.cli.main import main as treb_main
from trebuchet.errors import UserError


def _parser() -> Any:
    return specless.verb_parser(build_parser("run"), "run")


def _torchrun_options() -> dict[str, bool]:
    """torch's run.py option strings -> takes no value, read from its source (no import)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        pytest.skip("torch is not installed")
    source = Path(spec.origin).parent / "distributed" / "run.py"
    out = {}
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant)]
            action = {k.arg: k.value for k in node.keywords}.get("action")
            switch = isinstance(action, ast.Name) and action.id == "check_env" or (
                isinstance(action, ast.Constant) and action.value == "store_true")  # fmt: skip
            out.update({n: switch for n in names if isinstance(n, str) and n.startswith("-")})
    assert len(out) > 40, out  # both spellings of ~30 flags
    return out


def parse(*words: str, on: str | None = None) -> tuple[Any, list[str] | None]:
    p = _parser()
    head, command = specless.split(p, ["run", *words])
    args = p.parse_args(head[1:])
    args.command = command
    if on is not None:
        args.on = on
    return args, command


def translate(*words: str, on: str | None = None) -> torchrun_flags.Translated:
    args, command = parse(*words, on=on)
    return torchrun_flags.translate(args, args.on, command is not None)


def test_every_option_string_of_torchrun_is_treb_runs() -> None:
    """torch's parser, spelling by spelling: treb run knows each, with or without a value
    as torchrun has it (-h aside: treb's own help)."""
    ours = _parser()._option_string_actions
    theirs = _torchrun_options()
    missing = sorted(set(theirs) - set(ours) - {"-h", "--help"})
    assert not missing, missing
    wrong = [o for o, switch in theirs.items() if o not in ("-h", "--help")
             and (ours[o].nargs == 0) != switch]  # fmt: skip
    assert not wrong, wrong


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)
    (tmp_path / "p.py").write_text("")
    (tmp_path / "run.sh").write_text("")
    return tmp_path


def test_program_flags_make_the_first_word_the_program(here: Path) -> None:
    """-m MODULE and --no-python PROGRAM: everything after the program is the program's
    (before: -m was --sweep, and the program's --prepared-data was read as treb's)."""
    args, command = parse("-n", "2", "-m", "pkg.train", "--lr", "1", "--name", "x")
    assert command == ["pkg.train", "--lr", "1", "--name", "x"]
    args.torchrun = torchrun_flags.translate(args, None, True)
    assert specless.build(args) == {
        "name": "train",
        "command": ["python", "-m", "pkg.train", "--lr", "1", "--name", "x"],
        "snapshot": False,  # in this folder, as torchrun runs it (test_specless.py)
    }
    args, command = parse("--no-python", "./run.sh", "--prepared-data", "/d")
    args.torchrun = torchrun_flags.translate(args, None, True)
    assert specless.build(args)["command"] == ["./run.sh", "--prepared-data", "/d"]
    args, command = parse("--run-path", "p.py", "-x")
    args.torchrun = torchrun_flags.translate(args, None, True)
    assert specless.build(args)["command"] == ["python", "p.py", "-x"]
    # the sweep keeps --sweep and --multirun
    assert parse("--sweep", "job.yaml")[0].sweep and parse("--multirun", "job.yaml")[0].sweep


@pytest.mark.parametrize(
    ("words", "on", "overrides"),
    [
        (["--nnodes=1:2", "p.py"], None, ["nodes=1"]),  # one machine: the agent alone
        (["--nnodes", "2:4", "p.py"], "slurm", ["nodes=2:4"]),  # treb's range, as a spec's
        (
            ["--nproc_per_node=cpu", "p.py"],
            None,
            [f"procs_per_node={len(os.sched_getaffinity(0))}"],
        ),
        (
            ["--max_restarts=3", "--shutdown-timeout", "9", "p.py"],
            None,
            ["retries=3", "grace_period=9"],
        ),  # fmt: skip
        # --rdzv-id is TORCHELASTIC_RUN_ID where torchrun keeps it
        (
            ["--rdzv-id=abc", "--master-port=29400", "p.py"],
            None,
            ["master_port=29400", "env.TORCHELASTIC_RUN_ID=abc"],
        ),  # fmt: skip
        (
            ["--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-id=j", "p.py"],
            None,
            ["env.TORCHELASTIC_RUN_ID=j"],
        ),  # fmt: skip
        (["--rdzv-id=abc", "p.py"], None, []),  # one node, no port: torchrun's own uuid
        (["--standalone", "--rdzv-id=abc", "p.py"], None, ["nodes=1"]),
        (["--role", "trainer", "p.py"], None, ["env.ROLE_NAME=trainer"]),
        (["--master-addr", "10.0.0.1", "p.py"], None, ["env.MASTER_ADDR=10.0.0.1"]),
        (
            ["--nnodes=2", "--node-rank=1", "--master-addr=h0", "p.py"],
            None,
            ["nodes=2", "env.MASTER_ADDR=h0", "master_port=29500"],
        ),
    ],
)
def test_flags_become_overrides(words: list[str], on: str | None, overrides: list[str],
                                here: Path) -> None:  # fmt: skip
    assert translate(*words, on=on).overrides == overrides


def test_pet_variables_are_torchruns_defaults(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: PET_NPROC_PER_NODE=4 ran 1 rank without a word."""
    for name, value in {"PET_NPROC_PER_NODE": "4", "PET_NNODES": "1", "PET_NO_PYTHON": "1",
                        "PET_MAX_RESTARTS": "2", "PET_MODULE": "0"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    args, command = parse("run.sh", "--x")  # PET_NO_PYTHON: run.sh is the program
    assert command == ["run.sh", "--x"]
    t = torchrun_flags.translate(args, None, True)
    assert t.overrides == ["nodes=1", "procs_per_node=4", "retries=2"] and t.mode == "as-is"
    assert any("PET_NPROC_PER_NODE" in n for n in t.notes)
    assert translate("-n", "3", "p.py").overrides[1] == "procs_per_node=3"  # typed wins
    monkeypatch.setenv("PET_MODULE", "1")
    with pytest.raises(UserError, match="--module and --no-python: not both"):
        translate("run.sh")
    monkeypatch.setenv("PET_MODULE", "yes")
    with pytest.raises(UserError, match="PET_MODULE='yes': torchrun reads it as an integer"):
        translate("p.py")


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["--nproc-per-node=unknown", "p.py"], "Unsupported nproc_per_node value"),
        (["--nproc-per-node=xpu", "p.py"], "no XPU on this machine"),
        (["--nnodes=2:1", "p.py"], "needs 0 < MIN <= MAX"),
        (["--nnodes=a", "p.py"], "give N or MIN:MAX"),
        (["--logs-specs=DOESNOT_EXIST", "p.py"], "no torchrun.logs_specs entry point"),
        (["--local-ranks-filter=a", "p.py"], "a comma-separated list of local ranks"),
        (["--redirects=4", "--log-dir=x", "p.py"], "give 0-3"),
        (["--monitor-interval=x", "p.py"], "not a number"),
        (["-m", "--no-python", "p.py"], "not both"),
        (["--nnodes=2", "--node-rank=2", "p.py"], "node ranks are 0 to 1"),
    ],
)
def test_what_torchrun_refuses_is_named(words: list[str], says: str, here: Path) -> None:
    with pytest.raises(UserError, match=says):
        translate(*words)


def test_flags_without_a_counterpart_say_what_treb_does(here: Path) -> None:
    """One note per flag (two rendezvous flags with the same answer: one note)."""
    t = translate("--monitor-interval=1", "--start-method=spawn", "--rdzv-backend=c10d",
                  "--rdzv-endpoint=h:1", "--numa-binding=node", "--virtual-local-rank",
                  "--local-addr=x", "p.py")  # fmt: skip
    assert len(t.notes) == 6, t.notes
    assert any(
        n.startswith("--rdzv-backend c10d --rdzv-endpoint h:1: treb starts") for n in t.notes
    )
    assert translate("--standalone", "--rdzv-backend=c10d", "p.py").notes == []


def test_log_dir_command_lays_out_files_as_torchrun(here: Path) -> None:
    """-r 3 -t 0:1 --log-dir logs, run by bash as a rank runs it: local rank 0's stdout in
    its file and on the terminal, its stderr in its file only; rank 1's both in files only;
    the program's exit status kept; every byte written before the rank ends."""
    import subprocess

    t = translate("--log-dir", "logs", "-r", "3", "-t", "0:1", "p.py")
    program = ["bash", "-c", "echo out $LOCAL_RANK; echo err $LOCAL_RANK >&2; exit 3"]
    argv = torchrun_flags.wrap_command(t, program)
    assert argv[3:] == [str(here / "logs"), *program]
    for local, shown in ((0, "out 0\n"), (1, "")):
        env = {**os.environ, "LOCAL_RANK": str(local), "TREB_RUN_ID": "r1",
               "TORCHELASTIC_RUN_ID": "j", "TREB_ATTEMPT": "0"}  # fmt: skip
        res = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert (res.returncode, res.stdout, res.stderr) == (3, shown, "")
        d = here / "logs" / "j_r1" / "attempt_0" / str(local)
        assert (d / "stdout.log").read_text() == f"out {local}\n"
        assert (d / "stderr.log").read_text() == f"err {local}\n"
    # no --log-dir: the run directory's torchrun-logs/ (torchrun: a temporary folder)
    argv = torchrun_flags.wrap_command(translate("-t", "3", "p.py"), ["x"])
    assert argv[3:] == ["", "x"] and '"${0:-$TREB_RUN_DIR/torchrun-logs}/' in argv[2]
    assert torchrun_flags.wrap_command(translate("p.py"), ["x"]) == ["x"]


# torchrun's flags with values torchrun takes (gpu/xpu apart: they depend on the machine)
GOOD: dict[str, st.SearchStrategy[str]] = {
    "--nnodes": st.sampled_from(["1", "1:1", "1:2"]),
    "--nproc-per-node": st.sampled_from(["1", "2", "cpu", "auto"]),
    "--rdzv-backend": st.sampled_from(["static", "c10d"]),
    "--rdzv-endpoint": st.sampled_from(["localhost:29400", ""]),
    "--rdzv_id": st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1),
    "--rdzv-conf": st.sampled_from(["timeout=5", "'join_timeout=5,last_call_timeout=1'"]),
    "--max-restarts": st.sampled_from(["0", "3"]),
    "--monitor-interval": st.sampled_from(["1", "0.1"]),
    "--start-method": st.sampled_from(["spawn", "fork", "forkserver"]),
    "--role": st.sampled_from(["default", "trainer"]),
    "--log-dir": st.just("logs"),
    "-r": st.sampled_from(["0", "3", "0:1,1:2"]),
    "--tee": st.sampled_from(["0", "3", "1:3"]),
    "--local-ranks-filter": st.sampled_from(["0", "0,1"]),
    "--master-addr": st.sampled_from(["localhost", "127.0.0.1"]),
    "--master_port": st.sampled_from(["29500", "29401"]),
    "--logs-specs": st.just("default"),
    "--numa-binding": st.sampled_from(["node", "socket"]),
    "--signals-to-handle": st.just("SIGTERM,SIGUSR1"),
    "--shutdown-timeout": st.just("30"),
}
SWITCHES = ["--standalone", "--no-python", "--run-path", "--virtual-local-rank"]


@st.composite
def torchrun_argv(draw: st.DrawFn) -> list[str]:
    out: list[str] = []
    for flag in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=6, unique=True)):
        out += [flag, draw(GOOD[flag])] if draw(st.booleans()) else [f"{flag}={draw(GOOD[flag])}"]
    out += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    if "--standalone" in out and any(w.startswith("--nnodes") for w in out):
        out = [w for w in out if w != "--standalone"]  # with 2 nodes: refused, see docs/cli.md
    return [*out, "p.py", *draw(st.lists(st.sampled_from(["--lr", "1", "-m", "--on"]), max_size=3))]


@settings(max_examples=60, deadline=None)
@given(argv=torchrun_argv())
def test_an_argv_torchrun_takes_is_a_spec(argv: list[str]) -> None:
    """Whatever torchrun flags, with values it takes: --print-spec prints a spec, exit 0."""
    code, err = _print_spec(argv)
    assert code == 0, (argv, err)


WORDS = st.one_of(
    st.sampled_from(
        [
            *GOOD,
            *SWITCHES,
            "-m",
            "--",
            "p.py",
            "job.yaml",
            "-n",
            "-o",
            "--on",
            "--sweep",
            "=",
            "--nnodes=",
            "x",
            "-1",
            "2:1",
            "gpu",
        ]
    ),  # fmt: skip
    st.text(max_size=12),
)


@settings(max_examples=150, deadline=None)
@given(argv=st.lists(WORDS, max_size=8))
def test_any_argv_is_a_spec_or_a_named_error(argv: list[str]) -> None:
    """Any words at all: a spec printed (0), or a named error with exit 2; no traceback."""
    code, err = _print_spec(argv)
    assert code in (0, 2) and "Traceback" not in err, (argv, code, err)
    if code == 2:
        assert "treb" in err, (argv, err)


def _print_spec(argv: list[str]) -> tuple[int, str]:
    """`treb run --print-spec --no-check ARGV` in a folder holding p.py: (exit code, stderr)."""
    import contextlib
    import io
    import tempfile

    with tempfile.TemporaryDirectory() as d, _chdir(d), _no_pet():
        Path(d, "p.py").write_text("")
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = _run(["run", "--print-spec", "--no-check", *argv])
        return code, err.getvalue()


def _run(words: list[str]) -> int:
    try:
        return treb_main(words)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2


class _chdir:  # noqa: N801 (a context manager, as contextlib.chdir of Python 3.11)
    def __init__(self, path: str) -> None:
        self.path, self.old = path, os.getcwd()

    def __enter__(self) -> None:
        os.chdir(self.path)

    def __exit__(self, *exc: object) -> None:
        os.chdir(self.old)


class _no_pet:  # noqa: N801
    """No PET_* from the shell, and the variables flag_overrides sets for the view undone."""

    def __enter__(self) -> None:
        self.saved = dict(os.environ)
        for name in [n for n in os.environ if n.startswith("PET_")]:
            del os.environ[name]

    def __exit__(self, *exc: object) -> None:
        os.environ.clear()
        os.environ.update(self.saved)


class _Out:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes, /) -> int:
        self.data += data
        return len(data)

    def flush(self) -> None:
        pass


def test_terminal_shows_the_ranks_filtered_with_torchruns_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--local-ranks-filter 1 and TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (view/live.py)."""
    from trebuchet.view.live import View

    monkeypatch.setenv(
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${rank}/${local_rank}]: "
    )
    monkeypatch.setenv("TREB_LOCAL_RANKS_FILTER", "1")
    monkeypatch.setenv("TREB_ROLE_NAME", "trainer")
    for rank in (2, 3):
        (tmp_path / f"rank-{rank}.log").write_text(f"line of {rank}\n")
    out, err = _Out(), _Out()
    view = View(out=out, err=err)
    view.add("1:0", tmp_path / "rank-2.log")
    view.add("1:1", tmp_path / "rank-3.log")
    view.close()
    assert out.data == b"[trainer3/1]: line of 3\n"


def test_m_with_a_spec_names_the_sweep_flag(here: Path, capsys: pytest.CaptureFixture) -> None:
    """`treb run job.yaml -m` was a sweep: now -m is torchrun's --module, which a spec has
    no use for, so it is refused with the sweep's spelling rather than run once silently."""
    (here / "job.yaml").write_text("command: echo hi\n")
    assert _run(["run", "job.yaml", "-m", "-o", "env.A=1,2"]) == 2
    assert "a sweep is --sweep (or --multirun)" in capsys.readouterr().err

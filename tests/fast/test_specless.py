"""`treb run`'s rule for what is a spec and what is a command (cli/specless.py), and the
node agent's line for a launcher missing on a node (runtime/process/unstarted.py) as the diagnosis
reads it. The launches themselves: tests/integration/test_specless.py."""

from __future__ import annotations

import argparse
import errno
from pathlib import Path

import pytest

from trebuchet.cli import specless
from trebuchet.cli.main import build_parser
from trebuchet.diagnose import catalog
from trebuchet.errors import UserError
from trebuchet.runtime.process import unstarted


def split(*words: str) -> tuple[list[str], list[str] | None]:
    parser = specless.verb_parser(build_parser("run"), "run")
    return specless.split(parser, ["run", *words])


def test_the_rule() -> None:
    # after --: the command, as typed
    assert split("-n", "2", "--", "python", "-m", "pkg") == (
        ["run", "-n", "2"], ["python", "-m", "pkg"])  # fmt: skip
    # a .py word: it and everything after, treb's own option names included
    assert split("--nproc_per_node=2", "train.py", "--on", "x", "--name", "y") == (
        ["run", "--nproc_per_node=2"], ["train.py", "--on", "x", "--name", "y"])  # fmt: skip
    assert split("-n2", "--on", "slurm", "t.PY") == (["run", "-n2", "--on", "slurm"], ["t.PY"])
    # otherwise a spec, with treb's options after it, as before
    assert split("job.yaml", "--on", "slurm", "-n", "4") == (
        ["run", "job.yaml", "--on", "slurm", "-n", "4"], None)  # fmt: skip
    assert split("job", "-d") == (["run", "job", "-d"], None)
    # an option's value is never the command: -o's, --name's
    assert split("-o", "a.py=1", "--name", "x.py", "t.py") == (
        ["run", "-o", "a.py=1", "--name", "x.py"], ["t.py"])  # fmt: skip
    # a unique prefix is the option, as argparse has it
    assert split("--det", "t.py") == (["run", "--det"], ["t.py"])


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["job.yaml", "--", "ls"], "job.yaml and a command after --"),
        (["job.yaml", "t.py"], "not both"),
        (["--"], "nothing after --"),
        ([], "give a spec"),
        (["--rdzv_endpointx", "1", "t.py"], "not an option of treb run"),
    ],
)
def test_refusals_exit_2(words: list[str], says: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        split(*words)
    assert exc.value.code == 2 and says in capsys.readouterr().err


def _args(*command: str, no_python: bool = False) -> argparse.Namespace:
    return argparse.Namespace(command=list(command), no_python=no_python)


def test_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "My Train.py").write_text("")
    assert specless.build(_args("My Train.py", "--lr", "1")) == {
        "name": "my-train",
        "command": ["python", "My Train.py", "--lr", "1"],
        "snapshot": False,
    }  # snapshot: false: in place, as torchrun (launcher/outputs.in_place)
    assert specless.build(_args("My Train.py", no_python=True))["command"] == ["My Train.py"]
    assert specless.build(_args("python3", "-m", "pkg.trainer"))["name"] == "trainer"
    assert specless.build(_args("/bin/echo", "hi")) == {
        "name": "echo", "command": ["/bin/echo", "hi"], "snapshot": False}  # fmt: skip
    with pytest.raises(UserError, match="gone.py: no such file in"):
        specless.build(_args("python", "gone.py"))
    # --no-python runs any program as it is, as torchrun does
    assert specless.build(_args("echo", "x", no_python=True))["command"] == ["echo", "x"]


def test_a_module_runs_in_place_as_a_script_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`treb run -m pkg.trainer` (torchrun's --module): python -m runs from the folder it was
    typed in, as `treb run train.py` does (torchrun runs both there); it kept the spec's
    default snapshot, so its ranks ran in `<run dir>/code` and wrote their files there."""
    from trebuchet.cli.torchrun_flags import Translated

    monkeypatch.chdir(tmp_path)
    args = argparse.Namespace(command=["pkg.trainer", "--lr", "1"],
                              torchrun=Translated(mode="module"))  # fmt: skip
    built = specless.build(args)
    assert built["command"] == ["python", "-m", "pkg.trainer", "--lr", "1"]
    assert built["snapshot"] is False, built
    args.on = "ssh"  # where the code travels, the snapshot stays (launcher/outputs.in_place)
    assert "snapshot" not in specless.build(args)


def test_flags_are_overrides() -> None:
    parser = specless.verb_parser(build_parser("run"), "run")
    ns = parser.parse_args(["run", "--standalone", "-n", "4", "--max-restarts", "2",
                            "--master-port", "29500"])  # fmt: skip
    assert specless.flag_overrides(ns) == [
        "nodes=1", "procs_per_node=4", "retries=2", "master_port=29500"]  # fmt: skip
    ns.nnodes = "2"
    with pytest.raises(UserError, match="--standalone is one node"):
        specless.flag_overrides(ns)


def test_missing_launcher_line_is_named_by_the_catalog() -> None:
    text = unstarted.line("torchrun", FileNotFoundError(errno.ENOENT, "x"), "/usr/bin", 3)
    assert text.startswith("treb: torchrun not found on ") and "(node 3)" in text
    assert text.endswith("not on its PATH, which was /usr/bin\n")
    rule = catalog.match(text.strip())
    assert rule is not None and rule.category == "launcher_missing"
    other = unstarted.line("mytool", FileNotFoundError(errno.ENOENT, "No such file"), None, 0)
    assert other == "treb: cannot start 'mytool': No such file\n"
    assert catalog.match(other.strip()).category == "bad_command"  # type: ignore[union-attr]
    for shell in ("bash: line 1: mpirun: command not found", "sh: 1: horovodrun: not found"):
        assert catalog.match(shell).category == "launcher_missing"  # type: ignore[union-attr]


def test_every_run_option_takes_no_value_or_one() -> None:
    """split() knows an option's value as the next word: an option taking several (or an
    optional one) would make the rule ambiguous, so none may."""
    parser = specless.verb_parser(build_parser("run"), "run")
    assert {a.nargs for a in parser._actions if a.option_strings} <= {0, None}


def test_printed_spec_loads_back_with_only_the_fields_given() -> None:
    import yaml

    data = {"name": "x", "command": ["python", "-c", "import os\nprint(1)"], "nodes": "2",
            "env": {"A": "${HOME}", "B": "1"}}  # fmt: skip
    validated = {**data, "nodes": 2, "env": {"A": "/root", "B": "1"}, "retries": 0}
    text = specless.spec_yaml(data, validated, ["run", "--print-spec", "--", "x\ny"])
    head = [ln for ln in text.splitlines() if ln.startswith("#")]
    assert len(head) == 3 and "x\\ny" in head[0]  # a newline typed stays in its comment
    assert yaml.safe_load(text) == {
        "name": "x", "command": ["python", "-c", "import os\nprint(1)"], "nodes": 2,
        "env": {"A": "${HOME}", "B": "1"}}  # fmt: skip

"""`treb` entry point: parse arguments, import only the verb asked for, map errors to exits."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

VERBS = {
    "run": "launch a spec (attached: streams logs, Ctrl+C cancels)",
    "rerun": "start an earlier run again: its resolved spec, its overrides, its code",
    "ps": "list runs",
    "status": "one run: state, attempts, per-rank exit codes, first failure",
    "logs": "print or follow a run's logs",
    "cancel": "stop a run",
    "rm": "remove runs: their directories (code copy, checkpoints, logs) and records",
    "prune": "remove the ended runs older than an age",
    "render": "show exactly what would be launched",
    "schema": "print the spec's JSON Schema",
    "diagnose": "root cause of a failed run, or of logs from elsewhere",
    "stacks": "the Python stacks of every rank of a running run (py-spy), grouped",
    "results": "performance results of runs (table, madengine perf.csv)",
    "metrics": "a run's metrics from its logs: last values and a small plot (--json, --csv)",
    "goodput": "where runs' wall time went (training kept, restarts, redone work, hangs...) "
    "and their effective training time ratio",
    "nodes": "each node's history across runs (lost, unhealthy, hardware errors, straggler), "
    "its score, and whether new runs avoid it; --clear HOST forgets it",
    "top": "active runs, live: state, ranks, attempt, latest metrics and their rate",
    "build": "build or refresh the spec's environment now",
    "import": "a spec from an sbatch script, AI Runtime YAML, madengine card or NeMo config",
    "check": "preflight checks: mistakes a queue wait would reveal, found now; --nodes N: "
    "the nodes' health checks, run on N nodes now",
    "fault": "inject a fault into a running run: kill-node NODE, hang-rank RANK, preempt",
    "doctor": "check TREB_HOME and the run index; --rebuild-index rebuilds it from the runs",
    "completion": 'a shell completion script: eval "$(treb completion bash)"',
    "ui": "the web dashboard (pip install 'trebuchet[ui]'), on 127.0.0.1 with a token",
}


class _Help(argparse.HelpFormatter):
    """Fills `{engines}` in a flag's help with the registered engines' names, only when help
    is printed (the registry reads installed packages' entry points: parsing never pays)."""

    def _expand_help(self, action: argparse.Action) -> str:
        text = super()._expand_help(action)
        if "{engines}" in text:
            from trebuchet.backends import names

            text = text.replace("{engines}", " | ".join(names()))
        return text


def _add_spec_args(p: argparse.ArgumentParser, optional: bool = False, run: bool = False,
                   maybe: bool = False) -> None:  # fmt: skip
    if maybe:  # `treb check --nodes N`: the spec's health_check and GPUs when given
        p.add_argument("spec", nargs="?", metavar="SPEC", help="workload spec (YAML)")
    elif optional:  # `treb run`: a command instead (cli/specless.py)
        p.add_argument("spec", nargs="?", metavar="SPEC | SCRIPT.py ARG... | -- COMMAND",
                       help="workload spec (YAML), or a command to run without one")  # fmt: skip
    elif run:  # `treb render`: also a run's recorded spec
        p.add_argument("spec", metavar="SPEC | RUN",
                       help="workload spec (YAML), or a run: its recorded spec")  # fmt: skip
    else:
        p.add_argument("spec", metavar="SPEC", help="workload spec (YAML)")
    p.add_argument(
        "-o",
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a field, e.g. -o nodes=2 -o env.LR=0.1 (repeatable); the value is "
        "taken as typed, commas included, unless --sweep",
    )
    p.add_argument(
        "--on", default="local", metavar="BACKEND", help="engine: {engines} (default: local)"
    )


SWEEP_HELP = (
    "sweeps: `--sweep -o env.LR=1e-3,3e-4 -o env.BS=32,64` starts one run per combination "
    "(4 runs, one sweep id; Hydra's --multirun); a `sweep:` block in the spec sweeps without "
    "--sweep. Without --sweep a comma is part of the value (-o env.NCCL_IB_HCA=mlx5_0,mlx5_1 "
    "is one run); with it, write \\, for a literal comma."
)


def _add_sweep_flag(p: argparse.ArgumentParser, short: bool = True) -> None:
    """--sweep (-m, --multirun): a comma in an -o value separates sweep values. `treb run`
    has no -m: there it is torchrun's --module (cli/torchrun_flags.py)."""
    p.add_argument(
        "--sweep", *(["-m"] if short else []), "--multirun", dest="sweep", action="store_true",
        help="a comma in an -o value separates sweep values: one run per combination",
    )  # fmt: skip


def _count(text: str) -> int:
    """A number >= 0 (--tail, --rank, --node, --attempt): -5 is a mistake, not "all"."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """What `treb run` and `treb rerun` share."""
    p.add_argument(
        "--detach", "-d", action="store_true", help="return at once; follow with treb logs -f"
    )
    p.add_argument("--name", help="run name (default: the spec's name)")
    p.add_argument(
        "--no-check", action="store_true", help="skip the preflight checks (see treb check)"
    )
    p.add_argument(
        "--resume-from", metavar="RUN",
        help="start with a copy of that earlier run's checkpoints in TREB_CHECKPOINT_DIR",
    )  # fmt: skip
    _add_after_flag(p)


def _add_after_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--after", action="append", default=[], metavar="RUN[:ok|:any]",
        help="wait for these runs (repeat it, or a comma list): start once each succeeded "
        "(:ok, the default) or ended (:any), else end CANCELLED; returns at once (detached)",
    )  # fmt: skip


def _add_latest_run(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "run", nargs="?", metavar="RUN", help="run id or unique prefix (default: latest)"
    )


class _Skipped:
    """The parser of a verb that is not being parsed: every call on it is ignored."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """treb's parser; `only`: with that verb's arguments alone (the others' parsers cost
    ~10 ms to build, a tenth of a local launch)."""
    parser = argparse.ArgumentParser(
        prog="treb",
        description="trebuchet: one YAML file, any engine, for distributed training.",
        formatter_class=_Help,
    )
    parser.add_argument("--version", action="store_true", help="print the version")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    def add(verb: str) -> Any:
        if only not in (None, verb):
            return _Skipped()
        return sub.add_parser(verb, help=VERBS[verb], formatter_class=_Help)

    p = add("run")
    _add_spec_args(p, optional=True)
    _add_sweep_flag(p, short=False)
    _add_run_flags(p)
    if only in (None, "run"):
        from trebuchet.cli import specless

        specless.add_flags(p)
    p.epilog = SWEEP_HELP
    p = add("rerun")
    p.add_argument("run", metavar="RUN", help="run id, unique prefix or name")
    p.add_argument(
        "-o", "--override", action="append", default=[], metavar="KEY=VALUE",
        help="change a field on top of the earlier run's (repeatable)",
    )  # fmt: skip
    _add_sweep_flag(p)
    p.add_argument("--on", metavar="BACKEND", help="engine: {engines} (default: the earlier run's)")
    _add_run_flags(p)
    p.add_argument(
        "--current-code", action="store_true",
        help="snapshot the spec's workdir now instead of reusing the earlier run's code",
    )  # fmt: skip
    p = add("ps")
    p.add_argument("name_arg", nargs="?", metavar="NAME", help="only runs of this name (as --name)")
    p.add_argument("--all", "-a", action="store_true", help="every run, not only recent ones")
    p.add_argument(
        "--state", action="append", default=[], metavar="STATE",
        help="only runs in these states: FAILED,TIMEOUT, active, ended (repeatable)",
    )  # fmt: skip
    p.add_argument("--name", metavar="NAME", help="only runs of this name (a glob: 'digits*')")
    p.add_argument("--backend", metavar="BACKEND", help="only runs on this engine")
    p.add_argument(
        "--since", metavar="WHEN",
        help="only runs started since: an age (2h, 3d) or an ISO date (2024-05-01)",
    )  # fmt: skip
    p.add_argument("--sweep", metavar="SWEEP", help="only the runs of this sweep (id or prefix)")
    p.add_argument("--quiet", "-q", action="store_true", help="only run ids, one a line")
    p.add_argument("--no-refresh", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("stacks")
    _add_latest_run(p)
    p.add_argument("--wait", type=float, default=60.0, metavar="S",
                   help="how long to wait for every rank's stack (default 60)")  # fmt: skip
    p = add("status")
    p.add_argument(
        "run", nargs="?", metavar="RUN | SWEEP",
        help="run id, unique prefix or name (its latest run), or a sweep id: its points side "
        "by side (default: the latest run)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("logs")
    _add_latest_run(p)
    p.add_argument("--rank", type=_count, help="only this global rank")
    p.add_argument("--node", type=_count, help="only this node")
    p.add_argument(
        "--attempt",
        type=_count,
        help="attempt number, from 1 as `treb status` lists them (default: the latest)",
    )
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    p.add_argument("--tail", type=_count, metavar="N", help="only the last N lines of each log")
    p.add_argument(
        "--dedup",
        action="store_true",
        help="a line several ranks print at about the same time, once with its ranks ([0-7])",
    )
    p = add("cancel")
    p.add_argument(
        "run", metavar="RUN | SWEEP",
        help="run id, unique prefix or name (its latest run), or a sweep id: all its points",
    )  # fmt: skip
    p = add("rm")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run ids, prefixes, names or sweep ids")
    p.add_argument("--force", "-f", action="store_true", help="cancel active runs, then remove")
    p = add("prune")
    p.add_argument(
        "--older-than", required=True, metavar="AGE",
        help="ended more than AGE ago (30d, 12h) or before an ISO date",
    )  # fmt: skip
    p.add_argument(
        "--state", action="append", default=[], metavar="STATE",
        help="only runs in these states (default: every ended state; repeatable)",
    )  # fmt: skip
    p.add_argument("--dry-run", "-n", action="store_true", help="list what would go, remove none")
    p = add("render")
    _add_spec_args(p, run=True)
    _add_sweep_flag(p)
    _add_after_flag(p)
    p.epilog = SWEEP_HELP
    add("schema")
    p = add("import")
    p.add_argument("kind", choices=["sbatch", "air", "madengine", "nemo", "determined"],
                   metavar="KIND", help="sbatch | air | madengine | nemo | determined")  # fmt: skip
    p.add_argument("file", metavar="FILE", help="the file to import")
    p.add_argument("--tags", action="append", default=[], metavar="TAG",
                   help="madengine: the card whose name or tags match (repeatable)")  # fmt: skip
    p.add_argument("--recipe", metavar="TARGET", help="nemo: the recipe class to run")
    p = add("build")
    _add_spec_args(p)
    p.add_argument("--json", action="store_true", help="print the manifest as JSON")
    p = add("check")
    _add_spec_args(p, maybe=True)
    p.add_argument("--json", action="store_true", help="machine-readable findings")
    p.add_argument("--nodes", type=_count, metavar="N",
                   help="run the nodes' health checks (docs/recovery.md) on N nodes of "
                   "the engine now, each node's result printed (the spec is optional)",
                   )  # fmt: skip
    p = add("fault")
    p.add_argument("run", metavar="RUN", help="a running run's id or unique prefix")
    p.add_argument("action", choices=["kill-node", "hang-rank", "preempt"],
                   metavar="kill-node NODE | hang-rank RANK | preempt",
                   help="kill-node: SIGKILL to every process of the run on NODE (a name or "
                   "index); hang-rank: SIGSTOP to RANK; preempt: Slurm requeues the job, "
                   "elsewhere every rank gets SIGTERM from outside")  # fmt: skip
    p.add_argument("target", nargs="?", metavar="NODE|RANK", help=argparse.SUPPRESS)
    p = add("diagnose")
    p.add_argument(
        "targets",
        nargs="*",
        metavar="RUN | LOG",
        help="a run id or prefix (default: latest), or log files / a log directory",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = add("results")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids or prefixes (default: recent)")
    p.add_argument("--csv", metavar="FILE", help="write madengine perf.csv-compatible rows")
    p.add_argument("--all", "-a", action="store_true", help="every run, not only recent ones")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--metric", "-m", action="append", metavar="NAME",
                   help="also each run's last value of this metric (repeatable)")  # fmt: skip
    p = add("doctor")
    p.add_argument("--rebuild-index", action="store_true",
                   help="move runs.db aside (runs.db.damaged-<time> when damaged) and rebuild "
                   "it from the run directories")  # fmt: skip
    p = add("completion")
    p.add_argument(
        "shell", choices=["bash", "zsh", "fish"], metavar="SHELL", help="bash | zsh | fish"
    )
    p = add("ui")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_count, default=8765, help="port (default 8765; 0: any free)")
    p = add("metrics")
    _add_latest_run(p)
    p.add_argument("names", nargs="*", metavar="NAME", help="only these metrics")
    p.add_argument("--rank", type=int, metavar="R", help="this rank's (default: the lowest read)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="every stored point, as JSON")
    fmt.add_argument("--csv", action="store_true", help="every stored point, as CSV on stdout")
    p = add("goodput")
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids or prefixes (default: latest)")
    p.add_argument(
        "--since", metavar="AGE", help="every run created since then (7d, 12h, or an ISO date)"
    )
    p.add_argument(
        "--by",
        choices=["cause", "node", "run"],
        default="run",
        help="a row per run (default), per cause over all, or per node",
    )
    p.add_argument("--json", action="store_true", help="machine-readable, per run and total")
    p = add("nodes")
    p.add_argument("--json", action="store_true", help="machine-readable: one object per node")
    p.add_argument(
        "--clear",
        action="append",
        default=[],
        metavar="HOST",
        help="forget HOST's history up to now (repeatable): new runs use it again",
    )
    p.add_argument("--clear-all", action="store_true", help="forget every node's history")
    p = add("top")
    p.add_argument("--interval", "-n", type=float, default=2.0, metavar="S",
                   help="seconds between refreshes (default 2)")  # fmt: skip
    p.add_argument("--once", action="store_true", help="print one plain snapshot and exit")
    p.add_argument("--all", "-a", action="store_true", help="also runs that ended recently")
    return parser


def state_error(exc: BaseException):  # -> TrebError | None
    """A failure of TREB_HOME itself (an SQLite error about runs.db, a full or read-only
    disk) as a named error; None for anything else (a bug keeps its traceback)."""
    import errno

    sqlite3 = sys.modules.get("sqlite3")
    if sqlite3 is not None and isinstance(exc, sqlite3.Error):
        from trebuchet.store.db import explain

        return explain(exc)
    if isinstance(exc, OSError) and exc.errno in (
        errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM
    ):  # fmt: skip
        from trebuchet.errors import StateError

        where = f"{exc.filename}: " if exc.filename else ""
        return StateError(f"{where}{exc.strerror}")
    return None


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a lone surrogate (argv, a store) never raises
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    words = sys.argv[1:] if argv is None else argv
    if words and not words[0].startswith("-") and words[0] not in VERBS:
        _say(unknown_verb(words[0]))
        return 2
    parser = build_parser(words[0] if words and words[0] in VERBS else None)
    if words[:1] == ["run"]:  # a command instead of a spec: cli/specless.py
        from trebuchet.cli import specless

        head, command = specless.split(specless.verb_parser(parser, "run"), list(words))
        args = parser.parse_args(head)
        args.command, args.typed = command, list(words)
    else:
        args = parser.parse_args(argv)
    if args.version:
        from importlib.metadata import version

        print(f"treb {version('trebuchet')}")
        return 0
    if not args.verb:
        parser.print_help()
        return 2
    from trebuchet.errors import SpecError, TrebError

    try:
        module = importlib.import_module(f"trebuchet.cli.{args.verb}_cmd")
        return int(module.main(args) or 0)
    except SpecError as exc:
        for problem in exc.problems:
            _say(problem)
        return exc.exit_code
    except TrebError as exc:
        _say(exc)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        err = state_error(exc)
        if err is None:
            raise
        _say(err)
        return err.exit_code


def unknown_verb(word: str) -> str:
    """A word where a verb belongs: the closest verb, not argparse's list of every verb."""
    import difflib

    if word.endswith((".yaml", ".yml", ".py")):  # a spec or a script: `treb run` was meant
        return f"unknown verb {word!r}; did you mean `treb run {word}`?"
    close = difflib.get_close_matches(word, VERBS, n=1, cutoff=0.6)
    if close:
        return f"unknown verb {word!r}; did you mean {close[0]!r}?"
    return f"unknown verb {word!r}; `treb --help` lists the verbs"


def _say(error: object) -> None:
    """An error on stderr, each of its lines shown as text: it may quote a file name, an
    argument or a line that a user or a program wrote (ESC, OSC, lone surrogates)."""
    from trebuchet.runtime.watch.display_lines import shown

    text = "\n".join(shown(line, tab=True) for line in str(error).split("\n"))
    print(f"treb: {text}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

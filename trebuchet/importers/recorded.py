"""The workload of an imported batch script, from what bash ran in the import sandbox.

The oracle (importers/oracle.py) recorded every srun, launcher and interpreter call with
its argv as executed, environment and directory. Here the last top-level srun becomes the
workload: its task's torchrun worker (launcher torchrun) or its program (launcher native,
or none when one task per node starts its own launcher), the environment the ranks would
see beyond Slurm's own, the working directory, container flags. Earlier calls become
`slurm.setup` lines; everything else recorded is named in a note with its line.
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import shlex
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.importers.common import (
    Fragments,
    ImportResult,
    bash_syntax,
    credential_kind,
    credential_spans,
    env_or_secret,
    is_secret,
)
from trebuchet.importers.oracle import ADDR, HOST, JOB_ID, PYTHONS, Call, Recording
from trebuchet.importers.statement import ASSIGNMENT, Simple, command_word
from trebuchet.importers.statement import split as split_simple
from trebuchet.runtime.contracts.rank_env import NODE_NAMES, RANK_NAMES
from trebuchet.spec.duration import parse_duration

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TORCHRUN_MODULES = ("torch.distributed.run", "torch.distributed.launch")
SELF_LAUNCHING = ("accelerate", "deepspeed", "mpirun", "mpiexec", "horovodrun")
SETUP_KINDS = ("module", "ml", "spack", "conda", "mamba", "micromamba", "source")
SILENT_IN_SUBST = ("scontrol", "hostname")  # simulated: they answer for the allocation
IGNORED_ENV = {"PWD", "OLDPWD", "SHLVL", "_", "BASH_ENV", "TMPDIR", "CUDA_VISIBLE_DEVICES"}
LAUNCHER_ENV = {*RANK_NAMES, *NODE_NAMES, "MASTER_ADDR"}
TORCHRUN_VALUE = {
    "nnodes", "node-rank", "nproc-per-node", "master-addr", "master-port", "rdzv-backend",
    "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts", "monitor-interval", "start-method",
    "role", "log-dir", "redirects", "tee", "local-addr", "local-ranks-filter", "logs-specs",
    "rdzv-timeout", "event-log-handler", "numa-binding", "signals-to-handle",
}  # fmt: skip
TORCHRUN_SHORT = {"r": "redirects", "t": "tee", "m": "module"}
TORCHRUN_SET_BY_TREB = {
    "nnodes", "node-rank", "master-addr", "rdzv-endpoint", "rdzv-backend", "rdzv-id", "rdzv-conf",
    "standalone",
}  # fmt: skip


@dataclass
class Workload:
    """What build() found: the spec is filled in place; this is what the round trip checks."""

    launcher: str
    argv: list[str]  # what each rank (or node, launcher none) runs, as recorded
    command_words: str  # the same as a shell string, without cd/setup prefixes
    env: dict[str, str]  # marker values to give the check (secrets, MASTER_ADDR)
    line: int | None
    ppn: int | None = None
    srun_opts: dict[str, str | None] = field(default_factory=dict)
    shell_body: bool = False  # the command is the body of the task's `bash -c BODY`


class Words:
    """Renders recorded argv back to shell words: literals quoted, secret markers and the
    simulated first node's address turned into live references."""

    def __init__(self, rec: Recording, secret_values: dict[str, str], text: str = "") -> None:
        self.live: dict[str, str] = {m: "${" + n + "}" for m, n in rec.markers.items()}
        for value, name in secret_values.items():
            self.live[value] = "${" + name + "}"
        # HOST and JOB_ID are drawn for each import and absent from the script: only what
        # came from the simulated allocation holds them. The address is fixed: a script
        # that writes it keeps it as written.
        self.live[HOST.format(0)] = "${MASTER_ADDR}"
        if ADDR.format(1) not in text:  # drawn from 65,536: a script may hold it by chance
            self.live[ADDR.format(1)] = "${MASTER_ADDR}"
        self.live[JOB_ID] = "${SLURM_JOB_ID}"
        self.used: set[str] = set()
        ends = {HOST.format(0), ADDR.format(1)}  # not node 10's name or address
        self.pattern = re.compile(
            "|".join(
                re.escape(k) + ("(?![0-9])" if k in ends else "")
                for k in sorted(self.live, key=len, reverse=True)
            )
        )

    def word(self, arg: str) -> str:
        out, at = [], 0
        for m in self.pattern.finditer(arg):
            if m.start() > at:
                out.append(shlex.quote(arg[at : m.start()]))
            out.append('"' + self.live[m.group(0)] + '"')
            self.used.add(self.live[m.group(0)][2:-1])
            at = m.end()
        if at < len(arg) or not out:
            out.append(shlex.quote(arg[at:]))
        return "".join(out)

    def join(self, argv: list[str]) -> str:
        return " ".join(self.word(a) for a in argv)


def _base(arg: str) -> str:
    return arg.rsplit("/", 1)[-1]


def is_torchrun(c: Call) -> bool:
    return c.tool == "torchrun" or (
        c.tool in PYTHONS
        and len(c.argv) > 2
        and c.argv[1] == "-m"
        and c.argv[2] in TORCHRUN_MODULES
    )


SrunParser = Callable[[list[str], "int | None"], "tuple[dict[str, str | None], list[str]]"]


def build(
    rec: Recording, res: ImportResult, path: Path, text: str, parse_srun: SrunParser
) -> Workload | None:
    """Fill res.spec (command, env, workdir, setup, container) from the recording; the
    workload for the round trip, or None when the script has no srun (launcher none)."""
    lines = text.splitlines()
    top = rec.top()
    sruns = [c for c in top if c.tool == "srun" and not c.in_subst]
    _stderr_notes(rec, res, path)
    for line, why in rec.notes:
        res.note(line, why)
    if not sruns:
        return None
    main = sruns[-1]
    if rec.status != 0:
        res.note(
            None,
            f"the script exited with status {rec.status} in the import sandbox "
            "(after the main srun was recorded)",
        )
    secrets = _Withheld(rec)
    secret_values = secrets.values
    words = Words(rec, secret_values, text)
    opts, program = parse_srun(main.argv[1:], main.line)
    if not program:
        raise UserError(
            f"{path}:{main.line}: srun without a command (the srun line expands to none)"
        )
    setup: list[str] = []
    for c in top:
        if c is main or c.in_subst:
            if c.in_subst and c.tool not in SILENT_IN_SUBST and c.tool != "srun":
                res.drop(
                    c.line,
                    _short(c.argv, words=words),
                    "ran inside $(...): recorded in the import sandbox, not run, so the value "
                    "it would print is missing from what follows",
                )
            continue
        if c.id > main.id:
            res.drop(c.line, _short(c.argv, words=words), "after the main srun")
            continue
        setup.append(words.join(c.argv))
        redirects = _redirects(lines, c)
        if redirects:
            res.drop(
                c.line,
                redirects[:120],
                f"the redirection of {c.tool}: slurm.setup keeps the command without it",
            )
        if c.tool not in SETUP_KINDS:
            res.note(
                c.line,
                "kept in slurm.setup (runs in the batch script before the main srun): "
                + _short(c.argv, words=words),
            )
        elif c.tool == "source":
            res.note(
                c.line,
                f"{_short(c.argv, words=words)}: not a file on this machine; kept in slurm.setup "
                "(what it sets was not seen by the import)",
            )
    if setup:
        res.spec.setdefault("slurm", {})["setup"] = setup
    _after_main(lines, main, rec, res)
    kids = [c for c in rec.children(main, 0) if c.tool not in SILENT_IN_SUBST]
    tr = next((c for c in kids if is_torchrun(c)), None)
    prefix: list[str] = []
    if tr is not None:
        wrapper = next((c for c in kids if c.id == tr.parent and c.tool == "uv"), None)
        for c in kids:
            if c is tr or c is wrapper:
                continue
            if c.id > tr.id:
                res.drop(c.line, _short(c.argv, words=words), "in the srun task after torchrun")
                continue
            prefix.append(words.join(c.argv))
            res.note(
                c.line,
                f"{_short(c.argv, words=words)}: ran in the srun task before torchrun; now "
                "runs before each rank (trebuchet starts torchrun itself)",
            )
        worker, ppn = _torchrun(tr, res, words)
        if not worker:
            raise UserError(f"{path}:{tr.line}: torchrun without a program")
        launcher, argv, at = "torchrun", worker, tr
        if wrapper is not None:
            argv = wrapper.argv[: len(wrapper.argv) - len(tr.argv)] + worker
        _per_rank(rec, main, tr, res, worker)
    else:
        argv, at, ppn = program, main, None
        launcher = "native"
        nested = [c for c in kids if c.tool in SELF_LAUNCHING]
        if nested:
            launcher = "none"
            res.note(
                main.line,
                f"the srun task starts {nested[0].tool} itself: launcher none (once per node)",
            )
    command = words.join(argv)
    body = (
        launcher != "torchrun"
        and len(argv) == 3
        and _base(argv[0]) in ("bash", "sh")
        and argv[1] == "-c"
        and not words.pattern.search(argv[2])
        and "TREB^PH" not in argv[2]  # a template's <PLACEHOLDER>s: not bash until filled in
    )
    if body:  # a string command runs as `bash -c '<string>'`: the body itself is the same
        command = argv[2].strip("\n")
    if not "".join(argv).strip() or not command.strip():
        raise UserError(f"{path}:{main.line}: the srun command expands to nothing")
    env = _carry_env(rec, at, res, lines, secrets)
    cwd = at.cwd
    if opts.get("container-workdir"):
        cwd = opts["container-workdir"] or cwd
    full = " && ".join([*prefix, command])
    if cwd and Path(cwd).is_dir():
        res.spec["workdir"] = str(Path(cwd).resolve())
    elif cwd:
        full = f"cd {shlex.quote(cwd)} && {full}"
        res.note(
            main.line,
            f"working directory {cwd} is not a directory on this machine: the command "
            "starts with cd instead of setting workdir",
        )
    res.spec["command"] = full
    for name in sorted(words.used):
        if name in rec.markers.values() and name not in secret_values.values():
            res.add_secret(name)
            res.note(
                main.line,
                f"${name}: a credential the script reads from the shell you submit from: "
                "secrets (given to the ranks at run time)",
            )
        elif name in secret_values.values() and name not in res.spec.get("secrets", []):
            value = next(v for v, n in secret_values.items() if n == name)
            res.add_secret(name, value)
            res.note(
                secrets.line.get(name, main.line),
                f"{secrets.what.get(name, name)}: withheld: {secrets.why[name]}; export "
                f"{name} in the shell you submit from (the command reads ${{{name}}})",
            )
        elif name == "SLURM_JOB_ID":
            res.note(
                main.line,
                "the command uses the Slurm job id: ${SLURM_JOB_ID} (set when the run is "
                "a Slurm job; empty elsewhere)",
            )
    check_env = {n: m for m, n in rec.markers.items()}
    check_env.update({n: v for v, n in secret_values.items()})
    check_env["MASTER_ADDR"] = HOST.format(0)
    check_env["SLURM_JOB_ID"] = JOB_ID
    for name in env:
        check_env.setdefault(name, env[name])
    if ADDR.format(1) in words.live:  # the check gives MASTER_ADDR the first node's name
        argv = [a.replace(ADDR.format(1), HOST.format(0)) for a in argv]
    return Workload(launcher, argv, command, check_env, main.line, ppn, opts, body)


def _after_main(lines: list[str], main: Call, rec: Recording, res: ImportResult) -> None:
    """What the main srun's statement holds beside the srun (a `timeout`, a redirection, a
    pipe, what runs after it) and the lines after it that recorded nothing (builtins such
    as echo or wait) are carried or named: the ranks never run them."""
    first = main.line or 1
    end = _statement_end(lines, main.line or len(lines))
    statement = "\n".join(lines[first - 1 : end])
    simples = split_simple(statement)
    srun = [i for i, s in enumerate(simples) if _tool_of(s) == "srun"]
    seen = {(c.line, c.tool) for c in rec.top()}
    seen_lines = {line for line, _ in seen}
    if srun:
        s = simples[srun[-1]]

        def line_of(x: Simple) -> int:
            return first + statement.count("\n", 0, x.at)

        _wrappers(command_word(s)[1], line_of(s), res)
        if s.redirects:
            res.drop(
                line_of(s),
                " ".join(s.redirects)[:120],
                "srun's output redirected: trebuchet keeps each rank's log in the run "
                "directory (treb logs); the redirection is not carried",
            )
        rest, op = simples[srun[-1] + 1 :], s.op
        while rest and op in ("|", "|&"):
            res.drop(
                line_of(rest[0]),
                "| " + rest[0].text[:100],
                "srun's output piped on: trebuchet keeps every rank's log in the run directory",
            )
            rest, op = rest[1:], rest[0].op
        for x in rest:
            if (line_of(x), _tool_of(x)) not in seen:  # a recorded one is named by its call
                res.drop(line_of(x), x.text[:120], "after the main srun")
    for no in range(end + 1, len(lines) + 1):
        text = lines[no - 1].strip()
        if text and not text.startswith("#") and no not in seen_lines:
            res.drop(no, text[:120], "after the main srun")


def _redirects(lines: list[str], c: Call) -> str:
    """The redirections written on the line (and its continuations) of a recorded call."""
    if not c.line or c.line > len(lines):
        return ""
    end = c.line
    while end < len(lines) and lines[end - 1].rstrip().endswith("\\"):
        end += 1
    found = [s for s in split_simple("\n".join(lines[c.line - 1 : end])) if _tool_of(s) == c.tool]
    return " ".join(found[0].redirects) if found else ""


def _tool_of(s: Simple) -> str:
    at = command_word(s)[0]
    return _base(s.words[at]) if at < len(s.words) else ""


def _wrappers(words: list[str], line: int, res: ImportResult) -> None:
    """`timeout N` before srun becomes the spec's timeout; other wrappers are named."""
    if not words:
        return
    if _base(words[0]) == "timeout" and re.fullmatch(r"[0-9]+(\.[0-9]+)?[smhd]?", words[-1]):
        value = words[-1]
        try:
            parse_duration(value)
        except ValueError:
            res.drop(line, " ".join(words) + " before srun", "no time limit: timeout 0")
            return
        res.spec["timeout"] = int(value) if value.isdigit() else value
        options = " ".join(words[1:-1])
        res.note(
            line,
            f"{' '.join(words)} before srun: the spec's timeout ({value} per attempt)"
            + (f"; its options {options} are not carried" if options else ""),
        )
        return
    if all(ASSIGNMENT.match(w) for w in words[1:]) and _base(words[0]) == "env":
        return  # env A=1 srun: A is in srun's recorded environment (env below)
    res.drop(line, " ".join(words)[:120] + " before srun", "the spec has no field for it")


def _statement_end(lines: list[str], start: int) -> int:
    """The last line of the statement that starts at `start`: a prefix of the script that
    bash can read whole (continuations, multi-line quotes, the rest of an if block). Found
    with a few runs of bash -n (doubling the step, then halving it), never one per line:
    each reads the whole prefix (1 MiB at most), and 400 of them took minutes."""
    last = min(len(lines), start + 400)

    def parses(end: int) -> int:
        """`end` (past its continuation lines) when lines[:end] is whole bash, else 0."""
        while end < last and lines[end - 1].rstrip().endswith("\\"):
            end += 1  # bash reads a continuation at the end of its input as complete
        return end if bash_syntax("\n".join(lines[:end]) + "\n") is None else 0

    got = parses(start)
    if got:
        return got
    bad, step = start, 1
    while True:  # a prefix that bash reads whole, doubling the step
        good = min(bad + step, last)
        got = parses(good)
        if got:
            break
        if good >= last:
            return len(lines)
        bad, step = good, step * 2
    while good - bad > 1:  # then the first one after `bad`, halving the step
        mid = (bad + good) // 2
        found = parses(mid)
        if found:
            good, got = mid, found
        else:
            bad = mid
    return got


def _short(argv: list[str], limit: int = 120, words: Words | None = None) -> str:
    text = words.join(argv) if words else shlex.join(argv)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _stderr_notes(rec: Recording, res: ImportResult, path: Path) -> None:
    """What bash said in the sandbox: each line is a note, with its line when bash gave one."""
    shown = 0
    for raw in rec.stderr.splitlines():
        if raw.startswith("+"):
            continue  # set -x tracing: the script's own echo of what it runs
        m = re.match(r"(.*?): line (\d+): (.*)", raw)
        if m and m.group(1).endswith(path.name):
            res.note(int(m.group(2)), f"bash in the import sandbox: {m.group(3)}")
        elif raw.strip():
            res.note(
                None, f"the script printed on stderr in the import sandbox: {raw.strip()[:200]}"
            )
        shown += 1
        if shown >= 20:
            res.note(None, "more stderr in the import sandbox not shown")
            break


class _Withheld:
    """What never reaches the spec (value -> the name the spec reads it from instead):
    values the script exported that are credentials by their name or look, or were made
    from a secret (a piece of its marker); then, in what bash gave any recorded command,
    what looks like a credential or holds a piece of a marker, under a name of its own."""

    def __init__(self, rec: Recording) -> None:
        self.values: dict[str, str] = {}
        self.why: dict[str, str] = {}  # name -> why it is withheld
        self.line: dict[str, int | None] = {}  # a name made here -> the line that used it
        self.what: dict[str, str] = {}  # a name made here -> what held the value
        self.pieces = Fragments(rec.markers)
        self.markers = rec.markers
        for c in rec.calls:
            for name, value in c.env.items():
                if name in self.why or rec.baseline.get(name) == value or value in rec.markers:
                    continue
                if name in IGNORED_ENV or name.startswith(("TREB_ORACLE_", "SLURM")):
                    continue
                why = self._suspect(value)
                if why is None and is_secret(name) and len(value) >= 4 and "$" not in value:
                    why = "a credential by its name"
                if why:
                    self.values.setdefault(value, name)
                    self.why[name] = why
        for name, secret in rec.derived.items():  # changed with the stand-ins (sbatch.py)
            self.why[name] = f"its value is made from a secret (${secret})"
            for c in rec.calls:
                value = c.env.get(name, "")
                if len(value) >= Fragments.K and value not in rec.markers:
                    self.values.setdefault(value, name)
        known = sorted([*self.values, *self.markers], key=len, reverse=True)
        for c in rec.calls:
            self._arguments(c, known)

    def _suspect(self, value: str) -> str | None:
        """Why `value` (a secret's marker taken out) cannot be written down, or None."""
        for marker in self.markers:
            value = value.replace(marker, "\0")
        pieces = self.pieces.spans(value)
        if pieces:
            return f"its value is made from a secret (${pieces[0][2]})"
        kind = credential_kind(value)
        return f"its value looks like a credential ({kind})" if kind else None

    def _arguments(self, c: Call, known: list[str]) -> None:
        """A call's arguments, read as one text (NUL between them: no span crosses one)."""
        rest = "\0".join(c.argv)
        starts = list(itertools.accumulate((len(a) + 1 for a in c.argv), initial=0))
        for value in known:
            rest = rest.replace(value, "\0" * len(value))  # the same length: offsets hold
        pieces = self.pieces.spans(rest)
        looks = [s for s in credential_spans(rest) if not any(
            s[0] < p[1] and p[0] < s[1] for p in pieces)]  # fmt: skip
        for start, end, origin in pieces + looks:
            value = rest[start:end]
            if value in self.values or "\0" in value:
                continue
            kind = origin if origin in self.markers.values() else None
            base = f"{origin}_PART" if kind else "IMPORTED_SECRET"
            name = f"{base}_{sum(n.startswith(base) for n in self.why) + 1}"
            i = bisect.bisect_right(starts, start) - 1
            self.values[value] = name
            self.line[name] = c.line
            self.what[name] = f"argument {i} of {c.tool}" if i else c.tool
            self.why[name] = (
                f"its value is made from a secret (${kind})"
                if kind
                else f"its value looks like a credential ({origin})"
            )


def _line_of(lines: list[str], name: str) -> int | None:
    pat = re.compile(
        r"(?:^|[\s;(])(?:export\s+|declare\s+-x\s+|local\s+)?" + re.escape(name) + r"\+?="
    )
    for no, line in enumerate(lines, 1):
        if pat.search(line):
            return no
    return None


def _carry_env(
    rec: Recording, at: Call, res: ImportResult, lines: list[str], secrets: _Withheld
) -> dict[str, str]:
    """The environment the ranks would see beyond the submitting shell's and Slurm's."""
    carried: dict[str, str] = {}
    for name in sorted(at.env):
        value = at.env[name]
        if (
            name in IGNORED_ENV
            or name.startswith(("TREB_ORACLE_", "SLURM_", "SLURMD_"))
            or rec.baseline.get(name) == value
        ):
            continue
        line = _line_of(lines, name) or at.line
        if name.startswith("TREB_"):
            res.drop(line, f"{name}={value}", "TREB_* names are trebuchet's own")
            continue
        if name in LAUNCHER_ENV:
            res.drop(line, f"{name}={value}", "trebuchet's launcher sets it for every rank")
            continue
        if name == "MASTER_PORT":
            if value.isdigit() and 1024 <= int(value) <= 65535:
                res.spec.setdefault("master_port", int(value))
                res.note(line, f"MASTER_PORT={value}: master_port")
            else:
                res.drop(line, f"MASTER_PORT={value}", "not a port number")
            continue
        if name in rec.derived:  # however short: it changed with a secret's stand-in
            res.add_secret(name, value if len(value) >= Fragments.K else None)
            res.note(
                line,
                f"{name}: withheld: {secrets.why[name]}; export it in the shell you submit from",
            )
            continue
        if value in secrets.values:  # (another variable may hold the same value)
            why = secrets.why.get(name) or secrets.why[secrets.values[value]]
            res.add_secret(name, value)
            res.note(line, f"{name}: withheld: {why}; export it in the shell you submit from")
            continue
        addr = ADDR.format("") in value and not any(ADDR.format("") in x for x in lines)
        if any(h in value for h in rec.hosts) or addr or JOB_ID in value:
            res.drop(
                line,
                f"{name}={value}",
                "computed from the simulated allocation (its node names or job id): "
                "trebuchet's launcher sets MASTER_ADDR and the rank variables itself",
            )
            continue
        if "/treb-import-" in value:
            res.drop(line, f"{name}={value}", "a path made in the import sandbox's scratch folder")
            continue
        if name == "PATH":
            value = ":".join(p for p in value.split(":") if p != rec.bin_dir)
            if rec.baseline.get(name) == value:
                continue
        text = value.replace("${", "$${")
        base = rec.baseline.get(name, "")
        if name == "PATH":
            base = ":".join(p for p in base.split(":") if p != rec.bin_dir)
        held = _holding(value, base)
        if held is not None:  # optional, as bash reads an unset one
            text = held.replace("${", "$${").replace("\0", "${" + name + ":-}")
        marker = next((m for m in rec.markers if m in value), None)
        if marker:
            text = text.replace(marker, "${" + rec.markers[marker] + "}")
        env_or_secret(res, name, text, line)
        carried[name] = value
    return carried


def _holding(value: str, base: str) -> str | None:
    """`value` with the inherited `base` as NUL, or None where it holds none: a list's
    first or last entry (`x:$PYTHONPATH`, whatever its length: `.` too), else anywhere when
    longer than a character (one character would be found everywhere)."""
    if not base:
        return None
    if value.endswith(":" + base):
        return value[: -len(base)] + "\0"
    if value.startswith(base + ":"):
        return "\0" + value[len(base) :]
    return value.replace(base, "\0") if len(base) > 1 and base in value else None


def _torchrun(c: Call, res: ImportResult, words: Words) -> tuple[list[str], int | None]:
    """The worker argv (what each rank runs) and procs per node from a recorded torchrun."""
    line = c.line
    module_form = c.tool in PYTHONS
    if module_form:
        python, rest = c.argv[0], c.argv[3:]
    else:
        python, rest = _interpreter(c), c.argv[1:]
    ppn: int | None = None
    module = no_python = False
    replaced: list[str] = []
    i = 0
    while i < len(rest):
        tok = rest[i]
        if not tok.startswith("-") or tok == "--":
            i += tok == "--"
            break
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
        else:
            name, value = TORCHRUN_SHORT.get(tok[1:2], tok[1:2]), tok[2:]
            eq = "=" if value else ""
        name = name.replace("_", "-")
        if name in TORCHRUN_VALUE and not eq:
            value = rest[i + 1] if i + 1 < len(rest) else ""
            i += 1
        i += 1
        if name == "nproc-per-node":
            ppn = int(value) if value.isdigit() else None
            if ppn is None:
                res.note(line, f"torchrun --nproc_per_node={value}: one rank per GPU")
        elif name == "master-port":
            if value.isdigit() and 1024 <= int(value) <= 65535:
                res.spec["master_port"] = int(value)
            else:
                replaced.append(f"--master_port={value}")
        elif name in TORCHRUN_SET_BY_TREB:
            replaced.append(f"--{name}" + (f"={value}" if value else ""))
        elif name == "module":
            module = True
        elif name == "no-python":
            no_python = True
        else:
            flag = f"--{name}" + (f"={value}" if value else "")
            res.drop(
                line,
                f"torchrun {flag}",
                "trebuchet runs torchrun with its own options"
                + ("; use retries" if name == "max-restarts" else ""),
            )
    if replaced:
        res.note(
            line,
            "torchrun "
            + " ".join(replaced)
            .replace(HOST.format(0), "$MASTER_ADDR")
            .replace(ADDR.format(1), "$MASTER_ADDR")
            + ": trebuchet's torchrun launcher sets the node "
            "rank and rendezvous itself",
        )
    program = rest[i:]
    if not program:
        return [], ppn
    if no_python:
        return program, ppn
    return ([python, "-m", *program] if module else [python, *program]), ppn


def _interpreter(c: Call) -> str:
    """The python a torchrun starts its workers with: the one of its own shebang (a venv's
    torchrun runs the venv's python), else `python` beside it, else the one on PATH."""
    exe = c.argv[0]
    if "/" not in exe:
        return "python"
    path = Path(exe) if Path(exe).is_absolute() else Path(c.cwd) / exe
    try:  # a path the script chose: a regular file only (never a FIFO, a tty, treb's stdin)
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise OSError("not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise OSError("not a regular file")
            first = f.readline(512).decode("utf-8", "replace").strip()
        if first.startswith("#!"):
            words = first[2:].split()
            if words and _base(words[0]) in PYTHONS:
                return words[0]
    except OSError:
        pass
    return os.path.join(os.path.dirname(exe), "python")


def _per_rank(rec: Recording, main: Call, tr: Call, res: ImportResult, worker: list[str]) -> None:
    """The last task's torchrun worker, compared with task 0's: an argument computed per
    task in the srun's shell cannot be carried as one command."""
    last = [
        c for c in rec.calls if c.parent == main.id and c.task not in (None, 0) and is_torchrun(c)
    ]
    if not last:
        return
    other, _ = _torchrun(last[0], ImportResult("sbatch", ""), Words(rec, {}))
    if other == worker:
        return
    diff = [f"{x!r} / {y!r}" for x, y in zip(worker, other, strict=False) if x != y]
    if len(worker) != len(other):
        diff.append(f"{len(worker)} / {len(other)} arguments")
    res.drop(
        tr.line,
        "worker arguments that differ per task (task 0 / last task: " + ", ".join(diff[:4]) + ")",
        "the command keeps task 0's values",
    )

"""`treb import sbatch`: a Slurm batch script -> spec.

#SBATCH headers become the shape and the `slurm:` block; the last `srun` line is the
workload (srun-native ranks, or torchrun inside `bash -c "..."`); the script's own
variables are substituted the way bash would (`\\$` escapes undone), `export` lines become
`env` or, when they look like credentials, `secrets` by name; `module load`, `source
.../activate` and the other lines before the main srun are kept in `slurm.setup`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.importers.common import PLACEHOLDER, ImportResult, env_or_secret, is_secret, to_name
from trebuchet.importers.shell import (
    ASSIGN,
    Command,
    Part,
    ShellSyntaxError,
    Word,
    assigned,
    expand,
    source,
    split_script,
    statements,
)
from trebuchet.runtime.contract import NODE_NAMES, RANK_NAMES

SHORT = {
    "N": "nodes",
    "n": "ntasks",
    "t": "time",
    "p": "partition",
    "A": "account",
    "J": "job-name",
    "G": "gpus",
    "c": "cpus-per-task",
    "o": "output",
    "e": "error",
    "D": "chdir",
    "C": "constraint",
    "q": "qos",
    "w": "nodelist",
    "x": "exclude",
    "a": "array",
    "d": "dependency",
    "m": "distribution",
    "L": "licenses",
    "M": "clusters",
    "b": "begin",
    "i": "input",
    "k": "no-kill",
    "O": "overcommit",
    "H": "hold",
    "s": "oversubscribe",
    "W": "wait",
    "Q": "quiet",
    "v": "verbose",
    "l": "label",
    "u": "unbuffered",
    "X": "disable-status",
    "E": "preserve-env",
    "Z": "no-allocate",
    "h": "help",
    "V": "version",
    "K": "kill-on-bad-exit",
    "r": "relative",
}
FLAGS = {
    "exclusive",
    "requeue",
    "no-requeue",
    "overcommit",
    "hold",
    "wait",
    "quiet",
    "verbose",
    "contiguous",
    "use-min-nodes",
    "spread-job",
    "test-only",
    "parsable",
    "no-kill",
    "oversubscribe",
    "label",
    "unbuffered",
    "disable-status",
    "preserve-env",
    "no-allocate",
    "pty",
    "overlap",
    "no-container-mount-home",
    "container-mount-home",
    "container-remap-root",
    "no-container-remap-root",
    "container-writable",
    "container-readonly",
    "no-container-entrypoint",
    "container-entrypoint",
    "help",
    "version",
    "ignore-pbs",
    "kill-on-bad-exit",
    "exact",
    "whole",
    "multi-prog",
    "no-shell",
    "container-save",
    "nvmps",
}
# Set where the ranks run, so a reference to them is expected to stay live.
RUNTIME_PREFIXES = ("SLURM_", "SLURMD_", "TREB_", "OMPI_", "PMI_", "PMIX_", "SKYPILOT_")
RUNTIME_NAMES = {*RANK_NAMES, *NODE_NAMES, "MASTER_ADDR", "MASTER_PORT", "HOME", "USER", "PATH"}
RUNTIME_NAMES |= {"HOSTNAME", "PWD", "CUDA_VISIBLE_DEVICES"}
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SETUP_COMMANDS = {"module", "ml", "source", ".", "spack"}
ACTIVATE = {"conda", "mamba", "micromamba"}
TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}
TORCHRUN_VALUE = {
    "nnodes",
    "node-rank",
    "nproc-per-node",
    "master-addr",
    "master-port",
    "rdzv-backend",
    "rdzv-endpoint",
    "rdzv-id",
    "rdzv-conf",
    "max-restarts",
    "monitor-interval",
    "start-method",
    "role",
    "log-dir",
    "redirects",
    "tee",
    "local-addr",
    "local-ranks-filter",
    "logs-specs",
    "rdzv-timeout",
    "event-log-handler",
    "numa-binding",
    "signals-to-handle",
}
TORCHRUN_SHORT = {"r": "redirects", "t": "tee", "m": "module"}
TORCHRUN_SET_BY_TREB = {
    "nnodes",
    "node-rank",
    "master-addr",
    "rdzv-endpoint",
    "rdzv-backend",
    "rdzv-id",
    "standalone",
}
SIGNALS = {
    "USR1": "SIGUSR1",
    "USR2": "SIGUSR2",
    "TERM": "SIGTERM",
    "INT": "SIGINT",
    "HUP": "SIGHUP",
    "QUIT": "SIGQUIT",
    "10": "SIGUSR1",
    "12": "SIGUSR2",
    "15": "SIGTERM",
    "2": "SIGINT",
    "1": "SIGHUP",
    "3": "SIGQUIT",
}


def parse_options(
    tokens: list[str], stop_at_program: bool = False
) -> tuple[list[tuple[str, str | None, int]], int]:
    """`--opt=v`, `--opt v`, `-N2`, `-N 2`, flags -> [(long name, value, token index)], rest."""
    out: list[tuple[str, str | None, int]] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            if eq:
                out.append((name, value, i))
            elif name in FLAGS or i + 1 >= len(tokens):
                out.append((name, None, i))
            else:
                out.append((name, tokens[i + 1], i))
                i += 1
        elif tok.startswith("-") and len(tok) > 1 and tok != "-":
            name = SHORT.get(tok[1], tok[1])
            if name in FLAGS or len(name) == 1 and tok[1] in "lukXEZKrhVvQ":
                out.append((name, None, i))
            elif len(tok) > 2:
                out.append((name, tok[2:].lstrip("="), i))
            elif i + 1 < len(tokens):
                out.append((name, tokens[i + 1], i))
                i += 1
            else:
                out.append((name, None, i))
        elif stop_at_program:
            return out, i
        else:
            out.append(("", tok, i))  # a stray word
        i += 1
    return out, i


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and re.fullmatch(r"\d+", value.strip()) else None


def _gpus(value: str) -> tuple[int | None, str | None]:
    """ "8", "h100:8", "gpu:8", "gpu:a100:4" -> (8, type)."""
    parts = [p for p in value.split(":") if p and p != "gpu"]
    if not parts:
        return None, None
    count = _int(parts[-1].split("(")[0])
    kind = parts[0] if len(parts) > 1 else None
    return count, kind


@dataclass
class _Item:
    """A line kept for slurm.setup, or the assignment of a script variable."""

    line: int
    raw: str
    names: set[str]


class _Script:
    """State while reading one batch script."""

    def __init__(self, path: Path, res: ImportResult) -> None:
        self.path = path
        self.res = res
        self.vars: dict[str, tuple[str, _Item]] = {}  # plain (not exported) shell variables
        self.parts: dict[str, list[Part]] = {}  # their values as parts (live references kept)
        self.exported: set[str] = set()
        self.used: set[str] = set()
        self.setup: list[_Item] = []
        self.setup_vars: set[str] = set()
        self.workdir: tuple[str, int] | None = None
        self.sb: dict[str, tuple[str | None, int]] = {}
        self.srun_opts: dict[str, str | None] = {}

    def resolve(self, name: str) -> str | None:
        if name in self.vars and name not in self.exported:
            self.used.add(name)
            return self.vars[name][0]
        return None

    def lookup(self, name: str) -> list[Part] | None:
        """A script variable's value as parts, for expand() (which splits it as bash does)."""
        if name in self.vars and name not in self.exported:
            self.used.add(name)
            return self.parts[name]
        return None


def import_file(path: str | Path, **_: object) -> ImportResult:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise UserError(f"{p}: cannot read: {exc}") from None
    res = ImportResult("sbatch", str(p))
    st = _Script(p, res)
    try:
        cmds = split_script(text)
    except ShellSyntaxError as exc:
        raise UserError(f"{p}:{exc.line}: cannot read the script: {exc}") from None
    first_cmd = cmds[0].line if cmds else 1 << 30
    _headers(text, first_cmd, st)
    _body(cmds, text, st)
    _finish(st)
    return res


def _headers(text: str, first_cmd: int, st: _Script) -> None:
    res = st.res
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped.startswith("#SBATCH"):
            continue
        if no > first_cmd:
            res.drop(no, stripped, "#SBATCH after the first command: sbatch ignores it")
            continue
        try:
            tokens = shlex.split(stripped[len("#SBATCH") :], comments=True)
        except ValueError as exc:
            res.drop(no, stripped, f"cannot parse: {exc}")
            continue
        opts, _ = parse_options(tokens)
        for name, value, _i in opts:
            if not name:
                res.drop(no, value or "", "not an option")
                continue
            st.sb[name] = (value, no)


def _body(cmds: list[Command], text: str, st: _Script) -> None:
    res = st.res
    stmts = statements(cmds, text)
    srun_at = [i for i, stmt in enumerate(stmts) if stmt[0].argv0 == "srun"]
    main = srun_at[-1] if srun_at else None
    body: list[str] = []
    for i, stmt in enumerate(stmts):
        c, raw = stmt[0], source(stmt, text)
        first = raw.splitlines()[0] + (" ..." if "\n" in raw else "")
        if i == main:
            _srun(c, st)
            for other in stmt[1:]:
                res.drop(
                    other.line,
                    other.raw,
                    "srun's output piped on: trebuchet keeps every rank's log in the run directory",
                )
            if stmt[-1].end == "&":
                res.drop(c.line, "&", "srun in the background")
        elif main is not None and i > main:
            res.drop(c.line, first, "after the main srun")
        elif len(stmt) == 1 and all(ASSIGN.match(w.raw) for w in c.words):
            for w in c.words:
                assign = ASSIGN.match(w.raw)
                assert assign is not None  # each word matched, above
                name = assign.group(1)
                value = w.value(st.resolve)[len(name) + 1 :]
                st.parts[name] = assigned(w, st.lookup)
                st.vars[name] = (value, _Item(c.line, c.raw, w.names()))
        elif len(stmt) == 1 and c.argv0 == "export":
            _export(c, st)
        elif len(stmt) == 1 and c.argv0 == "cd" and len(c.words) == 2 and main is not None:
            st.workdir = (c.words[1].value(st.resolve), c.line)
        elif main is None:
            body.append(raw)
            for x in stmt:
                for w in x.words:
                    st.used |= w.names() & set(st.vars)
        else:
            kind = c.argv0.rsplit("/", 1)[-1]
            setup_like = kind in SETUP_COMMANDS or (
                kind in ACTIVATE and len(c.words) > 1 and c.words[1].value() == "activate"
            )
            names = {n for x in stmt for w in x.words for n in w.names()}
            st.setup.append(_Item(c.line, raw, names))
            if not setup_like:
                res.note(
                    c.line,
                    f"kept in slurm.setup (runs in the batch script before the main srun): {first}",
                )
    if main is None:
        if not body:
            raise UserError(f"{st.path}: no command found (no srun line and no other command)")
        res.note(
            None,
            "no srun line: the script's commands become the command, run once per "
            "node with launcher none",
        )
        res.spec["command"] = "\n".join(body)
        _shape(st, "none", None, 0)


def _export(c: Command, st: _Script) -> None:
    res = st.res
    for w in c.words[1:]:
        m = ASSIGN.match(w.raw)
        if w.raw.startswith("-"):
            res.drop(c.line, f"export {w.raw}", "export option")
            continue
        if not m:
            name = w.value()
            value = st.vars.pop(name, (None, None))[0]
            st.exported.add(name)
            if value is None:
                continue  # exporting an inherited variable: the submitting env has it
        else:
            name = m.group(1)
            value = w.value(st.resolve)[len(name) + 1 :]
            st.exported.add(name)
        secret = is_secret(name, value)
        live = m is not None and any(
            p.kind == "sub" or (p.kind == "var" and st.resolve(p.text) is None) for p in w.parts
        )
        if secret:
            if value and not re.fullmatch(r"\$\{?" + name + r"\}?", value):
                res.note(
                    c.line,
                    f"{name} becomes a secret: its value here is not carried; "
                    "export it in the shell you submit from",
                )
            res.add_secret(name, None if live else value)
        elif live:
            st.setup.append(_Item(c.line, c.raw, w.names()))
            res.note(
                c.line, f"export {name}: its value is computed on the node; kept in slurm.setup"
            )
        else:  # a literal value: a "${" in it must not be expanded at submission
            env_or_secret(res, name, (value or "").replace("${", "$${"), c.line)


def _srun(c: Command, st: _Script) -> None:
    res = st.res
    for w in c.words[1:]:
        st.used |= w.names() & set(st.vars)
    words = expand(c.words[1:], st.lookup)
    _unresolved(words, c.line, st)
    values = [w.value(st.resolve) for w in words]
    opts, start = parse_options(values, stop_at_program=True)
    argv = words[start:]
    for r in c.redirs:
        res.drop(c.line, r, "srun's output redirected: trebuchet keeps every rank's log")
    srun: dict[str, str | None] = {}
    for name, value, _ in opts:
        if name in (
            "nodes",
            "ntasks",
            "ntasks-per-node",
            "gpus-per-node",
            "gpus",
            "gres",
            "cpus-per-task",
            "time",
            "partition",
            "account",
        ):
            srun[name] = value
        elif name == "mpi":
            res.spec.setdefault("slurm", {})["mpi"] = value
        elif name == "container-image":
            res.spec.setdefault("environment", {})["image"] = value
        elif name == "container-mounts":
            mounts = [m for m in (value or "").split(",") if m]
            res.spec.setdefault("environment", {})["mounts"] = mounts
        elif name == "container-workdir" or name == "chdir":
            st.workdir = (value or "", c.line)
        elif name == "export" and (value or "").upper() == "ALL":
            pass  # trebuchet exports the submitting environment too
        elif name in ("label", "unbuffered"):
            res.note(c.line, f"srun --{name}: trebuchet prefixes and unbuffers rank output itself")
        else:
            flag = f"--{name}" + (f"={value}" if value is not None else "")
            res.drop(c.line, f"srun {flag}", "the spec has no field for srun options")
    if not argv:
        raise UserError(f"{st.path}:{c.line}: srun without a command")
    _program(argv, c, st, srun)


def _unresolved(words: list[Word], line: int, st: _Script) -> None:
    """Say which references in the srun line the script does not set: they stay for the
    node's shell, which takes them from the environment the job starts with."""
    known = st.exported | set(st.res.spec.get("env", {})) | set(st.res.spec.get("secrets", []))
    names = sorted(
        {p.text for w in words for p in w.parts if p.kind == "var" and NAME_RE.fullmatch(p.text)}
        - known
    )
    names = [n for n in names if not n.startswith(RUNTIME_PREFIXES) and n not in RUNTIME_NAMES]
    if names:
        refs = " ".join("$" + n for n in names)
        st.res.note(
            line,
            f"{refs}: not set by the script; left for the shell on the node to expand "
            "(from the environment you submit from, or empty)",
        )


def _program(argv: list[Word], c: Command, st: _Script, srun: dict[str, str | None]) -> None:
    res = st.res
    prog = argv[0].value(st.resolve).rsplit("/", 1)[-1]
    script: str | None = None
    if prog in ("bash", "sh") and len(argv) >= 3:
        flags = [w.value() for w in argv[1:-1]]
        if flags and flags[-1] in ("-c", "-lc", "-cl") or "-c" in flags:
            idx = next(i for i, w in enumerate(argv) if w.value() in ("-c", "-lc", "-cl"))
            script = argv[idx + 1].value(st.resolve)
            for w in argv[1 : idx + 1] + argv[idx + 2 :]:
                st.used |= w.names()
            st.used |= argv[idx + 1].names() & set(st.vars)
            if len(argv) > idx + 2:
                res.drop(
                    c.line,
                    " ".join(w.raw for w in argv[idx + 2 :]),
                    "arguments after bash -c's script",
                )
    st.srun_opts = srun
    if script is not None:
        try:
            inner = split_script(script)
        except ShellSyntaxError:
            inner = []
        for k, ic in enumerate(inner):
            tr = _find_torchrun(ic.words)
            if tr is not None:
                worker, ppn = _torchrun(ic.words, tr, c.line, st, resolve=None)
                before = "".join(x.raw + _sep(x.end) for x in inner[:k])
                after = "".join(
                    _sep(inner[k].end if j == k + 1 else "") + x.raw
                    for j, x in enumerate(inner[k + 1 :], k + 1)
                )
                if before.strip():
                    res.note(
                        c.line,
                        "the commands before torchrun in the srun command now run "
                        "in every rank (trebuchet starts torchrun itself)",
                    )
                res.spec["command"] = before + worker + after
                _shape(st, "torchrun", ppn, c.line)
                return
        res.spec["command"] = _dedent(script)
        _shape(st, "native", None, c.line)
        return
    for w in argv:
        st.used |= w.names() & set(st.vars)
    tr = _find_torchrun(argv)
    if tr is not None:
        worker, ppn = _torchrun(argv, tr, c.line, st, resolve=st.resolve)
        res.spec["command"] = worker
        _shape(st, "torchrun", ppn, c.line)
        return
    res.spec["command"] = " ".join(w.shell(st.resolve) for w in argv)
    _shape(st, "native", None, c.line)


def _sep(end: str) -> str:
    return {"&&": " && ", "||": " || ", ";": "; ", "|": " | ", "&": " & ", "": ""}.get(end, "\n")


def _dedent(script: str) -> str:
    import textwrap

    return textwrap.dedent(script).strip("\n")


def _find_torchrun(words: list[Word]) -> int | None:
    """Index of `torchrun` or of `python` in `python -m torch.distributed.run`."""
    vals = [w.value() for w in words]
    for i, v in enumerate(vals):
        base = v.rsplit("/", 1)[-1]
        if base == "torchrun":
            return i
        if (
            re.fullmatch(r"python[0-9.]*", base)
            and i + 2 < len(vals)
            and vals[i + 1] == "-m"
            and vals[i + 2] in TORCHRUN_MODULES
        ):
            return i
    return None


def _torchrun(
    words: list[Word], at: int, line: int, st: _Script, resolve
) -> tuple[str, int | None]:
    """Worker command (what each rank runs) and procs per node from a torchrun call."""
    res = st.res
    pre = [w.shell(resolve) for w in words[:at]]
    is_module_form = words[at].value().rsplit("/", 1)[-1] != "torchrun"
    python = words[at].shell(resolve) if is_module_form else "python"
    rest = words[at + 3 :] if is_module_form else words[at + 1 :]
    vals = [w.value(resolve) for w in rest]
    ppn: int | None = None
    module = no_python = False
    i = 0
    replaced: list[str] = []
    while i < len(vals):
        tok = vals[i]
        if not tok.startswith("-"):
            break
        if tok.startswith("--"):
            name, eq, value = tok[2:].partition("=")
        else:
            name, eq, value = TORCHRUN_SHORT.get(tok[1:2], tok[1:2]), "", tok[2:]
            eq = "=" if value else ""
        name = name.replace("_", "-")
        if name in TORCHRUN_VALUE and not eq:
            value = vals[i + 1] if i + 1 < len(vals) else ""
            i += 1
        i += 1
        if name == "nproc-per-node":
            ppn = _int(value)
            if ppn is None:
                res.note(line, f"torchrun --nproc_per_node={value}: one rank per GPU")
        elif name == "master-port":
            port = _int(value)
            if port and 1024 <= port <= 65535:
                res.spec["master_port"] = port
            else:
                replaced.append(f"--master_port={value}")
        elif name == "nnodes":
            n = _int(value)
            nodes = _int((st.sb.get("nodes") or (None, 0))[0])
            if n is not None and nodes is not None and n != nodes:
                res.note(
                    line,
                    f"torchrun --nnodes={n} differs from --nodes={nodes}: the spec uses {nodes}",
                )
        elif name in TORCHRUN_SET_BY_TREB:
            replaced.append(f"--{name}" + (f"={value}" if eq or name in TORCHRUN_VALUE else ""))
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
            "torchrun " + " ".join(replaced) + ": trebuchet's torchrun launcher "
            "sets the node rank and rendezvous itself",
        )
    program = [w.shell(resolve) for w in rest[i:]]
    if no_python:
        worker = program
    elif module:
        worker = [python, "-m", *program]
    else:
        worker = [python, *program]
    return " ".join(pre + worker), ppn


def _shape(st: _Script, launcher: str, ppn: int | None, line: int) -> None:
    """nodes, procs_per_node, gpus_per_node and the launcher from #SBATCH and srun options."""
    res, sb = st.res, st.sb
    srun = st.srun_opts

    def opt(name: str) -> tuple[str | None, int | None]:
        if name in srun and srun[name] is not None:
            return srun[name], line
        v = sb.get(name)
        return (v[0], v[1]) if v else (None, None)

    nodes_v, nodes_line = opt("nodes")
    nodes = 1
    if nodes_v is not None:
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", nodes_v.strip())
        if m:
            nodes = int(m.group(1))
            if m.group(2):
                res.note(nodes_line, f"--nodes={nodes_v}: a range; the spec asks for {nodes}")
            res.spec["nodes"] = nodes
        else:
            res.drop(nodes_line, f"--nodes={nodes_v}", "not a number; nodes left at 1")
    tpn_v, tpn_line = opt("ntasks-per-node")
    tpn = _int(tpn_v)
    if tpn_v is not None and tpn is None:
        res.drop(tpn_line, f"--ntasks-per-node={tpn_v}", "not a number")
    nt_v, nt_line = opt("ntasks")
    if tpn is None and nt_v is not None:
        total = _int(nt_v)
        if total is not None and total % nodes == 0:
            tpn = total // nodes
        else:
            res.drop(nt_line, f"--ntasks={nt_v}", f"not a multiple of {nodes} node(s)")
    gpus = None
    g_v, g_line = opt("gpus-per-node")
    if g_v is not None:
        gpus, kind = _gpus(g_v)
        if gpus is None:
            res.drop(g_line, f"--gpus-per-node={g_v}", "not a number")
        elif kind:
            res.note(
                g_line,
                f"--gpus-per-node={g_v}: GPU type {kind} is not a spec field "
                "(set skypilot.accelerators or slurm.constraint if it matters)",
            )
    for name in ("gres", "gpus"):
        v, vline = opt(name)
        if v is None or gpus is not None:
            continue
        if name == "gres" and not v.startswith("gpu"):
            res.spec.setdefault("slurm", {}).setdefault("sbatch_args", []).append(f"--gres={v}")
            continue
        count, kind = _gpus(v)
        if count is None:
            res.drop(vline, f"--{name}={v}", "not a GPU count")
        elif name == "gpus":
            if count % nodes:
                res.drop(vline, f"--gpus={v}", f"not a multiple of {nodes} node(s)")
            else:
                gpus = count // nodes
        else:
            gpus = count
    if gpus:
        res.spec["gpus_per_node"] = gpus
    default_ppn = gpus if gpus else 1
    if launcher == "torchrun":
        if tpn and tpn > 1:
            res.note(
                tpn_line,
                f"--ntasks-per-node={tpn} with torchrun would start {tpn} "
                "torchruns per node; imported as one torchrun per node",
            )
        ppn = ppn or default_ppn
    else:
        ppn = tpn or 1
    res.spec["launcher"] = launcher
    if ppn != default_ppn:
        res.spec["procs_per_node"] = ppn
    if launcher == "native" and tpn in (None, 1) and gpus and gpus > 1:
        res.note(
            line,
            "no torchrun in the srun command: launcher native with one rank per "
            "node as srun had; if the command starts torchrun itself, use "
            "launcher: none",
        )


def _finish(st: _Script) -> None:
    res, sb, spec = st.res, st.sb, st.res.spec
    slurm = spec.setdefault("slurm", {})
    for name, (value, line) in sb.items():
        if name in ("nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "gpus"):
            continue
        if name == "gres" and (value or "").startswith("gpu"):
            continue
        if name == "job-name":
            spec["name"] = to_name(value or "job")
            if spec["name"] != value:
                res.note(line, f"--job-name={value}: run name {spec['name']!r}")
        elif name in ("time", "partition", "account", "qos", "constraint", "mem"):
            slurm[name] = value
            if value and PLACEHOLDER.search(value):
                res.note(line, f"--{name}={value}: placeholder kept as is")
        elif name == "cpus-per-task":
            _cpus(_int(value), value, line, res)
        elif name == "exclusive":
            if value in (None, ""):
                slurm["exclusive"] = True
            else:
                slurm.setdefault("sbatch_args", []).append(f"--exclusive={value}")
        elif name in ("output", "error", "input", "open-mode"):
            res.drop(
                line, f"--{name}={value}", "trebuchet writes each rank's log in the run directory"
            )
        elif name == "chdir":
            st.workdir = st.workdir or (value or "", line)
        elif name == "signal":
            _signal(value or "", line, res)
        elif name in ("array", "dependency", "hold", "wait", "test-only", "parsable"):
            res.drop(
                line,
                f"--{name}" + (f"={value}" if value else ""),
                "trebuchet submits one run per spec",
            )
        elif name == "export":
            if (value or "").upper() != "ALL":
                res.drop(
                    line,
                    f"--export={value}",
                    "trebuchet exports the submitting environment and the spec's env",
                )
        elif name in ("requeue", "no-requeue"):
            res.drop(line, f"--{name}", "use retries")
        else:
            slurm.setdefault("sbatch_args", []).append(
                f"--{name}" + (f"={value}" if value is not None else "")
            )
    _workdir(st)
    _setup(st)
    _referenced_secrets(st)
    for name, (_value, item) in st.vars.items():
        if name not in st.used and name not in st.setup_vars:
            res.drop(item.line, f"{name}=...", "a shell variable nothing carried over uses")
    spec.setdefault("name", to_name(st.path.stem))
    found = sorted(set(PLACEHOLDER.findall(str(spec.get("command", "")))))
    if found:
        res.note(None, "command: placeholders kept as is: " + " ".join(found))
    _mask_secret_values(res)


def _cpus(n: int | None, value: str | None, line: int, res: ImportResult) -> None:
    """slurm.cpus_per_task is per rank; under torchrun or none one Slurm task holds them all."""
    if not n:
        res.drop(line, f"--cpus-per-task={value}", "not a number")
        return
    spec = res.spec
    if spec.get("launcher") == "native":
        spec.setdefault("slurm", {})["cpus_per_task"] = n
        return
    gpus = spec.get("gpus_per_node") or 0
    ranks = spec.get("procs_per_node") or (gpus if gpus > 0 else 1)
    per_rank = max(1, n // ranks)
    spec.setdefault("slurm", {})["cpus_per_task"] = per_rank
    if per_rank * ranks != n:
        res.note(
            line,
            f"--cpus-per-task={n} for {ranks} ranks per task: slurm.cpus_per_task "
            f"{per_rank} per rank ({per_rank * ranks} per node)",
        )


def _signal(value: str, line: int, res: ImportResult) -> None:
    m = re.fullmatch(r"(?:[RB]+:)?([A-Z0-9]+)(?:@(\d+))?", value.upper().replace("SIG", ""))
    sig = SIGNALS.get(m.group(1)) if m else None
    if m is None or not sig:
        res.drop(line, f"--signal={value}", "not a signal trebuchet can send")
        return
    res.spec["checkpoint_signal"] = sig
    res.spec["timeout_warning"] = int(m.group(2) or 60)
    res.note(
        line,
        f"--signal={value}: checkpoint_signal {sig}, sent {res.spec['timeout_warning']}"
        " s before the time limit (needs timeout or slurm.time)",
    )


def _workdir(st: _Script) -> None:
    if not st.workdir:
        return
    d, line = st.workdir
    res = st.res
    local = Path(d) if Path(d).is_absolute() else st.path.resolve().parent / d
    if "$" not in d and local.is_dir():
        res.spec["workdir"] = str(local.resolve())
        return
    res.spec["command"] = f"cd {shlex.quote(d) if '$' not in d else d} && {res.spec['command']}"
    res.note(
        line,
        f"working directory {d} is not a directory on this machine: the command "
        "starts with cd instead of setting workdir",
    )


def _setup(st: _Script) -> None:
    """slurm.setup: the kept lines, preceded by the script variables they use."""
    if not st.setup:
        return
    need: set[str] = set()
    for item in st.setup:
        need |= item.names
    todo = list(need)
    while todo:  # the variables those assignments use, transitively
        name = todo.pop()
        if name in st.vars:
            for extra in st.vars[name][1].names - need:
                need.add(extra)
                todo.append(extra)
    items = list(st.setup)
    for name in need:
        if name in st.vars and name not in st.exported:
            st.setup_vars.add(name)
            if st.vars[name][1] not in items:
                items.append(st.vars[name][1])
    items.sort(key=lambda it: it.line)
    st.res.spec.setdefault("slurm", {})["setup"] = [one_line(it.raw) for it in items]


def one_line(text: str) -> str:
    """slurm.setup holds one shell line per item: continuations joined, else `eval $'...'`."""
    joined = re.sub(r"[ \t]*\\\n[ \t]*", " ", text)
    if "\n" not in joined and "\r" not in joined:
        return joined
    quoted = "".join(
        {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, ch)
        for ch in joined
    )
    return f"eval $'{quoted}'"


def _referenced_secrets(st: _Script) -> None:
    """Credentials the command uses without the script defining them come from the shell."""
    spec = st.res.spec
    text = str(spec.get("command", "")) + "\n".join(spec.get("slurm", {}).get("setup", []))
    for name in sorted(set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", text))):
        if (
            is_secret(name)
            and name not in spec.get("secrets", [])
            and name not in st.vars
            and name not in spec.get("env", {})
        ):
            st.res.add_secret(name)
            st.res.note(
                None,
                f"{name} is used by the command: a secret, taken from the shell you submit from",
            )


def _mask_secret_values(res: ImportResult) -> None:
    """A credential's literal value never reaches the spec: it becomes ${NAME}."""
    spec = res.spec
    for value, name in sorted(res.secret_values.items(), key=lambda kv: -len(kv[0])):
        ref = "${" + name + "}"
        if isinstance(spec.get("command"), str):
            spec["command"] = spec["command"].replace(value, ref)
        setup = spec.get("slurm", {}).get("setup")
        if setup:
            spec["slurm"]["setup"] = [s.replace(value, ref) for s in setup]
        for k, v in list(spec.get("env", {}).items()):
            spec["env"][k] = v.replace(value, ref)

"""`treb import sbatch`: a Slurm batch script -> spec, with bash itself as the oracle.

#SBATCH headers become the shape and the `slurm:` block. The script's shell is not parsed
here: bash runs it in a sandbox with the allocation simulated (importers/oracle.py), and the
srun, launcher and interpreter calls it records become the workload (importers/recorded.py).
The result is checked before it is printed (importers/roundtrip.py).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import string
from collections.abc import Callable
from pathlib import Path

from trebuchet.errors import UserError
from trebuchet.importers import oracle, recorded, roundtrip
from trebuchet.importers.common import (
    PLACEHOLDER,
    Fragments,
    ImportResult,
    as_text,
    bash_syntax,
    is_secret,
    mask,
    read_text,
    to_name,
)

MAX_BYTES = 1 << 20  # a batch script is a few KB; anything past 1 MiB is not one
# sbatch/srun short options -> their long names.
SHORT = {
    "N": "nodes", "n": "ntasks", "t": "time", "p": "partition", "A": "account", "J": "job-name",
    "G": "gpus", "c": "cpus-per-task", "o": "output", "e": "error", "D": "chdir",
    "C": "constraint", "q": "qos", "w": "nodelist", "x": "exclude", "a": "array",
    "d": "dependency", "m": "distribution", "L": "licenses", "M": "clusters", "b": "begin",
    "i": "input", "k": "no-kill", "O": "overcommit", "H": "hold", "s": "oversubscribe",
    "W": "wait", "Q": "quiet", "v": "verbose", "l": "label", "u": "unbuffered",
    "X": "disable-status", "E": "preserve-env", "Z": "no-allocate", "h": "help", "V": "version",
    "K": "kill-on-bad-exit", "r": "relative",
}  # fmt: skip
# Options that take no value: srun's (oracle.SRUN_FLAGS) and sbatch's own.
FLAGS = set(oracle.SRUN_FLAGS.split()) | {
    "requeue", "no-requeue", "hold", "wait", "use-min-nodes", "spread-job", "parsable",
    "ignore-pbs", "no-shell",
}  # fmt: skip
# srun options the shape and the slurm: block take from the main srun (_shape, _finish).
SRUN_SHAPE = ("nodes", "ntasks", "ntasks-per-node", "gpus-per-node", "gpus", "gres",
              "cpus-per-task", "time", "partition", "account")  # fmt: skip
# --signal's names and numbers trebuchet can send as checkpoint_signal.
SIGNALS = {
    key: sig.name
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                signal.SIGQUIT)
    for key in (sig.name.removeprefix("SIG"), str(int(sig)))
}  # fmt: skip


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
            if name in FLAGS:
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


class _Script:
    """State while importing one batch script."""

    def __init__(self, path: Path, res: ImportResult) -> None:
        self.path = path
        self.res = res
        self.sb: dict[str, tuple[str | None, int]] = {}
        self.srun_opts: dict[str, str | None] = {}


def read_script(p: Path) -> str:
    """The script's text; a named error for what cannot be a batch script."""
    return read_text(p, "a batch script", MAX_BYTES)


PLACEHOLDER_WORD = re.compile(r"<[A-Za-z][A-Za-z0-9_.-]*>")


def _runnable(p: Path, text: str) -> tuple[str | None, dict[str, str]]:
    """bash -n: what bash itself cannot read is refused before anything runs. A template
    whose `<PLACEHOLDER>` words are what bash rejects runs with them replaced by markers
    (kept as written in the spec): (text to run instead, marker -> placeholder)."""
    err = bash_syntax(text)
    if not err:
        return None, {}
    marks: dict[str, str] = {}

    def mark(m: re.Match[str]) -> str:
        marker = f"TREB^PH{len(marks)}^"
        marks[marker] = m.group(0)
        return marker

    swapped = PLACEHOLDER_WORD.sub(mark, text)
    if marks and not bash_syntax(swapped):
        return swapped, marks
    first = err.splitlines()[0]
    if first:
        m = re.match(r".*?: line (\d+): (.*)", first)
        where = f"{p}:{m.group(1)}" if m else str(p)
        raise UserError(f"{where}: cannot read the script: {m.group(2) if m else first}")
    raise UserError(f"{p}: cannot read the script")


def import_file(path: str | Path, **_: object) -> ImportResult:
    p = Path(path)
    text = read_script(p)
    swapped, placeholders = _runnable(p, text)
    res = ImportResult("sbatch", str(p))
    st = _Script(p, res)
    first_cmd = next(
        (
            no
            for no, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")
        ),
        1 << 30,
    )
    _headers(text, first_cmd, st)
    rec = _record(p, text, st, swapped)
    work = recorded.build(rec, res, p, swapped or text, _srun_options(st))
    pieces = Fragments(rec.markers)
    for n in res.notes:  # a credential is named, never a sandbox marker (nor a piece of one)
        for marker, name in rec.markers.items():
            n.text = n.text.replace(marker, "$" + name)
        n.text = mask(n.text, pieces.spans(n.text))
    if work is None:
        _no_srun(text, st, rec)
    else:
        st.srun_opts = work.srun_opts
        _shape(st, work.launcher, work.ppn, work.line or 0)
    if placeholders:
        res.spec = _strings(res.spec, lambda text: _unmark(text, placeholders))
        res.notes = [type(n)(n.line, _unmark(n.text, placeholders), n.kind) for n in res.notes]
    _finish(st)
    if work is not None:
        roundtrip.check(res, work)
    return res


def _strings(data, change: Callable[[str], str]):
    """`data` (a spec's plain data) with `change` applied to every string value in it."""
    if isinstance(data, str):
        return change(data)
    if isinstance(data, list):
        return [_strings(x, change) for x in data]
    if isinstance(data, dict):
        return {k: _strings(v, change) for k, v in data.items()}
    return data


def _unmark(text: str, marks: dict[str, str]) -> str:
    """Template placeholders back where their markers ended up."""
    for marker, placeholder in marks.items():
        text = text.replace(marker, placeholder)
    return re.sub(r"TREB\^PH\d*\^?", "<", text)  # one cut short in a note


def _allocation(st: _Script) -> tuple[int, int, int]:
    """Nodes, tasks per node and GPUs per node the #SBATCH lines ask for (1, 1, 0 unsaid)."""
    sb = st.sb
    nodes_v = (sb.get("nodes") or (None, 0))[0] or ""
    m = re.match(r"\d+", nodes_v.strip())
    nodes = max(1, min(int(m.group(0)), 4096)) if m else 1
    tpn = _int((sb.get("ntasks-per-node") or (None, 0))[0])
    total = _int((sb.get("ntasks") or (None, 0))[0])
    if tpn is None and total:
        tpn = max(1, total // nodes)
    gpus = None
    for name in ("gpus-per-node", "gres", "gpus"):
        v = (sb.get(name) or (None, 0))[0]
        if v and gpus is None:
            count = _gpus(v)[0]
            if count is not None:
                gpus = count // nodes if name == "gpus" else count
    return nodes, max(1, min(tpn or 1, 1024)), max(0, min(gpus or 0, 1024))


def _record(p: Path, text: str, st: _Script, swapped: str | None) -> oracle.Recording:
    nodes, tpn, gpus = _allocation(st)
    submit = str(p.resolve().parent)
    chdir = (st.sb.get("chdir") or (None, 0))[0]
    cwd = submit
    if chdir:
        cwd = chdir if chdir.startswith("/") else os.path.join(submit, chdir)
        cwd = os.path.normpath(cwd)
    name = (st.sb.get("job-name") or (p.stem, 0))[0] or p.stem
    slurm_env = oracle.allocation_env(nodes, tpn, gpus, submit, name)
    low = text.lower()
    if oracle.JOB_ID in text or oracle.HOST.format("") in low:
        raise UserError(f"{p}: holds this import's simulated job id or node name by chance: "
                        "run treb import again (each run draws new ones)")  # fmt: skip
    passed: dict[str, str] = {}
    markers: dict[str, str] = {}
    for ref in sorted(set(re.findall(r"\$\{?[!#]?([A-Za-z_][A-Za-z0-9_]*)", text))):
        if ref.startswith("SLURM") or ref in slurm_env:
            continue
        if is_secret(ref, os.environ.get(ref)):  # by its name, or by the look of your value
            marker = _marker(low, markers)
            passed[ref] = marker
            markers[marker] = ref
        elif ref in os.environ and ref not in ("PATH", "HOME", "USER", "LOGNAME", "SHELL"):
            passed[ref] = os.environ[ref]
    last = nodes * tpn - 1
    tasks = ["0:0:0"] + ([f"{last}:{nodes - 1}:{tpn - 1}"] if last > 0 else [])
    rec = oracle.record(p, cwd, slurm_env, passed, tasks, swapped)
    rec.markers = markers
    if markers:  # (a script that reads no secret is recorded once)

        def again(given: dict[str, str]) -> oracle.Recording:
            return oracle.record(p, cwd, slurm_env, {**passed, **given}, tasks, swapped)

        rec.derived = _secret_derived(p, low, rec, again)
    _derived(text, sorted(markers.values()), st.res)
    for ref in sorted(set(passed) - set(markers.values())):
        st.res.note(
            None,
            f"${ref}: the script read it from the environment it started with: the import "
            f"gave it your shell's value ({passed[ref][:60]!r}), as sbatch gives it the "
            "value of the shell you submit from",
        )
    return rec


def _view(rec: oracle.Recording, markers: dict[str, str]) -> dict[str, tuple[str, int | None]]:
    """What of a recording reaches the spec, each value in a form that does not depend on
    the stand-ins where the existing checks already see them: the main srun's arguments,
    the torchrun worker's, the environment of both (key -> (value, line))."""
    sruns = [c for c in rec.top() if c.tool == "srun" and not c.in_subst]
    if not sruns:
        return {}
    main = sruns[-1]
    tr = next((c for c in rec.children(main, 0) if recorded.is_torchrun(c)), None)
    pieces = Fragments(markers)
    scratch = os.path.dirname(rec.bin_dir)

    def shape(value: str) -> str:
        for marker, name in markers.items():
            value = value.replace(marker, "${" + name + "}")
        for start, end, name in reversed(pieces.spans(value)):
            value = f"{value[:start]}<{name}>{value[end:]}"
        return value.replace(scratch, "<scratch>")

    out = {f"argv {i}": (shape(a), main.line) for i, a in enumerate(main.argv)}
    for c in (main, tr):
        if c is None:
            continue
        if c is tr:
            out.update({f"worker {i}": (shape(a), c.line) for i, a in enumerate(c.argv)})
        for name, value in c.env.items():
            if rec.baseline.get(name) != value and not name.startswith("TREB_ORACLE_"):
                out[f"env {name}"] = (shape(value), c.line)
    return out


def _differ(a: dict[str, tuple[str, int | None]], b: dict[str, tuple[str, int | None]]) -> set[str]:
    return {k for k in a.keys() | b.keys() if (a.get(k) or ("",))[0] != (b.get(k) or ("",))[0]}


def _secret_derived(
    p: Path, low: str, rec: oracle.Recording, again: Callable[[dict[str, str]], oracle.Recording]
) -> dict[str, str]:
    """A value computed from a secret can keep none of its stand-in (reversed, hex, cut to
    single characters, its length): the script runs again with other stand-ins (of another
    length), and what reaches the spec and changes with them is computed from the secret.
    What changes in a third run with the first stand-ins is random ($RANDOM in a subshell,
    mktemp, date), not the secret's. An argument so computed is an error naming the secret;
    an environment variable is withheld (returned: name -> the secret)."""
    names = {n: m for m, n in rec.markers.items()}
    taken = dict(rec.markers)

    def other(name: str) -> str:
        marker = _marker(low, taken, 40)
        taken[marker] = name
        return marker

    def run(swap: dict[str, str]) -> dict[str, tuple[str, int | None]]:
        """The view of a run with the secrets in `swap` given new stand-ins."""
        markers = {swap.get(n, m): n for n, m in names.items()}
        return _view(again({n: m for m, n in markers.items()}), markers)

    first = _view(rec, rec.markers)
    second = run({n: other(n) for n in names})
    changed = _differ(first, second)
    if changed:
        changed -= _differ(first, run({}))
    by: dict[str, str] = {}
    if len(names) == 1:
        by = dict.fromkeys(changed, next(iter(names)))
    else:
        for name in sorted(names) if changed else ():
            for k in _differ(first, run({name: other(name)})) & changed:
                by.setdefault(k, name)
    for k in sorted(changed):
        by.setdefault(k, min(names))
    derived = {k[4:]: n for k, n in by.items() if k.startswith("env ")}
    args = sorted(
        ((k, n) for k, n in by.items() if not k.startswith("env ")),
        key=lambda kn: (kn[0].split()[0], int(kn[0].split()[1])),
    )
    for k, name in args:
        what, i = k.split()
        line = (first.get(k) or ("", None))[1]
        if _held(first, k, derived) == _held(second, k, derived):
            continue  # `--t "$T"`, T exported and withheld: the spec reads ${T}
        whose = "the srun command" if what == "argv" else "torchrun"
        raise UserError(
            f"{p}:{line}: argument {i} of {whose} is computed from ${name} in the script "
            f"(its value changes with the secret's): treb cannot carry it; pass the secret "
            f'itself ("${name}") or compute it in the program'
        )
    return derived


def _held(view: dict[str, tuple[str, int | None]], key: str, withheld: dict[str, str]) -> str:
    """The value at `key` with the values of withheld variables as their references."""
    value = (view.get(key) or ("",))[0]
    for env in withheld:
        held = (view.get(f"env {env}") or ("",))[0]
        if len(held) >= Fragments.K:
            value = value.replace(held, "${" + env + "}")
    return value


def _derived(text: str, names: list[str], res: ImportResult) -> None:
    """A secret's length or a short slice of it (`${#TOKEN}`, `${TOKEN:0:3}`) is computed
    from a stand-in: named with its line, since it can hold too little of the stand-in to
    be recognised (6 characters or more are withheld, recorded.py)."""
    if not names:
        return
    alt = "|".join(map(re.escape, names))
    pattern = re.compile(r"\$\{(?:[#!](?:" + alt + r")\}|(?:" + alt + r")(?![-:]?[-}])[:^,/#%@\[])")
    for no, line in enumerate(text.splitlines(), 1):
        for m in pattern.finditer(line):
            res.note(
                no,
                f"{m.group(0)}...: computed from a secret the import does not read (a stand-in "
                "took its place): where the result holds too little of it to be withheld, "
                "check the spec",
            )


def _marker(low: str, taken: dict[str, str], length: int = 32) -> str:
    """What a secret's variable holds in the sandbox instead of your value: 32 random
    lowercase letters and digits, no 6 of them in a row in the script (Fragments finds any
    piece of it in what the script made of it)."""
    while True:
        m = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length))
        grams = [m[i : i + Fragments.K] for i in range(len(m) - Fragments.K + 1)]
        if not any(g in low or any(g in t for t in taken) for g in grams):
            return m


def _srun_options(st: _Script):
    """The main srun's options into the spec; returns a parser: srun argv -> (opts, program)."""
    res = st.res

    def parse(args: list[str], line: int | None) -> tuple[dict[str, str | None], list[str]]:
        opts, start = parse_options(args, stop_at_program=True)
        srun: dict[str, str | None] = {}
        for name, value, _ in opts:
            if name in SRUN_SHAPE:
                srun[name] = value
            elif name == "mpi":
                res.spec.setdefault("slurm", {})["mpi"] = value
            elif name == "container-image":
                res.spec.setdefault("environment", {})["image"] = value
            elif name == "container-mounts":
                mounts = [m for m in (value or "").split(",") if m]
                res.spec.setdefault("environment", {})["mounts"] = mounts
            elif name in ("container-workdir", "chdir"):
                srun["container-workdir"] = value
            elif name == "export" and (value or "").upper() == "ALL":
                pass  # trebuchet exports the submitting environment too
            elif name in ("label", "unbuffered"):
                res.note(
                    line, f"srun --{name}: trebuchet prefixes and unbuffers rank output itself"
                )
            else:
                flag = f"--{name}" + (f"={value}" if value is not None else "")
                res.drop(line, f"srun {flag}", "the spec has no field for srun options")
        return srun, args[start:]

    return parse


def _no_srun(text: str, st: _Script, rec: oracle.Recording) -> None:
    """No srun: the batch script itself is the job, once per node (launcher none)."""
    res = st.res
    if rec.status != 0 and not rec.top():
        tail = (rec.stderr.strip().splitlines() or ["no output"])[-1]
        for marker, name in rec.markers.items():
            tail = tail.replace(marker, "$" + name)
        tail = as_text(res.redact(mask(tail, Fragments(rec.markers).spans(tail))))
        raise UserError(
            f"{st.path}: the script stopped (exit {rec.status}) before any srun: {tail}"
        )
    body = "\n".join(
        line
        for line in text.split("\n")  # bash's lines: a lone \r is a word, not a break
        if not line.startswith("#!") and not line.lstrip().startswith("#SBATCH")
    ).strip("\n")
    if not rec.top() and not re.search(r"^\s*[^#\s]", body, re.M):
        raise UserError(f"{st.path}: no command found (no srun line and no other command)")
    srun = re.compile(r"(^|[\s;&|(])srun\s")
    unrun = [no for no, line in enumerate(text.splitlines(), 1)
             if not line.lstrip().startswith("#") and srun.search(line)]  # fmt: skip
    if unrun:
        res.note(
            unrun[0],
            "srun did not run in the import sandbox (a branch not taken, or bash stopped it: "
            "see its notes): the script's commands become the command, run once per node "
            "with launcher none",
        )
    else:
        res.note(
            None,
            "no srun line: the script's commands become the command, run once per node with "
            "launcher none",
        )
    res.spec["command"] = body
    _shape(st, "none", None, 0)


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
            pass  # the sandbox started the script there: the workload's directory has it
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
    spec.setdefault("name", to_name(st.path.stem))
    found = sorted(set(PLACEHOLDER.findall(str(spec.get("command", "")))))
    if found:
        res.note(None, "command: placeholders kept as is: " + " ".join(found))
    _mask_secret_values(res)
    _literal(spec)


def _literal(spec: dict) -> None:
    """What #SBATCH lines and srun options hold is literal (sbatch expands no variable
    there, and bash already did in srun's): a `${` in it is written `$${`, so treb's own
    `${VAR}` expansion leaves it as it was. slurm.setup is shell, run by the batch script."""
    slurm = spec.get("slurm", {})
    for key in slurm:
        if key != "setup":
            slurm[key] = _escaped(slurm[key])
    env = spec.get("environment", {})
    for key in ("image", "mounts"):
        if key in env:
            env[key] = _escaped(env[key])


def _escaped(value):
    return _strings(value, lambda text: text.replace("${", "$${"))


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

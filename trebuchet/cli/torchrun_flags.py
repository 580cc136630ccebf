"""torchrun's flags on `treb run` (torch 2.13's `torchrun --help`, docs/cli.md's table).

Every flag torchrun takes is taken, in both spellings (`--nproc-per-node`,
`--nproc_per_node`), and, as torchrun's argparse actions do, from `PET_<DEST>` when the flag
is not typed (torch/distributed/argparse_util.py: `env` and `check_env`). Each does what
it does under torchrun, or, where treb has no such concept, is accepted with one note
saying what treb does instead. An argv torchrun refuses (a bad `--nnodes`, `--module` with
`--no-python`, an unknown `--logs-specs`) is refused here too, named, exit 2.

Why a table: the parser (add_flags), the PET_ lookup and the command-word rule
(specless.split: `-m`, `--no-python` and `--run-path` make the first word the program)
read the same names, so they cannot drift.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from typing import Any


def _flag(*names: str, switch: bool = False, choices: tuple[str, ...] | None = None) -> tuple:
    """(option strings, dest (torchrun's: PET_<DEST>), takes no value, choices); a
    hyphenated long name is taken in torchrun's underscore spelling too."""
    long = names[-1]
    dest = long[2:].replace("-", "_")
    alias = (f"--{dest}",) if "-" in long[2:] else ()
    return (*names, *alias), dest, switch, choices


FLAGS: tuple[tuple[tuple[str, ...], str, bool, tuple[str, ...] | None], ...] = (
    _flag("--nnodes"),
    _flag("-n", "--nproc-per-node"),
    _flag("--rdzv-backend"),
    _flag("--rdzv-endpoint"),
    _flag("--rdzv-id"),
    _flag("--rdzv-conf"),
    _flag("--standalone", switch=True),
    _flag("--max-restarts"),
    _flag("--monitor-interval"),
    _flag("--start-method", choices=("spawn", "fork", "forkserver")),
    _flag("--event-log-handler"),
    _flag("--role"),
    _flag("-m", "--module", switch=True),
    _flag("--no-python", switch=True),
    _flag("--run-path", switch=True),
    _flag("--log-dir"),
    _flag("-r", "--redirects"),
    _flag("-t", "--tee"),
    _flag("--local-ranks-filter"),
    _flag("--duplicate-stdout-filters"),
    _flag("--duplicate-stderr-filters"),
    _flag("--node-rank"),
    _flag("--master-addr"),
    _flag("--master-port"),
    _flag("--local-addr"),
    _flag("--logs-specs"),
    _flag("--numa-binding", choices=("node", "socket", "exclusive", "core-complex")),
    _flag("--signals-to-handle"),
    _flag("--shutdown-timeout"),
    _flag("--virtual-local-rank", switch=True),
)
SWITCHES = tuple(dest for _, dest, switch, _ in FLAGS if switch)
# The flags that make the first word after treb's options the program, whatever it ends in.
PROGRAM_FLAGS = frozenset(("module", "no_python", "run_path"))
HELP = {
    "nnodes": 'nodes: N, or MIN:MAX (nodes: "MIN:MAX")',
    "nproc_per_node": "ranks per node: N, or auto|cpu|gpu|xpu (counted here, as torchrun)",
    "max_restarts": "extra attempts after a failed one (retries)",
    "master_port": "a fixed MASTER_PORT (master_port)",
    "master_addr": "MASTER_ADDR the ranks see (env.MASTER_ADDR)",
    "standalone": "one node (as torchrun's)",
    "module": "run the program as python -m MODULE",
    "no_python": "run the program as it is, not with python",
    "run_path": "run the program (a .py path) with python",
    "rdzv_id": "TORCHELASTIC_RUN_ID the ranks see",
    "role": "ROLE_NAME the ranks see",
    "log_dir": "with -r/-t: each rank's stdout.log/stderr.log there, in torchrun's layout "
    "(without it: the run directory's torchrun-logs/)",
    "redirects": "streams into --log-dir only: 3 (both), 1 (out), 2 (err), or 0:3,1:1",
    "tee": "streams into --log-dir and the terminal (as -r)",
    "local_ranks_filter": "the terminal shows only these local ranks (0,1)",
    "shutdown_timeout": "seconds between SIGTERM and SIGKILL (grace_period)",
    "node_rank": "this machine's node of a manual launch (the command typed on each machine)",
}
# torchrun's flags with no counterpart here: what treb does instead (one note each).
INSTEAD = {
    "rdzv_backend": "treb starts every node itself (MASTER_ADDR: the first node; "
    "MASTER_PORT: --master-port, or a free port per attempt)",
    "rdzv_endpoint": "treb starts every node itself (MASTER_ADDR: the first node; "
    "MASTER_PORT: --master-port, or a free port per attempt)",
    "rdzv_conf": "treb starts every node itself; no rendezvous to configure",
    "monitor_interval": "treb's node agent watches the ranks continuously",
    "start_method": "each rank is a new process (exec), as torchrun's spawn",
    "event_log_handler": "treb records its own events in the run directory (treb status)",
    "duplicate_stdout_filters": "every line is kept in the rank's log: treb logs RUN | grep",
    "duplicate_stderr_filters": "every line is kept in the rank's log: treb logs RUN | grep",
    "local_addr": "each node's address is the one treb reaches it by",
    "logs_specs": "treb keeps its logs in the run directory (treb logs RUN)",
    "numa_binding": "not applied: ranks get the node's CPUs (pin them in the command)",
    "signals_to_handle": "treb forwards SIGINT/SIGTERM to the ranks (grace_period, then KILL)",
    "virtual_local_rank": "not applied: LOCAL_RANK is the rank's index on its node",
}


def add_flags(g: Any) -> None:
    """torchrun's flags, dest = torchrun's (None: not typed, PET_<DEST> may give it)."""
    for names, dest, switch, choices in FLAGS:
        text = HELP.get(dest) or f"accepted as torchrun's: {INSTEAD.get(dest, '')}"
        if switch:
            g.add_argument(*names, dest=dest, action="store_const", const=True, default=None,
                           help=text)  # fmt: skip
        else:
            g.add_argument(*names, dest=dest, metavar=dest.upper(), choices=choices,
                           default=None, help=text)  # fmt: skip


def usage(text: str) -> Exception:
    from trebuchet.errors import UserError

    return UserError(text)


def pet_switch(dest: str, environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """A switch from PET_<DEST>, as torchrun's check_env reads it (an integer, non-zero)."""
    value = (os.environ if environ is None else environ).get(f"PET_{dest.upper()}")
    if value is None:
        return False
    try:
        return bool(int(value))
    except ValueError:
        raise usage(
            f"PET_{dest.upper()}={value!r}: torchrun reads it as an integer (0 or 1)"
        ) from None


def with_pet(args: argparse.Namespace) -> list[str]:
    """Fill the flags not typed from PET_<DEST>, as torchrun does; the names used."""
    used = []
    for _, dest, switch, choices in FLAGS:
        if getattr(args, dest, None) is not None:
            continue
        name = f"PET_{dest.upper()}"
        if name not in os.environ:
            continue
        if switch:
            value: Any = pet_switch(dest) or None
        else:
            value = os.environ[name]
            if not value:  # torchrun: an empty value is its default
                continue
            if choices and value not in choices:
                raise usage(f"{name}={value!r}: one of {', '.join(choices)}")
        setattr(args, dest, value)
        used.append(name)
    return used


def parse_nnodes(text: str) -> tuple[int, int]:
    """torchrun's N or MIN:MAX (run.py parse_min_max_nnodes), 0 < MIN <= MAX."""
    parts = text.split(":")
    try:
        if len(parts) > 2:
            raise ValueError
        low, high = int(parts[0]), int(parts[-1])
    except ValueError:
        raise usage(f"--nnodes {text!r}: give N or MIN:MAX (torchrun's form)") from None
    if not 0 < low <= high:
        raise usage(f"--nnodes {text!r}: needs 0 < MIN <= MAX")
    return low, high


def _gpus_here() -> int:
    """CUDA devices on this machine, as torch.cuda.device_count() would count them."""
    import shutil
    import subprocess

    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        return len([d for d in mask.split(",") if d.strip() and not d.startswith("-")])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def nproc(text: str) -> int:
    """torchrun's --nproc-per-node (run.py determine_local_world_size), counted here."""
    try:
        value = int(text)
    except ValueError:
        pass
    else:
        if value < 1:
            raise usage(f"--nproc-per-node {text!r}: must be >= 1")
        return value
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if text == "cpu":
        return cpus or 1
    if text in ("gpu", "auto"):
        gpus = _gpus_here()
        if gpus:
            return gpus
        if text == "gpu":
            raise usage("--nproc-per-node gpu: no CUDA device on this machine (torchrun's "
                        "'Cuda is not available'); give the number of ranks")  # fmt: skip
        return cpus or 1
    if text == "xpu":
        raise usage("--nproc-per-node xpu: no XPU on this machine (torchrun's 'Xpu is not "
                    "available'); give the number of ranks")  # fmt: skip
    raise usage(f"--nproc-per-node {text!r}: give a number, or auto, cpu, gpu, xpu "
                "(torchrun's 'Unsupported nproc_per_node value')")  # fmt: skip


def _whole(flag: str, text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise usage(f"{flag} {text!r}: not a whole number") from None
    if value < low:
        raise usage(f"{flag} {text!r}: must be >= {low}")
    return value


STREAMS = {"0": "", "1": "out", "2": "err", "3": "out err"}


def parse_std(flag: str, text: str) -> dict[int, str] | str:
    """torchrun's Std.from_str: `3` for every local rank, or `0:3,1:1` per local rank."""
    if re.fullmatch(r"[0-3]", text):
        return STREAMS[text]
    out: dict[int, str] = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-3])\s*", part)
        if m is None:
            raise usage(f"{flag} {text!r}: give 0-3 (3: stdout and stderr), or "
                        "LOCAL_RANK:0-3 pairs, e.g. 0:3,1:1 (torchrun's form)")  # fmt: skip
        out[int(m[1])] = STREAMS[m[2]]
    return out


def _logs_specs(name: str) -> None:
    """torchrun loads `torchrun.logs_specs` entry points; an unknown name is its ValueError."""
    if name == "default":
        return
    from importlib.metadata import entry_points

    if not [e for e in entry_points(group="torchrun.logs_specs") if e.name == name]:
        raise usage(f"--logs-specs {name!r}: no torchrun.logs_specs entry point of that name "
                    "(torchrun refuses it too); 'default' is torchrun's own")  # fmt: skip


class Translated:
    """What the torchrun flags of one `treb run` mean here. (A plain class: `treb run`'s
    fast path imports no dataclasses, tests/fast/test_spec_cache.py.)"""

    def __init__(self, mode: str = "python") -> None:
        self.overrides: list[str] = []
        self.notes: list[str] = []
        self.env: dict[str, str] = {}  # set in treb's own process: the view, the plan
        self.mode = mode  # python | module | as-is | run-path
        self.log_dir: str | None = None  # "": the run directory's torchrun-logs/
        self.redirect: dict[int, str] | str = ""  # local rank -> "out err": files only
        self.tee: dict[int, str] | str = ""  # into files and the terminal


def _std_of(std: dict[int, str] | str, local: int | None) -> set[str]:
    """The streams of one local rank (None: a rank the per-rank form does not name)."""
    if isinstance(std, str):
        return set(std.split())
    return set(std.get(local, "").split()) if local is not None else set()


def translate(args: argparse.Namespace, on: str | None, specless: bool) -> Translated:
    """The flags given (typed, or PET_ for a launch without a spec) as overrides, notes and
    the command's form; a value torchrun refuses: UserError (exit 2)."""
    out = Translated()
    if specless:
        used = with_pet(args)
        if used:
            out.notes.append(f"read {', '.join(used)} (torchrun's defaults for its flags)")
    elif any(k.startswith("PET_") for k in os.environ):
        out.notes.append("PET_* variables ignored: the spec says what runs (torchrun's flags "
                         "typed on the line override it)")  # fmt: skip

    def g(dest: str) -> Any:
        return getattr(args, dest, None)

    if g("module") and g("no_python"):
        raise usage("--module and --no-python: not both (torchrun refuses it too): -m runs "
                    "python -m MODULE, --no-python runs the program as it is")  # fmt: skip
    out.mode = ("run-path" if g("run_path") else "module" if g("module")
                else "as-is" if g("no_python") else "python")  # fmt: skip
    nnodes = None
    if g("nnodes") is not None:
        low, high = parse_nnodes(g("nnodes"))
        if low == high:
            nnodes = str(low)
        elif (on or "local") == "local":
            # torchrun alone on one machine starts with the nodes that joined: this one.
            nnodes = str(low)
            out.notes.append(f"--nnodes {low}:{high}: on this machine alone {low} node(s) "
                             f"start, as torchrun's agent with no other to join it")  # fmt: skip
        else:
            nnodes = f"{low}:{high}"
    if g("standalone"):
        if nnodes not in (None, "1"):
            raise usage(f"--standalone and --nnodes {nnodes}: --standalone is one node")
        nnodes = "1"
    procs = nproc(g("nproc_per_node")) if g("nproc_per_node") is not None else None
    if procs is not None and g("nproc_per_node") in ("auto", "cpu", "gpu") and on not in (
        None, "local"):  # fmt: skip
        out.notes.append(f"--nproc-per-node {g('nproc_per_node')}: {procs}, counted on this "
                         "machine (torchrun counts on each node)")  # fmt: skip
    restarts = _whole("--max-restarts", g("max_restarts"), 0) if g("max_restarts") else None
    port = _whole("--master-port", g("master_port"), 1) if g("master_port") else None
    for key, value in (("nodes", nnodes), ("procs_per_node", procs), ("retries", restarts),
                       ("master_port", port)):  # fmt: skip
        if value is not None:
            out.overrides.append(f"{key}={value}")
    if g("shutdown_timeout") is not None:
        seconds = _whole("--shutdown-timeout", g("shutdown_timeout"), 0)
        out.overrides.append(f"grace_period={seconds}")
    run_id = elastic_run_id(args)
    if run_id is not None:
        out.overrides.append(f"env.TORCHELASTIC_RUN_ID={run_id}")
    if g("role") is not None:
        out.overrides.append(f"env.ROLE_NAME={g('role')}")
        out.env["TREB_ROLE_NAME"] = g("role")
    if g("master_addr") is not None and g("node_rank") is None:
        out.overrides.append(f"env.MASTER_ADDR={g('master_addr')}")
    if g("node_rank") is not None:
        rank = _whole("--node-rank", g("node_rank"), 0)
        if (on or "local") != "local" and nnodes not in (None, "1"):
            raise usage(
                f"--node-rank with --on {on}: treb starts every node itself there; "
                "drop --node-rank (it is for typing the command on each machine)"
            )
        out.notes.extend(_manual(rank, nnodes, g("master_addr"), out))
    if g("monitor_interval") is not None:
        try:
            float(g("monitor_interval"))
        except ValueError:
            raise usage(f"--monitor-interval {g('monitor_interval')!r}: not a number") from None
    if g("logs_specs") is not None:
        _logs_specs(g("logs_specs"))
    if g("local_ranks_filter") is not None:
        ranks = g("local_ranks_filter").split(",")
        if not all(re.fullmatch(r"\s*[0-9]+\s*", r) for r in ranks):
            raise usage(f"--local-ranks-filter {g('local_ranks_filter')!r}: a comma-separated "
                        "list of local ranks, e.g. 0,1,2")  # fmt: skip
        out.env["TREB_LOCAL_RANKS_FILTER"] = ",".join(str(int(r)) for r in ranks)
    redirect = parse_std("--redirects", g("redirects")) if g("redirects") else ""
    tee = parse_std("--tee", g("tee")) if g("tee") else ""
    if (redirect or tee) and not specless:
        out.notes.append("--redirects/--tee with a spec: the rank logs are in the run "
                         "directory (treb logs RUN); they apply to a command")  # fmt: skip
    elif redirect or tee:
        # torchrun without --log-dir writes them in a temporary folder: here, the run's
        out.log_dir = os.path.abspath(g("log_dir")) if g("log_dir") is not None else ""
        out.redirect, out.tee = redirect, tee
        if not out.log_dir:
            out.notes.append(
                "--redirects/--tee without --log-dir: the files are in the run "
                "directory's torchrun-logs/ (torchrun's: a temporary folder)"
            )
    ignored = [d for d in INSTEAD if g(d) is not None and g(d) is not False]
    if g("standalone"):
        ignored = [d for d in ignored if not d.startswith("rdzv")]
    by_note: dict[str, list[str]] = {}  # one note for the flags it answers
    for dest in ignored:
        by_note.setdefault(INSTEAD[dest], []).append(dest)
    for note, same in by_note.items():
        given = " ".join(f"--{d.replace('_', '-')}" + ("" if d in SWITCHES
                         else f" {shlex.quote(str(g(d)))}") for d in same)  # fmt: skip
        out.notes.append(f"{given}: {note}")
    return out


def elastic_run_id(args: argparse.Namespace) -> str | None:
    """TORCHELASTIC_RUN_ID as torchrun 2.13 sets it (run.py run()): --rdzv-id, except
    where torchrun makes a fresh one: --standalone, and one node with neither
    --rdzv-endpoint nor --master-port (a c10d store on a free port, uuid4). None: treb's
    own, its run id (not torchrun's "none" when no --rdzv-id is typed: a variable Slurm's
    native ranks must not get, runtime/contract.py elastic_vars)."""

    def g(dest: str) -> Any:
        return getattr(args, dest, None)

    if g("standalone") or g("rdzv_id") is None:
        return None
    static = (g("rdzv_backend") or "static") == "static"
    high = int(str(g("nnodes") or "1").split(":")[-1])
    if static and not g("rdzv_endpoint") and g("master_port") is None and high == 1:
        return None
    return str(g("rdzv_id"))


def _manual(rank: int, nnodes: str | None, addr: str | None, out: Translated) -> list[str]:
    """--node-rank: torchrun's static rendezvous, one command per machine (docs/cli.md)."""
    count = int(nnodes.split(":")[0]) if nnodes else 1
    if rank >= count:
        raise usage(f"--node-rank {rank} with --nnodes {nnodes or 1}: node ranks are 0 to "
                    f"{count - 1}")  # fmt: skip
    if count == 1:
        if addr is not None:
            out.overrides.append(f"env.MASTER_ADDR={addr}")
        return []
    out.env["TREB_NODE_RANK_ONLY"] = str(rank)
    out.overrides.append(f"env.MASTER_ADDR={addr or '127.0.0.1'}")
    if not any(o.startswith("master_port=") for o in out.overrides):
        out.overrides.append("master_port=29500")  # torchrun's default, the same on each
    return [
        f"--node-rank {rank}: this machine starts node {rank} of {count} only, its "
        f"ranks {rank}*P..; the others are started by the same command with their "
        f"--node-rank (MASTER_ADDR {addr or '127.0.0.1'})"
    ]


def wrap_command(t: Translated, command: list[str]) -> list[str]:
    """The command with each rank's streams written under --log-dir as torchrun lays them
    out: <log-dir>/<run id>_<treb run>/attempt_<n>/<local rank>/{stdout,stderr}.log; a
    redirected stream goes to its file only, a tee'd one to the rank's log too. A tee is a
    pipeline bash waits for (not `>(tee)`, which may still be writing when the rank has
    ended and the run with it); the exit status is the program's."""
    if t.log_dir is None:
        return command  # "": the run directory's torchrun-logs/
    cases = []
    ranks = {k for std in (t.redirect, t.tee) if isinstance(std, dict) for k in std}
    for local in [*sorted(ranks), None]:
        files = _std_of(t.redirect, local) | _std_of(t.tee, local)
        quiet = _std_of(t.redirect, local) - _std_of(t.tee, local)
        line = '"$@"' + "".join(
            f' {fd}>"$d/{name}.log"'
            for stream, fd, name in (("out", "1", "stdout"), ("err", "2", "stderr"))
            if stream in quiet
        )
        # `sed -u ""` passes on whole lines only: the two tees share the rank's log, and a
        # line the program wrote in two pieces (Python's unbuffered print) must not take
        # the other stream's line between them (torchrun's tee is by lines too)
        if "out" in files - quiet:
            line = f'{{ {line} | tee "$d/stdout.log" | sed -u ""; exit ${{PIPESTATUS[0]}}; }}'
        if "err" in files - quiet:
            line = (f'{{ {line} 2>&1 1>&3 3>&- | tee "$d/stderr.log" 3>&- | sed -u "" >&2 3>&-; '
                    "exit ${PIPESTATUS[0]}; } 3>&1")  # fmt: skip
        if line == '"$@"':
            line = 'exec "$@"'
        cases.append(f"{'*' if local is None else local}) {line};;")
    script = (
        'd="${0:-$TREB_RUN_DIR/torchrun-logs}/${TORCHELASTIC_RUN_ID:-none}_${TREB_RUN_ID}/'
        'attempt_${TREB_ATTEMPT:-0}/${LOCAL_RANK}"; mkdir -p "$d" || exit 1; '
        'case "$LOCAL_RANK" in ' + " ".join(cases) + " esac"
    )
    return ["bash", "-c", script, t.log_dir, *command]


def say(notes: list[str]) -> None:
    for note in notes:
        print(f"treb: note: {note}", file=sys.stderr)

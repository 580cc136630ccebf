"""Bash as the oracle for `treb import sbatch`: run the batch script with bash itself in a
sandbox and record what the ranks would have run.

The script runs in private user, mount, network, PID, IPC and UTS namespaces (`unshare`):
every mount read-only except a scratch folder, no network but a down loopback. The
`#SBATCH` allocation is simulated (SLURM_* variables, `scontrol show hostnames`); `srun`,
`torchrun`, `python`, `accelerate`, `deepspeed`, `mpirun` and the like are shims first on
PATH that record their argv, environment and directory instead of running. A launcher
called by path (`./venv/bin/torchrun`) is caught by a DEBUG trap before bash runs it.
`srun` then runs task 0 (and the allocation's last task) of its program in the sandbox, so
what a `bash -c "..."` task body calls is recorded too. Where the sandbox cannot be made,
the import is refused: the script is never run outside it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trebuchet.errors import UserError

TIMEOUT_S = 60
MAX_OUTPUT = 64 * 1024 * 1024  # ulimit -f: no file in the scratch folder grows past this
# The simulated nodes and job id: random for each process, so that no script can hold them
# (sbatch.py refuses the rare one that does): what bash gives the ranks that contains one
# came from the simulated allocation, and only that becomes ${MASTER_ADDR}/${SLURM_JOB_ID}.
HOST = "node" + secrets.token_hex(5) + "-{}"
JOB_ID = str(10**8 + secrets.randbelow(9 * 10**8))
ADDR = f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}." + "{}"  # `hostname -i`
# Recorded instead of run (first on PATH, or by path through the DEBUG trap).
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "mpirun", "mpiexec", "horovodrun")
PYTHONS = ("python", "python3") + tuple(f"python3.{n}" for n in range(8, 15))
SLURM_TOOLS = ("srun", "scontrol", "sbatch", "salloc", "squeue", "sinfo", "sacct", "scancel")
SETUP_TOOLS = ("module", "ml", "spack", "conda", "mamba", "micromamba", "pip", "pip3")
OTHER_TOOLS = ("nvidia-smi", "hostname", "uv", "enroot", "singularity", "apptainer", "docker")
TOOLS = LAUNCHERS + PYTHONS + SLURM_TOOLS + SETUP_TOOLS + OTHER_TOOLS
# srun options that take no value (the rest take one): where the task's program starts.
SRUN_FLAGS = (
    "exclusive overcommit quiet verbose contiguous no-kill oversubscribe label unbuffered "
    "disable-status preserve-env no-allocate pty overlap no-container-mount-home "
    "container-mount-home container-remap-root no-container-remap-root container-writable "
    "container-readonly no-container-entrypoint container-entrypoint help version exact "
    "whole multi-prog kill-on-bad-exit container-save nvmps test-only usage"
)
SRUN_SHORT_FLAGS = "lukXEZKrhVvQOs"

SHIM = r"""#!/bin/bash
# trebuchet import sandbox: this command is recorded, not run.
__tool=${TREB_ORACLE_AS:-${0##*/}}
__argv0=${TREB_ORACLE_ARGV0:-$__tool}
unset TREB_ORACLE_AS TREB_ORACLE_ARGV0
__d=$(mktemp -d "$TREB_ORACLE_DIR/rec/$(date +%s%N).XXXXXX") || exit 97
printf '%s\0' "$__argv0" "$@" >"$__d/argv"
printf '%s\0' "$__tool" "${TREB_ORACLE_LINE:-}" "${TREB_ORACLE_PARENT:-}" \
  "${TREB_ORACLE_TASK:-}" "${TREB_ORACLE_CWD:-$PWD}" "${TREB_ORACLE_SUB:-0}" >"$__d/meta"
env -0 >"$__d/env"
case $__tool in
scontrol)
  if [[ ${1:-} == show && ${2:-} == hostname* ]]; then printf '%s\n' $TREB_ORACLE_HOSTS; fi ;;
hostname)
  n=${SLURM_NODEID:-0}
  case ${1:-} in -i | -I | --ip-address | --all-ip-addresses) echo "10.254.0.$((n + 1))" ;;
  *) echo "${SLURMD_NODENAME:-oracle-node-0}" ;; esac ;;
uv)
  if [[ ${1:-} == run ]]; then
    shift
    while [[ ${1:-} == -* ]]; do
      case $1 in --with | --python | -p | --project | --directory | --env-file | --extra \
        | --group | --index | --package) shift 2 ;; *) shift ;; esac
    done
    (($#)) && TREB_ORACLE_PARENT=$__d TREB_ORACLE_TASK=${TREB_ORACLE_TASK:-} exec "$@"
  fi ;;
srun)
  while (($#)); do
    case $1 in
    --) shift; break ;;
    --*=*) shift ;;
    --*) if [[ " $TREB_ORACLE_SRUN_FLAGS " == *" ${1#--} "* ]]; then shift; else shift 2; fi ;;
    -?*) if ((${#1} > 2)) || [[ $TREB_ORACLE_SRUN_SHORT == *"${1:1:1}"* ]]; then shift
         else shift 2; fi ;;
    *) break ;;
    esac
  done
  (($#)) || exit 0
  for __t in $TREB_ORACLE_TASKS; do
    IFS=: read -r __p __n __l <<<"$__t"
    (
      export SLURM_PROCID=$__p SLURM_NODEID=$__n SLURM_LOCALID=$__l SLURM_STEP_ID=0 \
        SLURMD_NODENAME=oracle-node-$__n TREB_ORACLE_PARENT=$__d TREB_ORACLE_TASK=$__p \
        TREB_ORACLE_SUB=0 BASH_ENV=$TREB_ORACLE_PRELUDE
      __b=${1##*/}
      if [[ $1 == */* && " $TREB_ORACLE_TOOLS " == *" $__b "* ]]; then
        TREB_ORACLE_AS=$__b TREB_ORACLE_ARGV0=$1 exec "$TREB_ORACLE_BIN/$__b" "${@:2}"
      fi
      exec "$@"
    ) 2>"$__d/task$__p.err" </dev/null | if [[ $__t == "${TREB_ORACLE_TASKS%% *}" ]]; then
      cat; else cat >/dev/null; fi
  done ;;
esac
exit 0
""".replace("oracle-node-", HOST.format("")).replace("10.254.0.", ADDR.format(""))

PRELUDE = r"""# trebuchet import sandbox: sourced by every bash in it (BASH_ENV).
[[ $0 == "$TREB_ORACLE_BIN"/* ]] && return 0
if [[ ${TREB_ORACLE_TOP:-} == 1 ]]; then __treb_top=1; export TREB_ORACLE_TOP=0; fi
__treb_note() { printf '%s\t%s\n' "${TREB_ORACLE_LINE:-}" "$*" >>"$TREB_ORACLE_DIR/notes"; }
__treb_call() {
  local b=${1##*/}
  TREB_ORACLE_AS=$b TREB_ORACLE_ARGV0=$1 "$TREB_ORACLE_BIN/$b" "${@:2}"
}
__treb_source() {
  [[ -f ${1:-} || ${1:-} != */* && -n $(type -P -- "${1:-}") ]] && return 1
  TREB_ORACLE_AS=source TREB_ORACLE_ARGV0=source "$TREB_ORACLE_BIN/_shim" "$@" || true
  return 0
}
__treb_dbg() {
  [[ -n ${__treb_x:-} ]] || { __treb_x=1; shopt -s extdebug; }
  [[ ${BASH_SOURCE[1]:-} == "$TREB_ORACLE_PRELUDE" ]] && return 0
  if [[ -n ${__treb_re:-} ]]; then __treb_re=; set -e; fi
  if [[ -n ${__treb_top:-} ]]; then
    export TREB_ORACLE_LINE=$__treb_l TREB_ORACLE_SUB=$BASH_SUBSHELL
  fi
  local c=$BASH_COMMAND w=${BASH_COMMAND:0:4096}  # a path is shorter; %% on more is O(n^2)
  w=${w%%[[:space:]]*}
  if [[ $w =~ ^[A-Za-z0-9_.~/+-]+$ && $w == */* && " $TREB_ORACLE_TOOLS " == *" ${w##*/} "* ]]
  then
    eval "__treb_call $c"
  elif [[ $w == source || $w == . ]] && [[ $c == *[[:space:]]* ]]; then
    eval "__treb_source ${c#*[[:space:]]}" || return 0
  else
    return 0
  fi
  [[ $- == *e* ]] && { set +e; __treb_re=1; }
  return 1
}
cd() {
  if builtin cd "$@" 2>/dev/null; then export TREB_ORACLE_CWD=$PWD; return 0; fi
  local t=${HOME:-/}
  (($#)) && t=${!#}
  [[ $t == /* ]] || t=${TREB_ORACLE_CWD:-$PWD}/$t
  export TREB_ORACLE_CWD=$t
  __treb_note "cd $t: not a directory on this machine: recorded as the working directory"
  return 0
}
__treb_write() {
  local tool=$1
  shift
  TREB_ORACLE_AS=$tool TREB_ORACLE_ARGV0=$tool "$TREB_ORACLE_BIN/_shim" "$@"
  command "$tool" "$@" 2>/dev/null && return 0
  __treb_note "$tool $*: not possible in the read-only sandbox: taken as done"
  return 0
}
mkdir() { __treb_write mkdir "$@"; }
touch() { __treb_write touch "$@"; }
cp() { __treb_write cp "$@"; }
mv() { __treb_write mv "$@"; }
ln() { __treb_write ln "$@"; }
rm() { __treb_write rm "$@"; }
chmod() { __treb_write chmod "$@"; }
tee() { command tee "$@" 2>/dev/null || true; }
command_not_found_handle() {
  TREB_ORACLE_AS=${1##*/} TREB_ORACLE_ARGV0=$1 "$TREB_ORACLE_BIN/_shim" "${@:2}"
  __treb_note "$1: not a command on this machine: recorded, taken as done"
  return 0
}
set -T
trap '__treb_l=$LINENO; __treb_dbg' DEBUG
"""

INNER = r"""# trebuchet import sandbox: made inside fresh namespaces, then the script runs.
S=$1 script=$2 cwd=$3
mount --make-rprivate / 2>/dev/null
mount --bind "$S" "$S" || { echo "treb-oracle: cannot bind the scratch folder" >&2; exit 90; }
while read -r _ _ _ _ mp rest; do
  mp=$(printf '%b' "$mp")
  [[ $mp == "$S" || " $rest " == *" - nsfs "* ]] && continue  # nsfs: a namespace, no files
  mount -o remount,bind,ro "$mp" 2>/dev/null ||
    { echo "treb-oracle: cannot make $mp read-only" >&2; exit 91; }
done </proc/self/mountinfo
touch /.treb-oracle-probe 2>/dev/null && { echo "treb-oracle: / is writable" >&2; exit 92; }
cd "$cwd" 2>/dev/null || cd "$S/tmp"
ulimit -f $((TREB_ORACLE_FSIZE / 1024))
ulimit -c 0
ulimit -v $((4 << 20))  # 4 GiB of address space: a runaway $(...) fails, not the machine
BASH_ENV=$TREB_ORACLE_PRELUDE exec bash "$script" >"$S/out" 2>"$S/err" </dev/null
"""


@dataclass
class Call:
    """One recorded command: argv as executed, its environment, where and from which line."""

    id: str
    tool: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    line: int | None
    parent: str | None
    task: int | None
    in_subst: bool
    out: str = ""
    err: str = ""


@dataclass
class Recording:
    calls: list[Call]
    baseline: dict[str, str]
    status: int
    stderr: str
    notes: list[tuple[int | None, str]] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    markers: dict[str, str] = field(default_factory=dict)  # marker -> secret name
    bin_dir: str = ""

    def top(self) -> list[Call]:
        """Commands the batch script itself ran (not inside an srun task)."""
        return [c for c in self.calls if c.parent is None]

    def children(self, parent: Call, task: int = 0) -> list[Call]:
        """Commands run, directly or through wrappers, by one task of an srun."""
        ids = {parent.id}
        out = []
        for c in self.calls:
            if c.parent in ids and (c.task == task or c.task is None):
                ids.add(c.id)
                out.append(c)
        return out


def sandbox_command() -> list[str]:
    """unshare with the namespaces the sandbox needs; a UserError where they cannot be made."""
    unshare = shutil.which("unshare")
    if not unshare:
        raise UserError(
            "treb import sbatch runs the script in a sandbox made with `unshare` (util-linux), "
            "which is not on PATH: refusing to run the script without it"
        )
    cmd = [unshare, "--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc"]
    cmd += ["--uts", "--fork", "--kill-child"]
    probe = subprocess.run(
        [*cmd, "bash", "--noprofile", "--norc", "-c", "mount -t tmpfs none /mnt && echo ok"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=20,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    if probe.returncode != 0 or probe.stdout.strip() != "ok":
        why = (probe.stderr.strip().splitlines() or ["no detail"])[-1]
        raise UserError(
            "treb import sbatch cannot make its sandbox (private user, mount and network "
            f"namespaces) on this machine: {why}; refusing to run the script outside it "
            "(unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone)"
        )
    return cmd


def allocation_env(
    nodes: int, tasks_per_node: int, gpus: int, submit_dir: str, name: str
) -> dict[str, str]:
    """The SLURM_* variables the batch script sees on the first node of the allocation."""
    hosts = [HOST.format(i) for i in range(nodes)]
    hostlist = HOST.format(f"[0-{nodes - 1}]") if nodes > 1 else hosts[0]
    ntasks = nodes * tasks_per_node
    env = {
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOBID": JOB_ID,
        "SLURM_JOB_NAME": name,
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NODELIST": hostlist,
        "SLURM_NODELIST": hostlist,
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node),
        "SLURM_SUBMIT_DIR": submit_dir,
        "SLURM_SUBMIT_HOST": "oracle-login",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": hosts[0],
        "SLURM_CLUSTER_NAME": "oracle",
        "SLURM_JOB_CPUS_PER_NODE": str(max(1, tasks_per_node)),
        "SLURM_CPUS_ON_NODE": str(max(1, tasks_per_node)),
    }
    if gpus > 0:
        env["SLURM_GPUS_ON_NODE"] = str(gpus)
        env["SLURM_GPUS_PER_NODE"] = str(gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(gpus))
    return env


def record(
    script: Path,
    cwd: str,
    slurm_env: dict[str, str],
    passed: dict[str, str],
    tasks: list[str],
    text: str | None = None,
) -> Recording:
    """Run `script` under bash in the sandbox; what its shims recorded.

    `passed`: variables taken from the importing shell (sbatch exports the submitting
    environment), secret markers included. `tasks`: `procid:nodeid:localid` of each srun
    task simulated. `text`: run this instead of the file (a template with its placeholders
    replaced), from a copy of the same name in the scratch folder."""
    cmd = sandbox_command()
    with tempfile.TemporaryDirectory(prefix="treb-import-") as tmp:
        scratch = Path(tmp).resolve()
        bin_dir = scratch / "bin"
        for sub in ("bin", "rec", "tmp"):
            (scratch / sub).mkdir()
        shim = bin_dir / "_shim"
        shim.write_text(SHIM)
        shim.chmod(0o755)
        for tool in TOOLS:
            (bin_dir / tool).symlink_to("_shim")
        prelude = scratch / "prelude.sh"
        prelude.write_text(PRELUDE)
        inner = scratch / "inner.sh"
        inner.write_text(INNER)
        run_script = script.resolve()
        if text is not None:
            (scratch / "src").mkdir()
            run_script = scratch / "src" / script.name
            run_script.write_text(text)
        path = [p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p]
        env = {
            "PATH": ":".join([str(bin_dir), *path]),
            "HOME": os.environ.get("HOME", "/root"),
            "USER": os.environ.get("USER", "user"),
            "LOGNAME": os.environ.get("LOGNAME", os.environ.get("USER", "user")),
            "SHELL": "/bin/bash",
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TMPDIR": str(scratch / "tmp"),
            **slurm_env,
            **passed,
        }
        baseline = dict(env)
        control = {
            "TREB_ORACLE_DIR": str(scratch),
            "TREB_ORACLE_BIN": str(bin_dir),
            "TREB_ORACLE_PRELUDE": str(prelude),
            "TREB_ORACLE_TOOLS": " ".join(TOOLS),
            "TREB_ORACLE_SRUN_FLAGS": SRUN_FLAGS,
            "TREB_ORACLE_SRUN_SHORT": SRUN_SHORT_FLAGS,
            "TREB_ORACLE_HOSTS": " ".join(
                HOST.format(i) for i in range(int(slurm_env["SLURM_NNODES"]))
            ),
            "TREB_ORACLE_TASKS": " ".join(tasks),
            "TREB_ORACLE_TOP": "1",
            "TREB_ORACLE_CWD": cwd,
            "TREB_ORACLE_FSIZE": str(MAX_OUTPUT),
        }
        run_dir = cwd if os.path.isdir(cwd) else str(script.parent)
        try:
            done = subprocess.run(
                [*cmd, "bash", "--noprofile", "--norc", str(inner), str(scratch), str(run_script)]
                + [run_dir],
                env={**env, **control},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"{script}: the script did not finish within {TIMEOUT_S} s in the import "
                "sandbox (a loop waiting for something that never comes?)"
            ) from None
        if done.returncode in (90, 91, 92):
            raise UserError(
                f"{script}: the import sandbox could not be made: {done.stderr.strip()}"
            )
        stderr = _read(scratch / "err")
        rec = Recording(
            calls=_calls(scratch / "rec"),
            baseline=baseline,
            status=done.returncode,
            stderr=stderr,
            hosts=control["TREB_ORACLE_HOSTS"].split(),
            bin_dir=str(bin_dir),
        )
        notes = _read(scratch / "notes")
        for row in notes.splitlines():
            line, _, text = row.partition("\t")
            rec.notes.append((int(line) if line.isdigit() else None, text))
        return rec


def _read(path: Path, limit: int = 1 << 20) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("utf-8", "replace")
    except OSError:
        return ""


def _nul(path: Path) -> list[str]:
    data = path.read_bytes().decode("utf-8", "surrogateescape")
    items = data.split("\0")
    return items[:-1] if items and items[-1] == "" else items


def _calls(rec_dir: Path) -> list[Call]:
    out = []
    for d in sorted(rec_dir.iterdir(), key=lambda p: p.name):
        try:
            tool, line, parent, task, cwd, sub = _nul(d / "meta")
            argv = _nul(d / "argv")
            env = {}
            for item in _nul(d / "env"):
                name, eq, value = item.partition("=")
                if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                    env[name] = value
        except (OSError, ValueError):
            continue  # a shim killed half-way: nothing reliable to read
        out.append(
            Call(
                id=str(d),
                tool=tool,
                argv=argv,
                env=env,
                cwd=cwd,
                line=int(line) if line.isdigit() else None,
                parent=parent or None,
                task=int(task) if task.isdigit() else None,
                in_subst=sub not in ("", "0"),
                out=_read(d / "task0.out", 4096),
                err=_read(d / "task0.err", 4096),
            )
        )
    return out


def argv_in_sandbox(command: str, env: dict[str, str]) -> list[str]:
    """The argv bash gives the first command of `command` (a spec's command string), got
    in the same sandbox: the imported command's round trip against the recorded one."""
    cmd = sandbox_command()
    with tempfile.TemporaryDirectory(prefix="treb-import-check-") as tmp:
        out = Path(tmp) / "argv"
        probe = "__treb_argv() { printf '%s\\0' \"$@\" >" + _q(str(out)) + "; exit 0; }\n"
        done = subprocess.run(
            [*cmd, "bash", "--noprofile", "--norc", "-c", probe + "__treb_argv " + command],
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        if done.returncode != 0 or not out.exists():
            return []
        return _nul(out)


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)

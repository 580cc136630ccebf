"""Bash as the oracle for `treb import sbatch`: run the batch script with bash itself in a
sandbox and record what the ranks would have run, instead of parsing shell.

The sandbox (INNER) is made in private user, mount, network, PID, IPC and UTS namespaces
before the script's first line: a tmpfs root with the system folders read-only, an /etc of
ETC_ALLOWED only, a minimal /dev, an empty HOME and /tmp, and the script's folder
copy-on-write with credential files hidden; no network, no other sockets. The script runs
in a nested user and mount namespace (mounts locked), with no capability, no_new_privs and
bounded processes, memory, disk and time; its environment is fixed. What it hands back is a
bounded tar of regular files, and notes are fixed sentences (NOTES), so nothing the script
writes can make treb say more than running a command would. Where the sandbox cannot be
made the import is refused: the script never runs outside it.

The allocation is simulated (SLURM_*, `scontrol show hostnames`); srun, launchers and
interpreters are shims first on PATH (or, called by path or through a wrapper, caught by a
DEBUG trap) that record argv, environment and directory instead of running; srun runs task
0 and the last task so a `bash -c` task body is recorded too.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tarfile
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
DISK_BYTES = 128 * 1024 * 1024  # the sandbox's writable tmpfs: /tmp, HOME, the folder's writes
TAR_BYTES = DISK_BYTES + 32 * 1024 * 1024  # what it hands back: its files and tar's headers
MEMORY_BYTES = 1 << 30  # ulimit -v of each process in it
MAX_PROCS = 256  # ulimit -u in its nested user namespace, and pid 1 ends it past that
MAX_FILES = 20_000  # files read back from its record folder
MAX_NOTES = 1000
MAX_NESTING = 256  # bash's parser crashes past a few thousand nested $( ( {
RECORD_DIR = "/.treb"  # inside: the record folder, on the sandbox's size-limited tmpfs
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the sandbox takes from the importing user's environment (beyond the variables the
# script names, which sbatch.py passes, credentials as markers): names, not secrets.
ENV_ALLOWED = ("USER", "LOGNAME", "LANG", "LANGUAGE", "TZ")  # and LC_*
# /etc inside: copied from the host's, these names only (no shadow, munge, ssh keys).
ETC_ALLOWED = (
    "passwd", "group", "hosts", "hostname", "host.conf", "nsswitch.conf", "resolv.conf",
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "alternatives",
    "bash.bashrc", "profile", "inputrc", "os-release", "debian_version", "lsb-release",
    "protocols", "services", "mime.types", "environment",
)  # fmt: skip
# Files of the script's folder whose names say they hold credentials: absent from its
# copy-on-write view (`source .env` is then kept as a setup line, run on the nodes).
CREDENTIAL_FILES = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", ".git-credentials", ".pypirc", ".npmrc",
    ".ssh", ".aws", ".gnupg", ".docker", ".kube", ".azure", ".config", ".cache",
    "*.pem", "*.key", "*.p12", "*.pfx", "*.keystore", "*.jks", "id_rsa*", "id_dsa*",
    "id_ecdsa*", "id_ed25519*", "credentials*", "*credentials.json", "secrets*", ".secrets*",
    "token", "*.token", "*_token", ".token*", "*.kdbx",
)  # fmt: skip
HIDE_DEPTH = 3  # folders below the script's searched for them
HIDE_MAX = 5000  # entries looked at: a script's folder, not a dataset
# Folders a script's folder may not be: it is shown to the script copy-on-write.
SHARED_FOLDERS = ("/", "/home", "/tmp", "/var/tmp", "/dev/shm")
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev", "/etc", "/run", "/boot")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
CRASHES = {4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 11: "SIGSEGV"}
# The notes the sandbox's shell functions write: the only sentences a notes row can give.
NOTES = {
    "cd": "cd {}: not a directory on this machine: recorded as the working directory",
    "write": "{}: not possible in the import sandbox: taken as done",
    "absent": "{}: not a command on this machine: recorded, taken as done",
}
# Recorded instead of run (first on PATH, or by path through the DEBUG trap).
LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "mpirun", "mpiexec", "horovodrun")
PYTHONS = ("python", "python3") + tuple(f"python3.{n}" for n in range(8, 15))
SLURM_TOOLS = ("srun", "scontrol", "sbatch", "salloc", "squeue", "sinfo", "sacct", "scancel")
SETUP_TOOLS = ("module", "ml", "spack", "conda", "mamba", "micromamba", "pip", "pip3")
OTHER_TOOLS = ("nvidia-smi", "hostname", "uv", "enroot", "singularity", "apptainer", "docker")
TOOLS = LAUNCHERS + PYTHONS + SLURM_TOOLS + SETUP_TOOLS + OTHER_TOOLS
# Commands that start another by path (`env A=1 /usr/bin/python3 ...`): that one is recorded.
WRAPPERS = (
    "env", "nice", "nohup", "stdbuf", "numactl", "taskset", "chrt", "ionice", "exec", "command",
    "time", "setsid", "unbuffer",
)  # fmt: skip
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
if [[ ${TREB_ORACLE_TOP:-} == 1 ]]; then __treb_top=1; export TREB_ORACLE_TOP=0; RANDOM=4242; fi
__treb_note() {
  printf '%s\t%s\t%s\n' "${TREB_ORACLE_LINE:-}" "$1" "${*:2}" >>"$TREB_ORACLE_DIR/notes"
}
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
  local c=$BASH_COMMAND w
  [[ $c =~ ^[^[:space:]]* ]] && w=${BASH_REMATCH[0]}  # linear: ${c%%...} is quadratic
  ((${#w} < 4096)) || return 0  # a long assignment: no program of interest starts so
  if [[ $w =~ ^[A-Za-z0-9_.~/+-]+$ && $w == */* && " $TREB_ORACLE_TOOLS " == *" ${w##*/} "* ]]
  then
    eval "__treb_call $c"
  elif [[ ${w##*/} =~ ^($TREB_ORACLE_WRAPPERS)$ && $c =~ $TREB_ORACLE_WRAPPED ]]; then
    eval "__treb_wrapped $c" || return 0
  elif [[ $w == source || $w == . ]] && [[ $c == *[[:space:]]* ]]; then
    eval "__treb_source ${c#*[[:space:]]}" || return 0
  else
    return 0
  fi
  [[ $- == *e* ]] && { set +e; __treb_re=1; }
  return 1
}
__treb_wrapped() {
  local -a set=()
  local w=${1##*/}
  shift
  while (($#)); do
    case $1 in
    --) shift; break ;;
    -u | -C | --unset | --chdir) shift 2 ;;
    -*) shift ;;
    [A-Za-z_]*=*) [[ $w == env ]] || break; set+=("$1"); shift ;;
    [0-9]*) shift ;;
    *) [[ " ${TREB_ORACLE_WRAPPERS//|/ } " == *" ${1##*/} "* ]] || break; w=${1##*/}; shift ;;
    esac
  done
  local b=${1##*/}
  [[ ${1:-} == */* && " $TREB_ORACLE_TOOLS " == *" $b "* ]] || return 1
  env ${set[@]+"${set[@]}"} TREB_ORACLE_AS="$b" TREB_ORACLE_ARGV0="$1" \
    "$TREB_ORACLE_BIN/$b" "${@:2}"
  [[ $w == exec ]] && exit 0
  return 0
}
cd() {
  if builtin cd "$@" 2>/dev/null; then export TREB_ORACLE_CWD=$PWD; return 0; fi
  local t=${HOME:-/}
  (($#)) && t=${!#}
  [[ $t == /* ]] || t=${TREB_ORACLE_CWD:-$PWD}/$t
  export TREB_ORACLE_CWD=$t
  __treb_note cd "$t"
  return 0
}
__treb_write() {
  local tool=$1
  shift
  TREB_ORACLE_AS=$tool TREB_ORACLE_ARGV0=$tool "$TREB_ORACLE_BIN/_shim" "$@"
  command "$tool" "$@" 2>/dev/null && return 0
  __treb_note write "$tool $*"
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
  __treb_note absent "$1"
  return 0
}
set -T
trap '__treb_l=$LINENO; __treb_dbg' DEBUG
"""

INNER = r"""# trebuchet import sandbox: stage "make" builds the root (module docstring), stage
# "run" is pid 1 and hands back the recording as a tar on stdout.
set -u
if [[ $1 == make ]]; then
  S=$2 sub=$3 run_dir=$4 script=$5 home=$6
  die() { echo "treb-oracle: $*" >&2; exit 91; }
  mount --make-rprivate / || die "cannot make the mounts private"
  mount -t tmpfs -o size=1m,mode=755 treb-root "$S/root" || die "cannot mount a tmpfs"
  cd "$S/root" || die "cannot enter the new root"
  mkdir -p .treb proc dev tmp etc
  mount -t tmpfs -o "size=$TREB_ORACLE_DISK,nr_inodes=20000,mode=755,nosuid,nodev" \
    treb-scratch .treb || die "cannot mount the scratch tmpfs"
  mkdir -p .treb/rec .treb/tmp/treb-import-tmp .treb/up .treb/work .treb/home .treb/cwd \
    .treb/shm .treb/empty
  : >.treb/notes
  for d in usr bin sbin lib lib32 lib64 libx32; do
    if [[ -L /$d ]]; then
      ln -s "$(readlink "/$d")" "$d"
    elif [[ -d /$d ]]; then
      mkdir -p "$d" && mount --bind -o ro,nosuid,nodev "/$d" "$d" || die "cannot bind /$d"
    fi
  done
  etc=()
  for f in $TREB_ORACLE_ETC; do [[ -e /etc/$f ]] && etc+=("/etc/$f"); done
  ((${#etc[@]})) && cp -dR --preserve=mode,timestamps -t etc "${etc[@]}" 2>/dev/null
  for d in null zero urandom; do
    : >"dev/$d" && mount --bind "/dev/$d" "dev/$d" || die "cannot bind /dev/$d"
  done
  ln -s /proc/self/fd dev/fd && ln -s /proc/self/fd/0 dev/stdin &&
    ln -s /proc/self/fd/1 dev/stdout && ln -s /proc/self/fd/2 dev/stderr && mkdir dev/shm &&
    mount --bind .treb/shm dev/shm && mount --bind .treb/tmp tmp ||
    die "cannot make /dev and /tmp"
  mount -t proc -o nosuid,nodev,noexec proc proc || die "cannot mount /proc"
  mkdir -p "./$S" && mount --bind -o ro,nosuid,nodev "$S" "./$S" ||
    die "cannot bind the import's own files"
  if [[ $home == /?* && "$home/" != "$sub/"* && "$S/" != "$home/"* && $home != /tmp ]]; then
    mkdir -p "./$home" && mount --bind .treb/home "./$home" || die "cannot make an empty HOME"
  fi
  if [[ -n $sub ]]; then
    mkdir -p "./$sub" || die "cannot make $sub"
    mount -t overlay treb-folder -o "lowerdir=$sub,upperdir=.treb/up,workdir=.treb/work" \
      "./$sub" 2>/dev/null || mount --bind .treb/empty "./$sub" || die "cannot mount $sub"
    while IFS= read -r -d '' rel; do  # files that hold credentials: absent (else emptied)
      e=./$sub/$rel
      rm -rf -- "$e" 2>/dev/null && continue
      if [[ -d $e && ! -L $e ]]; then mount -t tmpfs -o size=4k,ro treb-hidden "$e"
      elif [[ -e $e && ! -L $e ]]; then mount --bind /dev/null "$e"; fi || die "cannot hide $rel"
    done <"$S/hide"
    if [[ $home == /?* && "$home/" == "$sub/"* ]]; then
      for e in "./$home"/.[!.]* "./$home"/..?*; do  # HOME's dotfiles: ~/.ssh, ~/.netrc...
        if [[ -L $e ]]; then continue
        elif [[ -d $e ]]; then mount -t tmpfs -o size=4k,ro treb-hidden "$e" || die "cannot hide $e"
        elif [[ -e $e ]]; then mount --bind /dev/null "$e" || die "cannot hide $e"; fi
      done
    fi
    { [[ -f ./$script ]] || : >"./$script"; } && mount --bind "$S/script" "./$script" ||
      die "cannot place the script"
  fi
  if [[ -d $run_dir && ! -d ./$run_dir ]]; then
    mkdir -p "./$run_dir" 2>/dev/null && mount --bind .treb/cwd "./$run_dir"
  fi
  mkfifo .tick && mkdir .old && pivot_root . .old && umount -l /.old && rmdir /.old &&
    mount -o remount,bind,ro / || die "cannot enter the sandbox's root"
  : 2>/dev/null >/.treb-probe && die "/ is writable"
  cd "$run_dir" 2>/dev/null || cd "${sub:-/tmp}" 2>/dev/null || cd /tmp
  ulimit -c 0 -f "$TREB_ORACLE_FSIZE_K" -v "$TREB_ORACLE_MEM_K" -u "$TREB_ORACLE_NPROC" ||
    die "cannot set the limits"
  # CAP_SETFCAP alone, in this user namespace: the kernel's condition for mapping root in
  # the nested one (the script's, where it has none and cannot reach this process).
  exec "$TREB_ORACLE_SETPRIV" --bounding-set=-all,+setfcap --inh-caps=-all \
    --ambient-caps=-all --no-new-privs -- /bin/bash --noprofile --norc "$S/inner.sh" run "$S" \
    "$script"
fi
# stage run: pid 1, no capability but CAP_SETFCAP; the script in a nested user and mount
# namespace (its mounts locked), with none.
S=$2 script=$3 unshare=$TREB_ORACLE_UNSHARE setpriv=$TREB_ORACLE_SETPRIV
max=$((TREB_ORACLE_NPROC / 2))
(
  unset $(compgen -e)
  while IFS= read -r -d '' kv; do export "$kv" 2>/dev/null; done <"$S/env"
  exec "$unshare" --user --map-root-user --mount -- "$setpriv" --bounding-set=-all \
    --inh-caps=-all --ambient-caps=-all --no-new-privs -- /bin/bash --noprofile --norc "$script"
) </dev/null >/.treb/out 2>/.treb/err &
pid=$!
exec {tick}<>/.tick
while kill -0 "$pid" 2>/dev/null; do
  procs=(/proc/[0-9]*)
  if ((${#procs[@]} > max)); then
    echo "treb-oracle-flood: more than $max processes" >&2
    break
  fi
  read -r -t 0.01 -u "$tick" _
done
kill -9 -1 2>/dev/null
wait "$pid"
status=$?
# A sparse file costs the scratch tmpfs nothing and reads back whole: the tar is cut at
# what the tmpfs can hold (a cut tar keeps its entries before the cut).
cd /.treb && tar -cf - rec notes out err argv 2>/dev/null | head -c "$TREB_ORACLE_TAR_MAX"
exit "$status"
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
    derived: dict[str, str] = field(default_factory=dict)  # env name -> the secret it varies with
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


def sandbox_command() -> list[str]:
    """unshare with the namespaces of the sandbox's outer stage; a UserError where the tools
    it needs are missing (then nothing of the script runs)."""
    unshare = shutil.which("unshare")
    if not unshare:
        raise UserError(
            "treb import sbatch runs the script in a sandbox made with `unshare` (util-linux), "
            "which is not on PATH: refusing to run the script without it"
        )
    cmd = [unshare, "--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc"]
    return [*cmd, "--uts", "--fork", "--kill-child"]


def _system_tool(name: str) -> str:
    """A program the sandbox runs inside itself, by absolute path from the system folders
    (the only ones it sees), never from a PATH a script or a user set."""
    for folder in SYSTEM_PATH.split(":"):
        path = f"{folder}/{name}"
        if os.access(path, os.X_OK):
            return path
    raise UserError(
        f"treb import sbatch needs `{name}` (util-linux) in {SYSTEM_PATH} to make its sandbox: "
        "refusing to run the script without it"
    )


def refuse_deep_nesting(script: Path, text: str, limit: int = MAX_NESTING) -> None:
    """bash's parser recurses once per nested `$(`, `(` or `{` and crashes (SIGSEGV) past a
    few thousand: such a script is refused by name before bash reads it."""
    depth = 0
    line = 1
    for ch in text:
        if ch in "({":
            depth += 1
            if depth > limit:
                raise UserError(
                    f"{script}:{line}: more than {limit} nested `$(`, `(` or `{{`: "
                    "not a batch script (bash itself would crash reading it)"
                )
        elif ch in ")}":
            depth = max(0, depth - 1)
        elif ch == "\n":
            line += 1


@dataclass
class _Run:
    """What one sandbox run handed back: the script's exit status, the files of its record
    folder (regular files only, bounded), and what the sandbox's own stages said."""

    status: int
    files: dict[str, bytes]
    said: str


def _sandbox(
    scratch: Path,
    script_text: str,
    env: dict[str, str],
    *,
    folder: str = "",
    script: str = "",
    run_dir: str = "/tmp",
    home: str = "",
    what: str,
) -> _Run:
    """Run `script_text` (at `script`, in `folder` seen copy-on-write; else from the scratch
    folder) with exactly `env` in the locked sandbox. Recorded values never become the
    environment of a process outside it: they are read from a file inside."""
    cmd = sandbox_command()
    setpriv = _system_tool("setpriv")
    unshare_in = _system_tool("unshare")
    bash = _system_tool("bash")
    (scratch / "root").mkdir()
    (scratch / "inner.sh").write_text(INNER)
    (scratch / "script").write_text(script_text, errors="surrogateescape")
    blob = b"".join(
        f"{k}={v}".encode("utf-8", "surrogateescape") + b"\0"
        for k, v in env.items()
        if NAME_RE.fullmatch(k) and "\0" not in v
    )
    (scratch / "env").write_bytes(blob)
    hide = hidden_files(folder) if folder else []
    (scratch / "hide").write_bytes(b"".join(os.fsencode(h) + b"\0" for h in hide))
    fixed = {
        "PATH": SYSTEM_PATH,
        "LANG": "C.UTF-8",
        "TREB_ORACLE_DISK": f"{DISK_BYTES // 1024}k",
        "TREB_ORACLE_TAR_MAX": str(TAR_BYTES),
        "TREB_ORACLE_FSIZE_K": str(MAX_OUTPUT // 1024),
        "TREB_ORACLE_MEM_K": str(MEMORY_BYTES // 1024),
        "TREB_ORACLE_NPROC": str(MAX_PROCS),
        "TREB_ORACLE_ETC": " ".join(ETC_ALLOWED),
        "TREB_ORACLE_SETPRIV": setpriv,
        "TREB_ORACLE_UNSHARE": unshare_in,
    }
    argv = [*cmd, bash, "--noprofile", "--norc", str(scratch / "inner.sh"), "make"]
    argv += [str(scratch), folder, run_dir, script or str(scratch / "script"), home]
    try:
        done = subprocess.run(
            argv,
            env=fixed,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=TIMEOUT_S,
            close_fds=True,
        )
    except subprocess.TimeoutExpired:
        raise UserError(
            f"{what}: the script did not finish within {TIMEOUT_S} s in the import "
            "sandbox (a loop waiting for something that never comes?)"
        ) from None
    said = done.stderr.decode("utf-8", "replace").strip()
    if "treb-oracle-flood:" in said:
        raise UserError(
            f"{what}: the script started more than {MAX_PROCS // 2} processes at once in the "
            "import sandbox (a fork flood?): ended, nothing recorded"
        )
    if not done.stdout:
        why = (said.splitlines() or ["no detail"])[-1]
        raise UserError(
            "treb import sbatch cannot make its sandbox (private user, mount and network "
            f"namespaces) on this machine: {why}; refusing to run the script outside it "
            "(unprivileged user namespaces may be disabled: kernel.unprivileged_userns_clone)"
        )
    return _Run(done.returncode, _members(done.stdout), said)


def hidden_files(folder: str) -> list[str]:
    """Paths (relative to `folder`, HIDE_DEPTH deep at most) whose names say they hold
    credentials: the script never sees them (nor a symlink's target, which is not followed)."""
    out: list[str] = []
    seen = 0
    for top, dirs, files in os.walk(folder):
        rel = os.path.relpath(top, folder)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        for name in [*dirs, *files]:
            seen += 1
            if any(fnmatch.fnmatch(name.lower(), pat) for pat in CREDENTIAL_FILES):
                out.append(name if rel == "." else os.path.join(rel, name))
        dirs[:] = [d for d in dirs if depth < HIDE_DEPTH and not
                   any(fnmatch.fnmatch(d.lower(), pat) for pat in CREDENTIAL_FILES)]  # fmt: skip
        if seen > HIDE_MAX:
            break
    return out


def _members(data: bytes) -> dict[str, bytes]:
    """The regular files of the sandbox's tar (FIFOs, links and devices the script planted
    are skipped, never opened), each and all bounded."""
    out: dict[str, bytes] = {}
    left = DISK_BYTES
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tf:
            for m in tf:
                if len(out) >= MAX_FILES:
                    break
                if not m.isreg():
                    continue
                f = tf.extractfile(m)
                if f is not None:
                    out[m.name] = f.read(min(MAX_OUTPUT, left))
                    left -= len(out[m.name])
    except (tarfile.TarError, OSError, EOFError):
        pass  # what was read before a damaged entry is kept
    return out


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
    task simulated. `text`: run this instead of the file's text (a template with its
    placeholders replaced), at the file's path."""
    if text is None:
        with open(script, "rb") as f:
            text = f.read(MAX_OUTPUT).decode("utf-8", "replace")
    refuse_deep_nesting(script, text)
    folder = str(script.resolve().parent)
    if folder in SHARED_FOLDERS or folder.startswith(SYSTEM_FOLDERS):
        raise UserError(
            f"{script}: the import sandbox shows the script's folder ({folder}) to it, and "
            "that one holds the files of the system or of other users: put the script in a "
            "folder of its own"
        )
    with tempfile.TemporaryDirectory(prefix="treb-import-") as tmp:
        scratch = Path(tmp).resolve()
        bin_dir = scratch / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "_shim"
        shim.write_text(SHIM)
        shim.chmod(0o755)
        for tool in TOOLS:
            (bin_dir / tool).symlink_to("_shim")
        prelude = scratch / "prelude.sh"
        prelude.write_text(PRELUDE)
        run_script = script.resolve()
        env = {
            "PATH": ":".join([str(bin_dir), SYSTEM_PATH]),
            "HOME": os.environ.get("HOME", "/root"),
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp/treb-import-tmp",
        }
        for name in ENV_ALLOWED:
            if name in os.environ:
                env[name] = os.environ[name]
        env.update({k: v for k, v in os.environ.items() if k.startswith("LC_")})
        env.update(slurm_env)
        env.update(passed)
        baseline = dict(env)
        control = {
            "TREB_ORACLE_DIR": RECORD_DIR,
            "TREB_ORACLE_BIN": str(bin_dir),
            "TREB_ORACLE_PRELUDE": str(prelude),
            "TREB_ORACLE_TOOLS": " ".join(TOOLS),
            "TREB_ORACLE_WRAPPERS": "|".join(WRAPPERS),
            "TREB_ORACLE_WRAPPED": "[[:space:]][^[:space:]]*/("
            + "|".join(re.escape(t) for t in TOOLS)
            + ")([[:space:]]|$)",
            "TREB_ORACLE_SRUN_FLAGS": SRUN_FLAGS,
            "TREB_ORACLE_SRUN_SHORT": SRUN_SHORT_FLAGS,
            "TREB_ORACLE_HOSTS": " ".join(
                HOST.format(i) for i in range(int(slurm_env["SLURM_NNODES"]))
            ),
            "TREB_ORACLE_TASKS": " ".join(tasks),
            "TREB_ORACLE_TOP": "1",
            "TREB_ORACLE_CWD": cwd,
            "BASH_ENV": str(prelude),
        }
        run = _sandbox(
            scratch,
            text,
            {**env, **control},
            folder=str(run_script.parent),
            script=str(run_script),
            run_dir=cwd if os.path.isdir(cwd) else str(run_script.parent),
            home=env["HOME"],
            what=str(script),
        )
    if run.status - 128 in CRASHES:
        raise UserError(
            f"{script}: the script (bash, or the last command it ran) ended by "
            f"{CRASHES[run.status - 128]} in the import sandbox (exit {run.status}): "
            "nothing reliable was recorded"
        )
    rec = Recording(
        calls=_calls(run.files),
        baseline=baseline,
        status=run.status,
        stderr=_text(run.files.get("err", b""), 1 << 20),
        hosts=control["TREB_ORACLE_HOSTS"].split(),
        bin_dir=str(bin_dir),
    )
    for row in _text(run.files.get("notes", b""), 1 << 20).splitlines()[:MAX_NOTES]:
        note = _note(row)
        if note:
            rec.notes.append(note)
    for rel in hidden_files(str(run_script.parent)):
        shown_rel = "".join(c if c.isprintable() else repr(c)[1:-1] for c in rel)
        rec.notes.append(
            (None, f"{shown_rel}: hidden from the import sandbox (its name says it holds "
             "credentials): what the script reads from it was not seen by the import")
        )  # fmt: skip
    return rec


def _note(row: str) -> tuple[int | None, str] | None:
    """One row of the notes file: `LINE<TAB>KIND<TAB>WORDS`, KIND one of NOTES. The script
    can write that file too, but only these sentences exist, with its words shown as
    text: a forged row says no more than the script running that command would."""
    line, _, rest = row.partition("\t")
    kind, _, words = rest.partition("\t")
    if kind not in NOTES or (line and not line.isdigit()):
        return None
    words = "".join(c if c.isprintable() else repr(c)[1:-1] for c in words[:300])
    return (int(line) if line else None), NOTES[kind].format(words)


def _text(data: bytes, limit: int) -> str:
    return data[:limit].decode("utf-8", "replace")


def _nul(data: bytes) -> list[str]:
    items = data.decode("utf-8", "surrogateescape").split("\0")
    return items[:-1] if items and items[-1] == "" else items


def _calls(files: dict[str, bytes]) -> list[Call]:
    """The recorded calls, in the order they were made (the folders' names start with the
    time); an entry without its three regular files (a shim killed half-way, or something
    the script planted) is skipped."""
    names = sorted({n.split("/")[1] for n in files if n.startswith("rec/") and n.count("/") == 2})
    out = []
    for name in names:
        at = f"rec/{name}/"
        if not all(at + k in files for k in ("meta", "argv", "env")):
            continue
        meta = _nul(files[at + "meta"])
        if len(meta) != 6:
            continue
        tool, line, parent, task, cwd, sub = meta
        env = {}
        for item in _nul(files[at + "env"]):
            key, eq, value = item.partition("=")
            if eq and NAME_RE.fullmatch(key):
                env[key] = value
        out.append(
            Call(
                id=f"{RECORD_DIR}/{at[:-1]}",
                tool=tool,
                argv=_nul(files[at + "argv"]),
                env=env,
                cwd=cwd,
                line=int(line) if line.isdigit() else None,
                parent=parent or None,
                task=int(task) if task.isdigit() else None,
                in_subst=sub not in ("", "0"),
                out=_text(files.get(at + "task0.out", b""), 4096),
                err=_text(files.get(at + "task0.err", b""), 4096),
            )
        )
    return out


def argv_in_sandbox(command: str, env: dict[str, str]) -> list[str]:
    """The argv bash gives the first command of `command` (a spec's command string), got
    in the same locked sandbox: the imported command's round trip against the recorded
    one. `env`'s values are data: shell variables set from the script file inside, never
    the environment of a process (the sandbox's own environment is fixed)."""
    lines = ["__treb_argv() { printf '%s\\0' \"$@\" >" + RECORD_DIR + "/argv; exit 0; }"]
    for name, value in env.items():
        if NAME_RE.fullmatch(name) and "\0" not in value:
            lines.append(f"declare -- {name}={shlex.quote(value)} 2>/dev/null")
    lines.append("__treb_argv " + command)
    with tempfile.TemporaryDirectory(prefix="treb-import-check-") as tmp:
        run = _sandbox(
            Path(tmp).resolve(),
            "\n".join(lines) + "\n",
            {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8"},
            what="the imported command",
        )
    if run.status != 0 or "argv" not in run.files:
        return []
    return _nul(run.files["argv"])

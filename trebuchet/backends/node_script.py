"""The per-node shell script that engines we do not supervise run (SkyPilot `run:`, the
Kubernetes pod command): it starts the spec's launcher with the contract's variables.

Every value from the spec is shell-quoted; the engine-specific head sets NODE_RANK,
NUM_NODES, MASTER_ADDR and MASTER_PORT.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from trebuchet.errors import UserError
from trebuchet.launcher.plan import NSYS_WRAPPER

SECRET_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def command_words(command: str | list[str]) -> str:
    """The spec's command as shell words: a string runs in bash, a list as is."""
    if isinstance(command, str):
        return "bash -c " + shlex.quote(command)
    return shlex.join(command)


def env_with_secrets(value: str, secrets: list[str]) -> str:
    """A shell word for an env value whose ${SECRET} references resolve on the node."""
    out, pos = [], 0
    for m in SECRET_REF.finditer(value):
        if m.group(1) not in secrets:
            continue
        if m.start() > pos:
            out.append(shlex.quote(value[pos : m.start()]))
        out.append('"${' + m.group(1) + '}"')
        pos = m.end()
    if pos < len(value) or not out:
        out.append(shlex.quote(value[pos:]))
    return "".join(out)


def check_common(spec: Any, source: str, engine: str) -> None:
    """What neither SkyPilot nor Kubernetes rendering can express."""
    if spec.launcher in ("mpirun", "horovod"):
        raise UserError(
            f"{source}: launcher: {spec.launcher} is not rendered for {engine}; "
            "use native, torchrun or none"
        )
    if spec.gpus_per_node == -1:
        raise UserError(
            f"{source}: gpus_per_node: -1 (all visible) has no {engine} "
            "equivalent: give the number of GPUs per node"
        )


def node_script(spec: Any, head: list[str], prelude: list[str] | None = None) -> str:
    """Lines after `head` are the same on every engine: env, launcher, exit status."""
    ppn = spec.ranks_per_node
    lines = ["# trebuchet: launcher " + spec.launcher + f", {ppn} rank(s) per node", *head]
    lines.append('export GROUP_RANK="$NODE_RANK" PYTHONUNBUFFERED=1')
    for name, value in spec.env.items():
        if SECRET_REF.search(value) and any(s in value for s in spec.secrets):
            lines.append(f"export {name}={env_with_secrets(value, list(spec.secrets))}")
    if spec.launcher != "none" and "OMP_NUM_THREADS" not in spec.env:
        lines.append(
            f'[ -n "${{OMP_NUM_THREADS:-}}" ] || export OMP_NUM_THREADS=$(( '
            f"$(nproc) / {ppn} > 0 ? $(nproc) / {ppn} : 1 ))"
        )
    lines += prelude or []
    cmd = command_words(spec.command)
    if spec.profile == "nsys":  # as on the other backends: nsys wraps the selected ranks
        cmd = f"bash -c {shlex.quote(NSYS_WRAPPER)} treb-nsys {cmd}"
    if spec.profile == "torch":
        lines.append('export TREB_TORCH_PROFILE_DIR="$TREB_RUN_DIR/profile/torch"')
    if spec.profile_ranks is not None:
        ranks = " ".join(str(r) for r in spec.profile_ranks)
        lines.append(f"export TREB_PROFILE_RANKS={shlex.quote(ranks)}")
    if spec.timeout:
        grace = max(1, int(spec.grace_period))
        cmd = f"timeout --kill-after={grace} {int(-(-spec.timeout // 1))} {cmd}"
    if spec.launcher == "torchrun":
        lines.append(
            f'exec torchrun --nnodes "$NUM_NODES" --node_rank "$NODE_RANK" --nproc_per_node '
            f'{ppn} --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" --no-python ' + cmd
        )
    elif spec.launcher == "none":
        lines.append(f"export LOCAL_WORLD_SIZE={ppn}")
        lines.append(f"exec {cmd}")
    else:
        lines += _native(ppn, cmd)
    return "\n".join(lines) + "\n"


def _native(ppn: int, cmd: str) -> list[str]:
    """One process per rank, each its own process group; the first failure stops the rest."""
    return [
        "set -m  # each rank in its own process group",
        'treb_dir=$(mktemp -d) treb_pids=""',
        f"for LOCAL_RANK in $(seq 0 {ppn - 1}); do",
        f"  RANK=$((NODE_RANK * {ppn} + LOCAL_RANK))",
        f"  (export LOCAL_RANK RANK WORLD_SIZE=$((NUM_NODES * {ppn})) LOCAL_WORLD_SIZE={ppn} "
        f'GROUP_WORLD_SIZE="$NUM_NODES" ROLE_RANK="$RANK" ROLE_WORLD_SIZE=$((NUM_NODES * {ppn}))',
        f'   {cmd}; echo $? > "$treb_dir/$LOCAL_RANK") &',
        '  treb_pids="$treb_pids $!"',
        "done",
        "treb_rc=0",
        "while :; do",
        "  treb_done=0",
        '  for f in "$treb_dir"/*; do',
        '    [ -e "$f" ] || continue',
        '    treb_done=$((treb_done + 1)) treb_r=$(cat "$f")',
        '    [ "$treb_r" != 0 ] && [ "$treb_rc" = 0 ] && treb_rc=$treb_r',
        "  done",
        f'  [ "$treb_rc" != 0 ] || [ "$treb_done" -ge {ppn} ] && break',
        "  sleep 1",
        "done",
        'if [ "$treb_rc" != 0 ]; then',
        '  for p in $treb_pids; do kill -TERM -- -"$p" 2>/dev/null; done',
        "fi",
        "wait",
        'rm -rf "$treb_dir"',
        'exit "$treb_rc"',
    ]

"""One launcher, not two: the command must not start its own ranks under a launcher that
already does (seed 004: ntasks-per-node=8 with torchrun --nproc_per_node=8 gave 64
processes per node and EADDRINUSE), and launcher none must have something that does.
"""

from __future__ import annotations

from trebuchet.preflight import command as cmd
from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import ERROR, WARNING, Finding


def found_launchers(ctx: Context) -> list[str]:
    """Launchers the command starts, directly or in a shell script of the workdir."""
    ws = cmd.words(cmd.command_text(ctx.spec.command))
    found = cmd.launchers(ws)
    for name, text in cmd.scripts(ws, ctx.loaded.workdir):
        found += [f"{launcher} (in {name})" for launcher in cmd.launchers(cmd.words(text))]
    return found


def nested_launchers(ctx: Context) -> list[Finding]:
    spec = ctx.spec
    found = found_launchers(ctx)
    n = spec.ranks_per_node
    if spec.launcher == "none":
        if found or not spec.procs_per_node or spec.procs_per_node < 2:
            return []
        return [
            ctx.finding(
                "no-launcher-for-procs",
                WARNING,
                f"launcher none starts the command once per node, but procs_per_node is "
                f"{n} and the command starts no launcher (torchrun, ...): only one process "
                "per node would run unless your program spawns the others itself",
                "use `launcher: native` (trebuchet starts the ranks) or start them in the "
                "command, e.g. `torchrun --nproc_per_node $LOCAL_WORLD_SIZE ...`",
                "launcher",
            )
        ]
    if not found:
        return []
    inner = found[0]
    if spec.launcher == "torchrun":
        return [
            ctx.finding(
                "launcher-in-torchrun",
                ERROR,
                f"launcher is torchrun and the command starts {inner} too: each of the {n} "
                f"workers per node would start its own workers ({n} x their count per node), "
                "fighting over GPUs and ports (EADDRINUSE)",
                "keep one: `launcher: none` to run the command's own launcher once per node, "
                f"or remove {inner.split(' (')[0]} from the command",
                "command",
            )
        ]
    severity = ERROR if n > 1 else WARNING
    effect = (
        f"each of the {n} ranks per node would start its own workers ({n} x their count "
        "per node), fighting over GPUs and the rendezvous port (EADDRINUSE, seed 004)"
        if n > 1
        else "it works only by accident: the rank variables trebuchet sets are replaced "
        "by the inner launcher's"
    )
    return [
        ctx.finding(
            "launcher-in-command",
            severity,
            f"launcher is {spec.launcher} and the command starts {inner}: {effect}",
            "set `launcher: none` so the command's launcher runs once per node "
            "(NODE_RANK, NUM_NODES, MASTER_ADDR and MASTER_PORT are set for it), or drop "
            f"{inner.split(' (')[0]} and let `launcher: {spec.launcher}` start the ranks",
            "command",
        )
    ]


def torchrun_nnodes(ctx: Context) -> list[Finding]:
    """launcher none + torchrun --nnodes N: N must be the number of nodes that run it."""
    spec = ctx.spec
    if spec.launcher != "none":
        return []
    ws = cmd.words(cmd.command_text(spec.command))
    if not any(cmd.is_torchrun(x) for x in cmd.launchers(ws)):
        return []
    nnodes = cmd.as_int(cmd.option(ws, ("nnodes",)), spec.env)
    if nnodes is None or nnodes == spec.nodes:
        return []
    return [
        ctx.finding(
            "torchrun-nnodes-mismatch",
            ERROR,
            f"the command's torchrun --nnodes {nnodes} but the spec runs it on nodes "
            f"{spec.nodes}: the rendezvous would wait for nodes that never come (or leave "
            "nodes out) until it times out",
            "write `--nnodes $NUM_NODES --node_rank $NODE_RANK --master_addr $MASTER_ADDR "
            "--master_port $MASTER_PORT` (trebuchet sets them for launcher none)",
            "command",
        )
    ]

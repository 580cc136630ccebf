"""Model-parallel sizes from the workload's own arguments must divide the world size.

Megatron (and NeMo / Megatron Bridge overrides) refuse at start-up, after the queue wait
and the allocation, when tensor x pipeline x context parallel sizes do not divide the
number of ranks; expert parallelism needs expert-tensor x expert x pipeline to divide it.
"""

from __future__ import annotations

from trebuchet.preflight import command as cmd
from trebuchet.preflight.context import Context
from trebuchet.preflight.findings import ERROR, Finding


def _names(long: str, *short: str) -> tuple[str, ...]:
    return (long, long.replace("-", "_"), *short)


SIZES = {
    "tp": _names("tensor-model-parallel-size", "tensor-parallel-size", "tensor_parallel_size",
                 "tp", "tp-size", "tp_size"),
    "pp": _names("pipeline-model-parallel-size", "pipeline-parallel-size",
                 "pipeline_parallel_size", "pp", "pp-size", "pp_size"),
    "cp": _names("context-parallel-size", "cp", "cp-size", "cp_size"),
    "ep": _names("expert-model-parallel-size", "expert-parallel-size", "expert_parallel_size",
                 "ep", "ep-size", "ep_size"),
    "etp": _names("expert-tensor-parallel-size", "etp"),
}  # fmt: skip


def world_shape(ctx: Context, ws: list[str]) -> tuple[int, int] | None:
    """(nodes, ranks per node) of the job, when the spec (or the command's torchrun) says."""
    spec = ctx.spec
    if spec.launcher != "none":
        return spec.nodes, spec.ranks_per_node
    if not any(cmd.is_torchrun(x) for x in cmd.launchers(ws)):
        return None  # the command's own process count is unknown
    nproc = cmd.option(ws, ("nproc_per_node", "nproc-per-node"))
    per_node = cmd.as_int(nproc, spec.env)
    if per_node is None and nproc in ("gpu", "auto") and spec.gpus_per_node > 0:
        per_node = spec.gpus_per_node
    nnodes = cmd.as_int(cmd.option(ws, ("nnodes",)), spec.env) or spec.nodes
    return (nnodes, per_node) if per_node else None


def parallel_sizes(ctx: Context) -> list[Finding]:
    spec = ctx.spec
    ws = cmd.words(cmd.command_text(spec.command))
    sizes = {k: cmd.as_int(cmd.option(ws, names), spec.env) for k, names in SIZES.items()}
    if not any(sizes[k] for k in ("tp", "pp", "cp", "ep")):
        return []
    shape = world_shape(ctx, ws)
    if not shape:
        return []
    nodes, per_node = shape
    world = nodes * per_node
    tp, pp, cp = sizes["tp"] or 1, sizes["pp"] or 1, sizes["cp"] or 1
    shown = " x ".join(f"{k.upper()} {sizes[k]}" for k in ("tp", "pp", "cp") if sizes[k])
    text = f"world size {world} ({nodes} node(s) x {per_node})"
    if world % (tp * pp * cp):
        model = tp * pp * cp
        if " x " in shown:
            shown += f" = {model}"
        return [_finding(ctx, f"{shown} does not divide the {text}", model, per_node)]
    ep = sizes["ep"]
    if ep:
        etp = sizes["etp"] or tp
        group = etp * ep * pp
        if world % group:
            what = f"expert-tensor {etp} x expert {ep} x pipeline {pp} = {group}"
            return [_finding(ctx, f"{what} does not divide the {text}", group, per_node)]
    return []


def _finding(ctx: Context, what: str, group: int, per_node: int) -> Finding:
    fits = [n for n in range(1, 65) if n * per_node % group == 0]
    hint = f"e.g. nodes: {fits[0]}" if fits else "a multiple of it"
    return ctx.finding(
        "parallel-size-mismatch",
        ERROR,
        f"the command's parallel sizes: {what}; Megatron would refuse at start-up, after the "
        "queue wait",
        f"make the world size (nodes x procs per node) a multiple of {group} ({hint}), or "
        "change the parallel sizes",
        "command",
    )

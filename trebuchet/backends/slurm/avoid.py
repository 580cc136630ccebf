"""Nodes with a bad history across runs (store/nodes.py, docs/nodes.md) kept off a new
job: one `#SBATCH --exclude` line after the spec's own, holding the spec's excludes too
(sbatch takes the last --exclude), never a node the spec asks for (`allow_nodes`, or
named by `--nodelist` in slurm.sbatch_args: Slurm refuses a node both listed and
excluded). Host names come from the index, checked against Slurm's node-name rules when
they were recorded, so a line never holds anything but `[A-Za-z0-9._-]` and commas."""

from __future__ import annotations

import sys
from typing import Any

from trebuchet.backends.slurm import argv as slurm_argv
from trebuchet.backends.slurm.script import _directive
from trebuchet.store.db import Store
from trebuchet.store.node_events import valid_host
from trebuchet.store.nodes import avoided, note


def _asked(spec: Any) -> tuple[set[str], str | None]:
    """(the nodes the spec asks for by name, its own --exclude value or None)."""
    from trebuchet.runtime.contracts.rank_env import expand_hostlist

    options, _ = slurm_argv.parse(list(spec.slurm.sbatch_args))
    named = set(spec.allow_nodes)
    exclude = None
    for opt in options:
        if opt.name == "nodelist" and opt.value:
            named.update(expand_hostlist(opt.value))
        elif opt.name == "exclude" and opt.value:
            exclude = opt.value
    return named, exclude


def exclude(spec: Any, store: Store | None = None, say: bool = True) -> tuple[list[str], list[str]]:
    """(the `#SBATCH --exclude` line for the avoided nodes, those nodes); ([], []) when none.
    `say`: the note on stderr (once per submission or render)."""
    named, own = _asked(spec)
    skipped = [n for n in avoided(named, store) if valid_host(n.host)]
    if not skipped:
        return [], []
    if say:
        print(note(skipped, "sbatch --exclude"), file=sys.stderr)
    hosts = ",".join(n.host for n in skipped)
    line = _directive("--exclude", f"{own},{hosts}" if own else hosts)
    return [line], [n.host for n in skipped]

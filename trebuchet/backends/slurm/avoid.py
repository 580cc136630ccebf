"""Nodes with a bad history across runs (store/nodes.py, docs/nodes.md) kept off a new
job: one `#SBATCH --exclude` line after the spec's own, holding the spec's excludes too
(sbatch takes the last --exclude), never a node the spec asks for (`allow_nodes`, or
named by `--nodelist` in slurm.sbatch_args: Slurm refuses a node both listed and
excluded). Host names come from the index, checked against Slurm's node-name rules when
they were recorded, so a line never holds anything but `[A-Za-z0-9._-]` and commas."""

from __future__ import annotations

import re
import sys
from typing import Any

from trebuchet.backends.slurm import argv as slurm_argv
from trebuchet.backends.slurm.script import _directive
from trebuchet.errors import UserError
from trebuchet.runtime.rundir.regular import read_text
from trebuchet.store.db import Store
from trebuchet.store.node_events import valid_host
from trebuchet.store.nodes import avoided, note

MAX_HOSTS = 100_000  # a hostlist longer than this is no partition's (and not expanded)
NUMBER = re.compile(r"[0-9]{1,18}")  # a range's bound (int() of '²' or 5000 digits raises)


def _as_hosts(opt: slurm_argv.Option) -> str:
    """An --exclude or --nodelist value as the hostlist sbatch reads: a value holding `/` is
    a file of host names (sbatch's rule), read here as sbatch would read it."""
    value = opt.value or ""
    if "/" not in value:
        return value
    try:
        text = read_text(value, 1 << 20)
    except OSError as exc:
        why = f"sbatch reads {value!r} as a file of host names: {exc.strerror or exc}"
        raise UserError(f"slurm.sbatch_args item {opt.item} ({opt.text}): {why}") from None
    return ",".join(text.split())  # a name per line or word, as sbatch joins them


def _expand(opt: slurm_argv.Option, hostlist: str) -> list[str]:
    """The hosts of a Slurm hostlist, or a named error (unbalanced brackets, a range that
    is no numbers, more than MAX_HOSTS hosts, which would not be expanded in memory)."""
    from trebuchet.runtime.contracts.rank_env import expand_hostlist

    size = 0
    for item in re.split(r",(?![^\[]*\])", hostlist):
        count = 1
        for ranges in re.findall(r"\[([^\[\]]*)\]", item):
            spans = [p.partition("-") for p in ranges.split(",")]
            if not all(NUMBER.fullmatch(lo) and NUMBER.fullmatch(hi or lo) for lo, _, hi in spans):
                count = -1
                break
            count *= sum(max(0, int(hi or lo) - int(lo) + 1) for lo, _, hi in spans)
        size = -1 if count < 0 or size < 0 else size + count
    why = "more than 100000 hosts" if size > MAX_HOSTS else "not a Slurm hostlist"
    if 0 <= size <= MAX_HOSTS and hostlist.count("[") == hostlist.count("]"):
        try:
            return expand_hostlist(hostlist)
        except Exception as exc:  # python-hostlist's BadHostlist, the fallback's ValueError
            why = f"not a Slurm hostlist ({exc})"
    raise UserError(f"slurm.sbatch_args item {opt.item} ({opt.text}): {why}")


def _asked(spec: Any) -> tuple[set[str], str | None]:
    """(the nodes --nodelist names, the spec's own --exclude hosts or None)."""
    options, _ = slurm_argv.parse(list(spec.slurm.sbatch_args))
    named: set[str] = set()
    exclude = None
    for opt in options:
        if opt.name == "nodelist" and opt.value:
            named.update(_expand(opt, _as_hosts(opt)))
        elif opt.name == "exclude" and opt.value:
            exclude = _as_hosts(opt)
    return named, exclude


def exclude(spec: Any, store: Store | None = None, say: bool = True) -> tuple[list[str], list[str]]:
    """(the `#SBATCH --exclude` line for the avoided nodes, those nodes); ([], []) when none.
    `say`: the note on stderr (once per submission or render)."""
    skipped = [n for n in avoided(spec.allow_nodes, store) if valid_host(n.host)]
    # sbatch_args read only then: a spec that avoids nothing renders as before
    named, own = _asked(spec) if skipped else (set(), None)
    skipped = [n for n in skipped if n.host not in named]
    if not skipped:
        return [], []
    if say:
        print(note(skipped, "sbatch --exclude"), file=sys.stderr)
    hosts = ",".join(n.host for n in skipped)
    line = _directive("--exclude", f"{own},{hosts}" if own else hosts)
    return [line], [n.host for n in skipped]

"""`slurm.sbatch_args` read the way sbatch reads its #SBATCH lines: all of them form one
argv that getopt_long parses, so `-o/tmp/x`, `--output /tmp/x`, `--outp=/tmp/x` (a unique
prefix) and `-vJx` (a cluster of short options) all set --output or --job-name. The table is
sbatch's own (Slurm 22.05, src/common/slurm_opt.c); an option it does not know (a SPANK
plugin's, such as pyxis's --container-image) is passed through.
"""

from __future__ import annotations

from dataclasses import dataclass

_NO_ARG = (
    "contiguous help hold ignore-pbs no-requeue overcommit oversubscribe parsable quiet reboot "
    "requeue spread-job test-only use-min-nodes usage verbose version wait"
)
_REQUIRED = (
    "account acctg-freq array batch bbf begin bb cluster-constraint chdir clusters cluster "
    "comment constraint container context core-spec cores-per-socket cpu-freq cpus-per-gpu "
    "cpus-per-task deadline delay-boot dependency distribution error exclude export "
    "export-file extra-node-info gid gpu-bind gpu-freq gpus gpus-per-node gpus-per-socket "
    "gpus-per-task gres gres-flags hint input job-name kill-on-invalid-dep licenses mail-type "
    "mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network nodefile "
    "nodelist nodes ntasks ntasks-per-core ntasks-per-node ntasks-per-socket ntasks-per-tres "
    "ntasks-per-gpu open-mode output partition power prefer priority profile qos reservation "
    "signal sockets-per-node switches tasks-per-node thread-spec threads-per-core time "
    "time-min tmp uid wait-all-nodes wckey wrap"
)
_OPTIONAL = "exclusive get-user-env nice no-kill propagate"
# name -> 0 no argument, 1 required, 2 optional (only as --name=value)
LONG = {
    **{n: 0 for n in _NO_ARG.split()},
    **{n: 1 for n in _REQUIRED.split()},
    **{n: 2 for n in _OPTIONAL.split()},
}
# getopt's optstring of sbatch ("x:" a value, "x::" an attached value only), and the long
# name of each short option.
SHORT_OPTS = "A:a:b:D:M:C:S:c:d:m:e:x:B:G:hHi:J:L:k::F:w:N:n:o:Osp:q:Qt:vVW"
SHORT_NAMES = {
    "A": "account",
    "a": "array",
    "b": "begin",
    "D": "chdir",
    "M": "clusters",
    "C": "constraint",
    "S": "core-spec",
    "c": "cpus-per-task",
    "d": "dependency",
    "m": "distribution",
    "e": "error",
    "x": "exclude",
    "B": "extra-node-info",
    "G": "gpus",
    "h": "help",
    "H": "hold",
    "i": "input",
    "J": "job-name",
    "L": "licenses",
    "k": "no-kill",
    "F": "nodefile",
    "w": "nodelist",
    "N": "nodes",
    "n": "ntasks",
    "o": "output",
    "O": "overcommit",
    "s": "oversubscribe",
    "p": "partition",
    "q": "qos",
    "Q": "quiet",
    "t": "time",
    "v": "verbose",
    "V": "version",
    "W": "wait",
}


@dataclass
class Option:
    """One option as sbatch would read it: its long name (or the text as written when
    sbatch's table does not know it), its value, the item it starts in and its spelling."""

    name: str
    value: str | None
    item: int
    text: str


def _short_arity(char: str) -> int | None:
    i = SHORT_OPTS.find(char)
    if i < 0 or char == ":":
        return None
    rest = SHORT_OPTS[i + 1 : i + 3]
    return 2 if rest == "::" else 1 if rest[:1] == ":" else 0


def resolve(name: str) -> tuple[str | None, list[str]]:
    """(long option, candidates) for `name` as getopt_long resolves it: an exact name, or
    the one option it is a prefix of (None and the candidates when several or none)."""
    if name in LONG:
        return name, [name]
    found = [n for n in LONG if n.startswith(name)]
    return (found[0] if len(found) == 1 else None), found


def words(item: str) -> list[str]:
    """The argv words sbatch gets from one item as script.py renders it: the text before
    the first `=` splits on whitespace, the value after it stays one word (it is quoted)."""
    flag, eq, value = item.partition("=")
    out = flag.split() or [""]
    if eq:
        out[-1] += "=" + value
    return out


def parse(items: list[str]) -> tuple[list[Option], list[tuple[int, str]]]:
    """The options in `items` and (item index, why) for what sbatch would refuse or misread."""
    tokens = [(i, word) for i, item in enumerate(items) for word in words(item)]
    out: list[Option] = []
    problems: list[tuple[int, str]] = []
    k = 0
    while k < len(tokens):
        i, word = tokens[k]
        k += 1
        nxt = tokens[k][1] if k < len(tokens) else None
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            full, cands = resolve(name)
            if full is None and len(cands) > 1:
                problems.append((i, f"{word}: ambiguous, could be --{', --'.join(cands[:6])}"))
                continue
            if full is not None:
                arity = LONG[full]
            else:  # unknown to sbatch's table: a plugin's option, passed through
                arity = 1 if not eq and nxt is not None and not nxt.startswith("-") else 0
            if eq and arity == 0 and full:
                problems.append((i, f"{word}: --{full} takes no value"))
                continue
            if not eq and arity == 1:
                if nxt is None:
                    problems.append((i, f"{word}: needs a value"))
                    continue
                value, k = nxt, k + 1
            out.append(Option(full or name, value if (eq or arity == 1) else None, i, word))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            j = 1
            while j < len(word):
                char = word[j]
                char_arity = _short_arity(char)
                j += 1
                if char_arity is None:
                    problems.append((i, f"{word}: -{char} is not an sbatch option"))
                    break
                if char_arity == 0:
                    out.append(Option(SHORT_NAMES[char], None, i, word))
                    continue
                attached = word[j:] or None
                if attached is None and char_arity == 1:
                    if nxt is None:
                        problems.append((i, f"{word}: -{char} needs a value"))
                        break
                    attached, k = nxt, k + 1
                out.append(Option(SHORT_NAMES[char], attached, i, word))
                break
        else:
            problems.append((i, f"{word!r}: not an option (one option per item, starting with -)"))
    return out, problems

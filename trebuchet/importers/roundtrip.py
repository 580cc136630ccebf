"""The imported spec checked before it is printed: its Slurm render is valid bash (bash -n,
and shellcheck at severity error where it is installed), and the argv bash gives its
command equals the argv the original script ran under the recording sandbox."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from trebuchet.errors import SpecError, UserError
from trebuchet.importers.common import ImportResult, bash_syntax
from trebuchet.importers.oracle import argv_in_sandbox

if TYPE_CHECKING:
    from trebuchet.importers.recorded import Workload


def check(res: ImportResult, work: Workload) -> None:
    """Exit 2 with the difference when the import is not faithful."""
    want = list(work.argv)  # the first node's address already as MASTER_ADDR (recorded.py)
    if work.shell_body:  # the command is the body itself: one argument to compare
        want, got = [work.argv[2].strip("\n")], [work.command_words.strip("\n")]
    else:
        got = argv_in_sandbox(work.command_words, work.env)
    if got != want:
        diff = [f"  argument {i}: recorded {w!r}, imported {g!r}" for i, (w, g) in
                enumerate(zip(want, got, strict=False)) if w != g]  # fmt: skip
        if len(want) != len(got):
            diff.append(f"  recorded {len(want)} arguments, imported {len(got)}")
        raise UserError(
            f"{res.source}:{work.line}: the imported command does not give the ranks the "
            "arguments the script gave them (a bug in treb import):\n" + "\n".join(diff[:10])
        )
    script = render(res, work.line)
    problems = shell_problems(script.split("\n# ---- ", 1)[0])  # the job.json shown after
    command = res.spec.get("command")
    for part in [command] if isinstance(command, str) else []:
        problems = problems or shell_problems(part, "command: ")
    for line in res.spec.get("slurm", {}).get("setup", []):
        problems = problems or shell_problems(line, "slurm.setup: ")
    if problems:
        raise UserError(
            f"{res.source}: the imported spec renders to a batch script bash rejects "
            "(a bug in treb import):\n" + problems
        )


@contextmanager
def _names_set(names: set[str]) -> Iterator[None]:
    """The spec's ${VAR} references and secrets, given a value for this render only."""
    missing = [n for n in names if n not in os.environ]
    for n in missing:
        os.environ[n] = "x"
    try:
        yield
    finally:
        for n in missing:
            os.environ.pop(n, None)


def render(res: ImportResult, line: int | None = None) -> str:
    """`treb render --on slurm` of the imported spec; a spec treb's loader refuses is a
    named error at the script's `line` (the main srun's)."""
    from trebuchet import runner

    text = res.to_yaml()
    names = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    names |= set(res.spec.get("secrets", []))
    with tempfile.TemporaryDirectory(prefix="treb-import-render-") as tmp:
        path = Path(tmp) / "job.yaml"
        path.write_text(text)
        with _names_set(names):
            try:
                return runner.render(str(path), "slurm")
            except SpecError as exc:  # e.g. a command past what one argument can hold
                said = [re.sub("^" + re.escape(str(path)) + r":\d+: ", "", p) for p in exc.problems]
                where = f"{res.source}:{line}" if line else res.source
                raise UserError(
                    f"{where}: what the script runs cannot be a spec: " + "; ".join(said)
                ) from None


def shell_problems(script: str, what: str = "") -> str:
    """What bash -n (and shellcheck -S error, where installed) say about a script; "" if
    nothing."""
    said = bash_syntax(script)
    if said is not None:
        return f"{what}bash -n: {said}"
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        done = subprocess.run([shellcheck, "-S", "error", "-s", "bash", "-"], input=script,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        if done.returncode != 0:
            return f"{what}shellcheck: " + done.stdout.strip()[:2000]
    return ""

"""The exit-time abort of torch 2.13 (issue 35, item 4), from the real program: two gloo
ranks that all-reduce, print, and return from main without `destroy_process_group()`. In
about half of its runs here a rank then aborts in the interpreter's shutdown (`terminate
called without an active exception`, SIGABRT), under torchrun too. The run is repeated
until one aborts (at most TRIES times: a run that never aborts in all of them is a
failure, since the reproduction itself would then be gone); that run's cause must be
`exit_abort` with the fix, not the generic `aborted`. With the fix, the same program
succeeds. The observable without torch, deterministically: tests/fast/test_exit_abort.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TrebFn, needs, status_json, write_spec

pytestmark = pytest.mark.integration
TRIES = 12

PROGRAM = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(20):
    dist.all_reduce(t)
print("done", dist.get_rank(), "sum", t.sum().item(), flush=True)
{end}
"""


def test_an_abort_at_exit_without_destroy_process_group_is_named(
    treb: TrebFn, tmp_path: Path
) -> None:
    needs("torch")
    (tmp_path / "ddp.py").write_text(PROGRAM.format(end=""))
    spec = write_spec(tmp_path, "command: python ddp.py\nprocs_per_node: 2\n"
                      "env: {PYTHONFAULTHANDLER: '1'}\n")  # fmt: skip
    for _ in range(TRIES):
        res = treb("run", str(spec))
        if res.returncode != 0:
            break
    else:
        pytest.fail(f"no rank aborted at exit in {TRIES} runs: the reproduction is gone")
    st = status_json(treb)
    assert st["first_failure"]["signal"] == "SIGABRT", st["first_failure"]
    root = st["diagnosis"]["root_cause"]
    assert root["category"] == "exit_abort", root
    assert "destroy_process_group()" in root["remedy"]
    assert "cause: exit_abort on rank" in res.stderr
    assert "done" in treb("logs", "--rank", str(root["rank"])).stdout  # its work had finished


def test_with_destroy_process_group_it_succeeds(treb: TrebFn, tmp_path: Path) -> None:
    needs("torch")
    (tmp_path / "ddp.py").write_text(PROGRAM.format(end="dist.destroy_process_group()"))
    spec = write_spec(tmp_path, "command: python ddp.py\nprocs_per_node: 2\n")
    for _ in range(3):
        res = treb("run", str(spec))
        assert res.returncode == 0, res.stderr

"""SkyPilot's job log back into each node's output (backends/skypilot/logs.py): the prefix
SkyPilot's log_lib puts before every line is dropped, the node read from it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trebuchet.backends.node_logs import split
from trebuchet.backends.skypilot.logs import by_node

CYAN, RESET = "\x1b[36m", "\x1b[0m"


def test_run_and_setup_lines_go_to_their_node() -> None:
    log = (
        f"{CYAN}(setup pid=11){RESET} building on the head\n"
        f"{CYAN}(setup pid=12, ip=10.0.0.2){RESET} building on the worker\n"
        f"{CYAN}(head, rank=0, pid=21){RESET} [0:1] rank 1 line\n"
        f"{CYAN}(worker1, rank=1, pid=22, ip=10.0.0.2){RESET} [1:0] rank 2 line\n"
        "(worker1, rank=1, pid=22, ip=10.0.0.2) treb: rank 3 (1:1) failed\n"
        "✓ Job finished (status: FAILED).\n"
    )
    nodes = by_node(log)
    assert nodes[0] == "building on the head\n[0:1] rank 1 line\n✓ Job finished (status: FAILED).\n"
    assert nodes[1] == "building on the worker\n[1:0] rank 2 line\ntreb: rank 3 (1:1) failed\n"
    files = split(nodes[1], 2, 1)
    assert files == {"agent-node-1.log": "building on the worker\ntreb: rank 3 (1:1) failed\n",
                     "rank-2.log": "rank 2 line\n"}  # fmt: skip


def test_one_node_cluster_prefix_names_the_task() -> None:
    assert by_node("(boundary, pid=5) [0:0] hello\n") == {0: "[0:0] hello\n"}


def test_the_lines_own_escapes_and_separators_are_kept() -> None:
    body = "[1:1] \x1b[31mred\x1b[0m a\u2028b (pid=3) \x00"
    assert by_node(f"(worker1, rank=1, pid=9, ip=h) {body}\n") == {1: body + "\n"}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.text(alphabet=st.characters(
    blacklist_characters="\n", blacklist_categories=("Cs",))))))  # fmt: skip
def test_every_line_comes_back_whole_at_its_node(rows: list[tuple[int, str]]) -> None:
    def prefix(node: int) -> str:
        who = (
            "head, rank=0, pid=1" if node == 0 else f"worker{node}, rank={node}, pid=2, ip=i{node}"
        )
        return f"{CYAN}({who}){RESET} "

    nodes = by_node("".join(f"{prefix(n)}{text}\n" for n, text in rows))
    for n in range(4):
        want = [text for node, text in rows if node == n]
        assert nodes.get(n, "") == "".join(f"{t}\n" for t in want)

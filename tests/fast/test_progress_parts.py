"""Issue 27's parts without processes: the progress parser (tqdm, `step N/M`, the
HuggingFace Trainer, a spec pattern, hostile lines), its record, `--dedup`'s grouping and
its rank ranges, the GPU query parsers and the idle-GPU rule, the spec's new fields."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from trebuchet.runtime.watch import eta, gpu
from trebuchet.runtime.watch.display_lines import Splitter
from trebuchet.view import dedup


def read(line: bytes, parser: eta.Parser | None = None) -> dict | None:
    reading, left = (parser or eta.Parser()).parse(line)
    return None if reading is None else eta.figures(reading, reading["rate"], left)


def test_tqdm_bar_gives_step_total_rate_and_its_own_eta() -> None:
    got = read(b" 45%|####5     | 450/1000 [00:10<00:12, 43.2it/s]")
    assert got == {"step": 450, "total": 1000, "fraction": 0.45, "rate": 43.2, "eta_s": 12.0}
    slow = read(b"  3%|3         | 3/100 [00:06<03:14,  2.00s/it]")
    assert slow["rate"] == 0.5 and slow["eta_s"] == 194.0
    scaled = read(b"10%|#         | 1.2k/12.0k [00:10<01:30, 1.20kit/s]")
    assert (scaled["step"], scaled["total"], scaled["rate"]) == (1200, 12000, 1200.0)
    early = read(b"  0%|          | 0/1000 [00:00<?, ?it/s]")
    assert early["step"] == 0 and early["eta_s"] is None


def test_tqdm_redraws_through_carriage_returns_are_read_state_by_state() -> None:
    data = b"".join(b"\r%3d%%|#   | %d/200 [00:01<00:02, 50.0it/s]" % (n // 2, n)
                    for n in range(0, 201, 40)) + b"\n"  # fmt: skip
    parser = eta.Parser()
    states = [read(line, parser) for line in Splitter().feed(data)]
    assert [s["step"] for s in states] == [0, 40, 80, 120, 160, 200]
    assert states[-1]["fraction"] == 1.0


def test_step_of_total_prefers_the_step_over_the_epoch() -> None:
    assert read(b"step 120/1000 loss 2.1")["fraction"] == 0.12
    assert read(b"Iteration 5 of 50")["step"] == 5
    assert read(b"Epoch 2/5 step 120/1000")["step"] == 120
    assert read(b"epoch 3/10")["total"] == 10
    assert read(b"loss 2.1 lr 1e-3") is None
    assert read(b"saved 3/4 shards") is None  # no step word: not progress


def test_huggingface_trainer_dicts_with_its_announced_totals() -> None:
    p = eta.Parser()
    assert read(b"{'loss': 2.1, 'epoch': 0.5}", p) is None  # no total known yet
    assert read(b"  Num Epochs = 3", p) is None
    assert read(b"  Total optimization steps = 1,200", p) is None
    got = read(b"{'loss': 2.1, 'grad_norm': 1.5, 'learning_rate': 5e-05, 'epoch': 1.5}", p)
    assert (got["step"], got["total"], got["fraction"]) == (600, 1200, 0.5)
    assert read(b'{"loss": 1.0, "global_step": 30, "max_steps": 120}')["fraction"] == 0.25
    only_epochs = eta.Parser()
    only_epochs.parse(b"Num Epochs = 4")
    assert read(b"{'loss': 1.0, 'epoch': 1.0}", only_epochs)["fraction"] == 0.25


def test_spec_pattern_wins_and_hostile_lines_yield_nothing() -> None:
    p = eta.Parser(r"done (?P<step>\d+) of (?P<total>\d+)")
    assert read(b"done 7 of 70 (and step 1/2)", p)["fraction"] == 0.1
    for line in (b"step " + b"9" * 400 + b"/1", b"\x00" * 100_000, b"{" * 10_000 + b"}",
                 b"step 1/0", b"|" * 5000 + b"1/2 [" * 2000, b"step nan/inf"):  # fmt: skip
        got = read(line)  # never raises
        assert got is None or got["fraction"] is None or 0 <= got["fraction"] <= 1


def test_eta_records_the_first_rank_only_in_one_rename(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-2"
    adir.mkdir()
    e = eta.Eta(str(adir))
    e("rank-1", b"step 900/1000")
    e.flush()
    assert not (tmp_path / eta.FILE).exists()  # only rank 0 (or node 0) is read
    e("rank-0", b"step 100/1000")
    e.flush()
    first = json.loads((tmp_path / eta.FILE).read_text())
    assert first["attempt"] == 2 and first["step"] == 100 and first["rate"] is None
    e("rank-0", b"step 300/1000")  # the first advance (a resumed bar's jump): no speed yet
    e.flush()
    assert eta.read(str(tmp_path), 2)["rate"] is None
    e.samples[0] = (e.samples[0][0] - 10, e.samples[0][1])  # that reading 10 s ago
    e("rank-0", b"step 500/1000")
    e.flush()
    got = eta.read(str(tmp_path), 2)
    assert got["fraction"] == 0.5 and 15 < got["rate"] < 25 and 15 < got["eta_s"] < 40
    assert eta.read(str(tmp_path), 1) is None  # another attempt's
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_from_log_tail_reads_the_last_state(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"hello\n" + b"".join(b"\r%d/50 [00:01<00:0%d, 10.0it/s]|" % (n, 9 - n // 10)
                                          for n in range(0, 50, 10)))  # fmt: skip
    log.write_bytes(b"hello\n 40%|####  | 20/50 [00:02<00:03, 10.0it/s]\r 60%|###### | 30/50 "
                    b"[00:03<00:02, 10.0it/s]")  # fmt: skip
    got = eta.from_log_tail(str(log))
    assert got["step"] == 30 and got["rate"] == 10.0 and got["eta_s"] <= 2.0
    assert eta.from_log_tail(str(tmp_path / "missing.log")) is None


def test_rank_ranges_are_compact() -> None:
    assert dedup.ranges([0, 1, 2, 3]) == "0-3"
    assert dedup.ranges([5, 0, 1, 3]) == "0-1,3,5"
    assert dedup.label(["2", "0", "1", "n0", "n1"]) == "0-2,n0-1"


def test_dedup_groups_by_window_and_keeps_repeats_apart() -> None:
    out = io.BytesIO()
    d = dedup.Dedup(out, ["0", "1", "2", "3"], window=2.0)
    d.add("0", [b"loading checkpoint", b"epoch done"], 0.0)
    d.add("1", [b"loading checkpoint"], 0.5)
    d.add("2", [b"loading checkpoint"], 1.0)
    d.add("3", [b"loading checkpoint"], 1.5)  # every rank: out at once
    assert out.getvalue() == b"[0-3] loading checkpoint\n"
    d.flush(1.6)
    d.flush(2.1)  # the read since 1.6 began inside rank 0's window (opened at 0.0)
    assert out.getvalue() == b"[0-3] loading checkpoint\n"
    d.flush(2.2)  # the read since 2.1 began after it and found nothing: out
    assert out.getvalue().decode().splitlines()[1:] == ["[0] epoch done"]
    d.add("1", [b"epoch done"], 3.0)  # after that: a group of its own
    d.add("0", [b"epoch done"], 3.1)  # rank 0's second one joins rank 1's
    d.flush(3.2)
    d.flush(10.0)  # the read since 3.2 began inside their window
    assert out.getvalue().decode().splitlines()[1:] == ["[0] epoch done"]
    d.flush(10.1)
    assert out.getvalue().decode().splitlines()[1:] == ["[0] epoch done", "[0-1] epoch done"]


def test_a_stalled_view_does_not_split_what_the_ranks_printed_together() -> None:
    """The view read ranks 0-2's line, then stalled 3 s (a loaded machine) before it read
    rank 3's: no read began after the window and found nothing, so they stay one group."""
    out = io.BytesIO()
    d = dedup.Dedup(out, ["0", "1", "2", "3"], window=2.0)
    d.add("0", [b"tick 2"], 0.0)
    d.add("1", [b"tick 2"], 0.0)
    d.add("2", [b"tick 2"], 0.0)
    d.flush(0.0)
    d.add("3", [b"tick 2"], 3.1)  # the next read, after the stall
    d.flush(3.1)
    assert out.getvalue() == b"[0-3] tick 2\n"


def test_dedup_of_written_logs_merges_by_position(tmp_path: Path) -> None:
    logs = []
    for r in range(4):
        lines = ["loading checkpoint", f"I am rank {r}"]
        lines += [f"detail {i}" for i in range(200)] if r == 0 else []
        lines += ["saving checkpoint"]
        path = tmp_path / f"rank-{r}.log"
        path.write_text("\n".join(lines) + ("\n" if r else ""))  # rank 0: no last newline
        logs.append((path, 0))
    out = io.BytesIO()
    dedup.written(out, logs)
    shown = out.getvalue().decode().splitlines()
    assert shown[0] == "[0-3] loading checkpoint" and shown[-1] == "[0-3] saving checkpoint"
    assert shown.count("[0-3] saving checkpoint") == 1 and "[2] I am rank 2" in shown
    assert len(shown) == 2 + 4 + 200


def test_following_keeps_a_written_line_open_for_the_ranks_still_to_print_it(
    tmp_path: Path,
) -> None:
    """`logs --dedup -f` started when rank 0 had printed `tick 1` and the others not yet."""
    logs = []
    for r in range(4):
        path = tmp_path / f"rank-{r}.log"
        path.write_text("start\n" + ("tick 1\n" if r == 0 else ""))
        logs.append((path, 0))
    out = io.BytesIO()
    ends, grouped = dedup.written(out, logs, follow_at=100.0)
    assert out.getvalue() == b"[0-3] start\n"  # whole groups go out at once
    assert ends == [len(b"start\ntick 1\n")] + [len(b"start\n")] * 3
    for r in ("1", "2", "3"):
        grouped.add(r, [b"tick 1"], 100.5)
    assert out.getvalue().decode().splitlines() == ["[0-3] start", "[0-3] tick 1"]
    grouped.flush(100.5)
    grouped.add("0", [b"tick 2"], 101.0)  # the others never print it: out after the window
    grouped.flush(101.0)
    grouped.flush(102.9)
    assert out.getvalue().decode().splitlines()[-1] == "[0-3] tick 1"
    grouped.flush(103.1)  # the read since 102.9 began inside the window
    assert out.getvalue().decode().splitlines()[-1] == "[0-3] tick 1"
    grouped.flush(103.2)
    assert out.getvalue().decode().splitlines()[-1] == "[0] tick 2"


def test_following_waits_for_the_ranks_whose_logs_are_not_there_yet(tmp_path: Path) -> None:
    """`logs --dedup -f` right after `run -d`: rank 3 has no log yet, but is one of 4."""
    logs = []
    for r in range(3):
        path = tmp_path / f"rank-{r}.log"
        path.write_text("tick 1\n")
        logs.append((path, 0))
    out = io.BytesIO()
    _, grouped = dedup.written(out, logs, follow_at=5.0, expect=["0", "1", "2", "3"])
    assert out.getvalue() == b""
    grouped.know("3")  # its log appeared
    grouped.add("3", [b"tick 1"], 5.5)
    assert out.getvalue() == b"[0-3] tick 1\n"


NVIDIA_OUT = "0, 87, 40000, 81559\n1, 0, 500, 81559\n2, [N/A], [N/A], 81559\nbad line\n"
ROCM_OUT = (
    "device,GPU use (%),VRAM Total Memory (B),VRAM Total Used Memory (B)\n"
    "card0,45,68702699520,1048576\ncard1,0,68702699520,0\n"
)


def test_gpu_query_outputs_and_masks() -> None:
    got = gpu.parse_nvidia(NVIDIA_OUT)
    assert [g["index"] for g in got] == [0, 1, 2]
    assert got[0] == {"index": 0, "util": 87.0, "mem": 40000.0, "mem_total": 81559.0}
    assert got[2]["util"] is None
    amd = gpu.parse_rocm(ROCM_OUT)
    assert amd[0]["util"] == 45.0 and amd[0]["mem"] == 1.0 and amd[1]["index"] == 1
    assert gpu.mask_of({"CUDA_VISIBLE_DEVICES": "2,3"}) == {2, 3}
    assert gpu.mask_of({"CUDA_VISIBLE_DEVICES": "GPU-1a2b"}) is None
    assert gpu.mask_of({}) is None
    assert gpu.interval({"idle_gpu_timeout": 4}) == 1.0 and gpu.interval({}) == 10.0


def test_idle_rule_needs_every_node_idle_for_the_timeout(tmp_path: Path) -> None:
    adir = tmp_path / "attempt-0"
    (adir / "gpu").mkdir(parents=True)
    now = time.time()

    def node(n: int, busy: float | None) -> None:
        state = {"node": n, "t": now, "busy": busy, "samples": [{"index": 0, "util": 0.0}]}
        (adir / "gpu" / f"node-{n}.json").write_text(json.dumps(state))

    watch = gpu.IdleWatch(str(adir), 60, "fail", started=now - 100)
    assert watch.check(now) is None  # no node sampled yet: no verdict
    node(0, None)
    node(1, now - 10)  # node 1 was busy 10 s ago
    assert watch.check(now) is None
    watch.next_check = 0
    node(1, now - 70)
    watch.next_check = 0
    assert watch.check(now) == {"idle_s": 70.0, "nodes": 2, "gpus": 2}
    watch.next_check = 0
    assert watch.check(now + 5) is None  # once per idle spell


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("metrics: {progress: 'step (\\d+)'}\n", "metrics.progress"),
        ("metrics: {progress: 'step (?P<step>\\d+'}\n", "metrics.progress"),
        ("idle_gpu_action: retry\n", "idle_gpu_action"),
        ("idle_gpu_timeout: soon\n", "idle_gpu_timeout"),
    ],
)
def test_new_fields_refuse_bad_values_with_file_and_line(tmp_path: Path, text: str,
                                                         where: str) -> None:  # fmt: skip
    from trebuchet.errors import UserError
    from trebuchet.spec.load import load_spec

    spec = tmp_path / "job.yaml"
    spec.write_text("command: echo hi\n" + text)
    with pytest.raises(UserError) as exc:
        load_spec(str(spec))
    assert f"job.yaml:2: {where}" in str(exc.value)


def test_reader_config_carries_the_gpu_watch(tmp_path: Path) -> None:
    from trebuchet.spec.load import load_spec
    from trebuchet.spec.readers import needed, reader_config

    spec = tmp_path / "job.yaml"
    spec.write_text("command: echo hi\ngpus_per_node: 2\nidle_gpu_timeout: 10m\n"
                    "idle_gpu_action: fail\nmetrics: {progress: 'it (?P<step>\\d+)'}\n")  # fmt: skip
    loaded = load_spec(str(spec)).spec
    conf = reader_config(loaded)
    assert conf["gpus"] == 2 and conf["idle_gpu_timeout"] == 600 and needed(loaded)
    assert conf["idle_gpu_action"] == "fail" and conf["progress"] == "it (?P<step>\\d+)"

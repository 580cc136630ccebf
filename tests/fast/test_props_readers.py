"""Property tests of every reader of text a program wrote (issue 33): the metrics line
parser, the progress/ETA readers, the log-line splitter, `--dedup`, the diagnosis readers
and the store's writes of metrics. Any text or bytes in (lone surrogates, C0/C1 controls,
NUL, ESC/OSC, U+2028, brackets): no exception, finite numbers, and what a view shows is
text a terminal shows as text (runtime/watch/display_lines.py `shown`, `inert`)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from trebuchet.runtime.watch import eta
from trebuchet.runtime.watch import metric_reader as rm
from trebuchet.runtime.watch.activity import Progress
from trebuchet.runtime.watch.display_lines import CAP, CUT, Splitter, inert, shown
from trebuchet.view import dedup

# Characters a rank may print that a terminal, SQLite or UTF-8 takes badly.
HOSTILE = ["\x00", "\x07", "\x1b", "\x7f", "\x85", "\x9b", "\x9d", "\u2028", "\u2029", "\u202e",
           "\u202a", "\u2066", "\u2069", "\ud800", "\udc80", "\udfff", "\t", "\n", "\r", "[", "]", "{", "}", "'", '"', ":",
           ",", "/", "%", "0", "7", ".", "e", " "]  # fmt: skip
CHARS = st.one_of(st.characters(exclude_categories=()), st.sampled_from(HOSTILE))
TEXT = st.text(alphabet=CHARS, max_size=40)
BYTES = st.one_of(st.binary(max_size=300), TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")))
NUMBER = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(),
                   st.integers(min_value=10**300, max_value=10**400))  # fmt: skip
# What a terminal acts on, in text: C0 (tab aside), DEL, C1, separators, bidi overrides; and
# what UTF-8 cannot encode: lone surrogates.
RAW = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
RAW_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]|\xc2[\x80-\x9f]")
# The line/paragraph separators and bidi controls: a terminal reorders or breaks the line.
BIDI = re.compile("[\u2028\u2029\u202a-\u202e\u2066-\u2069]")
FEW = settings(max_examples=150, deadline=None)


def _is_text(s: str) -> bool:
    """One line a terminal shows as text, encodable as UTF-8."""
    s.encode("utf-8")
    return not RAW.search(s)


# -- the one place for terminal-safe text ------------------------------------------------


@FEW
@given(TEXT)
@example("\ud800")
@example("a\x1b]0;T\x07b\x00\u2028\x9b")
def test_shown_is_text_and_idempotent(text: str) -> None:
    out = shown(text)
    assert _is_text(out) and shown(out) == out
    assert "\n" not in out and "\t" not in out
    assert shown(text, tab=True).count("\t") == text.count("\t")
    assert not RAW.search(shown(text, tab=True).replace("\t", " "))
    if text.isprintable():
        assert out == text


# -- metrics: the line parser ---------------------------------------------------------------


def _finite(v: Any) -> bool:
    try:
        return not isinstance(v, bool) and math.isfinite(float(v))
    except OverflowError:
        return False


def _check_read(line: bytes, config: rm.Config | None) -> tuple[float | None, rm.Values]:
    step, values, dropped = rm.read(line, config)
    assert step is None or math.isfinite(step)
    assert dropped >= 0
    for name, v in values.items():
        assert isinstance(v, float) and math.isfinite(v)
        assert _is_text(name) and shown(name) == name and len(name) > 0
    return step, values


@FEW
@given(BYTES)
@example(b'{"step": 2, "\\ud800": 1}')
@example(b'{"a\\u001b]0;x\\u0007": 1e999, "b": -1e400, "c": 123' + b"4" * 400 + b"}")
@example(b"[" * 100 + b"{" * 5000 + b"}")
def test_metrics_parse_any_bytes(line: bytes) -> None:
    _check_read(line, None)
    _check_read(line, rm.Config(prefix="loss", patterns=[r"(?P<x>\S+)=(?P<step>\S+)"]))


@FEW
@given(st.dictionaries(TEXT, NUMBER, max_size=6), st.sampled_from(["", "INFO ", "100%|##| "]),
       st.booleans())  # fmt: skip
@example({"step": 2, "\ud800": 1, "loss": 0.5}, "", False)
def test_metrics_keep_every_name_of_a_dict_line(d: dict[str, Any], prefix: str, hf: bool) -> None:
    """A JSON line (or the Trainer's repr) keeps each numeric name, made terminal-safe,
    whatever the other names hold: one name never loses the line's others."""
    body = repr(d) if hf else json.dumps(d)
    line = (prefix + body).encode("utf-8", "surrogatepass")
    step, values = _check_read(line, None)
    first_step = next((k for k in d if k in rm.STEP_KEYS), None)
    wanted = {shown(k) for k, v in d.items()
              if k and len(k) <= rm.NAME_MAX and _finite(v) and k != first_step}  # fmt: skip
    if wanted and len(body) <= rm.LITERAL_MAX:
        assert set(values) == wanted, (d, values)


# -- the store's writes of metrics, and a view over them ---------------------------------


_RUNS = iter(range(10**9))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.dictionaries(TEXT, NUMBER, max_size=4), BYTES), max_size=6))
@example([({"\ud800": 1, "loss": 0.5, "a\x1b]0;T\x07": 2, "[/]": 3, "[bold]x": 4}, b"")])
def test_store_keeps_any_names_and_a_view_renders(rows: list[tuple[dict, bytes]]) -> None:
    """Lines through the agent's reader and writer, plus points written straight into the
    file (a rank can write there too): ingested, read back, and `treb metrics` and `top`
    render them as text."""
    from trebuchet.cli.metrics_cmd import show
    from trebuchet.cli.top_cmd import metric_text
    from trebuchet.store import metrics as sm
    from trebuchet.store.db import RunRecord, Store

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TREB_HOME"] = os.path.join(tmp, "home")
        store = Store()
        run_dir = Path(tmp) / "run"
        rec = RunRecord(id=f"r{next(_RUNS):08d}", name="m\x1b[2J", backend="local",
                        launcher="native", state="RUNNING", nodes=1, procs_per_node=1,
                        run_dir=str(run_dir), created_at=time.time())  # fmt: skip
        store.insert_run(rec)
        adir = run_dir / "attempt-0"
        hook = rm.Metrics(str(adir), rm.Config())
        for d, raw in rows:
            hook("rank-0", json.dumps({"step": 1, **d}).encode())
            hook("rank-0", raw)
        hook.close()
        direct = adir / "metrics" / "rank-1.jsonl"
        direct.parent.mkdir(parents=True, exist_ok=True)
        with open(direct, "w") as fh:
            for d, raw in rows:
                fh.write(json.dumps({"t": 1.0, "s": 2, "m": d}) + "\n")
                fh.write(raw.decode(errors="replace").replace("\n", " ") + "\n")
        sm.ingest(store, rec)
        data = sm.series(store, rec.id)
        last = sm.latest(store, rec.id)
        for name, pts in data.items():
            assert _is_text(name)
            assert all(math.isfinite(x) for p in pts for x in p)
        names = {shown(k) for d, _ in rows for k in d if k and len(k) <= rm.NAME_MAX}
        assert set(last) <= names | {n for n in last if n in data}
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            show(rec, data, last)
        assert not RAW.search(out.getvalue().replace("\n", " "))
        for name, p in last.items():
            assert _is_text(metric_text((name, p["value"], p["step"], None)))
        _top_renders(rec, [(n, p["value"], p["step"], 1.0) for n, p in last.items()])
        store.conn.close()


def _top_renders(rec: Any, shown_metrics: list[tuple[str, float, float, float | None]]) -> None:
    """`treb top`'s live table (rich markup) and its plain snapshot, over these names."""
    from rich.console import Console

    from trebuchet.cli.top_cmd import RunView, plain, table

    view = RunView(rec, shown_metrics, ["node 0: 0 running"], {"step": 1, "total": 2})
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(table([view], 1.0))
    assert not RAW.search(out.getvalue().replace("\n", " "))
    assert all(_is_text(line) for line in plain([view]))


# -- progress and ETA ------------------------------------------------------------------------


def _check_reading(reading: dict[str, Any] | None, left: float | None) -> None:
    if reading is None:
        return
    for k in ("step", "total", "rate"):
        v = reading.get(k)
        assert v is None or (math.isfinite(v) and v >= 0), reading
    assert left is None or (math.isfinite(left) and left >= 0)
    fig = eta.figures(reading, reading.get("rate"), left)
    assert fig["fraction"] is None or 0 <= fig["fraction"] <= 1
    for k in ("rate", "eta_s"):
        assert fig[k] is None or (math.isfinite(fig[k]) and fig[k] >= 0), fig
    _check_view(fig)


def _check_view(p: dict[str, Any]) -> None:
    from trebuchet.cli.progress import eta_text, progress_text

    text = progress_text(p)
    m = re.match(r"(\d+)% ", text)
    assert m is None or 0 <= int(m[1]) <= 100, text
    assert _is_text(text) and _is_text(eta_text(p))


SCALED = st.tuples(st.floats(0, 1e12, allow_nan=False), st.sampled_from(["", "k", "M", "G", "P"]))
BAR = st.builds(
    lambda pct, n, total, el, left, rate, unit: (
        f"{pct}%|####| {n[0]:g}{n[1]}/{total[0]:g}{total[1]} [{el}<{left}, {rate:g}{unit}]"
    ),
    st.integers(0, 1000), SCALED, SCALED, st.sampled_from(["00:01", "1:02:03", "99999:99"]),
    st.sampled_from(["00:12", "?", "9" * 30 + ":00"]), st.floats(0, 1e300, allow_nan=False),
    st.sampled_from(["it/s", "s/it", "kit/s", "MB/s", "", "x"]),
)  # fmt: skip
STEP = st.builds(lambda w, a, b, sep: f"{w} {a}{sep}{b}", st.sampled_from(
    ["step", "Iter", "epoch", "batch"]), st.integers(0, 10**30), st.integers(0, 10**400),
    st.sampled_from(["/", " of ", "/ "]))  # fmt: skip
HF = st.builds(
    lambda d: repr(d),
    st.dictionaries(
        st.sampled_from(["epoch", "step", "global_step", "max_steps", "num_train_epochs", "loss"]),
        NUMBER,
    ),
)


@FEW
@given(
    st.lists(
        st.one_of(
            BYTES,
            BAR.map(str.encode),
            STEP.map(str.encode),
            HF.map(str.encode),
            st.just(b"Total optimization steps = 1,000"),
            st.just(b"Num Epochs = 0"),
        ),
        max_size=8,
    ),
    st.sampled_from([None, r"(?P<step>\S+)/(?P<total>\S+)", "(", "(?P<step>x)"]),
)
@example([b"step 1e999/5", b"100%|#| 1/0 [00:01<00:00, 1e-320s/it]"], None)
@example([b"nan/inf"], r"(?P<step>\S+)/(?P<total>\S+)")
def test_progress_readers_any_lines(lines: list[bytes], pattern: str | None) -> None:
    parser = eta.Parser(None if pattern == "(" else pattern)
    for line in lines:
        reading, left = parser.parse(line)
        _check_reading(reading, left)
    with tempfile.TemporaryDirectory() as tmp:
        adir = os.path.join(tmp, "attempt-0")
        os.makedirs(adir)
        hook = eta.hook(adir, {"progress": pattern})
        log = os.path.join(adir, "rank-0.log")
        with open(log, "wb") as fh:
            fh.write(b"\n".join(lines))
        reader = Progress(adir, hook)  # the agent's real reader over the rank's log
        reader.track("rank-0")
        reader.step(force=True)
        hook.flush()
        for got in (eta.read(tmp), eta.from_log_tail(log, pattern)):
            if got is not None:
                _check_view(got)
                assert got["eta_s"] is None or got["eta_s"] >= 0


@FEW
@given(
    st.one_of(
        st.binary(max_size=200),
        st.dictionaries(
            st.sampled_from(["step", "total", "fraction", "rate", "eta_s", "t", "attempt"]),
            st.one_of(NUMBER, TEXT, st.none(), st.booleans()),
        ).map(lambda d: json.dumps(d).encode()),
    )
)
@example(b'{"step": "x", "total": 1e999, "fraction": 7, "eta_s": -4, "rate": Infinity}')
def test_a_progress_record_a_rank_overwrote(data: bytes) -> None:
    """progress.json sits in the run directory, where a rank can write: the views read it."""
    from trebuchet.cli.progress import short

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, eta.FILE).write_bytes(data)
        got = eta.read(tmp)
    if got is not None:
        _check_view(got)
        if got.get("eta_s") is not None:
            assert _is_text(short(float(got["eta_s"])))


# -- the log-line splitter ---------------------------------------------------------------------


@FEW
@given(st.lists(BYTES, max_size=8), st.sampled_from([CAP, 7, 64]), st.booleans())
@example([b"a\xc2", b"\x9b2J\x1b]0;x\x07\r\n", b"\x00tab\there"], CAP, False)
def test_splitter_whole_inert_lines(chunks: list[bytes], cap: int, redraw: bool) -> None:
    split = Splitter(cap=cap, redraw=redraw)
    out: list[bytes] = []
    for c in chunks:
        out += split.feed(c)
    out += split.flush()
    for line in out:
        assert line and b"\n" not in line and b"\r" not in line
        assert not RAW_BYTES.search(line), line
        assert not BIDI.search(line.decode("utf-8", "replace")), line
        assert len(line) <= cap + len(CUT) or len(inert(line)) == len(line)
    if cap == CAP and not redraw:  # nothing cut: exactly the input's non-empty lines
        data = b"".join(chunks).replace(b"\r", b"\n")
        assert out == [inert(ln) for ln in data.split(b"\n") if ln]


@FEW
@given(BYTES)
@example(
    b"a\xe2\x80\xaeb\xe2\x80\xa8c\xe2\x80\xa9\xe2\x81\xa6\xe2\x81\xa9\xe2\x80\xaa\xe2\xe2\x80\xad"
)
@example("\u2026 \u201cq\u201d \u2588\u2067".encode())
def test_inert_shows_separators_and_bidi_controls_as_text(data: bytes) -> None:
    """U+2028/U+2029 and the bidi controls (U+202A-U+202E, U+2066-U+2069) go out as
    `\\u202e`, as `shown` writes them; other text (…, “, █) stays as it is."""
    out = inert(data)
    assert not BIDI.search(out.decode("utf-8", "replace")), out
    lines = out.replace(b"\r", b"\n").split(b"\n")  # \n and \r are kept: line ends
    assert not any(RAW_BYTES.search(ln) for ln in lines) and inert(out) == out
    if not BIDI.search(data.decode("utf-8", "replace")) and not any(
        RAW_BYTES.search(ln) for ln in data.replace(b"\r", b"\n").split(b"\n")
    ):
        assert out == data
    for ch in "\u2028\u2029\u202a\u202e\u2066\u2069":
        assert inert(ch.encode()) == shown(ch).encode() == f"\\u{ord(ch):04x}".encode()


# -- dedup ------------------------------------------------------------------------------------


def _keys_of(label: str) -> list[str]:
    """`0-2,5,n0-1` -> ['0', '1', '2', '5', 'n0', 'n1']."""
    out: list[str] = []
    node = False
    for part in label.split(","):
        if part.startswith("n"):
            node, part = True, part[1:]
        lo, _, hi = part.partition("-")
        for n in range(int(lo), int(hi or lo) + 1):
            out.append(f"n{n}" if node else str(n))
    return out


LINE = st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"") or b"x")


@FEW
@given(st.lists(st.tuples(st.sampled_from(["0", "1", "2", "5", "n0", "n1"]),
                          st.lists(st.sampled_from([b"same", b"other", b"[0] x"]) | LINE,
                                   max_size=6)), max_size=12))  # fmt: skip
def test_dedup_keeps_every_line_once(adds: list[tuple[str, list[bytes]]]) -> None:
    out = io.BytesIO()
    d = dedup.Dedup(out, sorted({k for k, _ in adds}) or ["0"], window=None)
    want: dict[bytes, int] = {}
    for key, lines in adds:
        d.add(key, lines, 0.0)
        for ln in lines:
            want[ln] = want.get(ln, 0) + 1
    d.flush(0.0, final=True)
    got: dict[bytes, int] = {}
    for row in out.getvalue().split(b"\n")[:-1]:
        label, _, text = row.partition(b"] ")
        keys = _keys_of(label[1:].decode())
        assert len(keys) == len(set(keys))  # a rank once in a group
        got[text] = got.get(text, 0) + len(keys)
    assert got == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_dedup_of_any_written_logs(logs: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for n, data in enumerate(logs):
            path = Path(tmp, f"rank-{n}.log")
            path.write_bytes(data)
            files.append((path, 0))
        out = io.BytesIO()
        dedup.written(out, files)
    for row in out.getvalue().split(b"\n")[:-1]:
        assert row.startswith(b"[") and not RAW_BYTES.search(row)


# -- diagnosis readers -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(TEXT, st.sampled_from([
    "Traceback (most recent call last):", '  File "/x/train.py", line 3, in <module>',
    "RuntimeError: CUDA out of memory", "[rank3]: " + "9" * 4400 + " failed",
    "[rank" + "9" * 4400 + "]: x", "WorkNCCL(SeqNum=" + "1" * 4400, "world_size=" + "2" * 4400,
    "keys: a/" + "3" * 4400, "Ranks 1, " + "4" * 4400 + " failed to pass monitoredBarrier",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
    "NCCL WARN \x1b]0;x\x07 \ud800"])), max_size=8))  # fmt: skip
def test_classify_any_log_text(lines: list[str]) -> None:
    from trebuchet.diagnose.classify import classify
    from trebuchet.diagnose.lines import parse
    from trebuchet.diagnose.report import diagnose_paths, text

    found = classify([parse(t, i) for i, t in enumerate("\n".join(lines).split("\n"))])
    assert found is not None
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp, "rank-0.log")
        log.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
        from trebuchet.diagnose.scan import scan

        got = scan(log)
        assert all(isinstance(ln, str) for ln in got.lines)
        shown_text = text(diagnose_paths([log]))
    assert not RAW.search(shown_text.replace("\n", " ").replace("\t", " "))


@FEW
@given(st.one_of(
    st.binary(max_size=300),
    st.recursive(st.one_of(st.none(), st.booleans(), NUMBER, TEXT),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner,
                                                                              max_size=3),
                 max_leaves=8).map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.builds(lambda m, stack, stamp: json.dumps({"message": {"message": m, "extraInfo": {
        "py_callstack": stack, "timestamp": stamp}}}).encode(), TEXT, TEXT | st.just(
        'Traceback:\n  File "/a.py", line 1, in f\n    x()\n'), st.one_of(TEXT, st.sampled_from(
        ["²", "٣", "1" * 20, "123"]), NUMBER)),
))  # fmt: skip
@example(b'{"message": {"message": "x", "extraInfo": {"timestamp": "\\u00b2"}}}')
def test_error_file_any_bytes(data: bytes) -> None:
    from trebuchet.diagnose.errorfile import read

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "error.json")
        path.write_bytes(data)
        got = read(path)
    if got is not None:
        assert not re.search("[\x00-\x08\x0b-\x1f\x7f]", got.message)
        assert all(_is_text(shown(f)) for f in got.frames)
        assert got.timestamp is None or isinstance(got.timestamp, int)

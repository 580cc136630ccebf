"""The dashboard's parts that need no server: the store's page and metrics queries, HTML
escaping, the missing-extra message, and the web stack kept out of `treb --help`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trebuchet.store.db import RunFilter, RunRecord, Store


def _store(tmp_path: Path) -> Store:
    return Store(tmp_path / "runs.db")


def _add(store: Store, i: int, **kw) -> None:
    values = dict(
        id=f"{i:08x}", name=f"job{i % 3}", backend="local" if i % 2 else "slurm",
        launcher="native", state="FAILED" if i % 5 == 0 else "SUCCEEDED", nodes=1,
        procs_per_node=2, run_dir=f"/nowhere/{i}", created_at=1000.0 + i,
        started_at=1000.0 + i, ended_at=1000.0 + i + (i % 7),
    )  # fmt: skip
    values.update(kw)
    store.insert_run(RunRecord(**values))


def test_page_filters_sorts_and_counts_in_sql(tmp_path: Path) -> None:
    store = _store(tmp_path)
    for i in range(1, 31):
        _add(store, i)
    rows, total = store.page(limit=10)
    assert total == 30 and [r.id for r in rows] == [f"{i:08x}" for i in range(30, 20, -1)]
    rows, total = store.page(offset=25, limit=10)
    assert total == 30 and len(rows) == 5
    rows, total = store.page(RunFilter(states=["FAILED"], backend="local"), limit=100)
    assert total == len(rows) == 3  # 5, 15, 25
    assert {r.id for r in rows} == {f"{i:08x}" for i in (5, 15, 25)}
    rows, _ = store.page(RunFilter(name="*b2*"), sort="name", descending=False, limit=100)
    assert rows and all(r.name == "job2" for r in rows)
    rows, _ = store.page(sort="duration", descending=True, limit=30)
    durations = [r.ended_at - r.started_at for r in rows]
    assert durations == sorted(durations, reverse=True)
    rows, _ = store.page(sort="'; DROP TABLE runs; --", limit=1)  # unknown: the default sort
    assert rows[0].id == f"{30:08x}"


def test_metrics_empty_without_table_then_series_by_step(tmp_path: Path) -> None:
    from trebuchet.store.metrics import ingest

    store = _store(tmp_path)
    assert store.metrics("00000001") == {}
    # The table as the metrics ingestion writes it (issue 14 section 1), from agent files.
    for rid in ("00000001", "00000002"):
        _add(store, int(rid, 16), run_dir=str(tmp_path / rid))
    files = {
        "00000001/attempt-0/metrics/rank-0.jsonl": [(1, 11.0, {"loss": 2.0, "acc": 0.5}),
                                                    (2, 12.0, {"loss": 1.5})],
        "00000001/attempt-0/metrics/rank-1.jsonl": [(1, 11.0, {"loss": 9.0})],
        "00000002/attempt-0/metrics/rank-0.jsonl": [(1, 11.0, {"loss": 7.0})],
    }  # fmt: skip
    for rel, points in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(
            "".join(json.dumps({"t": t, "s": s, "m": m}) + "\n" for s, t, m in points)
        )
    for rid in ("00000001", "00000002"):
        ingest(store, store.get(rid))
    got = store.metrics("00000001")
    assert got == {"acc": [(1, 0.5, 11.0)], "loss": [(1, 2.0, 11.0), (2, 1.5, 12.0)]}
    assert store.metrics("00000001", ["acc"]) == {"acc": [(1, 0.5, 11.0)]}


def test_html_escapes_values_and_json_cannot_close_its_script() -> None:
    pytest.importorskip("starlette")
    from trebuchet.ui.html import data, e, url

    assert e('<script>alert("x")</script>') == "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;"
    block = data("d", {"name": "</script><script>alert(1)</script>"})
    assert block.count("</script>") == 1 and "<script>alert" not in block
    assert json.loads(block.split(">", 1)[1].rsplit("<", 1)[0]) == {
        "name": "</script><script>alert(1)</script>"
    }
    assert url("/runs/x", q='"><b>') == "/runs/x?q=%22%3E%3Cb%3E"


def test_csrf_token_is_derived_and_checked() -> None:
    pytest.importorskip("starlette")
    from trebuchet.ui.security import csrf_ok, csrf_token, new_token

    token = new_token()
    assert len(token) >= 40 and new_token() != token
    assert csrf_ok(token, csrf_token(token))
    assert not csrf_ok(token, csrf_token(new_token())) and not csrf_ok(token, None)


def test_ui_without_the_extra_says_how_to_install_it(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None\n"
        "from trebuchet.cli.main import main; sys.exit(main(['ui']))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "TREB_HOME": str(tmp_path)}, timeout=60)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "pip install 'trebuchet[ui]'" in res.stderr and "Traceback" not in res.stderr


def test_help_imports_no_web_stack(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "trebuchet", "--help"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TREB_HOME": str(tmp_path)})  # fmt: skip
    assert res.returncode == 0 and "ui" in res.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines()}
    assert not {m for m in imported if m.split(".")[0] in ("starlette", "uvicorn", "anyio")}
    assert "trebuchet.ui" not in imported


def test_static_files_are_package_data() -> None:
    import tomllib

    root = Path(__file__).resolve().parents[2]
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    assert conf["tool"]["setuptools"]["package-data"]["trebuchet.ui"] == ["static/*"]
    static = root / "trebuchet" / "ui" / "static"
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE", "app.js", "style.css"):
        assert (static / name).is_file(), name
    assert "v1.6.32" in (static / "uPlot.iife.min.js").read_text()[:100]
    assert "starlette" not in " ".join(conf["project"]["dependencies"])


def test_chart_data_has_no_infinity_or_nan() -> None:
    """JSON.parse (the page's) refuses Infinity and NaN: they travel as null."""
    pytest.importorskip("starlette")
    from trebuchet.ui.html import data
    from trebuchet.ui.pages import _number, series

    block = data("d", series({"loss": [(1, float("inf"), 0.0), (2, float("nan"), 0.0),
                                        (3, 0.5, 0.0)]}))  # fmt: skip
    text = block.split(">", 1)[1].rsplit("<", 1)[0]

    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")

    assert json.loads(text, parse_constant=refuse) == {"loss": {"x": [1, 2, 3],
                                                                "y": [None, None, 0.5]}}  # fmt: skip
    assert [_number(v) for v in ("inf", "nan", "-inf", "1e999", "2", 3, "x")] == [
        None, None, None, None, 2.0, 3.0, None]  # fmt: skip


def test_login_cookie_parts() -> None:
    """The cookie holds an HMAC of the token, never the token; a Cookie header is read
    pair by pair (another app's JSON value spoils nothing); any text compares."""
    pytest.importorskip("starlette")
    from trebuchet.ui.security import cookie_value, cookies, csrf_token, same

    token = "t0ken-value"
    assert cookie_value(token) not in (token, csrf_token(token)) and len(cookie_value(token)) == 64
    header = b'prefs={"theme": "dark", "x": [1, 2]}; treb_ui_8765=abc; other="q;"'
    assert ("treb_ui_8765", "abc") in cookies(header)
    assert not same(token, "\u00e9") and not same(token, "") and same(token, token)

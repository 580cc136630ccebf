"""The dashboard's routes (Starlette): pages, the log stream, cancel and rerun.

Each request opens and closes the store (cheap; SQLite connections stay in their thread).
Cancel and rerun call what `treb cancel` and `treb rerun` call, so the dashboard adds no
second way to start or stop a run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from trebuchet.errors import TrebError
from trebuchet.store.db import Store
from trebuchet.store.paths import RUN_ID_RE
from trebuchet.ui import html, pages
from trebuchet.ui.security import TokenGate, csrf_ok, csrf_token

STATIC = Path(__file__).parent / "static"


def _with_store(fn: Callable[[Store], str], title: str, scripts: bool = False) -> Response:
    """One page: the store open around fn; a user error is the page's message (400)."""
    try:
        store = Store()
    except TrebError as exc:
        return HTMLResponse(html.page(title, f"<p class='bad'>{html.e(exc)}</p>"), 500)
    try:
        return HTMLResponse(html.page(title, fn(store), scripts))
    except TrebError as exc:
        return HTMLResponse(html.page(title, f"<p class='bad' id='error'>{html.e(exc)}</p>"), 400)
    finally:
        store.close()


def _run_or_404(store: Store, run_id: str):
    rec = store.get(run_id) if RUN_ID_RE.match(run_id) else None
    if rec is None:
        raise TrebError(f"no run {run_id}")
    return rec


def create_app(token: str, cookie: str = "treb_ui") -> TokenGate:
    csrf = csrf_token(token)

    def runs(request: Request) -> Response:
        q = dict(request.query_params)
        return _with_store(lambda s: pages.runs_page(s, q), "runs")

    def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]

        def body(store: Store) -> str:
            from trebuchet.runner import refresh

            rec = _run_or_404(store, run_id)
            refresh(store, [rec])
            return pages.run_page(store, store.get(rec.id) or rec, csrf)

        return _with_store(body, f"run {run_id}", scripts=True)

    def sweeps(request: Request) -> Response:
        return _with_store(pages.sweeps_page, "sweeps")

    def sweep(request: Request) -> Response:
        sid, q = request.path_params["sweep_id"], dict(request.query_params)

        def body(store: Store) -> str:
            members = store.sweep_runs(sid)
            if not members:
                raise TrebError(f"no sweep {sid}")
            return pages.sweep_page(store, members, q)

        return _with_store(body, f"sweep {sid}", scripts=True)

    def results(request: Request) -> Response:
        q = dict(request.query_params)
        return _with_store(lambda s: pages.results_page(s, q), "results", scripts=True)

    async def logs(request: Request) -> Response:
        from trebuchet.ui.logs import follow
        from trebuchet.view.follow import LOG_NAME

        run_id = request.path_params["run_id"]
        attempt, _, name = request.query_params.get("log", "").partition("/")
        if not (RUN_ID_RE.match(run_id) and attempt.isdigit() and LOG_NAME.fullmatch(name)):
            return Response("bad log\n", 400, media_type="text/plain")

        def lookup():
            with closing(Store()) as store:
                return store.get(run_id)

        rec = await run_in_threadpool(lookup)
        if rec is None:
            return Response("no such run\n", 404, media_type="text/plain")
        path = Path(rec.run_dir) / f"attempt-{int(attempt)}" / name

        def active() -> bool:
            from trebuchet.runner import refresh

            with closing(Store()) as store:
                now = store.get(run_id)
                if now is not None and now.active:
                    refresh(store, [now])
                    now = store.get(run_id)
                return bool(now and now.active)

        return StreamingResponse(follow(path, active, request.is_disconnected, rec.active),
                                 media_type="text/event-stream")  # fmt: skip

    async def _form(request: Request) -> dict[str, str] | Response:
        """The POST's fields, once its CSRF token and origin are checked."""
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin and re.sub(r"^https?://", "", origin) != host:
            return Response("403 Forbidden: cross-origin request\n", 403, media_type="text/plain")
        body = (await request.body())[:65536].decode("utf-8", errors="replace")
        fields = dict(parse_qsl(body))
        if not csrf_ok(token, fields.get("csrf")):
            return Response("403 Forbidden: bad CSRF token\n", 403, media_type="text/plain")
        return fields

    def _action(title: str, act: Callable[[str], str]) -> Callable[[Request], Any]:
        """A POST that changes a run: its form checked, `act(run_id)` in a thread, then a
        redirect to the page it names (or the error's page)."""

        async def endpoint(request: Request) -> Response:
            fields = await _form(request)
            if isinstance(fields, Response):
                return fields
            try:
                where = await run_in_threadpool(act, request.path_params["run_id"])
            except TrebError as exc:
                return HTMLResponse(html.page(title, f"<p class='bad'>{html.e(exc)}</p>"), 400)
            return RedirectResponse(where, 303)

        return endpoint

    def cancel(run_id: str) -> str:
        from trebuchet.cli.cancel_cmd import cancel_run

        with closing(Store()) as store:
            cancel_run(store, _run_or_404(store, run_id))
        return f"/runs/{run_id}"

    def rerun(run_id: str) -> str:
        from trebuchet import runner
        from trebuchet.backends.base import SweepSubmitted
        from trebuchet.cli.rerun_cmd import source

        with closing(Store()) as store:
            rec = _run_or_404(store, run_id)
        spec, extra = source(rec)
        started = runner.launch(spec, rec.backend, extra, attach=False, warn=lambda _: None)
        if isinstance(started.result, SweepSubmitted):
            return f"/sweeps/{started.result.sweep_id}"
        return f"/runs/{started.subs[0].record.id}"

    routes = [
        Route("/", runs),
        Route("/runs/{run_id}", run),
        Route("/runs/{run_id}/logs", logs),
        Route("/runs/{run_id}/cancel", _action("cancel", cancel), methods=["POST"]),
        Route("/runs/{run_id}/rerun", _action("rerun", rerun), methods=["POST"]),
        Route("/sweeps", sweeps),
        Route("/sweeps/{sweep_id}", sweep),
        Route("/results", results),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return TokenGate(Starlette(routes=routes), token, cookie)

"""`treb ui` in a real browser: headless Chromium (Debian's chromium and chromium-driver,
driven by selenium with the system /usr/bin/chromedriver: nothing is downloaded) against a
real `treb ui` serving real runs. Pages are checked against `treb ps/status/results
--json`; a live log is followed; cancel and rerun are clicked; requests without the token
are refused. One server and one browser for the module. Locally skipped without Chromium;
in CI (CI=true) that is a failure (make test installs it: scripts/system-deps).

TREB_UI_SHOTS=DIR saves a screenshot of each page there (docs/img/ui-*.png).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import BIN, in_ci, needs

pytestmark = [pytest.mark.integration, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
HOSTILE = "<script>window.__pwned=1</script>"
SECRET_VALUE = "s3cr3t-value-never-shown"

FAILS = """\
name: fails
command: 'echo "performance: 12.5 samples_per_second"; if [ "$RANK" = 1 ]; then echo boom >&2; exit 3; fi; sleep 1'
procs_per_node: 2
secrets: [UI_TEST_SECRET]
"""
LONG = """\
name: long
command: 'echo "<script>window.__pwned=1</script>"; for i in $(seq 1 600); do echo "step $i rank $RANK"; sleep 0.2; done'
procs_per_node: 2
"""
SWEEP = """\
name: sweepy
command: 'echo "performance: $((LR * 10)) samples_per_second"'
env: {LR: "1"}
"""


def wait_for(what: str, check: Callable[[], object], timeout: float = 30) -> object:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    end = time.monotonic() + timeout
    while True:
        try:  # a page still loading has no such element yet
            got = check()
        except (NoSuchElementException, StaleElementReferenceException) as exc:
            got, last = None, exc
        else:
            last = None
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what} ({last!r})")
        time.sleep(0.1)


class Env:
    """The module's TREB_HOME, its `treb`, the server and the browser."""

    def __init__(self, home: Path, specs: Path) -> None:
        self.home = home
        self.specs = specs
        self.env = {**os.environ, "TREB_HOME": str(home),
                    "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}  # fmt: skip
        self.env.pop("OMP_NUM_THREADS", None)
        self.base = ""
        self.token = ""
        self.driver = None

    def treb(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trebuchet", *args], capture_output=True,
                              text=True, timeout=timeout, env=self.env)  # fmt: skip

    def json(self, *args: str):
        res = self.treb(*args, "--json")
        assert res.returncode == 0, res.stderr
        return json.loads(res.stdout)

    def spec(self, name: str, text: str) -> str:
        path = self.specs / f"{name}.yaml"
        path.write_text(text)
        return str(path)

    def get(self, path: str):
        self.driver.get(self.base + path)
        return self.driver

    def shot(self, name: str) -> None:
        where = os.environ.get("TREB_UI_SHOTS")
        if where:
            Path(where).mkdir(parents=True, exist_ok=True)
            height = self.driver.execute_script("return document.body.scrollHeight")
            self.driver.set_window_size(1280, min(max(int(height) + 40, 700), 2400))
            self.driver.save_screenshot(str(Path(where) / f"ui-{name}.png"))
            self.driver.set_window_size(1280, 900)


def _browser():
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            msg = f"{path} is missing (apt-get install chromium chromium-driver)"
            if in_ci():
                pytest.fail(f"CI needs the browser: {msg}")
            pytest.skip(msg)
    needs("selenium")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900"):  # fmt: skip
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    # The driver's path is given: selenium-manager never runs, nothing is downloaded.
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    needs("starlette")
    driver = _browser()
    env = Env(tmp_path_factory.mktemp("ui-home"), tmp_path_factory.mktemp("ui-specs"))
    env.driver = driver
    env.env["UI_TEST_SECRET"] = SECRET_VALUE
    server = None
    try:
        res = env.treb("run", env.spec("fails", FAILS))
        assert res.returncode == 1, res.stderr
        res = env.treb("run", "-d", "--sweep", env.spec("sweepy", SWEEP), "-o", "env.LR=1,2,3")
        assert res.returncode == 0, res.stderr
        env.sweep_id = res.stdout.split()[0]
        res = env.treb("run", "-d", env.spec("long", LONG))
        assert res.returncode == 0, res.stderr
        env.long_id = res.stdout.split()[0]
        from trebuchet.store.db import RunRecord, Store

        store = Store(env.home / "runs.db")
        env.fails_id = store.resolve("fails").id
        # A row with a hostile name (an index rebuilt from a run dir written elsewhere).
        store.insert_run(RunRecord(id="0000beef", name=HOSTILE, backend="local",
                                   launcher="native", state="FAILED", nodes=1, procs_per_node=1,
                                   run_dir=str(env.home / "runs" / "0000beef"),
                                   created_at=1.0))  # fmt: skip
        # Metrics as the node agents write them, ingested (issue 14 section 1).
        from trebuchet.store.metrics import ingest

        fails = store.get(env.fails_id)
        mfile = Path(fails.run_dir) / "attempt-0" / "metrics" / "rank-0.jsonl"
        mfile.parent.mkdir(parents=True, exist_ok=True)
        mfile.write_text("".join(
            json.dumps({"t": 1000.0 + s, "s": s, "m": {"loss": 2.0 / (s + 1),
                                                        "accuracy": 0.9 / (s + 1)}}) + "\n"
            for s in range(20)))  # fmt: skip
        ingest(store, fails)
        store.close()
        server = subprocess.Popen([sys.executable, "-m", "trebuchet", "ui", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=env.env)  # fmt: skip
        line = server.stdout.readline()
        assert line.startswith("treb ui: http://127.0.0.1:"), (line, server.stderr.read())
        env.base, env.token = line.split()[-1].split("/?token=")
        driver.get(f"{env.base}/?token={env.token}")
        wait_for(
            "sweep to end",
            lambda: all(
                r["state"] == "SUCCEEDED" for r in env.json("status", env.sweep_id)["runs"]
            ),
        )
        yield env
    finally:
        driver.quit()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        if getattr(env, "long_id", None):
            env.treb("cancel", env.long_id)


def _http(url: str, data: bytes | None = None, cookie: str = "") -> tuple[int, dict, str]:
    req = urllib.request.Request(url, data=data, headers={"Cookie": cookie} if cookie else {})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_requests_without_the_token_are_refused(ui: Env) -> None:
    for path in ("/", f"/runs/{ui.long_id}", "/static/app.js", "/results", "/?token=wrong"):
        code, _, body = _http(ui.base + path)
        assert code == 403 and "token" in body, path
    code, _, _ = _http(f"{ui.base}/runs/{ui.long_id}/cancel", data=b"csrf=x")
    assert code == 403
    code, headers, _ = _http(f"{ui.base}/?token={ui.token}")
    assert code == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    code, headers, body = _http(ui.base + "/", cookie=cookie)
    assert code == 200 and "script-src 'self'" in headers["content-security-policy"]
    # The cookie alone does not make a POST: the CSRF token must come with it.
    code, _, _ = _http(f"{ui.base}/runs/{ui.long_id}/cancel", data=b"csrf=forged", cookie=cookie)
    assert code == 403
    assert ui.json("status", ui.long_id)["state"] in ("PENDING", "RUNNING")
    # In the browser too: without the cookie, the page is refused.
    ui.driver.delete_all_cookies()
    assert "403" in ui.get("/").find_element("tag name", "body").text
    ui.get(f"/?token={ui.token}")


def test_runs_page_shows_what_treb_ps_lists(ui: Env) -> None:
    from selenium.webdriver.support.ui import Select

    d = ui.get("/")
    rows = d.find_elements("css selector", "#runs tbody tr")
    shown = {r.get_attribute("data-run"): r.find_elements("tag name", "td") for r in rows}
    listed = ui.json("ps", "--all", "--no-refresh")
    assert set(shown) == {r["id"] for r in listed}
    for r in listed:
        cells = shown[r["id"]]
        assert cells[1].text == r["name"] and cells[3].text == r["backend"]
        if r["state"] not in ("RUNNING", "PENDING"):
            assert cells[2].text == r["state"]
    assert d.execute_script("return window.__pwned") is None  # the hostile name is text
    assert shown["0000beef"][1].text == HOSTILE
    ui.shot("runs")
    Select(d.find_element("id", "f-state")).select_by_value("FAILED")
    d.find_element("id", "f-apply").click()
    wait_for("filtered page", lambda: "state=FAILED" in d.current_url)
    ids = [r.get_attribute("data-run") for r in d.find_elements("css selector", "#runs tbody tr")]
    assert sorted(ids) == sorted(r["id"] for r in ui.json("ps", "--all", "--state", "FAILED"))
    d.find_element("id", "f-name").send_keys("swee")
    d.find_element("id", "f-apply").click()
    wait_for("no match", lambda: d.find_element("id", "count").text.endswith("of 0 runs"))


def store_metric_names(home: Path, run_id: str) -> list[str]:
    from trebuchet.store.db import Store

    store = Store(home / "runs.db")
    try:
        return list(store.metrics(run_id))
    finally:
        store.close()


def test_run_page_shows_what_treb_status_says(ui: Env) -> None:
    st = ui.json("status", ui.fails_id)
    d = ui.get(f"/runs/{ui.fails_id}")
    assert d.find_element("id", "fact-state").text == st["state"] == "FAILED"
    assert d.find_element("id", "fact-exit-code").text == str(st["exit_code"])
    ff = st["first_failure"]
    text = d.find_element("id", "first-failure").text
    assert f"rank {ff['rank']}" in text and f"code {ff['exit_code']}" in text
    assert st["diagnosis"]["root_cause"]["category"] in " ".join(
        p.text for p in d.find_elements("css selector", ".diag")
    )
    labels = [r.get_attribute("data-label") for r in d.find_elements("css selector", ".tl-row")]
    assert labels == [p["label"] for p in st["procs"]]
    first = d.find_element("css selector", ".tl-row.first").get_attribute("data-label")
    assert first == ff["label"]
    charts = d.find_elements("css selector", "#metric-charts .chart")
    names = sorted(c.get_attribute("data-name") for c in charts)
    want = sorted(store_metric_names(ui.home, ui.fails_id))  # also what its own log printed
    assert {"accuracy", "loss"} <= set(names) and names == want
    assert len(d.find_elements("css selector", "#metric-charts canvas")) == len(want)
    assert "12.5" in d.find_element("css selector", "table.results").text
    spec = d.find_element("id", "spec").text
    assert "UI_TEST_SECRET" in spec and SECRET_VALUE not in d.page_source
    wait_for("the ended log", lambda: d.find_element("id", "log-status").get_attribute(
        "data-state") == "ended")  # fmt: skip
    ui.shot("run-failed")
    d = ui.get(f"/runs/{ui.long_id}")
    assert d.find_element("id", "no-metrics").text == "no metrics recorded"


def test_live_log_follows_the_running_rank(ui: Env) -> None:
    d = ui.get(f"/runs/{ui.long_id}")

    def steps() -> list[int]:
        return [int(n) for n in re.findall(r"step (\d+) rank 0", d.find_element("id", "log").text)]

    first = wait_for("log lines", steps)
    wait_for("new lines", lambda: max(steps()) >= max(first) + 5)
    log = d.find_element("id", "log").text
    assert HOSTILE in log and d.execute_script("return window.__pwned") is None
    ui.shot("run-live")


def test_cancel_button_stops_the_run(ui: Env) -> None:
    d = ui.get(f"/runs/{ui.long_id}")
    assert ui.json("status", ui.long_id)["state"] == "RUNNING"
    d.find_element("id", "cancel").click()
    wait_for("cancelled page", lambda: d.find_element("id", "fact-state").text == "CANCELLED")
    assert ui.json("status", ui.long_id)["state"] == "CANCELLED"
    wait_for("the log's end", lambda: d.find_element("id", "log-status").get_attribute(
        "data-state") == "ended")  # fmt: skip
    assert not d.find_elements("id", "cancel")


def test_rerun_button_starts_a_new_run(ui: Env) -> None:
    d = ui.get(f"/runs/{ui.fails_id}")
    d.find_element("id", "rerun").click()
    wait_for("the new run's page", lambda: d.current_url.rsplit("/", 1)[-1] != ui.fails_id)
    new = d.find_element("id", "run-id").text
    st = wait_for("the rerun to end", lambda: (s := ui.json("status", new))["state"] not in (
        "PENDING", "RUNNING") and s)  # fmt: skip
    assert st["name"] == "fails" and st["state"] == "FAILED" and new != ui.fails_id


def test_sweep_and_results_pages(ui: Env) -> None:
    sweep = ui.json("status", ui.sweep_id)
    d = ui.get(f"/sweeps/{ui.sweep_id}")
    rows = d.find_elements("css selector", "table.sweep tbody tr")
    assert len(rows) == len(sweep["runs"]) == 3
    table = {r.find_elements("tag name", "td")[2].text: r.find_elements("tag name", "td")[3].text
             for r in rows}  # fmt: skip
    results = {r["params"]["env.LR"]: r["performance"] for r in ui.json("results", ui.sweep_id)}
    assert {k: float(v) for k, v in table.items()} == {str(k): v for k, v in results.items()}
    assert d.find_elements("css selector", "#sweep-chart canvas")
    ui.shot("sweep")
    d = ui.get("/results?workload=sweepy")
    cells = [r.find_elements("tag name", "td") for r in
             d.find_elements("css selector", "table.results tbody tr")]  # fmt: skip
    assert sorted(c[0].text for c in cells) == sorted(r["id"] for r in sweep["runs"])
    assert d.find_elements("css selector", "#trend-charts canvas")
    ui.shot("results")


# -- issue 25: what the dashboard showed wrong ---------------------------------------------------
def wait_ended(ui: Env, run_id: str, timeout: float = 120) -> None:
    """Until the run has ended, read from the store only: no `treb` command looks at it
    (one would ingest its metrics)."""
    from trebuchet.store.db import Store
    from trebuchet.store.states import TERMINAL

    def ended() -> bool:
        store = Store(ui.home / "runs.db")
        try:
            rec = store.get(run_id)
            return rec is not None and rec.state in TERMINAL
        finally:
            store.close()

    wait_for(f"run {run_id} to end", ended, timeout)


TOKENS = """\
name: tokens
command: [python, -c, "for i in range(21): print('{\\"step\\": %d, \\"tokens\\": %d}' % (i, 16050 + i * 167.5))"]
"""


def left_edge_ink(d, name: str) -> int:
    """Painted pixels in the leftmost 3 columns of a chart's canvas: a y label cut by the
    canvas edge ("16,050" drawn as "6,050") paints there."""
    return d.execute_script("""
        var c = document.querySelector('.chart[data-name="' + arguments[0] + '"] canvas');
        var px = c.getContext('2d').getImageData(0, 0, 3, c.height).data, ink = 0;
        for (var i = 3; i < px.length; i += 4) { if (px[i] > 0) { ink++; } }
        return ink;""", name)  # fmt: skip


def test_metrics_show_without_a_command_and_axis_labels_fit(ui: Env) -> None:
    """A detached run that ended without any `treb` command looking at it: its page
    ingests its metrics (it said "no metrics recorded"); the y axis is as wide as its
    labels (16,050-19,400 were cut to 6,050-9,400)."""
    res = ui.treb("run", "-d", ui.spec("tokens", TOKENS))
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.split()[0]
    wait_ended(ui, run_id)
    d = ui.get(f"/runs/{run_id}")
    assert not d.find_elements("id", "no-metrics")
    wait_for("the chart", lambda: d.find_elements(
        "css selector", '.chart[data-name="tokens"] canvas'))  # fmt: skip
    assert left_edge_ink(d, "tokens") == 0
    points = store_metric_names(ui.home, run_id)
    assert points == ["tokens"]


def test_failed_run_log_opens_the_failing_rank_and_never_says_following(ui: Env) -> None:
    """FAILS: rank 1 exits 3. The viewer opens rank 1's log; the ended run's log is read
    to its end, never "following"."""
    from selenium.webdriver.support.ui import Select

    d = ui.get(f"/runs/{ui.fails_id}")
    states = [d.find_element("id", "log-status").get_attribute("data-state")]
    chosen = Select(d.find_element("id", "log-pick")).first_selected_option
    assert chosen.get_attribute("value") == "0/rank-1.log"
    end = time.monotonic() + 15
    while states[-1] != "ended" and time.monotonic() < end:
        time.sleep(0.05)
        states.append(d.find_element("id", "log-status").get_attribute("data-state"))
    assert states[-1] == "ended" and "following" not in states, states
    assert "boom" in d.find_element("id", "log").text


HUNG = """\
name: hung
command: ["python", "-c", "import os, time\\nprint('start', flush=True)\\nn = 16 if os.environ['RANK'] == '0' else 26\\nfor i in range(n):\\n    print('step', i, flush=True); time.sleep(0.5)\\ntime.sleep(300)\\n"]
procs_per_node: 2
hang_timeout: 3s
"""


def test_hung_run_page_shows_the_stuck_rank_and_the_stacks(ui: Env) -> None:
    """Rank 0 goes silent first (after 8 s of a step every 0.5 s: its habit), rank 1
    5 s later: the hang stops the run. Its page says
    which rank is stuck, marks it in the timeline, shows every rank's stack and opens the
    stuck rank's log."""
    from selenium.webdriver.support.ui import Select

    res = ui.treb("run", ui.spec("hung", HUNG))
    assert res.returncode == 1, res.stderr
    st = ui.json("status")
    assert [a["reason"] for a in st["attempts"]] == ["hang"]
    d = ui.get(f"/runs/{st['id']}")
    who = d.find_element("id", "hang-rank")
    assert who.get_attribute("data-rank") == "0" and "rank 0" in who.text
    stacks = d.find_element("id", "stacks").text
    assert "== ranks 0, 1 " in stacks and "(<string>:6)" in stacks  # grouped as `treb stacks`
    stuck = d.find_elements("css selector", ".tl-row.stuck")
    assert [r.get_attribute("data-label") for r in stuck] == ["0:0"]
    chosen = Select(d.find_element("id", "log-pick")).first_selected_option
    assert chosen.get_attribute("value") == "0/rank-0.log"


GONE = """\
name: gone
command: 'echo "performance: 7.5 samples_per_second"'
"""


def test_removed_run_leaves_the_results_page(ui: Env) -> None:
    res = ui.treb("run", ui.spec("gone", GONE))
    assert res.returncode == 0, res.stderr
    run_id = ui.json("status")["id"]
    d = ui.get("/results?workload=gone")
    assert run_id in d.find_element("css selector", "table.results").text
    assert ui.treb("rm", run_id).returncode == 0
    d = ui.get("/results?workload=gone")
    assert not d.find_elements("css selector", "table.results") or run_id not in (
        d.find_element("css selector", "table.results").text)  # fmt: skip
    assert "gone (" not in d.find_element("css selector", ".workloads").text


INFINITE = """\
name: infinite
command: 'echo "performance: 5 samples_per_second"'
sweep: {env.LR: ["1", "inf", "nan", "2"]}
"""


def test_sweep_page_with_non_finite_parameters_still_draws(ui: Env) -> None:
    """`inf` and `nan` as a swept value: no Infinity/NaN in the page's JSON (which broke
    every chart of the page); the finite points are drawn."""
    res = ui.treb("run", ui.spec("infinite", INFINITE))
    assert res.returncode == 0, res.stderr
    sweep = next(r["sweep_id"] for r in ui.json("ps", "--all") if r["name"] == "infinite")
    d = ui.get(f"/sweeps/{sweep}")
    wait_for("the sweep chart", lambda: d.find_elements("css selector", "#sweep-chart canvas"))
    data = json.loads(d.execute_script(
        "return document.getElementById('sweep-data').textContent"))  # fmt: skip
    assert data["x"] == [1.0, 2.0]


def test_login_cookie_is_derived_scoped_and_tolerant(ui: Env) -> None:
    """The cookie is an HMAC of the token (never the token, which every server on
    127.0.0.1 would be sent), named after the port, HttpOnly, SameSite=Strict, Path=/;
    another app's JSON cookie does not lock the browser out; `?token=é` is a 403."""
    port = ui.base.rsplit(":", 1)[1]
    code, headers, _ = _http(f"{ui.base}/?token={ui.token}")
    assert code == 303
    set_cookie = headers["set-cookie"]
    name, _, value = set_cookie.split(";")[0].partition("=")
    assert name == f"treb_ui_{port}" and value and ui.token not in set_cookie
    attrs = {a.strip() for a in set_cookie.split(";")[1:]}
    assert {"Path=/", "HttpOnly", "SameSite=Strict"} <= attrs
    ours = f"{name}={value}"
    others = 'prefs={"theme": "dark", "ids": [1, 2]}; jupyter="2|1:0|10:x"'
    for cookie in (ours, f"{others}; {ours}", f"{ours}; {others}"):
        code, _, _ = _http(ui.base + "/", cookie=cookie)
        assert code == 200, cookie
    for cookie in (f"{name}={ui.token}", others, f"{name}=é".encode().decode("latin-1")):
        code, _, _ = _http(ui.base + "/", cookie=cookie)
        assert code == 403, cookie
    for bad in ("%C3%A9", "%FF", "é"):
        code, _, body = _http(f"{ui.base}/?token={bad}" if bad != "é" else
                              f"{ui.base}/?token=%C3%A9&x=1")  # fmt: skip
        assert code == 403 and "token" in body, bad
    # in the browser: a JSON cookie of another app on 127.0.0.1 beside ours
    d = ui.get("/static/style.css")
    d.add_cookie({"name": "prefs", "value": '{"theme":"dark"}', "path": "/"})
    assert ui.get("/").find_elements("id", "runs")
    d.delete_cookie("prefs")


def test_progress_eta_and_gpus_on_the_pages(ui: Env, tmp_path: Path) -> None:
    """Issue 27: a tqdm job's progress and ETA on the runs page and the run page, as `treb
    status --json` has them, and its GPUs' latest samples (a STAND-IN nvidia-smi, first on
    PATH: no GPU exists here; tests/integration/test_progress.py)."""
    needs("tqdm")
    from tests.integration.test_progress import TQDM_JOB, stand_in

    (ui.specs / "job.py").write_text(TQDM_JOB)
    spec = ui.spec("bar", "name: bar\ncommand: python job.py 400 0.1\nprocs_per_node: 2\n"
                   "gpus_per_node: 2\n")  # fmt: skip
    env = {**ui.env, **stand_in(tmp_path, 37)}
    env["PATH"] = env["PATH"].replace(os.pathsep + os.environ["PATH"], os.pathsep + ui.env["PATH"])
    res = subprocess.run([sys.executable, "-m", "trebuchet", "run", "-d", spec],
                         capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert res.returncode == 0, res.stderr
    run = res.stdout.split()[0]
    try:
        wait_for("progress", lambda: (p := ui.json("status", run)["progress"]) and p["rate"]
                 and p["fraction"] > 0.05)  # fmt: skip
        d = ui.get(f"/runs/{run}")
        span = d.find_element("css selector", "#fact-progress .run-progress")
        assert span.get_attribute("data-total") == "400"
        assert 0 < float(span.get_attribute("data-fraction")) < 1
        assert re.fullmatch(r"\d+% \d+/400, ETA \S+", span.text), span.text
        assert d.find_element("css selector", "#fact-progress progress")
        st = ui.json("status", run)
        rows = d.find_elements("css selector", "#gpus tr.gpu")
        shown = [(r.get_attribute("data-node"), r.get_attribute("data-index"),
                  r.get_attribute("data-util")) for r in rows]  # fmt: skip
        assert shown == [(str(g["node"]), str(g["index"]), str(g["util"])) for g in st["gpus"]]
        assert shown == [("0", "0", "37.0"), ("0", "1", "37.0")]
        ui.shot("run-progress")
        d = ui.get("/")
        cell = d.find_element("css selector", f"tr[data-run='{run}'] td.progress")
        assert re.fullmatch(r"\d+% \d+/400, ETA \S+", cell.text), cell.text
    finally:
        ui.treb("cancel", run)

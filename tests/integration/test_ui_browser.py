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
        res = env.treb("run", "-d", env.spec("sweepy", SWEEP), "-o", "env.LR=1,2,3")
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

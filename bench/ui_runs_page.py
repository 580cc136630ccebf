"""`treb ui`'s runs page with 10,000 runs in the store (target: under 200 ms).

The store is filled through the real Store API (bench/cli_startup.fill_store), a real
`treb ui --port 0` serves it, and each page is fetched over HTTP with the token cookie:
the time is the whole request (query, rendering, transfer) as a browser's request sees it.
With selenium and Debian's chromium + chromium-driver installed, the same pages are also
loaded in headless Chromium and the navigation timing (request start to load event) is
reported. Usage: python bench/ui_runs_page.py [--runs 10000] [--repeats 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_startup import fill_store  # noqa: E402
from common import machine, median  # noqa: E402

PAGES = {
    "runs, newest 100": "/",
    "filter state=FAILED": "/?state=FAILED",
    "filter name glob": "/?name=bench-1*",
    "sort by duration": "/?sort=duration&desc=1",
    "last page": "/?page=99",
}


def fetch(url: str, cookie: str) -> tuple[float, bytes]:
    req = urllib.request.Request(url, headers={"Cookie": cookie})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return time.perf_counter() - t, body


def browser_times(base: str, token: str, repeats: int) -> dict[str, float] | None:
    chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    if not os.path.exists(chromedriver):
        return None
    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=opts)
    try:
        driver.get(f"{base}/?token={token}")
        out = {}
        for name, path in PAGES.items():
            xs = []
            for _ in range(repeats):
                driver.get(base + path)
                xs.append(driver.execute_script(
                    "const t = performance.getEntriesByType('navigation')[0];"
                    "return t.loadEventEnd - t.requestStart;") / 1000)  # fmt: skip
            out[name] = median(xs)
        return out
    finally:
        driver.quit()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        fill_store(home, args.runs)
        env = {**os.environ, "TREB_HOME": str(home)}
        server = subprocess.Popen([sys.executable, "-m", "trebuchet", "ui", "--port", "0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                  env=env)  # fmt: skip
        try:
            url = server.stdout.readline().split()[-1]  # http://127.0.0.1:PORT/?token=...
            base, token = url.split("/?token=")
            cookie = f"treb_ui_{base.rsplit(':', 1)[1]}={token}"
            print(f"# treb ui runs page, {args.runs} runs in the store, {machine()}, "
                  f"median of {args.repeats}")  # fmt: skip
            fetch(base + "/", cookie)  # warm: imports, SQLite's page cache
            for name, path in PAGES.items():
                xs = []
                for _ in range(args.repeats):
                    dt, body = fetch(base + path, cookie)
                    xs.append(dt)
                assert b'id="runs"' in body, body[:500]
                print(f"HTTP     {name:<22} {median(xs) * 1000:7.1f} ms  ({len(body)} bytes)")
            times = browser_times(base, token, args.repeats)
            if times is None:
                print("Chromium: not measured (selenium or chromium-driver missing)")
            for name, t in (times or {}).items():
                print(f"Chromium {name:<22} {t * 1000:7.1f} ms  (request start -> load event)")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()

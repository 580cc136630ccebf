"""Environment builds: cold build with uv against pip for the same 30-line requirements,
and the warm reuse check (target < 50 ms), through trebuchet's own build code.

Cold means empty caches: a fresh UV_CACHE_DIR for uv, PIP_NO_CACHE_DIR=1 for pip. The two
tools alternate. Needs network access to PyPI.
Usage: python bench/env_build.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

REQUIREMENTS = """six==1.16.0
idna==3.7
certifi==2024.7.4
charset-normalizer==3.3.2
urllib3==2.2.2
requests==2.32.3
attrs==23.2.0
packaging==24.1
pyparsing==3.1.2
python-dateutil==2.9.0.post0
pytz==2024.1
tzdata==2024.1
click==8.1.7
itsdangerous==2.2.0
markupsafe==2.1.5
jinja2==3.1.4
werkzeug==3.0.3
flask==3.0.3
toml==0.10.2
tomli==2.0.1
typing-extensions==4.12.2
zipp==3.19.2
pyyaml==6.0.1
colorama==0.4.6
tabulate==0.9.0
docutils==0.21.2
pygments==2.18.0
more-itertools==10.3.0
decorator==5.1.1
blinker==1.8.2
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TREB_HOME"] = str(Path(tmp) / "home")
        from trebuchet.envs.build import ensure
        from trebuchet.envs.recipe import Recipe, stamp

        req = Path(tmp) / "requirements.txt"
        req.write_text(REQUIREMENTS)
        cold: dict[str, list[float]] = {"uv": [], "pip": []}
        warm: list[float] = []
        log = open(Path(tmp) / "build.log", "w")  # noqa: SIM115 - lives as long as the run
        for i in range(args.repeats):
            for tool in ("uv", "pip"):
                os.environ["UV_CACHE_DIR"] = str(Path(tmp) / f"uv-cache-{i}")
                os.environ["PIP_NO_CACHE_DIR"] = "1"
                r = Recipe(kind="venv", name=f"{tool}-{i}", prefix=str(Path(tmp) / f"{tool}-{i}"),
                           requirements_file=str(req), tool=tool)  # fmt: skip
                r.stamp = stamp(r)
                t0 = time.perf_counter()
                ensure(r, log)
                cold[tool].append(time.perf_counter() - t0)
                for _ in range(5):
                    warm.append(ensure(r, log)["check_seconds"])
        print(f"# environment builds, 30 requirements, median of {args.repeats} cold builds each")
        for tool, xs in cold.items():
            print(f"cold build {tool:<4} {statistics.median(xs):7.2f} s")
        ratio = statistics.median(cold["uv"]) / statistics.median(cold["pip"])
        print(f"uv / pip      {ratio:7.3f}")
        print(f"warm reuse check: median {statistics.median(warm) * 1000:.1f} ms, "
              f"max {max(warm) * 1000:.1f} ms over {len(warm)} checks")  # fmt: skip


if __name__ == "__main__":
    main()

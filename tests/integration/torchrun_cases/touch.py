"""A rank of the torchrun conformance matrix: writes <dir>/<RANK> with the variables it
sees (NAME=value lines), prints one line on stdout and one on stderr; --fail exits 1;
--fail-first fails the first attempt only (TORCHELASTIC_RESTART_COUNT 0)."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torchrun --run-path: runpy
from seen import seen  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--touch-file-dir")
p.add_argument("--fail", action="store_true")
p.add_argument("--fail-first", action="store_true")
args = p.parse_args()
rank = os.environ["RANK"]
print(f"creating {rank}", flush=True)
print(f"stderr of {rank}", file=sys.stderr, flush=True)
if args.fail or (args.fail_first and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"):
    sys.exit(1)
if args.touch_file_dir:
    with open(os.path.join(args.touch_file_dir, rank), "w") as f:
        f.write(seen())

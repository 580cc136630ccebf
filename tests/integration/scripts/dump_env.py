"""Writes the environment this process got to $TREB_RUN_DIR/env/<who>.json (test helper)."""

import json
import os
import sys

who = os.environ.get("RANK", "node" + os.environ.get("NODE_RANK", "?"))
out = os.path.join(os.environ["TREB_RUN_DIR"], "env")
os.makedirs(out, exist_ok=True)
data = dict(os.environ)
data["_argv"] = sys.argv[1:]
data["_cwd"] = os.getcwd()
data["_ppid"] = os.getppid()  # who started it (the node agent, torchrun)
with open(os.path.join(out, f"{who}.json.tmp"), "w") as fh:
    json.dump(data, fh)
os.replace(os.path.join(out, f"{who}.json.tmp"), os.path.join(out, f"{who}.json"))
print(f"dumped {who}")

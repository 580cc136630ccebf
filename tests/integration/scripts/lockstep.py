"""Two ranks in lockstep through files both see (LOCK, else the run directory): each
writes its step, then waits for the other to be at most one step behind, then prints.
`treb fault hang-rank` on one stops the other's output too, as a collective would,
without torch (the hang watch then finds the run hung)."""

import os
import time

rank = int(os.environ["RANK"])
folder = os.environ.get("LOCK") or os.environ["TREB_RUN_DIR"]


def other() -> int:
    try:
        with open(os.path.join(folder, f"tick-{1 - rank}")) as fh:
            return int(fh.read() or -1)
    except (OSError, ValueError):
        return -1


for step in range(2000):
    tmp = os.path.join(folder, f".tick-{rank}.tmp")
    with open(tmp, "w") as fh:
        fh.write(str(step))
    os.replace(tmp, os.path.join(folder, f"tick-{rank}"))
    while other() < step - 1:
        time.sleep(0.05)
    print(f"step {step}", flush=True)
    time.sleep(0.2)

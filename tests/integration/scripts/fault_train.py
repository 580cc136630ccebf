"""A DDP loop for `treb fault` tests: an all_reduce (gloo) and a line per step. Attempt 0
runs for minutes (the fault ends it) and leaves `ready-0-<rank>` in the run dir after 3
steps; a retry runs 5 steps and ends. A heartbeat while torch imports and the group forms
(slow on a loaded machine) keeps a short hang_timeout counting from the fault itself."""

import os
import time

from trebuchet.dist import heartbeat

heartbeat()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

heartbeat()
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = int(os.environ.get("TREB_ATTEMPT", "0"))
ready = os.path.join(os.environ["TREB_RUN_DIR"], f"ready-{attempt}-{rank}")
for step in range(5 if attempt else 3000):
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"attempt {attempt} step {step} sum {t.item():g}", flush=True)
    if step == 2:
        open(ready, "w").close()
    time.sleep(0.2)
dist.destroy_process_group()

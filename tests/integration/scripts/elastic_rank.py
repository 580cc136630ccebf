"""A rank that reports torchrun's contract as torch itself sees it (test helper).

Writes $TREB_RUN_DIR/elastic/<rank>-<attempt>.json: is_torchelastic_launched(), the
TORCHELASTIC_*/ROLE_*/GROUP_* variables, and whether a gloo group formed over env://
(no torchrun agent store to wait for). `--fail-rank R`: rank R raises inside a function
decorated with torch's @record, which writes TORCHELASTIC_ERROR_FILE; `--fail-attempts N`:
only in the first N attempts.
"""

import argparse
import json
import os

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

NAMES = (
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "RANK",
    "LOCAL_RANK", "WORLD_SIZE", "TREB_RUN_ID", "TREB_ATTEMPT",
)  # fmt: skip


def load_batch(step: int) -> None:
    raise ValueError(f"corrupt batch {step} in shard-0042 on rank {os.environ['RANK']}")


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempts", type=int, default=1 << 30)
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="env://")
    total = dist.all_reduce(__import__("torch").ones(1)) or None  # noqa: F841
    report = {name: os.environ.get(name) for name in NAMES}
    report["is_torchelastic_launched"] = dist.is_torchelastic_launched()
    report["world"] = dist.get_world_size()
    out = os.path.join(os.environ["TREB_RUN_DIR"], "elastic")
    os.makedirs(out, exist_ok=True)
    name = f"{os.environ['RANK']}-{os.environ.get('TREB_ATTEMPT', '0')}.json"
    with open(os.path.join(out, name + ".tmp"), "w") as fh:
        json.dump(report, fh)
    os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))
    dist.destroy_process_group()
    attempt = int(os.environ.get("TREB_ATTEMPT", "0"))
    if int(os.environ["RANK"]) == args.fail_rank and attempt < args.fail_attempts:
        load_batch(7)
    print(f"rank {os.environ['RANK']} ok")


if __name__ == "__main__":
    main()

"""The variables a launcher gives a rank that the matrix compares (tests/integration/
test_torchrun_conformance.py)."""

import os

NAMES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TEST_SENTINEL_PARENT",
)


def seen() -> str:
    return "".join(f"{n}={os.environ[n]}\n" for n in NAMES if n in os.environ)

"""Preflight checks: the mistakes that otherwise cost a queue wait and an NCCL timeout.

`preflight(loaded, backend)` looks at a validated spec (and, for Slurm, asks `sinfo`) and
returns findings; `treb check` prints them and `treb run` refuses errors before anything
is recorded. Stdlib only: importing this package never pulls in pydantic, rich or torch.
"""

from __future__ import annotations

from trebuchet.preflight.findings import CHECKS, ERROR, WARNING, Finding
from trebuchet.preflight.run import enforce, preflight

__all__ = ["CHECKS", "ERROR", "WARNING", "Finding", "enforce", "preflight"]

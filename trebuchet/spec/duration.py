"""Durations and sizes as users write them: 90, "90s", "30m", "2h", "1h30m", "1d",
"04:00:00"; "500MB", "2G"."""

from __future__ import annotations

import math
import re

_UNIT = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_PARTS = re.compile(r"([0-9]+(?:\.[0-9]+)?)([dhms])")
ALLOWED = "a duration such as 90, 90s, 30m, 2h, 1h30m, 1d, 04:00:00 or 1-00:00:00"
MAX_SECONDS = 366 * 86400  # a year and a day: no attempt runs longer; bounds Slurm's --time


def parse_duration(value: object) -> float:
    """Seconds in `value`; raises ValueError with the accepted forms."""
    if isinstance(value, bool):
        raise ValueError(ALLOWED)
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_text(value.strip().lower())
    else:
        raise ValueError(ALLOWED)
    if math.isnan(seconds) or seconds <= 0:
        raise ValueError(f"{ALLOWED}, greater than zero")
    if seconds > MAX_SECONDS:
        raise ValueError(f"at most {MAX_SECONDS // 86400} days")
    return seconds


def unit_seconds(text: str) -> float | None:
    """Seconds of a duration written with units ("90s", "30m", "1h30m", "1.5h", "1d"); None
    for any other form (Slurm's slurm.time reads "04:00:00" and a bare number its own way)."""
    t = text.strip().lower()
    if not t or _PARTS.sub("", t):
        return None
    return float(sum(float(n) * _UNIT[u] for n, u in _PARTS.findall(t)))


def _parse_text(text: str) -> float:
    if re.fullmatch(r"[0-9]+(\.[0-9]+)?", text):
        return float(text)
    if re.fullmatch(r"([0-9]+-)?[0-9]+(:[0-9]+){0,2}", text):
        days, has_days = 0, "-" in text
        if has_days:
            d, text = text.split("-", 1)
            days = int(d)
        nums = [int(x) for x in text.split(":")]
        # Slurm's forms: MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (a bare number is seconds).
        if has_days:
            nums += [0] * (3 - len(nums))
            h, m, s = nums
        elif len(nums) == 3:
            h, m, s = nums
        elif len(nums) == 2:
            h, m, s = 0, nums[0], nums[1]
        else:
            h, m, s = 0, nums[0], 0
        return float(days * 86400 + h * 3600 + m * 60 + s)
    if _PARTS.sub("", text) == "" and text:
        return float(sum(float(n) * _UNIT[u] for n, u in _PARTS.findall(text)))
    raise ValueError(ALLOWED)


def slurm_time(seconds: float) -> str:
    """Seconds as Slurm's D-HH:MM:SS (rounded up to whole minutes, as Slurm counts)."""
    total = int(-(-seconds // 60)) * 60
    d, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def human(seconds: float | None) -> str:
    """Short form for tables: 4s, 3m12s, 2h05m, 1d03h."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


_SIZE_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?B?)\s*", text.upper())
    if not m:
        raise ValueError("bad size")
    unit = m.group(2) if m.group(2).endswith("B") or not m.group(2) else m.group(2) + "B"
    return int(float(m.group(1)) * _SIZE_UNITS[unit])

"""Opening a file a rank can reach: regular files only, and never a wait.

A rank runs as the user, in its run directory, and may replace its log (or any file
there) with a FIFO, which blocks whoever opens it for reading until a writer comes, or
with a link to a device that never ends (/dev/zero). Every reader of such a file opens it
here: with O_NONBLOCK (a FIFO opens at once), then fstat; anything but a regular file is
refused as `NotRegular`, an OSError, which the readers already take for a missing file.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO


class NotRegular(OSError):
    """The path is a FIFO, a device, a socket or a directory: not read."""


def open_fd(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of the regular file at `path`; raises OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegular(f"{os.fspath(path)}: not a regular file")
    return fd


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """`open(path, "rb")` for a regular file only (module docstring); raises OSError."""
    return os.fdopen(open_fd(path), "rb")


def read_text(path: str | os.PathLike[str], limit: int = -1) -> str:
    """The text of a regular file (at most `limit` bytes; -1: all), undecodable bytes
    replaced; raises OSError."""
    with open_regular(path) as fh:
        return fh.read(limit).decode(errors="replace")

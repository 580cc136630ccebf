"""Opening a file a rank can reach: regular files only, and never a wait.

A rank may replace any file of its run directory with a FIFO (which blocks its reader
until a writer comes) or a link to /dev/zero. So readers open with O_NONBLOCK, then
fstat; anything but a regular file is `NotRegular`, an OSError, as a missing file is.
"""

from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # typing's, without its import (a node agent's start: issue 36)
if TYPE_CHECKING:
    from typing import BinaryIO


class NotRegular(OSError):
    pass


def open_fd(path: str | os.PathLike[str]) -> int:
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
    return os.fdopen(open_fd(path), "rb")


def read_text(path: str | os.PathLike[str], limit: int = -1) -> str:
    with open_regular(path) as fh:
        return fh.read(limit).decode(errors="replace")

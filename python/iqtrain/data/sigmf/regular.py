"""Opening what a data list names without blocking on it: a FIFO or a device named like a
SigMF file (``x.sigmf-meta`` made with ``mkfifo``) is refused, not read, since reading a FIFO
waits for a writer that may never come. The file is opened non-blocking (which a FIFO allows
with no writer) and its status checked on the descriptor, so a file swapped for a FIFO between
a check and the open is refused too."""

from __future__ import annotations

import errno
import os
import stat

__all__ = ["NotRegularFile", "open_regular", "read_regular"]


class NotRegularFile(OSError):
    """The path names something other than a regular file (``strerror`` says so)."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(errno.EINVAL, "not a regular file", os.fspath(path))


def open_regular(path: str | os.PathLike) -> int:
    """A read-only descriptor of the regular file at ``path`` (OSError otherwise)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike) -> bytes:
    """Every byte of the regular file at ``path``: one open, fstat and read for a small file
    (a buffered file object takes 3x as long), to its end whatever the size
    said (a file that grew, a short read). OSError when it cannot be read or is not a regular
    file."""
    fd = open_regular(path)
    try:
        parts = [os.read(fd, os.fstat(fd).st_size + 1)]
        while parts[-1]:
            parts.append(os.read(fd, 1 << 20))
        return b"".join(parts)
    finally:
        os.close(fd)

"""The lock a running attempt holds, and the status it implies."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

LOCK_NAME = "attempt.lock"


STATUSES = ("running", "completed", "failed", "interrupted", "crashed")


class AttemptLock:
    """The exclusive lock a running attempt holds (released by the kernel if it dies)."""

    def __init__(self, attempt: Path):
        self.path = Path(attempt) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> AttemptLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _lock_held(attempt: Path) -> bool:
    """True if a live process holds the attempt's lock."""
    try:
        fd = os.open(Path(attempt) / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock if we got it
    return False


def read_attempt_info(attempt: Path) -> dict:
    """``attempt.json`` as a dict; ValueError/OSError propagate to the caller."""
    info = json.loads((Path(attempt) / "attempt.json").read_text())
    if not isinstance(info, dict):
        raise ValueError("attempt.json is not a JSON object")
    return info


def attempt_status(attempt: Path, info: dict | None = None) -> str:
    """``running``, ``completed``, ``failed``, ``interrupted`` or ``crashed``.

    ``crashed``: attempt.json says running but no process holds the attempt's lock (the process
    was killed without a chance to record how it ended).
    """
    if info is None:
        info = read_attempt_info(attempt)
    status = info.get("status")
    if status == "running" and not _lock_held(Path(attempt)):
        return "crashed"
    return str(status)

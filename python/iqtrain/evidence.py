"""Evidence: what an attempt directory records, its lock and status, and its verification.

A running attempt holds an exclusive ``flock`` on ``<attempt>/attempt.lock`` for its whole
life. The kernel drops the lock when the process dies, however it dies (kill -9 included), so
an attempt whose ``attempt.json`` still says ``running`` but whose lock is free has crashed.
This module imports no torch: ``verify`` and ``report`` use it.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from iqtrain.errors import CheckpointError
from iqtrain.manifestcheck import ManifestError, checkpoint_problems, verify_manifest

__all__ = [
    "LOCK_NAME",
    "AttemptCheck",
    "AttemptLock",
    "attempt_status",
    "check_attempt",
    "checkpoint_problems",
    "read_attempt_info",
    "verify_attempt",
]

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


# ------------------------------------------------------------------------------- verification


@dataclass
class AttemptCheck:
    """What ``iqtrain verify`` found: ``problems`` fail verification, ``notes`` do not."""

    attempt: Path
    status: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _verify_checkpoints_only(attempt: Path, check: AttemptCheck) -> None:
    """An attempt without a manifest: each checkpoint, the config and the metric prefix."""
    from iqtrain.checkpoint import list_checkpoints

    for ckpt in list_checkpoints(attempt / "checkpoints"):
        check.problems.extend(checkpoint_problems(ckpt))


def _note_torn_tail(attempt: Path, check: AttemptCheck) -> None:
    """A stream cut mid-record by a kill: a note (no checkpoint's cursor covers the tail)."""
    from iqtrain.metrics import read_metric_stream

    path = attempt / "metrics.jsonl"
    if not path.exists():
        return
    try:
        stream = read_metric_stream(path)
    except CheckpointError as exc:
        check.problems.append(str(exc))
        return
    if stream.torn:
        check.notes.append(
            f"{path}: ends in a torn record ({stream.torn_bytes} bytes, ignored by resume)"
        )


def check_attempt(attempt: Path) -> AttemptCheck:
    """Verify an attempt: its manifest (every field, against the files) or its checkpoints.

    Raises CheckpointError when ``attempt`` is not an attempt directory at all (a bad input);
    everything else found is a problem (verification fails) or a note (leftovers of a crash).
    """
    from iqtrain.checkpoint import crash_leftovers

    attempt = Path(attempt)
    if not (attempt / "attempt.json").is_file():
        raise CheckpointError(f"{attempt}: not an attempt directory (no attempt.json)")
    try:
        info = read_attempt_info(attempt)
        if not all(isinstance(info.get(k), str) for k in ("id", "status")):
            raise ValueError("not an attempt record (no 'id'/'status')")
        status = attempt_status(attempt, info)
    except (OSError, ValueError) as exc:
        check = AttemptCheck(attempt, "unknown")
        check.problems.append(f"{attempt / 'attempt.json'}: unreadable: {exc}")
        return check
    check = AttemptCheck(attempt, status)
    if info["id"] != attempt.name:
        check.problems.append(f"attempt.json id: {info['id']!r} is not this attempt")
    if not (attempt / "config.toml").is_file():
        check.problems.append(f"{attempt / 'config.toml'}: missing")
    if not (attempt / "metrics.jsonl").is_file() and (attempt / "checkpoints").is_dir():
        check.problems.append(f"{attempt / 'metrics.jsonl'}: missing")
    for left in [*crash_leftovers(attempt), *crash_leftovers(attempt / "checkpoints")]:
        check.notes.append(f"{left}: leftover of an interrupted write or prune (ignored)")
    if status == "crashed":
        check.notes.append(
            f"{attempt}: crashed (attempt.json says running, but no process holds its lock); "
            "resume it from its newest verified checkpoint"
        )
    manifest_path = attempt / "manifest.json"
    if not manifest_path.is_file():
        if status == "completed":
            check.problems.append(f"{manifest_path}: missing, but attempt.json says completed")
        _verify_checkpoints_only(attempt, check)
        _note_torn_tail(attempt, check)
        check.problems = list(dict.fromkeys(check.problems))
        return check
    if status in ("failed", "interrupted"):  # a manifest is published only on success
        check.problems.append(f"attempt.json status: {status}, but manifest.json exists")
    elif status != "completed":  # killed between publishing and recording the end
        check.notes.append(f"{attempt}: manifest.json exists but attempt.json says {status}")
    try:
        manifest = json.loads(manifest_path.read_text())
        verify_manifest(attempt, manifest, info, check.problems)
    except (OSError, ValueError) as exc:
        check.problems.append(f"{manifest_path}: unreadable: {exc}")
    except ManifestError as exc:
        check.problems.append(str(exc))
    check.problems = list(dict.fromkeys(check.problems))  # one line per problem
    return check


def verify_attempt(attempt: Path) -> list[str]:
    """The problems :func:`check_attempt` finds (empty: the attempt verifies)."""
    return check_attempt(attempt).problems

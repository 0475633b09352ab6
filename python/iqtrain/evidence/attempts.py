"""Claiming an attempt directory and recording how it ended."""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from iqtrain.console import note
from iqtrain.errors import ConfigError, StorageError
from iqtrain.evidence.lock import AttemptLock
from iqtrain.storage import fsync_dir, storage_error, write_bytes_atomic, write_json_atomic


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def claim_attempt(run_dir: Path, config_text: str, info: dict) -> tuple[Path, AttemptLock]:
    """Create the next attempt directory, complete with config.toml and attempt.json.

    Failing before the rename is a ConfigError on ``run.dir`` (no attempt exists: exit 2).
    The directory is filled under a temporary name, locked, and renamed to its number: the
    rename claims the number atomically (it fails if the number is taken, since a claimed
    attempt is never empty), so a crash at any point leaves either no attempt or one that
    has its config and its record. The lock travels with the directory.
    """
    attempts = run_dir / "attempts"
    tmp = attempts / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        attempts.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:  # nothing exists yet: a bad run.dir (exit 2)
        raise ConfigError(f"run.dir: cannot create {attempts}: {exc.strerror or exc}") from None
    lock = AttemptLock(tmp)
    try:
        try:
            lock.acquire()
        except OSError as exc:
            raise StorageError(f"{tmp / 'attempt.lock'}: cannot write: {exc.strerror}") from None
        write_bytes_atomic(tmp / "config.toml", config_text.encode())
        while True:
            taken = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()]
            path = attempts / f"{max(taken, default=0) + 1:04d}"
            info["id"] = path.name
            write_json_atomic(tmp / "attempt.json", info)
            try:
                os.rename(tmp, path)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another run claimed this number between listing and rename
                raise StorageError(f"{path}: cannot create: {exc.strerror or exc}") from None
            fsync_dir(attempts)
            return path, lock
    except (StorageError, OSError) as exc:  # never claimed: still before it exists
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        reason = exc if isinstance(exc, StorageError) else storage_error(attempts, exc)
        raise ConfigError(f"run.dir: {reason}") from None
    except BaseException:
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def finish_attempt(attempt: Path, info: dict, status: str, step: int) -> None:
    """Record how the attempt ended. A failure here never hides the error that ended it."""
    in_flight = sys.exc_info()[1]
    info.update(status=status, finished=utc_now(), final_step=step)
    try:
        write_json_atomic(attempt / "attempt.json", info)
    except (OSError, StorageError) as exc:
        if in_flight is None:
            raise
        note(f"could not record the attempt's end: {exc}")


def requeue_point(run_dir: Path, *, notes: bool = True) -> Path | str | None:
    """What ``iqtrain run CONFIG --auto-resume`` does in ``run_dir`` (a job that is started
    again after preemption reruns the same command): the attempt to resume from its latest
    verified checkpoint (the newest attempt that has a checkpoint and did not complete), a line
    saying there is nothing to do (the newest such attempt completed), or None (no attempt
    with a checkpoint: a fresh start). An attempt still running (its lock held) is a
    CheckpointError, exit 2: two jobs never train one lineage. Attempts that ended before their
    first checkpoint are passed over, each named in a note (unless ``notes`` is false: the
    ranks other than 0)."""
    from iqtrain.checkpoint.files import list_checkpoints
    from iqtrain.errors import CheckpointError
    from iqtrain.evidence.lock import attempt_status, read_attempt_info

    root = Path(run_dir) / "attempts"
    numbered = sorted(
        (p for p in (root.iterdir() if root.is_dir() else []) if p.name.isdigit()),
        key=lambda p: int(p.name),
        reverse=True,
    )
    for attempt in numbered:
        try:
            info = read_attempt_info(attempt)
            status = attempt_status(attempt, info)
        except (OSError, ValueError):
            continue  # not an attempt (an interrupted claim): nothing to resume there
        if status == "running":
            raise CheckpointError(
                f"{attempt}: still running (its lock is held); another job trains this run"
            )
        if status == "completed":
            return f"{attempt}: completed at step {info.get('final_step')}; nothing to resume"
        if list_checkpoints(attempt / "checkpoints"):
            return attempt
        if notes:
            note(f"{attempt}: {status} before its first checkpoint; passed over")
    return None

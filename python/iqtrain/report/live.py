"""Watching a run while it trains: live TensorBoard event files and a Weights & Biases run.

Rank 0 hands every metric record it writes (train, val, probe) to :class:`LiveLog` right after
``metrics.jsonl`` got it, so the live views follow the record cadence and add nothing inside
the step; the loop's thread only queues the record, a writer thread writes the views. Both
views show the records as ``iqtrain report --tensorboard`` exports them: the same scalar names
(:func:`~iqtrain.report.tensorboard.record_scalars`, the lineage's baselines repeated at every
validation), at the same steps, wall time the time of writing (``time.time()`` when queued).

- ``[logging] tensorboard = true``: one event file per attempt in ``<attempt>/tensorboard/``,
  flushed after every record, so ``tensorboard --logdir runs/`` shows a run while it runs; a
  resumed attempt writes its own file in its own directory (its new records only).
- ``[logging] wandb = {project = …}``: one W&B run per lineage. Its id is chosen before the
  attempt is claimed and kept in ``attempt.json`` (``wandb_run_id``), a resume takes its
  parent's and continues that run (``resume="allow"``). Local files go to ``WANDB_DIR``, or
  else into the attempt directory (``<attempt>/wandb/``).

None of it is evidence: nothing is hashed, listed in the manifest or checked by verify, and
live logging never fails a run. A view that cannot be opened or written (a full disk, its
event file removed, W&B failing; W&B's directory with less than :data:`WANDB_MIN_FREE` free,
as wandb drops what it cannot write without a word) is one note line on stderr and is off for
the rest of the attempt; training goes on. A missing package is refused before any work instead
(:func:`check_live`, exit 2 naming the key). Imports neither torch nor wandb at module level.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import secrets
import string
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from iqtrain.config.sections import LoggingConfig, WandbConfig
from iqtrain.console import failure, note
from iqtrain.errors import ConfigError
from iqtrain.evidence.lock import read_attempt_info
from iqtrain.report.tensorboard import (
    EventFile,
    event_file_name,
    lineage_baselines,
    load_tensorboard,
    record_scalars,
)

__all__ = [
    "TENSORBOARD_DIR",
    "WANDB_RUN_ID",
    "LiveLog",
    "check_live",
    "wandb_run_id",
]

#: The live event files' directory inside an attempt.
TENSORBOARD_DIR = "tensorboard"
#: The attempt.json field holding the W&B run id (docs/design.md "attempt.json").
WANDB_RUN_ID = "wandb_run_id"
WANDB_EXTRA = "needs wandb: pip install 'iqtrain[wandb]'"
#: Free bytes under which the W&B run's directory counts as full (wandb-core drops a record it
#: cannot write without telling its caller, so the view looks for itself).
WANDB_MIN_FREE = 1 << 20
_ID_CHARS = string.ascii_lowercase + string.digits


def _wandb() -> Any:
    """The wandb module, or one ConfigError naming ``logging.wandb`` and the extra."""
    try:
        import wandb
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "wandb":
            raise ConfigError(f"logging.wandb {WANDB_EXTRA}") from None
        raise ConfigError(f"logging.wandb {WANDB_EXTRA} (it is installed, but {exc})") from None
    except Exception as exc:  # installed but broken: its import raised something else
        raise ConfigError(f"logging.wandb {WANDB_EXTRA} (it is installed, but {exc})") from None
    return wandb


def check_live(logging: LoggingConfig) -> None:
    """Refuse, before any work, a ``[logging]`` that asks for a package that is not installed
    (one ConfigError naming the key and the ``pip install`` that fixes it)."""
    if logging.tensorboard:
        load_tensorboard("logging.tensorboard")
    if logging.wandb is not None:
        _wandb()


def wandb_run_id(logging: LoggingConfig, parent_attempt: Path | None) -> str | None:
    """The W&B run this attempt logs to: its parent's (``parent_attempt``'s ``attempt.json``),
    so a resume continues the run; a new id when the parent had none; None without
    ``[logging] wandb``."""
    if logging.wandb is None:
        return None
    if parent_attempt is not None:
        try:
            run_id = read_attempt_info(parent_attempt).get(WANDB_RUN_ID)
        except (OSError, ValueError):
            run_id = None
        if isinstance(run_id, str) and run_id:
            return run_id
    return "".join(secrets.choice(_ID_CHARS) for _ in range(8))  # W&B's own id shape


class _View(Protocol):
    key: str  # the config key that asked for it: what its notes start with

    def write(self, wall_time: float, step: int, values: dict[str, float]) -> None: ...
    def close(self, ok: bool) -> None: ...


class _TensorBoard:
    """``<attempt>/tensorboard/events.out.tfevents.<start>.iqtrain.<run>.<id>``."""

    key = "logging.tensorboard"

    def __init__(self, attempt: Path) -> None:
        directory = attempt / TENSORBOARD_DIR
        directory.mkdir(exist_ok=True)
        start = time.time()
        name = event_file_name(start, attempt.parent.parent.name, attempt.name)
        self.out = EventFile(directory / name, start, needed_by=self.key)

    def write(self, wall_time: float, step: int, values: dict[str, float]) -> None:
        self.out.scalars(wall_time, step, values)
        self._flush()

    def _flush(self) -> None:
        self.out.flush()  # TensorBoard reads what the kernel has: visible now
        # Writes to a file whose directory was removed still succeed, into nothing.
        if os.fstat(self.out.file.fileno()).st_nlink == 0:
            raise OSError(errno.ENOENT, "removed while the run was writing it", str(self.out.path))

    def close(self, ok: bool) -> None:
        try:
            self._flush()
        finally:
            self.out.close()


class _Wandb:
    """One W&B run, resumed when it exists (its id from attempt.json)."""

    key = "logging.wandb"

    def __init__(
        self, cfg: WandbConfig, run_id: str, attempt: Path, config: dict[str, Any]
    ) -> None:
        wandb = _wandb()
        self.directory = Path(os.environ.get("WANDB_DIR") or attempt)  # where its files go
        self.run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            name=cfg.name or attempt.parent.parent.name,
            id=run_id,
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else os.fspath(attempt),
            # iqtrain's own stdout/stderr stay as they are (no capture, no wrapping).
            settings=wandb.Settings(console="off", quiet=True),
        )
        # A resume may change keys (max_steps, [logging]): the run's config follows.
        try:
            self.run.config.update(
                {**config, "attempt": attempt.name, "attempt_dir": os.fspath(attempt)},
                allow_val_change=True,
            )
        except Exception:
            with contextlib.suppress(Exception):
                self.run.finish(exit_code=1)
            raise

    def write(self, wall_time: float, step: int, values: dict[str, float]) -> None:
        _check_free(self.directory)
        self.run.log(values, step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


def _check_free(directory: Path) -> None:
    """``OSError(ENOSPC)`` naming ``directory`` when its file system has fewer than
    :data:`WANDB_MIN_FREE` bytes left for this process (root may use the reserved blocks): W&B
    would drop the records without a word, as its ``log`` never fails on a full disk."""
    st = os.statvfs(directory)
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free < WANDB_MIN_FREE:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(directory))


def _stream(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a metric stream, read lazily (a damaged line is skipped: this only looks
    for the baselines, and verify judges the stream)."""
    with open(path, "rb") as f:
        for line in f:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


class LiveLog:
    """Rank 0's live views of one attempt (:meth:`open`), fed record by record
    (:meth:`record`) and closed once (:meth:`close`). Never raises for a view's failure.

    The loop's thread only queues a record (with its wall time); one writer thread encodes it
    and writes it to every view, so neither TensorBoard's pure-Python CRC nor W&B's client
    runs on the loop's thread. Queuing wakes nobody (a wake-up costs the loop more than the
    record): the writer drains the queue every ``DRAIN_S`` seconds, and at once for
    :meth:`wait` and :meth:`close`. When the views fall ``BACKLOG`` records behind (a stalled
    W&B upload), queuing waits for them: the run slows to their pace rather than holding
    unbounded records in memory."""

    BACKLOG = 10_000
    DRAIN_S = 0.25

    def __init__(self, views: list[_View], baselines: dict[str, float]) -> None:
        self.views = views  # the writer thread's (and :meth:`close`'s, once it has ended)
        self.baselines = baselines
        self._queue: queue.SimpleQueue[tuple[float, dict[str, Any]] | threading.Event | None]
        self._queue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._writer = threading.Thread(target=self._drain, name="iqtrain-live", daemon=True)
        if views:
            self._writer.start()

    @classmethod
    def open(
        cls,
        logging: LoggingConfig,
        attempt: Path,
        *,
        run_id: str | None = None,
        config: dict[str, Any] | None = None,
        inherited: Path | None = None,
    ) -> LiveLog | None:
        """The views ``logging`` asks for (None when it asks for none). ``run_id``: the W&B
        run (attempt.json's); ``config``: the resolved config, for the W&B run;
        ``inherited``: the attempt's metric stream, holding the parent's records (a resume),
        where the lineage's baselines are found."""
        if not logging.tensorboard and logging.wandb is None:
            return None
        views: list[_View] = []
        if logging.tensorboard:
            try:
                views.append(_TensorBoard(attempt))
            except (OSError, ConfigError) as exc:
                _off("logging.tensorboard", exc)
        if logging.wandb is not None and run_id is not None:
            try:
                views.append(_Wandb(logging.wandb, run_id, attempt, config or {}))
            except Exception as exc:  # W&B is a view: it never fails the run
                _off("logging.wandb", exc)
        baselines: dict[str, float] = {}
        if inherited is not None and views:
            try:
                baselines = lineage_baselines(_stream(inherited))
            except OSError as exc:
                note(f"logging: cannot read {inherited} for the validation baselines: {exc}")
        return cls(views, baselines)

    def record(self, record: dict[str, Any]) -> None:
        """Queue one metric record, just written to metrics.jsonl, for every open view."""
        if self._writer.is_alive():
            if self._queue.qsize() >= self.BACKLOG:
                self.wait()
            self._queue.put((time.time(), dict(record)))

    def wait(self) -> None:
        """Until every record queued so far is written (or failed)."""
        done = threading.Event()
        self._queue.put(done)
        self._wake.set()
        while self._writer.is_alive() and not done.wait(1.0):
            pass

    def close(self, ok: bool) -> None:
        """Write what is queued, then close every view (``ok``: the attempt completed); a
        failure is a note."""
        if self._writer.is_alive():
            self._queue.put(None)
            self._wake.set()
            self._writer.join()
        views, self.views = self.views, []
        for view in views:
            self._close(view, ok)

    def _drain(self) -> None:
        """The writer thread: every queued record, in order, until :meth:`close`."""
        while True:
            self._wake.wait(self.DRAIN_S)
            self._wake.clear()
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return
                if isinstance(item, threading.Event):  # wait(): everything before it is done
                    item.set()
                    continue
                try:
                    self._show(*item)
                except Exception as exc:  # nothing but close may end this thread
                    note(f"logging: a record was not shown: {failure(exc)}")

    def _show(self, wall: float, record: dict[str, Any]) -> None:
        if not self.views:
            return
        if not self.baselines and record.get("kind") == "val":
            self.baselines = lineage_baselines([record])  # the lineage's first validation
        scalars = record_scalars(record, self.baselines)
        if scalars is None:
            return
        for view in list(self.views):
            try:
                view.write(wall, *scalars)
            except Exception as exc:  # a full disk, a removed file, W&B: a note, not a failure
                self.views.remove(view)
                _off(view.key, exc)
                with contextlib.suppress(Exception):  # the one note said it already
                    view.close(ok=False)

    @staticmethod
    def _close(view: _View, ok: bool) -> None:
        try:
            view.close(ok)
        except Exception as exc:
            note(f"{view.key}: {failure(exc)} (when closing it)")


def _off(key: str, exc: BaseException) -> None:
    note(f"{key}: {failure(exc)}; live logging there is off for the rest of this attempt")

"""``iqtrain report ATTEMPT --tensorboard DIR``: an attempt's metric stream as TensorBoard events.

Every finite number of every record becomes the scalar ``<kind>/<field>`` at the record's step
(``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/samples_per_s``, ``train/tflops``,
``train/mfu`` where recorded, ``val/loss``, ``val/pred_snr_db``, ``probe/accuracy``, …), except
``step`` and the constant counters ``samples`` and ``patches``; booleans are left out. A labelled
objective's validation adds ``val/accuracy`` and one ``val/class_accuracy/<class>`` per class that
has validation windows. The baselines of the first validation record (``val/baseline_zero_loss``,
``val/baseline_copy_last_loss``, or a classifier's ``val/baseline_majority_accuracy``:
model-independent, on the same fixed validation set) are written at every validation step, so
TensorBoard draws them as lines. Wall times are reconstructed: the attempt's start plus the step and
validation time of the records before, so TensorBoard's "relative" axis shows compute time. A
resumed attempt's stream holds its whole lineage (the parent's records up to the checkpoint it
resumed from), so it exports whole.

Events go to ``DIR/<run name>/<attempt id>/`` (one TensorBoard run per attempt; attempts of
different runs do not collide). Exporting again replaces that directory: the new events are
written into a temporary directory next to it, then swapped in by rename, so nothing is
duplicated; a failure (a full disk) removes it and the directories made for it. A directory
there holding anything but event files is refused, not replaced.

The writer is tensorboard's own record writer and protos, with a plain file: neither torch
(``torch.utils.tensorboard``) nor TensorFlow is imported. tensorboard is an optional extra
(``pip install 'iqtrain[tensorboard]'``). The one encoder (:class:`EventFile`) and the one
naming of scalars (:func:`record_scalars`, :func:`lineage_baselines`) serve this export and the
live event files a run writes while it trains (``[logging] tensorboard``,
:mod:`iqtrain.report.live`), so both show the same scalar names.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from iqtrain.errors import ConfigError
from iqtrain.report.summary import AttemptView, load_attempt, number
from iqtrain.storage import creatable_dir, discard_dir, missing_dirs

__all__ = [
    "EVENT_PREFIX",
    "EventFile",
    "event_file_name",
    "export_tensorboard",
    "lineage_baselines",
    "load_tensorboard",
    "record_scalars",
    "scalar_events",
    "tensorboard_target",
]

TB_EXTRA = "needs tensorboard: pip install 'iqtrain[tensorboard]'"
EVENT_PREFIX = "events.out.tfevents."
SKIPPED = frozenset({"kind", "step", "samples", "patches"})
#: The first validation's model-independent baselines: the next-patch objectives' two, or
#: a classifier's majority-class accuracy.
BASELINES = ("baseline_zero_loss", "baseline_copy_last_loss", "baseline_majority_accuracy")
#: A record field holding ``{name: number or null}``, written as ``<kind>/<field>/<name>``
#: (a classifier's validation accuracy per class; null: no window of the class).
PER_CLASS = ("class_accuracy",)
TIME_FIELDS = ("step_time_s", "time_s")


def load_tensorboard(needed_by: str = "--tensorboard") -> tuple[Any, Any, Any]:
    """(RecordWriter, Event, Summary), or one ConfigError starting with ``needed_by`` (the
    option or config key that asked for it) saying how to install tensorboard."""
    extra = f"{needed_by} {TB_EXTRA}"
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "tensorboard":
            raise ConfigError(extra) from None
        raise ConfigError(f"{extra} (it is installed, but {exc})") from None
    except ImportError as exc:  # installed but broken
        raise ConfigError(f"{extra} (it is installed, but {exc})") from None
    return RecordWriter, Event, Summary


class EventFile:
    """One TensorBoard event file, written event by event: tensorboard's ``RecordWriter`` (the
    length-prefixed, CRC-checked record framing) over a plain file, the version event first.
    The file is created new (``x``: never appended to or overwritten). ``OSError`` propagates
    (the export turns it into one line, the live writer into one note)."""

    def __init__(self, path: Path, wall_time: float, needed_by: str = "--tensorboard") -> None:
        RecordWriter, self._event, self._summary = load_tensorboard(needed_by)
        self.path = Path(path)
        self.file: BinaryIO = open(self.path, "xb")  # noqa: SIM115  # closed by close()
        self._writer = RecordWriter(self.file)
        self._put(self._event(wall_time=wall_time, file_version="brain.Event:2"))

    def _put(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())

    def scalars(self, wall_time: float, step: int, values: dict[str, float]) -> None:
        """One event holding ``values`` (tag -> value) at ``step``."""
        summary = self._summary(
            value=[self._summary.Value(tag=t, simple_value=v) for t, v in values.items()]
        )
        self._put(self._event(wall_time=wall_time, step=step, summary=summary))

    def flush(self, sync: bool = False) -> None:
        """Hand what is buffered to the kernel (a reader sees it now); ``sync``: to the disk."""
        self.file.flush()
        if sync:
            os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def event_file_name(start: float, run: str, attempt_id: str) -> str:
    """``events.out.tfevents.<start>.iqtrain.<run>.<attempt id>`` (TensorBoard finds files by
    the prefix; the rest tells one attempt's file from another's)."""
    return f"{EVENT_PREFIX}{int(start)}.iqtrain.{run}.{attempt_id}"


def _start_time(view: AttemptView) -> float:
    started = view.info.get("started")
    if isinstance(started, str):
        try:
            return datetime.fromisoformat(started).timestamp()
        except ValueError:
            pass
    try:
        return (view.path / "attempt.json").stat().st_mtime
    except OSError:
        return time.time()


def lineage_baselines(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """The model-independent baselines of the lineage (``{"val/baseline_zero_loss": …}``):
    those of the first validation record that has them (the lineage's first validation);
    empty if none has. Stops reading ``records`` at that record."""
    base = next(
        (r for r in records if r.get("kind") == "val" and any(k in r for k in BASELINES)), {}
    )
    return {f"val/{k}": v for k in BASELINES if (v := number(base, k)) is not None}


def record_scalars(
    record: dict[str, Any], baselines: dict[str, float]
) -> tuple[int, dict[str, float]] | None:
    """``(step, {tag: value})`` of one metric record: every finite number as ``<kind>/<field>``
    but ``kind, step, samples, patches`` (booleans and dicts are not numbers), every finite
    number of a :data:`PER_CLASS` dict as ``<kind>/<field>/<name>``, a validation's with the
    lineage's ``baselines``; None for a record without an integer step, a string kind or any
    such number."""
    step, kind = record.get("step"), record.get("kind")
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(kind, str):
        return None
    values = {
        f"{kind}/{k}": v
        for k in record
        if k not in SKIPPED and (v := number(record, k)) is not None
    }
    for k in PER_CLASS:
        per = record.get(k)
        if isinstance(per, dict):
            values.update(
                (f"{kind}/{k}/{name}", v) for name in per if (v := number(per, name)) is not None
            )
    if kind == "val":
        values.update(baselines)
    return (step, values) if values else None


def scalar_events(view: AttemptView) -> list[tuple[float, int, dict[str, float]]]:
    """``(wall_time, step, {tag: value})`` for each record of ``view`` with an integer step and
    at least one finite number, in stream order (see the module docstring for the tags)."""
    records = view.stream.records if view.stream is not None else []
    baselines = lineage_baselines(records)
    wall, events = _start_time(view), []
    for r in records:
        wall += sum(t for k in TIME_FIELDS if (t := number(r, k)) is not None and t > 0)
        scalars = record_scalars(r, baselines)
        if scalars is not None:
            events.append((wall, *scalars))
    return events


def _write_events(path: Path, view: AttemptView) -> int:
    """Write the event file ``path``; returns the number of scalar values written."""
    events = scalar_events(view)
    written = 0
    out = EventFile(path, events[0][0] if events else _start_time(view))
    try:
        for wall, step, values in events:
            out.scalars(wall, step, values)
            written += len(values)
        out.flush(sync=True)
    finally:
        out.close()
    return written


def _replaceable(target: Path) -> None:
    """Refuse to replace ``target`` unless it holds nothing but event files."""
    if not target.is_dir():
        raise ConfigError(f"--tensorboard {target}: exists and is not a directory")
    for entry in target.iterdir():
        if not (entry.name.startswith(EVENT_PREFIX) and entry.is_file()):
            raise ConfigError(
                f"--tensorboard {target}: holds {entry.name}, which is not a TensorBoard event "
                "file; not replacing it (remove it or export to another directory)"
            )


def tensorboard_target(attempt: Path, out_dir: Path) -> Path:
    """Where :func:`export_tensorboard` writes ``attempt``: ``out_dir/<run name>/<attempt id>/``,
    once writing it is known to be possible (tensorboard is there, an existing target holds
    event files only, ``out_dir`` can be created). ``ConfigError`` naming the path otherwise;
    ``CheckpointError`` if ``attempt`` is not an attempt. Nothing is written."""
    load_tensorboard()
    view = load_attempt(attempt)
    here = view.path.resolve()
    run_dir = view.info.get("run_dir")
    run = Path(run_dir).name if isinstance(run_dir, str) and run_dir else here.parent.parent.name
    target = Path(out_dir) / (run or "run") / here.name
    if target.exists() or target.is_symlink():
        _replaceable(target)
    why = creatable_dir(target.parent)
    if why is not None:
        raise ConfigError(f"--tensorboard {out_dir}: cannot write: {why}")
    return target


def export_tensorboard(attempt: Path, out_dir: Path) -> tuple[Path, int]:
    """Export attempt ``attempt`` into :func:`tensorboard_target`, replacing an earlier export
    of the same attempt. Returns (that directory, scalar values written).

    ``ConfigError`` (one line naming the path) without tensorboard, for a directory that cannot
    be written or that holds other files; ``CheckpointError`` if ``attempt`` is not an attempt.
    """
    target = tensorboard_target(attempt, out_dir)  # before anything is created
    view = load_attempt(attempt)
    parent, name_id = target.parent, target.name
    tmp = parent / f".tmp-{name_id}-{os.getpid()}"
    created = missing_dirs(tmp)  # DIR/<run name> and above, taken back on a failure
    try:
        parent.mkdir(parents=True, exist_ok=True)
        written = _swap_in(view, target, tmp)
    except OSError as exc:
        discard_dir(tmp, created)
        where = exc.filename or target
        raise ConfigError(f"--tensorboard {where}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        discard_dir(tmp, created)
        raise
    return target, written


def _swap_in(view: AttemptView, target: Path, tmp: Path) -> int:
    """Write ``view``'s events into ``tmp``, then rename it to ``target`` (an earlier export
    there is put back if that fails); returns the scalar values written."""
    parent, name_id = target.parent, target.name
    old = parent / f".old-{name_id}-{os.getpid()}"
    for prefix in (".tmp", ".old"):  # leftovers of a killed export
        for leftover in parent.glob(f"{prefix}-{name_id}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    name = event_file_name(_start_time(view), parent.name, name_id)
    written = _write_events(tmp / name, view)
    if target.exists():
        os.rename(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        if old.exists():
            os.rename(old, target)  # the earlier export stays as it was
        raise
    shutil.rmtree(old, ignore_errors=True)
    return written

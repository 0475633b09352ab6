"""What the training loop's records and iterations go to besides the evidence.

The loop (:class:`~iqtrain.train.loop.Trainer`) holds one list of :class:`LoopSink` and calls
every sink at the same places, in the list's order: :meth:`~LoopSink.before_step` before an
optimizer step reads its batch, :meth:`~LoopSink.on_record` with every record it has just
written (train, val, probe; after ``metrics.jsonl``, which is the evidence and stays the loop's
own), :meth:`~LoopSink.after_step` once the step's whole iteration is done (record,
validation, probe, checkpoint), and :meth:`~LoopSink.close` once when the loop ends, however it
ends. The hooks are Lightning's callbacks reduced to what this loop has; each does nothing
unless a sink overrides it.

The sinks: the attempt's live views (:class:`LiveViews`, rank 0, ``[logging]``), the profiler
(:class:`~iqtrain.train.profile.StepProfiler`, rank 0, ``training.profile_steps``) and the last
record of each kind (:class:`LastRecords`: the attempt's result reads them). None of them
decides anything in the loop: validation, the probe, checkpoints and early stopping stay in
the loop's own lines. Every rank runs the same hooks; only rank 0 writes records to
``metrics.jsonl``, and only its list holds the live views.
"""

from __future__ import annotations

from typing import Any

from iqtrain.report.live import LiveLog

__all__ = ["LastRecords", "LiveViews", "LoopSink"]


class LoopSink:
    """One consumer of the loop's iterations and records; every hook does nothing unless
    overridden. A sink never fails the run (it notes its own failures)."""

    def before_step(self, step: int) -> None:
        """Step ``step`` (1-based, as the records number it) is about to read its batch."""

    def on_record(self, record: dict[str, Any]) -> None:
        """A record the loop has just written (rank 0: to ``metrics.jsonl``)."""

    def after_step(self, step: int) -> None:
        """Step ``step``'s whole iteration is done (record, validation, probe, checkpoint)."""

    def close(self) -> None:
        """The loop ended (its last step, early stopping, a signal or a failure)."""


class LiveViews(LoopSink):
    """The attempt's live TensorBoard and W&B views (docs/design.md "Live views and the profiler"):
    each record is
    queued for them. The attempt opens the views and closes them once attempt.json records how
    it ended (W&B's exit code is the attempt's), so the loop's end leaves them open."""

    def __init__(self, live: LiveLog) -> None:
        self.live = live

    def on_record(self, record: dict[str, Any]) -> None:
        self.live.record(record)


class LastRecords(LoopSink):
    """The last record of each kind the loop wrote (every rank sees the train and val
    records; only rank 0 the probe's)."""

    def __init__(self) -> None:
        self.last: dict[str, dict[str, Any]] = {}

    def on_record(self, record: dict[str, Any]) -> None:
        self.last[record["kind"]] = record

    def get(self, kind: str) -> dict[str, Any] | None:
        """The last record of ``kind`` (``"val"``, ``"probe"``, ``"train"``); None before one."""
        return self.last.get(kind)

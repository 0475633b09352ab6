"""``training.profile_steps = [a, b]``: a torch.profiler trace of optimizer steps a..b.

Steps are numbered as the loop and the records number them (1 = the first optimizer step; a
resumed attempt continues the numbering, so it profiles what is left of the range). The
profiler starts before step ``a`` reads its batch and stops after step ``b``'s whole iteration
(record, validation, checkpoint), each step marked ``iqtrain step N`` in the trace. Written
into the attempt (rank 0 only: it is the rank that writes the attempt, docs/design.md
"Rank-0-only work"):

- ``<attempt>/profile/trace_steps_<a>-<b>.json``: the Chrome trace (``chrome://tracing``,
  Perfetto), CPU ops and, on CUDA, kernels;
- ``<attempt>/profile/memory_steps_<a>-<b>.pickle`` (CUDA only): the allocator's history
  (``torch.cuda.memory._dump_snapshot``; https://pytorch.org/memory_viz).

A run that ends inside the range (a signal, early stopping, a failure) writes what it profiled,
named by the steps it covers. Not evidence; a failure to start or write is one note and never
fails the run, and leaves nothing of that profile (no torn file, no kineto ``.tmp``). Off
(``None``), every hook returns at once.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import torch

from iqtrain.console import failure, note
from iqtrain.storage import remove_dirs, unlink_quietly
from iqtrain.train.sinks import LoopSink

__all__ = ["PROFILE_DIR", "StepProfiler"]

#: The profiles' directory inside an attempt.
PROFILE_DIR = "profile"
#: Allocator events the CUDA memory history keeps (torch's own example uses 100k).
MAX_MEMORY_EVENTS = 100_000


class StepProfiler(LoopSink):
    """The loop's profiler, one of its sinks: :meth:`before_step` / :meth:`after_step` around
    each iteration, :meth:`close` once at the end. It owns the torch profiler and the CUDA
    memory history while they run, and turns both off when it is done."""

    def __init__(self, steps: tuple[int, int] | None, directory: Path, device_type: str) -> None:
        self.steps = steps  # None: off, or done
        self.directory = Path(directory)
        self.cuda = device_type == "cuda"
        self._prof: Any = None
        self._mark: Any = None  # the running step's record_function
        self._first = 0
        self._done = 0
        self._made: list[Path] = []  # the directory, when this profiler created it

    def before_step(self, step: int) -> None:
        """Step ``step`` (1-based) is about to run: start at the range's first step."""
        if self.steps is None:
            return
        if self._prof is None:
            if not self.steps[0] <= step <= self.steps[1]:
                return
            self._start(step)
            if self._prof is None:
                return
        self._mark = torch.profiler.record_function(f"iqtrain step {step}")
        self._mark.__enter__()

    def after_step(self, step: int) -> None:
        """Step ``step``'s iteration is done: stop after the range's last step."""
        if self._prof is None:
            return
        self._end_mark()
        self._done = step
        assert self.steps is not None
        if step >= self.steps[1]:
            self._finish()

    def close(self) -> None:
        """The loop ended: write what was profiled, if it ended inside the range."""
        if self._prof is not None:
            self._end_mark()
            self._finish()

    def _start(self, step: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            made = not self.directory.exists()
            self.directory.mkdir(exist_ok=True)
            self._made = [self.directory] if made else []
            if self.cuda:
                torch.cuda.memory._record_memory_history(max_entries=MAX_MEMORY_EVENTS)
            prof = torch.profiler.profile(
                activities=activities, record_shapes=True, profile_memory=True
            )
            prof.start()
        except Exception as exc:  # a profile is never worth a failed run
            self.steps = None
            self._stop_memory_history()
            note(f"training.profile_steps: cannot profile: {failure(exc)}")
            return
        self._prof, self._first, self._done = prof, step, step - 1

    def _end_mark(self) -> None:
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _finish(self) -> None:
        prof, self._prof, self.steps = self._prof, None, None  # once per attempt
        name = f"steps_{self._first}-{max(self._done, self._first)}"
        trace = self.directory / f"trace_{name}.json"
        memory = self.directory / f"memory_{name}.pickle"
        try:
            prof.stop()
            prof.export_chrome_trace(os.fspath(trace))
            if not trace.is_file():  # the exporter logs its failure, it does not raise
                raise OSError(errno.ENOENT, "the profiler could not write it", os.fspath(trace))
            written = [trace]
            if self.cuda:
                torch.cuda.memory._dump_snapshot(os.fspath(memory))
                written.append(memory)
        except Exception as exc:
            # Kineto writes <trace>.tmp and renames it: a full disk leaves that, or a torn
            # snapshot. All of the profile goes, and the directory if it was made for it.
            for path in (trace, trace.with_name(f"{trace.name}.tmp"), memory):
                unlink_quietly(path)
            remove_dirs(self._made)
            note(f"training.profile_steps: cannot write the profile of {name}: {failure(exc)}")
        else:
            note(f"profile of {name.replace('_', ' ')}: {', '.join(map(os.fspath, written))}")
        finally:
            self._stop_memory_history()

    def _stop_memory_history(self) -> None:
        if self.cuda:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception as exc:
                note(f"training.profile_steps: cannot stop the CUDA memory history: {exc}")

"""The training loop: a short read over components that own their state.

``Trainer.train()`` reads top to bottom: next batch -> prepare -> step -> record -> maybe
validate (and probe) -> maybe checkpoint -> stop early or on a signal. Each component owns its
state and has ``state_dict()``/``load_state_dict()``: the step (model and optimizer, in
safetensors), the stream (the loader cursor), the loop state, the RNG and the metric writer (its
cursor); a checkpoint is the mapping of component name to state (:func:`state_components`), and
a restore is one loop over the same mapping. state.json's keys are
:class:`~iqtrain.checkpoint.state.CheckpointState`'s. When to save, what to keep and how the
ranks write a checkpoint is the :class:`~iqtrain.checkpoint.manager.CheckpointManager`'s; the
loop only asks it. The loop reads its own config sections (``[training]``, ``[data]``) and
nothing else of the config.

Every record rank 0 writes goes to the metric stream (the evidence) and then to the loop's one
list of sinks (:mod:`iqtrain.train.sinks`), which also hear when each iteration starts and ends:
the live views (TensorBoard, W&B), the profiler (``training.profile_steps``) and the last
record of each kind. Validation, the probe, checkpoints and early stopping are the loop's own
lines.
"""

from __future__ import annotations

import math
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint.files import checkpoint_name
from iqtrain.checkpoint.manager import CheckpointManager
from iqtrain.checkpoint.state import (
    COMPONENTS,
    LOOP_DEFAULTS,
    LOOP_FIELDS,
    CheckpointState,
    loop_field_problem,
)
from iqtrain.config.sections import DataConfig, TrainingConfig
from iqtrain.console import Interrupted, Progress, SignalGuard
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.data.identity import DataIdentity
from iqtrain.errors import CheckpointError, IQTrainError
from iqtrain.evidence.lineage import Parent
from iqtrain.evidence.metrics import MetricWriter
from iqtrain.model.flops import achieved_tflops, device_peak_tflops, mfu
from iqtrain.objectives import Objective
from iqtrain.report.summary import probe_summary
from iqtrain.train.probe import TrainingProbe, probe_due
from iqtrain.train.profile import PROFILE_DIR, StepProfiler
from iqtrain.train.rng import RNGState
from iqtrain.train.schedule import Plan, lr_at
from iqtrain.train.sinks import LastRecords, LoopSink
from iqtrain.train.step import StepResult, TrainStep
from iqtrain.train.validation import prepare_batch, validate, validate_classify

__all__ = [
    "LoopParts",
    "LoopState",
    "Trainer",
    "peak_memory",
    "spike_update",
    "state_components",
]

SPIKE_FACTOR = 3.0  # a train loss above 3x its running average is flagged as a spike
SPIKE_EMA = 0.9  # weight of the past in that running average


@dataclass
class LoopState:
    """The loop's counters: best validation, the loss average for spikes, validations run,
    and early stopping's bookkeeping (the reference an improvement must beat by
    ``training.early_stop_min_delta``, and the validations since one did).

    What "best" and "improvement" follow is the objective's monitored value
    (:attr:`~iqtrain.objectives.Objective.monitor`, its rules
    :meth:`~iqtrain.objectives.Objective.improves` and ``beats``): the validation loss, lower
    is better, or a labelled objective's accuracy, higher is better (``best_val_accuracy``;
    ``best_val_loss`` is then the best validation's loss, and ``early_stop_ref`` an
    accuracy)."""

    step: int = 0
    best_val_loss: float | None = None
    best_val_accuracy: float | None = None
    best_step: int | None = None
    best_checkpoint: str | None = None  # relative to the run dir: may live in an ancestor
    loss_ema: float | None = None
    validations: int = 0
    early_stop_ref: float | None = None
    stale_validations: int = 0

    def record_loss(self, loss: float, nats: bool = False) -> bool:
        """Fold a train loss into the running average; True if it is a spike (``nats``: the
        loss is a negative log-likelihood, see :func:`spike_update`)."""
        spike, self.loss_ema = spike_update(self.loss_ema, loss, nats)
        return spike

    def record_validation(
        self,
        record: dict[str, Any],
        attempt: Path,
        objective: Objective,
        min_delta: float = 0.0,
    ) -> bool:
        """Count a validation ``record``; True (and remember it as best) if its monitored value
        improved strictly on the best.

        For early stopping an improvement counts only when it beats the reference by more than
        ``min_delta`` (then the reference moves to it, as in Keras and Lightning); any other
        validation is one more without improvement."""
        value = objective.value_of(record)
        if value is None:
            raise ValueError(f"a validation record without its {objective.monitor}: {record!r}")
        # best_val_loss or best_val_accuracy: the monitored field's best (state.json's keys)
        improved = objective.improves(value, getattr(self, f"best_val_{objective.monitor}"))
        if improved:
            self.best_val_loss, self.best_val_accuracy = record["loss"], record.get("accuracy")
            self.best_step = self.step
            name = checkpoint_name(self.step)
            self.best_checkpoint = f"attempts/{attempt.name}/checkpoints/{name}"
        if objective.beats(value, self.early_stop_ref, min_delta):
            self.early_stop_ref, self.stale_validations = value, 0
        else:
            self.stale_validations += 1
        self.validations += 1
        return improved

    def state_dict(self) -> dict[str, Any]:
        """state.json ``loop`` (its keys: :data:`~iqtrain.checkpoint.state.LOOP_FIELDS`). The
        step is stored beside the other components (state.json ``step``), not in it."""
        return {key: getattr(self, key) for key in LOOP_FIELDS}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Every key of :data:`~iqtrain.checkpoint.state.LOOP_FIELDS` (KeyError when one is
        missing, TypeError naming it when its type is wrong), or nothing."""
        state = {**LOOP_DEFAULTS, **state}
        for key in LOOP_FIELDS:
            problem = loop_field_problem(key, state[key])
            if problem is not None:
                raise TypeError(problem)
        for key in LOOP_FIELDS:
            setattr(self, key, state[key])


def spike_update(ema: float | None, loss: float, nats: bool = False) -> tuple[bool, float]:
    """``(spike, new_ema)``: a loss above SPIKE_FACTOR x its running average is a spike.

    ``nats`` (a negative log-likelihood per complex sample: the "categorical" objective): a
    loss more than ``ln SPIKE_FACTOR`` above its running average is a spike. That is the same
    rule in the log domain: for a Gaussian of two real values per sample, an error variance
    SPIKE_FACTOR times larger costs ``2 * ln(SPIKE_FACTOR) / 2`` more nats per sample; a ratio
    of cross-entropies (8.3 nats untrained, 3-5 trained) would never flag a divergence."""
    if nats:
        spike = ema is not None and loss > ema + math.log(SPIKE_FACTOR)
    else:
        spike = ema is not None and loss > SPIKE_FACTOR * ema
    new = loss if ema is None else SPIKE_EMA * ema + (1 - SPIKE_EMA) * loss
    return spike, new


def peak_memory(device_type: str) -> dict[str, int]:
    """The process's peak resident memory so far (``getrusage``: kB on Linux, bytes on macOS)
    and, on CUDA, the most bytes torch's allocator has held on this device. Cheap: one
    syscall, and a counter torch keeps (no device synchronisation)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"peak_rss_bytes": int(rss if sys.platform == "darwin" else rss * 1024)}
    if device_type == "cuda":
        out["cuda_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def state_components(stream: TrainStream, loop: LoopState, rng: RNGState) -> dict[str, Any]:
    """The JSON-state components of a checkpoint, by their state.json key
    (:data:`~iqtrain.checkpoint.state.COMPONENTS`): what a checkpoint saves and a restore
    loads."""
    return dict(zip(COMPONENTS, (stream, loop, rng), strict=True))


_TORCH_DTYPES = {"int8": torch.int8, "int16": torch.int16, "float32": torch.float32}


def _ring(stream: TrainStream, device: torch.device, microbatches: int) -> list[torch.Tensor]:
    """Caller-owned batch buffers the stream assembles into: pinned on CUDA (so the copy to
    the device needs no staging copy), enough for the prefetch and one step's microbatches."""
    ds = stream.dataset
    rows = stream.batch_size // stream.world_size
    ring = [
        torch.empty(
            (rows, ds.window_len, 2),
            dtype=_TORCH_DTYPES[ds.dtype.name],
            pin_memory=device.type == "cuda",
        )
        for _ in range(stream.prefetch + microbatches)
    ]
    stream.use_ring([t.numpy() for t in ring])
    return ring


def _label_ring(stream: TrainStream, device: torch.device, slots: int) -> list[torch.Tensor]:
    """A labelled objective: one ``[rows]`` int64 label buffer per batch ring slot, pinned on CUDA
    (a non-blocking copy from pageable memory is staged through a synchronous one). Buffer ``i``
    holds the labels of the batch in slot ``i`` and is held and released with it: the step's host
    sync (``train_step``) has finished its copy before the slot is released."""
    rows = stream.batch_size // stream.world_size
    pinned = device.type == "cuda"
    return [torch.empty(rows, dtype=torch.int64, pin_memory=pinned) for _ in range(slots)]


def restore(parent: Parent, stepper: TrainStep, components: dict[str, Any]) -> None:
    """Continue exactly where ``parent``'s checkpoint stopped: the step's tensors, then one
    loop over the same component mapping a checkpoint writes. Runs before the child exists,
    so a checkpoint that cannot be restored is a CheckpointError (exit 2) naming its state.
    A sharded checkpoint's tensors are loaded later, by every rank together, once the step is
    sharded (:meth:`TrainStep.load_sharded`); its JSON components are restored here."""
    try:
        if parent.sharded is None:
            stepper.load_state_dict(
                {"model": parent.model_state, "optimizer": parent.optimizer_state}
            )
        for name, component in components.items():
            component.load_state_dict(parent.state.components[name])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as exc:
        raise CheckpointError(
            f"{parent.checkpoint / 'state.json'}: cannot restore: {type(exc).__name__}: {exc}"
        ) from None


@dataclass
class LoopParts:
    """The components a :class:`Trainer` runs over, built and checked before the attempt
    exists (:mod:`iqtrain.train.attempt`). ``identity`` is every rank's (each reads its share
    of the digests); ``probe`` is rank 0's alone (only when ``[probe] every`` > 0); ``sinks``
    are the attempt's own (rank 0's live views, only with ``[logging]``, opened once the
    attempt exists), which the loop adds to its own."""

    stepper: TrainStep
    stream: TrainStream
    val: IQDataset
    plan: Plan
    loop: LoopState
    identity: DataIdentity | None = None
    probe: TrainingProbe | None = None
    sinks: list[LoopSink] = field(default_factory=list)
    #: Where the lineage's first weights came from (``[init] from``): every checkpoint's
    #: state.json binds it (docs/design.md "A new attempt from existing weights").
    init: dict[str, Any] | None = None
    #: A labelled objective: the class of each training and validation window (indices into
    #: ``classes``, the training set's sorted class names; every state.json records them).
    train_labels: np.ndarray | None = None
    val_labels: np.ndarray | None = None
    classes: tuple[str, ...] | None = None
    #: The one sample rate of the recordings (None: none recorded, or several under
    #: ``data.sample_rate = "any"``): every state.json records it.
    sample_rate: float | None = None


class Trainer:
    """One attempt's loop over its components (built by ``run_attempt``)."""

    def __init__(
        self,
        training: TrainingConfig,
        data: DataConfig,
        attempt: Path,
        parts: LoopParts,
        *,
        checkpoints: CheckpointManager,
        metrics: MetricWriter | None,
        config_sha: str,
        probe_every: int = 0,
    ) -> None:
        """With several ranks every rank builds a Trainer and runs the same loop (the same
        decisions from the same agreed numbers); only rank 0 has ``metrics`` (and the parts'
        ``probe`` and its live views) and writes: the records, the checkpoints, the
        profile."""
        self.training, self.data, self.attempt = training, data, attempt
        self.stepper, self.stream, self.val, self.plan = (
            parts.stepper,
            parts.stream,
            parts.val,
            parts.plan,
        )
        self.loop, self.identity, self.probe = parts.loop, parts.identity, parts.probe
        self.metrics, self.checkpoints = metrics, checkpoints
        self.probe_every, self.config_sha, self.init = probe_every, config_sha, parts.init
        self.train_labels, self.val_labels = parts.train_labels, parts.val_labels
        self.classes, self.sample_rate = parts.classes, parts.sample_rate
        self.world = self.stepper.world
        self.rng = RNGState(self.world)
        self.stopped_early: dict[str, Any] | None = None
        t = training
        self.ring = _ring(self.stream, self.stepper.device, t.grad_accum)
        self.label_ring = (
            []
            if self.train_labels is None
            else _label_ring(self.stream, self.stepper.device, len(self.ring))
        )
        self.flops_per_window = self.stepper.model.train_flops_per_window(data.seq_patches)
        self.objective = self.stepper.model.objective
        # The records' TFLOP/s are the whole job's (the global batch), so MFU divides by the
        # peak of every rank's device together.
        peak = device_peak_tflops(t.device, t.precision, t.peak_tflops or None)
        self.peak_tflops = None if peak is None else peak * self.world.world_size
        self.components = state_components(self.stream, self.loop, self.rng)
        # What hears every iteration and record (rank 0's profiler and live views).
        self.last = LastRecords()
        profile = t.profile_steps if self.world.is_main else None
        profiler = StepProfiler(profile, attempt / PROFILE_DIR, self.stepper.device.type)
        self.sinks: list[LoopSink] = [self.last, profiler, *parts.sinks]

    def train(self) -> None:
        """Run to ``plan.max_steps`` or until early stopping (``stopped_early`` says why); a
        signal ends it after a checkpoint (Interrupted)."""
        t = self.training
        progress = Progress(self.loop.step, self.plan.max_steps, t.log_every, self.world.is_main)
        try:
            with SignalGuard(announce=self.world.is_main) as guard:
                while self.loop.step < self.plan.max_steps:
                    for sink in self.sinks:
                        sink.before_step(self.loop.step + 1)
                    t0 = time.perf_counter()
                    result = self._step(stop=lambda: guard.signum is not None)
                    self._record(result, time.perf_counter() - t0, progress)
                    final = self.loop.step == self.plan.max_steps
                    improved = stop_early = False
                    if self.loop.step % t.eval_every == 0 or final:
                        improved = self._validate(progress)
                        stop_early = not final and self._patience_exhausted()
                        self._maybe_probe(progress, last=final or stop_early)
                    end = final or stop_early
                    if self.checkpoints.due(self.loop.step, final=end, improved=improved):
                        self.checkpoint()
                    for sink in self.sinks:
                        sink.after_step(self.loop.step)
                    if stop_early:
                        self._stop_early(progress)
                        break
                    # result.stop: a signal on any rank (agreed in the step's all-reduce); one
                    # process also stops for a signal that came after it.
                    stop = result.stop or (not self.world.distributed and guard.signum is not None)
                    if stop and not final:
                        if not self.checkpoints.saved_at(self.loop.step):
                            self.checkpoint()
                        # A rank whose peer was signalled ends as if terminated.
                        signum = guard.signum or signal.SIGTERM
                        raise Interrupted(signum, self.attempt, self.world.world_size)
        finally:
            for sink in self.sinks:
                sink.close()
            progress.close()

    def _patience_exhausted(self) -> bool:
        patience = self.training.early_stop_patience
        return patience > 0 and self.loop.stale_validations >= patience

    def _stop_early(self, progress: Progress) -> None:
        t, loop = self.training, self.loop
        reason = (
            f"no validation improved on {loop.early_stop_ref:.6g} by more than "
            f"{t.early_stop_min_delta:g} in {loop.stale_validations} validations "
            f"(training.early_stop_patience = {t.early_stop_patience})"
        )
        self.stopped_early = {"step": loop.step, "best_step": loop.best_step, "reason": reason}
        progress.note(f"stopped early at step {loop.step}: {reason}")

    def _step(self, stop: Callable[[], bool]) -> StepResult:
        """Read A microbatches into the ring, prepare them and run one optimizer step."""
        micro, ids, slots = [], [], []
        try:
            for _ in range(self.training.grad_accum):
                slots.append(self.stream.next_slot())
                ids.append(self.stream.last_ids())
                micro.append(prepare_batch(self.ring[slots[-1]], self.stepper, self.data)[0])
            s = self.loop.step  # 0-based index of the step being run
            lr = lr_at(s, self.plan)
            ids_all = np.concatenate(ids)
            labels = None
            if self.train_labels is not None:  # each window's class travels with it
                labels = [self._labels(slot, i) for slot, i in zip(slots, ids, strict=True)]
            result = self.stepper.train_step(
                micro, lr, step=s + 1, window_ids=ids_all, stop=stop, labels=labels
            )
        finally:
            # train_step has synchronised with the device (its finite check), so every copy out
            # of these buffers (and of their label buffers) is done and the stream may fill them
            # again.
            for slot in slots:
                self.stream.release(slot)
        self.loop.step = s + 1
        return result

    def _labels(self, slot: int, ids: np.ndarray) -> torch.Tensor:
        """A labelled objective: the classes of windows ``ids`` (the batch in ring slot ``slot``),
        written into that slot's label buffer, which the step copies to the device."""
        assert self.train_labels is not None
        buf = self.label_ring[slot]
        buf.numpy()[:] = self.train_labels[ids.astype(np.int64)]
        return buf

    def _record(self, result: StepResult, dt: float, progress: Progress) -> None:
        d = self.data
        samples = d.batch_size * self.training.grad_accum
        spike = self.loop.record_loss(result.loss, nats=self.objective.nll)
        # Every position is computed (the last one predicts nothing, but costs the same).
        tflops = achieved_tflops(self.flops_per_window, samples, dt)
        record = {
            "kind": "train",
            "step": self.loop.step,
            "loss": result.loss,
            "lr": result.lr,
            "grad_norm": result.grad_norm,
            "clipped": result.clipped,
            "samples": samples,
            "patches": samples * (d.seq_patches - 1),
            "step_time_s": dt,
            "samples_per_s": samples / dt if dt > 0 else 0.0,
            "tflops": tflops,
            "spike": spike,
        }
        if self.objective.labelled:  # its targets are windows, not patches
            del record["patches"]
        utilisation = mfu(tflops, self.peak_tflops)
        if utilisation is not None:
            record["mfu"] = utilisation
        record.update(peak_memory(self.stepper.device.type))
        self._write(record)
        progress.update(self.loop.step, result.loss, result.lr, samples / dt if dt > 0 else 0.0)

    def _write(self, record: dict[str, Any]) -> None:
        """One record into the metric stream (rank 0), then to every sink (which never raise:
        a live view that fails is a note and is off)."""
        if self.metrics is not None:
            self.metrics.write(record)
        for sink in self.sinks:
            sink.on_record(record)

    def _validate(self, progress: Progress) -> bool:
        """Full validation, its record, and whether it improved on the best."""
        v0 = time.perf_counter()
        step, first = self.loop.step, self.loop.validations == 0
        if self.objective.labelled:
            assert self.classes is not None and self.val_labels is not None
            rec = validate_classify(
                self.stepper, self.val, self.val_labels, self.classes, self.data, step, first
            )
        else:
            rec = validate(self.stepper, self.val, self.data, step, first)
        min_delta = self.training.early_stop_min_delta
        improved = self.loop.record_validation(rec, self.attempt, self.objective, min_delta)
        rec = {"kind": "val", "step": step, **rec, "best": improved}
        rec["time_s"] = time.perf_counter() - v0
        self._write(rec)
        what = self.objective.validation_note(rec)
        progress.note(f"val step {step}: {what}{'  best' if improved else ''}")
        return improved

    def _maybe_probe(self, progress: Progress, last: bool) -> None:
        """``[probe]`` after a validation it is due at (and the last): rank 0 probes while the
        others wait for it. Probe data that fails now (changed, unreadable, non-finite) costs
        the probe record, not the training run: one note line, training goes on."""
        if not probe_due(self.probe_every, self.loop.validations, last):
            return
        p0 = time.perf_counter()
        model: Any = self.stepper.model
        if self.stepper.forward_is_collective:  # sharded: gathered whole onto rank 0
            model = self.stepper.model_state_dict()
        if self.probe is not None and self.metrics is not None:  # rank 0
            try:
                rec = self.probe.record(model, self.loop.step)
            except (IQTrainError, OSError) as exc:
                progress.note(f"probe step {self.loop.step}: skipped: {exc}")
            else:
                rec["time_s"] = time.perf_counter() - p0
                self._write(rec)
                progress.note(f"probe step {rec['step']}: {probe_summary(rec)}")
        self.world.wait_for_main()

    def checkpoint(self) -> Path | None:
        """Save every component's state at this step (every rank: the RNG component gathers
        all ranks' generators, a sharded step gathers the whole model onto rank 0); the
        manager writes it, with the ranks' shards, and prunes. The path on rank 0."""
        if self.identity is not None:
            # The first checkpoint waits for the background digests: every rank for its share,
            # then one gather (a collective: every rank is here), rank 0 merges.
            self.identity.digests()
        self.world.wait_for_main()
        components = {name: c.state_dict() for name, c in self.components.items()}
        tensors = self.stepper.state_dict()
        return self.checkpoints.save(
            tensors["model"],
            tensors["optimizer"],
            self._state(components) if self.world.is_main else None,
            step=self.loop.step,
            protect=self.loop.best_checkpoint,
            write_shards=self.stepper.save_sharded if self.stepper.sharded else None,
        )

    def _digests(self) -> dict[str, dict[str, str]]:
        assert self.identity is not None
        digests = self.identity.digests()  # merged by the first checkpoint's collective
        assert digests is not None  # rank 0's
        return digests

    def _state(self, components: dict[str, dict[str, Any]]) -> CheckpointState:
        """Rank 0's state.json of this step (the metric stream synced to disk first: the
        cursor must never point past what is there)."""
        assert self.identity is not None and self.metrics is not None
        self.identity.check_lengths()
        self.metrics.sync()
        return CheckpointState(
            step=self.loop.step,
            config_sha256=self.config_sha,
            plan=self.plan.to_dict(),
            fingerprints=self.identity.fingerprints,
            data=self._digests(),
            metrics=self.metrics.state_dict(),
            components=components,
            init=self.init,
            classes=None if self.classes is None else list(self.classes),
            sample_rate=self.sample_rate,
        )

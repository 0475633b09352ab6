"""The training loop: a short read over components that own their state.

``Trainer.train()`` reads top to bottom: next batch -> prepare -> step -> record -> maybe
validate -> maybe checkpoint -> stop on signal. Each component owns its state and has
``state_dict()``/``load_state_dict()``: the step (model and optimizer, in safetensors), the
stream (the loader cursor), the loop state, the RNG and the metric writer (its cursor); a
checkpoint is the mapping of component name to state, and a restore is one loop over the same
mapping. When to save and what to keep is the :class:`~iqtrain.checkpoint.CheckpointManager`'s
policy; the loop only asks it.
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint import CheckpointManager, checkpoint_name
from iqtrain.config import Config
from iqtrain.console import Interrupted, Progress, SignalGuard
from iqtrain.data import IQDataset, TrainStream
from iqtrain.errors import CheckpointError, DataError, IQTrainError
from iqtrain.flops import achieved_tflops, device_peak_tflops, mfu
from iqtrain.lineage import STATE_VERSION, Parent
from iqtrain.metrics import MetricWriter
from iqtrain.rngstate import RNGState
from iqtrain.schedule import Plan, lr_at
from iqtrain.sigmf_meta import BYTES_PER_SAMPLE
from iqtrain.step import StepResult, TrainStep
from iqtrain.trainprobe import TrainingProbe, probe_due
from iqtrain.validation import prepare_batch, validate

__all__ = [
    "DataIdentity",
    "LoopState",
    "Trainer",
    "compute_digests",
    "spike_update",
]

SPIKE_FACTOR = 3.0  # a train loss above 3x its running average is flagged as a spike
SPIKE_EMA = 0.9  # weight of the past in that running average


@dataclass
class LoopState:
    """The loop's counters: best validation, the loss average for spikes, validations run,
    and early stopping's bookkeeping (the reference loss an improvement must beat by
    ``training.early_stop_min_delta``, and the validations since one did)."""

    step: int = 0
    best_val_loss: float | None = None
    best_step: int | None = None
    best_checkpoint: str | None = None  # relative to the run dir: may live in an ancestor
    loss_ema: float | None = None
    validations: int = 0
    early_stop_ref: float | None = None
    stale_validations: int = 0

    def record_loss(self, loss: float) -> bool:
        """Fold a train loss into the running average; True if it is a spike."""
        spike, self.loss_ema = spike_update(self.loss_ema, loss)
        return spike

    def record_validation(self, loss: float, attempt: Path, min_delta: float = 0.0) -> bool:
        """Count a validation; True (and remember it as best) if it improved strictly.

        For early stopping an improvement counts only when it beats the reference by more than
        ``min_delta`` (then the reference moves to it, as in Keras and Lightning); any other
        validation is one more without improvement."""
        improved = self.best_val_loss is None or loss < self.best_val_loss
        if improved:
            self.best_val_loss, self.best_step = loss, self.step
            name = checkpoint_name(self.step)
            self.best_checkpoint = f"attempts/{attempt.name}/checkpoints/{name}"
        if self.early_stop_ref is None or loss < self.early_stop_ref - min_delta:
            self.early_stop_ref, self.stale_validations = loss, 0
        else:
            self.stale_validations += 1
        self.validations += 1
        return improved

    def state_dict(self) -> dict[str, Any]:
        # The step is stored beside the other components (state.json "step"), not in "loop".
        return {k: v for k, v in asdict(self).items() if k != "step"}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        kinds = {
            "best_val_loss": (float, type(None)),
            "best_step": (int, type(None)),
            "best_checkpoint": (str, type(None)),
            "loss_ema": (float, type(None)),
            "validations": (int,),
        }
        # Checkpoints written before early stopping existed lack its two keys: a fresh count.
        state = {"early_stop_ref": state.get("best_val_loss"), "stale_validations": 0, **state}
        kinds["early_stop_ref"] = (float, type(None))
        kinds["stale_validations"] = (int,)
        for key, kind in kinds.items():
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TypeError(f"loop.{key} is {value!r}")
        for key in kinds:
            setattr(self, key, state[key])


def spike_update(ema: float | None, loss: float) -> tuple[bool, float]:
    """``(spike, new_ema)``: a loss above SPIKE_FACTOR x its running average is a spike."""
    spike = ema is not None and loss > SPIKE_FACTOR * ema
    new = loss if ema is None else SPIKE_EMA * ema + (1 - SPIKE_EMA) * loss
    return spike, new


def compute_digests(train: IQDataset, val: IQDataset) -> dict[str, dict[str, str]]:
    """Full-content digests of every recording (reads every byte): BLAKE3 of each data file,
    SHA-256 of each ``.sigmf-meta`` (its captures and datatype decide what a window reads)."""
    return {
        "train": train.content_digests(),
        "val": val.content_digests(),
        "train_meta": _meta_digests(train),
        "val_meta": _meta_digests(val),
    }


def _meta_digests(ds: IQDataset) -> dict[str, str]:
    out = {}
    for rec in ds.recordings:
        try:
            out[str(rec.meta_path)] = hashlib.sha256(rec.meta_path.read_bytes()).hexdigest()
        except OSError as exc:
            raise DataError(f"{rec.meta_path}: cannot read: {exc.strerror or exc}") from None
    return out


class DataIdentity:
    """What the attempt trained on: sampled fingerprints and full-content digests.

    A fresh run computes the digests in a background thread (the Rust digest releases the GIL),
    so the first step never waits for them; the first checkpoint does, since it records them.
    A resume passes the digests it already computed and compared with its parent's.
    """

    def __init__(self, train: IQDataset, val: IQDataset, digests: dict | None = None):
        self.fingerprints = {"train": train.fingerprint, "val": val.fingerprint}
        self._lengths = [
            (rec, rec.num_samples * BYTES_PER_SAMPLE[rec.datatype])
            for ds in (train, val)
            for rec in ds.recordings
        ]
        self._digests = digests
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if digests is None:
            self._thread = threading.Thread(
                target=self._run, args=(train, val), name="iqtrain-digest", daemon=True
            )
            self._thread.start()

    def _run(self, train: IQDataset, val: IQDataset) -> None:
        try:
            self._digests = compute_digests(train, val)
        except BaseException as exc:  # re-raised in the loop's thread by digests()
            self._error = exc

    def check_lengths(self) -> None:
        """Every data file still has the length it was opened with (a file that grew is not
        read past its old end, but it is not the data the digests describe any more)."""
        for rec, nbytes in self._lengths:
            try:
                found = os.stat(rec.data_path).st_size
            except OSError as exc:
                raise DataError(f"{rec.data_path}: cannot inspect: {exc.strerror}") from None
            if found != nbytes:
                raise DataError(
                    f"{rec.data_path}: data file changed length while being read "
                    f"(expected {nbytes} bytes, found {found})"
                )

    def digests(self) -> dict[str, dict[str, str]]:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        assert self._digests is not None
        return self._digests


def state_components(stream: TrainStream, loop: LoopState, rng: RNGState) -> dict[str, Any]:
    """The JSON-state components of a checkpoint, by their state.json key."""
    return {"cursor": stream, "loop": loop, "rng": rng}


_TORCH_DTYPES = {"int8": torch.int8, "int16": torch.int16, "float32": torch.float32}


def _ring(stream: TrainStream, device: torch.device, config: Config) -> list[torch.Tensor]:
    """Caller-owned batch buffers the stream assembles into: pinned on CUDA (so the copy to
    the device needs no staging copy), enough for the prefetch and one step's microbatches."""
    ds = stream.dataset
    rows = config.data.batch_size // stream.world_size
    ring = [
        torch.empty(
            (rows, ds.window_len, 2),
            dtype=_TORCH_DTYPES[ds.dtype.name],
            pin_memory=device.type == "cuda",
        )
        for _ in range(config.data.prefetch + config.training.grad_accum)
    ]
    stream.use_ring([t.numpy() for t in ring])
    return ring


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
            component.load_state_dict(parent.state[name])
    except (KeyError, TypeError, ValueError, AttributeError, RuntimeError, IndexError) as exc:
        raise CheckpointError(
            f"{parent.checkpoint / 'state.json'}: cannot restore: {type(exc).__name__}: {exc}"
        ) from None


class Trainer:
    """One attempt's loop over its components (built by ``run_pretraining_attempt``)."""

    def __init__(
        self,
        config: Config,
        attempt: Path,
        *,
        stepper: TrainStep,
        stream: TrainStream,
        val: IQDataset,
        plan: Plan,
        metrics: MetricWriter | None,
        checkpoints: CheckpointManager,
        identity: DataIdentity | None,
        config_sha: str,
        loop: LoopState,
        probe: TrainingProbe | None = None,
    ) -> None:
        """With several ranks every rank builds a Trainer and runs the same loop (the same
        decisions from the same agreed numbers); only rank 0 has ``metrics`` and ``identity``
        and writes: the records, the checkpoints. Other ranks pass None for both."""
        self.config, self.attempt, self.plan = config, attempt, plan
        self.stepper, self.stream, self.val = stepper, stream, val
        self.metrics, self.checkpoints, self.identity = metrics, checkpoints, identity
        self.probe = probe  # rank 0 only, like the metrics
        self.config_sha = config_sha
        self.loop = loop
        self.world = stepper.world
        self.rng = RNGState(self.world)
        # The step of the last checkpoint, on every rank (only rank 0's manager saves).
        self.checkpointed_at: int | None = None
        self.stopped_early: dict[str, Any] | None = None
        t = config.training
        self.ring = _ring(stream, stepper.device, config)
        self.flops_per_patch = stepper.model.train_flops_per_patch(config.data.seq_patches)
        # The records' TFLOP/s are the whole job's (the global batch), so MFU divides by the
        # peak of every rank's device together.
        peak = device_peak_tflops(t.device, t.precision, t.peak_tflops or None)
        self.peak_tflops = None if peak is None else peak * self.world.world_size
        self.last_val: dict[str, Any] | None = None

    def components(self) -> dict[str, Any]:
        """The JSON-state components of a checkpoint, by their state.json key."""
        return state_components(self.stream, self.loop, self.rng)

    def train(self) -> None:
        """Run to ``plan.max_steps`` or until early stopping (``stopped_early`` says why); a
        signal ends it after a checkpoint (Interrupted)."""
        t = self.config.training
        progress = Progress(self.loop.step, self.plan.max_steps, t.log_every, self.world.is_main)
        try:
            with SignalGuard(announce=self.world.is_main) as guard:
                while self.loop.step < self.plan.max_steps:
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
                    if stop_early:
                        self._stop_early(progress)
                        break
                    # result.stop: a signal on any rank (agreed in the step's all-reduce); one
                    # process also stops for a signal that came after it.
                    stop = result.stop or (not self.world.distributed and guard.signum is not None)
                    if stop and not final:
                        if self.checkpointed_at != self.loop.step:
                            self.checkpoint()
                        # A rank whose peer was signalled ends as if terminated.
                        signum = guard.signum or signal.SIGTERM
                        raise Interrupted(signum, self.attempt, self.world.world_size)
        finally:
            progress.close()

    def _patience_exhausted(self) -> bool:
        patience = self.config.training.early_stop_patience
        return patience > 0 and self.loop.stale_validations >= patience

    def _stop_early(self, progress: Progress) -> None:
        t, loop = self.config.training, self.loop
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
            for _ in range(self.config.training.grad_accum):
                slots.append(self.stream.next_slot())
                ids.append(self.stream.last_ids())
                micro.append(prepare_batch(self.ring[slots[-1]], self.stepper, self.config)[0])
            s = self.loop.step  # 0-based index of the step being run
            lr = lr_at(s, self.plan)
            ids_all = np.concatenate(ids)
            result = self.stepper.train_step(micro, lr, step=s + 1, window_ids=ids_all, stop=stop)
        finally:
            # train_step has synchronised with the device (its finite check), so every copy out
            # of these buffers is done and the stream may fill them again.
            for slot in slots:
                self.stream.release(slot)
        self.loop.step = s + 1
        return result

    def _record(self, result: StepResult, dt: float, progress: Progress) -> None:
        d = self.config.data
        samples = d.batch_size * self.config.training.grad_accum
        spike = self.loop.record_loss(result.loss)
        # Every position is computed (the last one predicts nothing, but costs the same).
        tflops = achieved_tflops(self.flops_per_patch, samples * d.seq_patches, dt)
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
        utilisation = mfu(tflops, self.peak_tflops)
        if utilisation is not None:
            record["mfu"] = utilisation
        if self.metrics is not None:
            self.metrics.write(record)
        progress.update(self.loop.step, result.loss, result.lr, samples / dt if dt > 0 else 0.0)

    def _validate(self, progress: Progress) -> bool:
        """Full validation, its record, and whether it improved on the best."""
        v0 = time.perf_counter()
        step = self.loop.step
        rec = validate(self.stepper, self.val, self.config, step, self.loop.validations == 0)
        min_delta = self.config.training.early_stop_min_delta
        improved = self.loop.record_validation(rec["loss"], self.attempt, min_delta)
        rec = {"kind": "val", "step": step, **rec, "best": improved}
        rec["time_s"] = time.perf_counter() - v0
        if self.metrics is not None:
            self.metrics.write(rec)
        self.last_val = rec
        progress.note(
            f"val step {step}: loss {rec['loss']:.5f} "
            f"({rec['pred_snr_db']:.2f} dB){'  best' if improved else ''}"
        )
        return improved

    def _maybe_probe(self, progress: Progress, last: bool) -> None:
        """``[probe]`` after a validation it is due at (and the last): rank 0 probes while the
        others wait for it. Probe data that fails now (changed, unreadable, non-finite) costs
        the probe record, not the training run: one note line, training goes on."""
        if not probe_due(self.config, self.loop.validations, last):
            return
        p0 = time.perf_counter()
        model: Any = self.stepper.model
        if self.stepper.forward_is_collective:  # sharded: gathered whole onto rank 0
            model = self.stepper.model_state_dict()
        if self.probe is not None and self.metrics is not None:
            try:
                rec = self.probe.record(model, self.loop.step)
            except (IQTrainError, OSError) as exc:
                progress.note(f"probe step {self.loop.step}: skipped: {exc}")
            else:
                rec["time_s"] = time.perf_counter() - p0
                self.metrics.write(rec)
                progress.note(
                    f"probe step {rec['step']}: accuracy {rec['accuracy']:.4f} (random-init "
                    f"{rec['random_init_accuracy']:.4f}, chance {rec['chance']:.4f})"
                )
        self.world.wait_for_main()

    def checkpoint(self) -> Path | None:
        """Save every component's state; the manager prunes what its policy drops.

        Every rank calls it at the same step (the RNG component gathers all ranks' generators);
        only rank 0 writes, and returns the checkpoint's path (None elsewhere). Replicated (DDP),
        rank 0's model and optimizer are every rank's; sharded (FSDP), the model is gathered
        onto rank 0 and every rank writes its own shards into rank 0's checkpoint directory.
        """
        if self.identity is not None:
            self.identity.digests()  # the first checkpoint waits for the background digests
        self.world.wait_for_main()  # ... and the other ranks wait for rank 0 to have them
        components = {name: c.state_dict() for name, c in self.components().items()}
        self.checkpointed_at = self.loop.step
        # Sharded: gathers the whole model onto rank 0 for model.safetensors (a collective).
        tensors = self.stepper.state_dict()
        if self.metrics is None or self.identity is None:
            if self.stepper.sharded:  # into rank 0's temporary directory, with rank 0
                self.world.wait_for_main()  # while rank 0 writes model.safetensors alone
                self.stepper.save_sharded(Path(self.world.broadcast_object(None)))
            self.world.wait_for_main()  # while rank 0 writes the checkpoint
            return None
        state = {
            "version": STATE_VERSION,
            "step": self.loop.step,
            "config_sha256": self.config_sha,
            "plan": self.plan.to_dict(),
            "fingerprints": self.identity.fingerprints,
            "data": self.identity.digests(),
            "metrics": self.metrics.state_dict(),
            **components,
        }
        self.identity.check_lengths()
        self.metrics.sync()  # the cursor must never point past what is on disk
        path = self.checkpoints.save(
            self.loop.step,
            tensors["model"],
            tensors["optimizer"],
            state,
            protect=self.loop.best_checkpoint,
            sharded=self._write_shards if self.stepper.sharded else None,
        )
        self.world.wait_for_main()
        return path

    def _write_shards(self, directory: Path) -> None:
        """Rank 0's half of a sharded checkpoint: tell the others where, then write together."""
        self.world.wait_for_main()
        self.world.broadcast_object(os.fspath(directory))
        self.stepper.save_sharded(directory)

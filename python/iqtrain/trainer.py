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
import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint import CheckpointManager, checkpoint_name, restore_rng_state, rng_state
from iqtrain.config import Config
from iqtrain.console import Interrupted, Progress, SignalGuard
from iqtrain.data import IQDataset, TrainStream
from iqtrain.errors import CheckpointError, DataError, NonFiniteError
from iqtrain.flops import achieved_tflops, device_peak_tflops, mfu
from iqtrain.lineage import STATE_VERSION, Parent
from iqtrain.metrics import MetricWriter
from iqtrain.schedule import Plan, lr_at
from iqtrain.sigmf_meta import BYTES_PER_SAMPLE
from iqtrain.step import StepResult, TrainStep, format_ids

__all__ = [
    "DataIdentity",
    "LoopState",
    "RNGState",
    "Trainer",
    "compute_digests",
    "prepare_batch",
    "spike_update",
    "validate",
]

SPIKE_FACTOR = 3.0  # a train loss above 3x its running average is flagged as a spike
SPIKE_EMA = 0.9  # weight of the past in that running average


@dataclass
class LoopState:
    """The loop's counters: best validation, the loss average for spikes, validations run."""

    step: int = 0
    best_val_loss: float | None = None
    best_step: int | None = None
    best_checkpoint: str | None = None  # relative to the run dir: may live in an ancestor
    loss_ema: float | None = None
    validations: int = 0

    def record_loss(self, loss: float) -> bool:
        """Fold a train loss into the running average; True if it is a spike."""
        spike, self.loss_ema = spike_update(self.loss_ema, loss)
        return spike

    def record_validation(self, loss: float, attempt: Path) -> bool:
        """Count a validation; True (and remember it as best) if it improved strictly."""
        improved = self.best_val_loss is None or loss < self.best_val_loss
        if improved:
            self.best_val_loss, self.best_step = loss, self.step
            name = checkpoint_name(self.step)
            self.best_checkpoint = f"attempts/{attempt.name}/checkpoints/{name}"
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


class RNGState:
    """The process's CPU (and CUDA) random generators as a component."""

    def state_dict(self) -> dict[str, Any]:
        return rng_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng_state(state)


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


def prepare_batch(
    raw: np.ndarray, stepper: TrainStep, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loader batch -> device -> normalised patches, with the config's norm (the step picks
    the path: Triton on CUDA, compiled on CPU when training.compile, else the reference)."""
    d = config.data
    return stepper.prepare(raw, d.patch_len, norm=d.norm, prefix_patches=d.prefix_patches)


def validate(
    stepper: TrainStep, val: IQDataset, config: Config, step: int, baselines: bool
) -> dict[str, Any]:
    """Mean loss over every validation window (exact over the partial last batch).

    A non-finite batch loss raises NonFiniteError naming the step and that batch's window ids,
    before anything is recorded: the evidence never holds a non-finite number.
    """
    d = config.data
    sums, count, samples, bounds = [], 0, 0, []
    zero, copy = [], []
    for raw in val.val_batches(d.val_batch_size):
        patches, _ = prepare_batch(raw, stepper, config)
        total, c = stepper.eval_loss_sum(patches)  # no host sync per batch
        sums.append(total)
        bounds.append((samples, samples + raw.shape[0]))
        count, samples = count + c, samples + raw.shape[0]
        if baselines:
            x = patches.float()
            zero.append(x[:, 1:].square().sum(dtype=torch.float64))
            copy.append((x[:, 1:] - x[:, :-1]).square().sum(dtype=torch.float64))
    values = torch.stack(sums).tolist()  # the one sync of a validation pass
    for s, (lo, hi) in zip(values, bounds, strict=True):
        if not math.isfinite(s):
            raise NonFiniteError(
                f"step {step}: validation loss is {s} in data.val windows "
                f"{format_ids(np.arange(lo, hi))}"
            )
    loss_sum = sum(values)  # in batch order, in Python floats: exactly as before
    loss = loss_sum / count
    rec = {
        "loss": loss,
        "pred_snr_db": -10.0 * math.log10(loss) if loss > 0 else float("inf"),
        "samples": samples,
        "patches": samples * (d.seq_patches - 1),
    }
    if baselines:
        rec["baseline_zero_loss"] = sum(torch.stack(zero).tolist()) / count
        rec["baseline_copy_last_loss"] = sum(torch.stack(copy).tolist()) / count
    if not all(math.isfinite(v) for v in rec.values() if isinstance(v, float)):
        raise NonFiniteError(f"step {step}: validation produced a non-finite value: {rec}")
    return rec


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
    so a checkpoint that cannot be restored is a CheckpointError (exit 2) naming its state."""
    try:
        stepper.load_state_dict({"model": parent.model_state, "optimizer": parent.optimizer_state})
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
        metrics: MetricWriter,
        checkpoints: CheckpointManager,
        identity: DataIdentity,
        config_sha: str,
        loop: LoopState,
    ) -> None:
        self.config, self.attempt, self.plan = config, attempt, plan
        self.stepper, self.stream, self.val = stepper, stream, val
        self.metrics, self.checkpoints, self.identity = metrics, checkpoints, identity
        self.config_sha = config_sha
        self.loop = loop
        self.rng = RNGState()
        t = config.training
        self.ring = _ring(stream, stepper.device, config)
        self.flops_per_patch = stepper.model.train_flops_per_patch(config.data.seq_patches)
        self.peak_tflops = device_peak_tflops(t.device, t.precision, t.peak_tflops or None)
        self.last_val: dict[str, Any] | None = None

    def components(self) -> dict[str, Any]:
        """The JSON-state components of a checkpoint, by their state.json key."""
        return state_components(self.stream, self.loop, self.rng)

    def train(self) -> None:
        """Run to ``plan.max_steps``; a signal ends it after a checkpoint (Interrupted)."""
        t = self.config.training
        progress = Progress(self.loop.step, self.plan.max_steps, t.log_every)
        try:
            with SignalGuard() as guard:
                while self.loop.step < self.plan.max_steps:
                    t0 = time.perf_counter()
                    result = self._step()
                    self._record(result, time.perf_counter() - t0, progress)
                    final = self.loop.step == self.plan.max_steps
                    improved = False
                    if self.loop.step % t.eval_every == 0 or final:
                        improved = self._validate(progress)
                    if self.checkpoints.due(self.loop.step, final=final, improved=improved):
                        self.checkpoint()
                    if guard.signum is not None and not final:
                        if not self.checkpoints.saved_at(self.loop.step):
                            self.checkpoint()
                        raise Interrupted(guard.signum, self.attempt)
        finally:
            progress.close()

    def _step(self) -> StepResult:
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
            result = self.stepper.train_step(micro, lr, step=s + 1, window_ids=ids_all)
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
        self.metrics.write(record)
        progress.update(self.loop.step, result.loss, result.lr, samples / dt if dt > 0 else 0.0)

    def _validate(self, progress: Progress) -> bool:
        """Full validation, its record, and whether it improved on the best."""
        v0 = time.perf_counter()
        step = self.loop.step
        rec = validate(self.stepper, self.val, self.config, step, self.loop.validations == 0)
        improved = self.loop.record_validation(rec["loss"], self.attempt)
        rec = {"kind": "val", "step": step, **rec, "best": improved}
        rec["time_s"] = time.perf_counter() - v0
        self.metrics.write(rec)
        self.last_val = rec
        progress.note(
            f"val step {step}: loss {rec['loss']:.5f} "
            f"({rec['pred_snr_db']:.2f} dB){'  best' if improved else ''}"
        )
        return improved

    def checkpoint(self) -> Path:
        """Save every component's state; the manager prunes what its policy drops."""
        state = {
            "version": STATE_VERSION,
            "step": self.loop.step,
            "config_sha256": self.config_sha,
            "plan": self.plan.to_dict(),
            "fingerprints": self.identity.fingerprints,
            "data": self.identity.digests(),
            "metrics": self.metrics.state_dict(),
            **{name: c.state_dict() for name, c in self.components().items()},
        }
        self.identity.check_lengths()
        self.metrics.sync()  # the cursor must never point past what is on disk
        tensors = self.stepper.state_dict()
        return self.checkpoints.save(
            self.loop.step,
            tensors["model"],
            tensors["optimizer"],
            state,
            protect=self.loop.best_checkpoint,
        )

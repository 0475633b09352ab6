"""Validation: the mean next-patch loss over every validation window, sharded over ranks.

Each record holds the objective's own loss (``loss``: what training minimises, what the best
checkpoint and early stopping follow) and the NMSE of the predicted mean (``nmse``, with
``pred_snr_db = -10 log10 nmse``), which the zero and copy baselines are comparable with
whatever the objective; for ``model.objective = "mse"`` the two are one number.

The validation set is cut into batches of ``data.val_batch_size`` in window-id order, exactly as
one process reads it. Rank ``r`` of ``W`` evaluates batches ``r, r + W, r + 2W, ...``: whole
batches, so each batch's summed loss is computed by the same graph on the same rows as in one
process. The per-batch sums are then all-reduced into a table where every row has exactly one
non-zero contribution (``x + 0 = x`` exactly), and every rank adds the rows in batch order in
Python floats, as one process does: the validation loss is bit-identical at every world size
(given the same per-batch numerics, i.e. the same device and thread settings).

A pass synchronises with the device once, when it reads the table (``.tolist()``): every batch
is queued before it. Nothing in between reads a tensor back to the host: the batches are
copied from pinned memory (:meth:`TrainStep.prepare`), a classifier's labels once per pass,
asynchronously, and its counts per class are fixed-shape sums (no ``bincount``, no boolean
indexing, whose result sizes depend on the data).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from iqtrain.config.sections import DataConfig
from iqtrain.data.dataset import IQDataset
from iqtrain.errors import NonFiniteError
from iqtrain.train.step import TrainStep, format_ids

__all__ = ["prepare_batch", "validate", "validate_classify"]


def prepare_batch(
    raw: np.ndarray | torch.Tensor, stepper: TrainStep, d: DataConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loader batch -> device -> normalised patches, with the config's norm (the step picks
    the path: Triton on CUDA, compiled on CPU when training.compile, else the reference)."""
    return stepper.prepare(raw, d.patch_len, norm=d.norm, prefix_patches=d.prefix_patches)


def _batch_sums(stepper: TrainStep, val: IQDataset, d: DataConfig, baselines: bool) -> torch.Tensor:
    """``[batches, 5]`` float64 on the step's device: summed loss, target count, summed squared
    error of the predicted mean and the two baseline sums of every batch this rank evaluates;
    zeros in the other ranks' rows."""
    world = stepper.world
    n, bs = val.num_windows, d.val_batch_size
    batches = (n + bs - 1) // bs
    table = torch.zeros((batches, 5), dtype=torch.float64, device=stepper.device)
    rounds = (batches + world.world_size - 1) // world.world_size
    for b in range(world.rank, rounds * world.world_size, world.world_size):
        if b >= batches and not stepper.forward_is_collective:
            break
        # A sharded model's forward gathers parameters with every rank: a rank without a
        # batch of its own in the last round evaluates batch 0 again, and drops the result.
        src = b if b < batches else 0
        raw = val.windows(np.arange(src * bs, min((src + 1) * bs, n), dtype=np.uint64))
        patches, _ = prepare_batch(raw, stepper, d)
        total, count, squared_error = stepper.eval_sums(patches)  # no host sync per batch
        if b >= batches:
            continue
        table[b, 0] = total
        table[b, 1] = count
        table[b, 2] = squared_error
        if baselines:
            x = patches.float()
            table[b, 3] = x[:, 1:].square().sum(dtype=torch.float64)
            table[b, 4] = (x[:, 1:] - x[:, :-1]).square().sum(dtype=torch.float64)
    return world.all_reduce_sum(table)


def validate(
    stepper: TrainStep, val: IQDataset, d: DataConfig, step: int, baselines: bool
) -> dict[str, Any]:
    """Mean loss over every validation window (exact over the partial last batch), the same
    on every rank.

    A non-finite batch loss raises NonFiniteError naming the step and that batch's window ids,
    before anything is recorded: the evidence never holds a non-finite number. Every rank sees
    the same table, so every rank raises it.
    """
    rows = _batch_sums(stepper, val, d, baselines).tolist()  # the one sync of a pass
    bs = d.val_batch_size
    for b, row in enumerate(rows):
        if not (math.isfinite(row[0]) and math.isfinite(row[2])):
            hi = min((b + 1) * bs, val.num_windows)
            raise NonFiniteError(
                f"step {step}: validation loss is {row[0]} (squared error {row[2]}) in "
                f"data.val windows {format_ids(np.arange(b * bs, hi))}"
            )
    count = int(sum(row[1] for row in rows))
    loss = sum(row[0] for row in rows) / count  # in batch order, in Python floats
    nmse = sum(row[2] for row in rows) / count
    samples = val.num_windows
    rec = {
        "loss": loss,
        "nmse": nmse,
        "pred_snr_db": -10.0 * math.log10(nmse) if nmse > 0 else float("inf"),
        "samples": samples,
        "patches": samples * (d.seq_patches - 1),
    }
    if baselines:
        rec["baseline_zero_loss"] = sum(row[3] for row in rows) / count
        rec["baseline_copy_last_loss"] = sum(row[4] for row in rows) / count
    if not all(math.isfinite(v) for v in rec.values() if isinstance(v, float)):
        raise NonFiniteError(f"step {step}: validation produced a non-finite value: {rec}")
    return rec


def _device_labels(labels: np.ndarray, classes: int, device: torch.device) -> torch.Tensor:
    """Every validation window's class, int64 on ``device``: one copy per pass, from pinned
    memory on CUDA (non-blocking: a copy from pageable memory would wait for the queued
    work). Checked here on the host, since the counts that use them cannot notice: a label
    outside ``[0, classes)`` is a ValueError."""
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if y.size and (int(y.min()) < 0 or int(y.max()) >= classes):
        raise ValueError(f"validation labels must lie in [0, {classes}), got {y.min()}..{y.max()}")
    t = torch.from_numpy(y)
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def _classify_sums(
    stepper: TrainStep, val: IQDataset, labels: np.ndarray, classes: int, d: DataConfig
) -> torch.Tensor:
    """``[batches, 3 + 2 * classes]`` float64: summed cross-entropy, windows, correct windows,
    then windows and correct windows per class, of every batch this rank evaluates (zeros in
    the other ranks' rows), all-reduced: the table :func:`_batch_sums` builds, for a labelled
    objective.

    No host synchronisation: the labels are copied once, asynchronously, and the counts per
    class are sums over a one-hot ``[b, classes]`` mask of fixed shape (``bincount`` and
    boolean indexing size their results by the data, which reads it back to the host)."""
    world = stepper.world
    n, bs = val.num_windows, d.val_batch_size
    batches = (n + bs - 1) // bs
    table = torch.zeros((batches, 3 + 2 * classes), dtype=torch.float64, device=stepper.device)
    y_all = _device_labels(labels, classes, stepper.device)
    class_ids = torch.arange(classes, device=stepper.device)
    rounds = (batches + world.world_size - 1) // world.world_size
    for b in range(world.rank, rounds * world.world_size, world.world_size):
        if b >= batches and not stepper.forward_is_collective:
            break
        src = b if b < batches else 0  # a sharded forward is a collective: see _batch_sums
        lo, hi = src * bs, min((src + 1) * bs, n)
        patches, _ = prepare_batch(val.windows(np.arange(lo, hi, dtype=np.uint64)), stepper, d)
        y = y_all[lo:hi]
        total, count, predicted = stepper.eval_sums(patches, y)
        if b >= batches:
            continue
        hit = predicted == y
        onehot = y.unsqueeze(1) == class_ids  # [b, classes]
        table[b, 0] = total
        table[b, 1] = count
        table[b, 2] = hit.sum()
        table[b, 3 : 3 + classes] = onehot.sum(dim=0)
        table[b, 3 + classes :] = (onehot & hit.unsqueeze(1)).sum(dim=0)
    return world.all_reduce_sum(table)


def validate_classify(
    stepper: TrainStep,
    val: IQDataset,
    labels: np.ndarray,
    classes: tuple[str, ...],
    d: DataConfig,
    step: int,
    baselines: bool,
) -> dict[str, Any]:
    """A labelled objective: mean cross-entropy (nats per window), accuracy and per-class accuracy
    over every labelled validation window (``labels``: each window's class index), the same on every
    rank, exact at every world size as :func:`validate` is. ``class_accuracy`` holds None for a
    class no validation window has; ``baselines`` (the first validation): the majority class's
    share, what always predicting it scores. A non-finite batch loss raises NonFiniteError naming
    the step and the batch's windows."""
    c = len(classes)
    rows = _classify_sums(stepper, val, labels, c, d).tolist()  # the one sync of a pass
    bs = d.val_batch_size
    for b, row in enumerate(rows):
        if not math.isfinite(row[0]):
            hi = min((b + 1) * bs, val.num_windows)
            raise NonFiniteError(
                f"step {step}: validation loss is {row[0]} in data.val windows "
                f"{format_ids(np.arange(b * bs, hi))}"
            )
    count = int(sum(row[1] for row in rows))
    per_class = [int(sum(row[3 + k] for row in rows)) for k in range(c)]
    per_hit = [int(sum(row[3 + c + k] for row in rows)) for k in range(c)]
    rec: dict[str, Any] = {
        "loss": sum(row[0] for row in rows) / count,  # in batch order, in Python floats
        "accuracy": sum(row[2] for row in rows) / count,
        "class_accuracy": {
            name: (per_hit[k] / per_class[k] if per_class[k] else None)
            for k, name in enumerate(classes)
        },
        "samples": val.num_windows,
    }
    if baselines:
        rec["baseline_majority_accuracy"] = max(per_class) / count
    if not math.isfinite(rec["loss"]):
        raise NonFiniteError(f"step {step}: validation produced a non-finite loss: {rec}")
    return rec

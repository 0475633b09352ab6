"""``iqtrain inspect CONFIG``: one batch through every stage, printed once.

The checks worth doing before tuning anything: where the batch comes from and its shape and
dtype at each stage, how many parameters require gradients, how many samples, patches and
predicted patches one optimizer step consumes, and the loss of the untrained model next to the
zero-prediction baseline (~1.0 on window-normalised data). A labelled objective (a classifier):
its labelled windows and classes, the batch's labels, and the untrained loss next to ``ln C``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch

from iqtrain.config.schema import Config, config_to_dict, dumps_toml, load_config
from iqtrain.console import note
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.data.sources import open_datasets, open_labelled, report_dataset
from iqtrain.data.windows import LabelledSet, show_class
from iqtrain.model.transformer import IQTransformer
from iqtrain.train.schedule import Plan, lr_at
from iqtrain.train.step import TrainStep
from iqtrain.train.validation import prepare_batch

__all__ = ["inspect_config"]


def _t(x) -> str:
    return f"shape {tuple(x.shape)} dtype {str(x.dtype).removeprefix('torch.')} device {x.device}"


def _note_data(
    train: IQDataset, val: IQDataset, labelled: Sequence[LabelledSet] | None, window: int
) -> None:
    """The notes ``run`` gives on its data (:func:`~iqtrain.data.sources.report_dataset`), and
    of a fine-tune's labels read as blank."""
    for key, ds in (("data.train", train), ("data.val", val)):
        report_dataset(key, ds, window)
    for key, ls in zip(("data.train", "data.val"), labelled or (), strict=False):
        if ls.blank:
            note(f"{key}: {ls.blank}")


def _data_lines(
    train: IQDataset, val: IQDataset, labelled: Sequence[LabelledSet] | None
) -> list[str]:
    """The datasets, and a fine-tune's classes with their training windows."""
    out = [
        f"train: {train!r}\n  fingerprint {train.fingerprint}",
        f"val:   {val!r}\n  fingerprint {val.fingerprint}",
    ]
    if labelled is not None:
        counts = ", ".join(
            f"{show_class(c)} {int((labelled[0].labels == k).sum())}"
            for k, c in enumerate(labelled[0].classes)
        )
        out.append(f"classes ({len(labelled[0].classes)}, training windows each): {counts}")
    return out


def inspect_config(path: str | os.PathLike, overrides: list[str] | None = None) -> str:
    """The report of ``iqtrain inspect``: one batch through every stage (the CLI prints it)."""
    lines: list[str] = []
    emit = lines.append
    config = load_config(path, overrides)
    d, t = config.data, config.training
    objective = config.model.task
    labelled = open_labelled(config.data) if objective.labelled else None
    train, val = (labelled[0].dataset, labelled[1].dataset) if labelled else open_datasets(d)
    _note_data(train, val, labelled, d.window)
    emit(
        "resolved config:\n"
        + "".join(f"  {line}\n" for line in dumps_toml(config_to_dict(config)).splitlines())
    )
    lines += _data_lines(train, val, labelled)

    stream = TrainStream(train, batch_size=d.batch_size, seed=config.run.seed, prefetch=0)
    raw = next(stream)
    emit(
        f"1 loader batch (numpy): shape {raw.shape} dtype {raw.dtype} "
        f"ids {stream.last_ids()[:4].tolist()}…"
    )
    labels = None
    if labelled is not None:
        labels = torch.from_numpy(labelled[0].labels[stream.last_ids().astype("int64")])
        emit(f"  labels {labels[:8].tolist()}… (indices into the classes)")
    torch.manual_seed(config.run.seed)
    stepper = TrainStep(
        IQTransformer(config.model, 0 if labelled is None else len(labelled[0].classes)),
        config.optimizer,
        device=t.device,
        precision=t.precision,
        compile=False,
    )
    dev = torch.from_numpy(raw).to(stepper.device)
    emit(f"2 on device: {_t(dev)}")
    patches, scale = prepare_batch(raw, stepper, config.data)
    emit(f"3 prepare_iq_input patches: {_t(patches)}")
    emit(f"  scale: {_t(scale)} min {scale.min().item():.4g} max {scale.max().item():.4g}")
    emit(
        f"  mean power of patches {patches.float().square().mean().item() * 2:.4f} "
        "(1.0 = normalised)"
    )
    with torch.no_grad():
        stepper.model.eval()
        pred = stepper.model(patches)
    emit(f"4 model predictions: {_t(pred)}")
    total, trainable = stepper.model.param_counts()
    emit(f"  parameters: {total:,} ({trainable:,} require gradients)")
    emit(
        f"  weight decay on {len(stepper.decay_param_names)} tensors, "
        f"none on {len(stepper.no_decay_param_names)}"
    )
    loss_t, count, squared_t = stepper.eval_sums(patches, labels)
    # A labelled objective's targets are windows: no predicted mean, no zero prediction.
    squared, zero = 0.0, 0.0
    if not objective.labelled:
        squared = float(squared_t)
        zero = patches.float()[:, 1:].square().sum().item() / count
    emit(
        objective.untrained_line(
            float(loss_t), squared, count, zero, config.model, stepper.model.classes
        )
    )
    return _plan_lines(lines, config, train.num_windows)


def _plan_lines(lines: list[str], config: Config, windows: int) -> str:
    """The step's size, the epoch and the lr plan, after ``lines``; all of it as one text."""
    emit = lines.append
    d, t = config.data, config.training
    per_step = d.batch_size * t.grad_accum
    emit(
        f"per optimizer step: {per_step} windows = {per_step * d.window:,} samples, "
        f"{per_step * d.seq_patches:,} input patches, "
        + (
            f"{per_step} classified"
            if config.model.task.labelled
            else f"{per_step * (d.seq_patches - 1):,} predicted"
        )
    )
    emit(
        f"one epoch = {windows} windows = {math.ceil(windows / per_step)} steps; "
        f"{t.max_steps} steps = {t.max_steps * per_step / windows:.2f} epochs"
    )
    plan = Plan.from_config(
        config.schedule, t.max_steps, config.optimizer.lr, config.optimizer.min_lr
    )
    marks = sorted(
        {0, plan.warmup_steps, plan.decay_start, t.max_steps - 1} & set(range(t.max_steps))
    )
    emit("lr plan: " + ", ".join(f"step {s + 1}: {lr_at(s, plan):.3g}" for s in marks))
    return "\n".join(lines)

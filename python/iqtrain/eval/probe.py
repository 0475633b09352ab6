"""Linear probe: how linearly decodable labels are from a frozen model's features
(docs/design.md section 10).

Labelled examples are windows of the model's length lying wholly inside one SigMF annotation
that has a ``core:label`` (:func:`labelled_windows`). Features are the final hidden states
(after the final norm, before the output head), mean-pooled over patches, computed in eval mode
without gradients after the training's normalisation (:func:`probe_features`). A multinomial
logistic regression on standardised features is scored by k-fold cross-validation with folds
grouped by annotation, so windows cut from one burst never sit on both sides of a split
(:func:`cross_validate`). :func:`run_probe` does all of it for one checkpoint of an attempt,
beside a randomly initialised model of the same config and seed and the majority-class rate.

Nothing here draws from or reseeds torch's global RNG (fold assignment uses a local generator,
the classifier starts from zeros, the random-init model is built under ``fork_rng``), so a
probe run inside training leaves the training stream and its exact resume untouched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from iqtrain.config.schema import build_config
from iqtrain.config.sections import DataConfig, ModelConfig
from iqtrain.data.dataset import IQDataset
from iqtrain.data.sigmf_meta import read_annotations
from iqtrain.data.sources import validation_patterns
from iqtrain.errors import CheckpointError, ConfigError, DataError
from iqtrain.evidence.lineage import ParentRef, load_parent
from iqtrain.model.prepare import prepare_iq_input_reference
from iqtrain.model.transformer import NextPatchModel

__all__ = [
    "FEATURE_BATCH",
    "L2",
    "LBFGS_ITERATIONS",
    "LabelledSet",
    "LogisticProbe",
    "ProbeResult",
    "ProbeScore",
    "assign_folds",
    "cross_validate",
    "fit_logistic",
    "format_table",
    "labelled_windows",
    "load_checkpoint_model",
    "probe_features",
    "probe_model",
    "random_init_model",
    "run_probe",
    "score",
]

# L2 on the weights (not the bias), relative to the mean cross-entropy, on standardised
# features: small enough not to cost accuracy on separable data, large enough that the optimum
# is finite when a training fold is separable (it often is: dim >= 64 features, few windows).
L2 = 1e-3
# Full-batch L-BFGS from zeros on a strictly convex loss: deterministic, no learning rate to
# tune, and 200 iterations reach the optimum for the sizes a probe sees (<= ~1e5 x 1e3).
LBFGS_ITERATIONS = 200
# A fixed batch: a matmul's rounding can depend on the batch size, and features must not.
FEATURE_BATCH = 256


# --------------------------------------------------------------------------- labelled windows


@dataclass(frozen=True)
class LabelledSet:
    """Windows inside labelled annotations: ``ids`` index ``dataset`` (stride-1 windows).

    Per window: ``labels`` (index into ``classes``, sorted label names), ``groups`` (the
    annotation it was cut from, numbered over the whole set), ``recordings`` (index into
    ``dataset.recordings``) and ``starts`` (its first sample in that recording's data).
    """

    dataset: IQDataset
    ids: np.ndarray
    labels: np.ndarray
    groups: np.ndarray
    recordings: np.ndarray
    starts: np.ndarray
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_annotations(self) -> int:
        return int(np.unique(self.groups).size)

    def batches(self, batch_size: int = FEATURE_BATCH) -> Iterator[np.ndarray]:
        """The windows in order, ``[b, window, 2]`` in the storage dtype, never all at once."""
        for lo in range(0, len(self.ids), batch_size):
            yield self.dataset.windows(self.ids[lo : lo + batch_size])


def _annotation_starts(
    segments: list[tuple[int, int]], start: int, count: int, window: int
) -> Iterator[tuple[int, int]]:
    """``(segment index, first sample)`` of each window of one annotation.

    The grid starts at the annotation's first sample with a stride of one window; a window that
    would cross a capture boundary is dropped (training never reads one either), and the grid
    stays anchored at the annotation's start on the far side.
    """
    end = start + count
    for k, (a, n) in enumerate(segments):
        lo = start if start >= a else start + -(-(a - start) // window) * window
        for s in range(lo, min(end, a + n) - window + 1, window):
            yield k, s


def labelled_windows(patterns: str | Sequence[str], window: int) -> LabelledSet:
    """Every window of ``window`` samples inside a SigMF annotation with a ``core:label``.

    ``patterns``: .sigmf-meta paths or glob patterns, validated as training data is (a bad or
    missing file, or a pattern matching nothing, is a DataError naming it). Unlabelled samples
    are ignored. No labelled window at all, or fewer than two classes, is a DataError.
    """
    dataset = IQDataset(patterns, window=window, stride=1)
    rows: list[tuple[int, int, str, int, int]] = []  # id, group, label, recording, start
    base, group = 0, 0
    for r, rec in enumerate(dataset.recordings):
        # With stride 1 a segment of n samples holds n - window + 1 windows, numbered in order.
        segments, offsets = rec.segments, []
        for _, n in segments:
            offsets.append(base)
            base += max(n - window + 1, 0)
        for ann in read_annotations(rec):
            if ann.label is None:
                continue
            found = [
                (offsets[k] + s - segments[k][0], group, ann.label, r, s)
                for k, s in _annotation_starts(segments, ann.sample_start, ann.sample_count, window)
            ]
            rows += found
            group += bool(found)
    assert base == dataset.num_windows, "window numbering disagrees with the native dataset"
    where = ", ".join(map(os.fspath, [patterns] if isinstance(patterns, str) else patterns))
    if not rows:
        raise DataError(
            f"{where}: no labelled window: no annotation with a core:label holds a whole "
            f"window of {window} samples (data.seq_patches * data.patch_len)"
        )
    classes = tuple(sorted({row[2] for row in rows}))
    if len(classes) < 2:
        raise DataError(
            f"{where}: every labelled window is {classes[0]!r}; a probe needs at least 2 classes"
        )
    index = {c: i for i, c in enumerate(classes)}
    return LabelledSet(
        dataset=dataset,
        ids=np.array([row[0] for row in rows], dtype=np.uint64),
        labels=np.array([index[row[2]] for row in rows], dtype=np.int64),
        groups=np.array([row[1] for row in rows], dtype=np.int64),
        recordings=np.array([row[3] for row in rows], dtype=np.int64),
        starts=np.array([row[4] for row in rows], dtype=np.int64),
        classes=classes,
    )


# --------------------------------------------------------------------------- features


def probe_features(
    model: NextPatchModel,
    labelled: LabelledSet,
    data: DataConfig,
    *,
    batch_size: int = FEATURE_BATCH,
) -> torch.Tensor:
    """``[len(labelled), dim]`` fp32 CPU: final hidden states mean-pooled over patches.

    Each window is normalised and patched exactly as training does (``data.patch_len``,
    ``data.norm``, ``data.prefix_patches``), on the model's device, in fp32 (autocast off),
    in eval mode under no_grad; the model's train/eval mode is restored afterwards.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            for raw in labelled.batches(batch_size):
                patches, _ = prepare_iq_input_reference(
                    torch.from_numpy(raw).to(device),
                    data.patch_len,
                    norm=data.norm,
                    prefix_patches=data.prefix_patches,
                )
                out.append(model.hidden_states(patches).float().mean(dim=1).cpu())
    finally:
        model.train(was_training)
    features = torch.cat(out)
    bad = (~torch.isfinite(features).all(dim=1)).nonzero().flatten().tolist()
    if bad:  # one such row would turn every standardised feature into NaN
        i = bad[0]
        rec = labelled.dataset.recordings[int(labelled.recordings[i])]
        raise DataError(
            f"{rec.data_path}: the window at sample {int(labelled.starts[i])} gives non-finite "
            f"features ({len(bad)} window(s) in all; non-finite samples in the recording?)"
        )
    return features


# --------------------------------------------------------------------------- classifier


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted multinomial logistic regression with its standardisation (float64)."""

    mean: torch.Tensor
    std: torch.Tensor
    weight: torch.Tensor  # [dim, classes]
    bias: torch.Tensor  # [classes]

    def predict(self, features: torch.Tensor) -> torch.Tensor:
        z = (features.double() - self.mean) / self.std
        return (z @ self.weight + self.bias).argmax(dim=1)


def fit_logistic(
    features: torch.Tensor,
    labels: torch.Tensor,
    num_classes: int,
    *,
    l2: float = L2,
    iterations: int = LBFGS_ITERATIONS,
) -> LogisticProbe:
    """Fit softmax regression on features standardised by their own mean and std.

    Loss: mean cross-entropy + ``l2 / 2 * |W|^2``, minimised by full-batch L-BFGS (strong Wolfe
    line search) from zeros; deterministic and free of any RNG. A constant feature gets std 1.
    """
    x = features.double()
    mean = x.mean(dim=0)
    std = x.std(dim=0, unbiased=False)
    std = torch.where(std > 1e-12, std, torch.ones_like(std))
    z = (x - mean) / std
    y = labels.long()
    weight = torch.zeros(x.shape[1], num_classes, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [weight, bias],
        lr=1.0,
        max_iter=iterations,
        history_size=20,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(z @ weight + bias, y) + 0.5 * l2 * weight.square().sum()
        loss.backward()
        return loss

    with torch.enable_grad():  # the caller may be inside no_grad (a probe during training)
        opt.step(closure)
    return LogisticProbe(mean, std, weight.detach(), bias.detach())


def assign_folds(
    labels: np.ndarray, groups: np.ndarray, folds: int, seed: int, *, key: str = "folds"
) -> np.ndarray:
    """The fold of each window; every window of one group (annotation) shares a fold.

    Groups are dealt round-robin to folds, class by class, each class's groups in a seeded
    order (a local torch.Generator): folds get near-equal numbers of annotations and each class
    spreads over as many folds as it has annotations. Fewer groups than folds is a ConfigError
    naming ``key``. A group's class is the label of its first window.
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"{key}: must be an integer >= 2, got {folds!r}")
    groups = np.asarray(groups)
    uniq, first = np.unique(groups, return_index=True)
    if uniq.size < folds:
        raise ConfigError(
            f"{key}: {folds} folds need at least {folds} labelled annotations (folds are "
            f"grouped by annotation), found {uniq.size}"
        )
    gen = torch.Generator().manual_seed(seed)
    group_class = np.asarray(labels)[first]
    order = []
    for c in np.unique(group_class):
        members = np.flatnonzero(group_class == c)
        order.extend(members[torch.randperm(members.size, generator=gen).numpy()])
    fold_of_group = np.empty(uniq.size, dtype=np.int64)
    fold_of_group[np.asarray(order, dtype=np.int64)] = np.arange(uniq.size) % folds
    return fold_of_group[np.searchsorted(uniq, groups)]


@dataclass(frozen=True)
class ProbeScore:
    """Pooled held-out accuracy, accuracy per true class, confusion (rows true, cols predicted)."""

    accuracy: float
    per_class: dict[str, float]
    confusion: list[list[int]]

    def to_dict(self) -> dict[str, Any]:
        return {"accuracy": self.accuracy, "per_class": self.per_class, "confusion": self.confusion}


def score(labels: np.ndarray, predicted: np.ndarray, classes: Sequence[str]) -> ProbeScore:
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (np.asarray(labels), np.asarray(predicted)), 1)
    totals = confusion.sum(axis=1)
    per_class = {
        c: float(confusion[i, i] / totals[i]) if totals[i] else math.nan
        for i, c in enumerate(classes)
    }
    accuracy = float(np.trace(confusion) / confusion.sum())
    return ProbeScore(accuracy, per_class, confusion.tolist())


def cross_validate(
    features: torch.Tensor,
    labels: np.ndarray,
    groups: np.ndarray,
    folds: int,
    seed: int,
    *,
    classes: Sequence[str] | None = None,
    key: str = "folds",
) -> ProbeScore:
    """Grouped k-fold cross-validation of :func:`fit_logistic`; pooled over held-out windows.

    Standardisation statistics come from each training fold only. ``classes`` names the label
    indices (default: their numbers); a class absent from a training fold is never predicted
    for that fold's held-out windows.
    """
    labels = np.asarray(labels, dtype=np.int64)
    names = list(classes) if classes is not None else [str(i) for i in range(labels.max() + 1)]
    fold_of = assign_folds(labels, groups, folds, seed, key=key)
    y = torch.from_numpy(labels)
    predicted = np.empty_like(labels)
    for f in range(folds):
        held = torch.from_numpy(fold_of == f)
        probe = fit_logistic(features[~held], y[~held], len(names))
        predicted[held.numpy()] = probe.predict(features[held]).numpy()
    return score(labels, predicted, names)


def probe_model(
    model: NextPatchModel, labelled: LabelledSet, data: DataConfig, folds: int, seed: int
) -> ProbeScore:
    """Features of ``model`` on ``labelled``, scored by grouped cross-validation: the part a
    training run can call (it needs no attempt and touches no global RNG)."""
    features = probe_features(model, labelled, data)
    return cross_validate(
        features, labelled.labels, labelled.groups, folds, seed, classes=labelled.classes
    )


# --------------------------------------------------------------------------- models


def random_init_model(config: ModelConfig, seed: int) -> NextPatchModel:
    """The model training starts from: ``torch.manual_seed(seed)`` then ``NextPatchModel``,
    built under ``fork_rng`` so the caller's global RNG state is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return NextPatchModel(config)


def load_checkpoint_model(
    attempt: str | os.PathLike, which: str = "latest"
) -> tuple[NextPatchModel, Any, Path, int]:
    """``(model, config, checkpoint dir, step)`` of checkpoint ``which`` (latest, best, step_N).

    Resolved and verified as a resume does (:func:`iqtrain.evidence.lineage.load_parent`: the
    attempt's manifest, the checkpoint's hashes); the config is the one of the attempt that
    wrote it.
    """
    parent = load_parent(ParentRef(Path(attempt), which))
    config = build_config(parent.config_tables)
    model = random_init_model(config.model, config.run.seed)  # every weight is overwritten
    try:
        model.load_state_dict(parent.model_state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(
            f"{parent.checkpoint / 'model.safetensors'}: does not fit the attempt's model "
            f"config ({first})"
        ) from None
    return model, config, parent.checkpoint, parent.state.step


# --------------------------------------------------------------------------- the whole probe


@dataclass(frozen=True)
class ProbeResult:
    attempt: Path
    checkpoint: str
    step: int
    classes: tuple[str, ...]
    windows: int
    annotations: int
    folds: int
    pretrained: ProbeScore
    random_init: ProbeScore
    chance: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "pretrained": self.pretrained.to_dict(),
            "random_init": self.random_init.to_dict(),
            "chance": self.chance,
            "classes": list(self.classes),
            "windows": self.windows,
            "annotations": self.annotations,
            "folds": self.folds,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "attempt": os.fspath(self.attempt),
        }


def run_probe(
    attempt: str | os.PathLike,
    patterns: str | Sequence[str] | None,
    from_: str = "latest",
    folds: int = 5,
) -> ProbeResult:
    """Probe checkpoint ``from_`` of ``attempt`` on the labelled windows of ``patterns``.

    Errors a user can cause (bad --folds, --from, attempt, checkpoint or data) raise
    ConfigError, CheckpointError or DataError with one line naming what is wrong, before any
    feature is computed.
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"--folds: must be an integer >= 2, got {folds!r}")
    model, config, ckpt, step = load_checkpoint_model(attempt, from_)
    if not patterns:  # the attempt's validation recordings (synthetic: its cached set)
        patterns = validation_patterns(config.data)
    labelled = labelled_windows(patterns, config.data.window)
    seed = config.run.seed
    assign_folds(labelled.labels, labelled.groups, folds, seed, key="--folds")  # refuse early
    baseline = random_init_model(config.model, seed)
    scores = [probe_model(m, labelled, config.data, folds, seed) for m in (model, baseline)]
    counts = np.bincount(labelled.labels, minlength=len(labelled.classes))
    return ProbeResult(
        attempt=Path(attempt),
        checkpoint=ckpt.name,
        step=step,
        classes=labelled.classes,
        windows=len(labelled),
        annotations=labelled.num_annotations,
        folds=folds,
        pretrained=scores[0],
        random_init=scores[1],
        chance=float(counts.max() / counts.sum()),
    )


def format_table(result: ProbeResult) -> str:
    """The readable report: accuracies side by side, then the pretrained confusion matrix."""
    r = result
    lines = [
        f"linear probe of {r.attempt} at {r.checkpoint} (step {r.step}): {r.windows} windows "
        f"in {r.annotations} annotations, {len(r.classes)} classes, {r.folds} folds grouped "
        "by annotation",
        "",
        f"{'':<16}{'pretrained':>12}{'random-init':>13}{'chance':>9}",
        f"{'accuracy':<16}{r.pretrained.accuracy:>12.4f}{r.random_init.accuracy:>13.4f}"
        f"{r.chance:>9.4f}",
    ]
    for c in r.classes:
        lines.append(
            f"  {c:<14}{r.pretrained.per_class[c]:>12.4f}{r.random_init.per_class[c]:>13.4f}"
        )
    width = max(7, *(len(c) + 1 for c in r.classes))
    lines += ["", "confusion of the pretrained model (rows true, columns predicted):"]
    lines.append(" " * 16 + "".join(f"{c:>{width}}" for c in r.classes))
    for c, row in zip(r.classes, r.pretrained.confusion, strict=True):
        lines.append(f"  {c:<14}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)

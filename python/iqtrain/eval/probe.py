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
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
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
    "DEFAULT_BIN_WIDTH",
    "accuracy_by",
    "assign_folds",
    "bin_edges",
    "bin_index",
    "bin_windows",
    "check_bins",
    "classical_score",
    "cross_validate",
    "fit_logistic",
    "format_table",
    "labelled_windows",
    "layer_features",
    "load_checkpoint_model",
    "parse_bins",
    "parse_layer",
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
    # The fields of each group's annotation (index: ``groups``), and where it was written.
    group_fields: tuple[dict[str, Any], ...] = ()
    group_where: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def num_annotations(self) -> int:
        return int(np.unique(self.groups).size)

    def numeric(self, key: str, name: str = "--by") -> np.ndarray:
        """``[len(self)]`` float64: annotation field ``key`` of each window's annotation.

        A key no annotation carries, or one annotation without it or with a value that is not
        a finite number, is a ConfigError naming ``--by``, the key and the annotation."""
        if not any(key in f for f in self.group_fields):
            raise ConfigError(
                f"{name} {key}: no labelled annotation carries {key!r} (the fields they carry: "
                f"{', '.join(sorted({k for f in self.group_fields for k in f}))})"
            )
        values = np.empty(len(self.group_fields), dtype=np.float64)
        for g, fields in enumerate(self.group_fields):
            v = fields.get(key)
            try:  # a 400-digit JSON integer is a number too large for a float
                number = (
                    float(v) if not isinstance(v, bool) and isinstance(v, int | float) else None
                )
            except OverflowError:
                number = None
            if number is None or not math.isfinite(number):
                what = "has none" if key not in fields else f"is {v!r:.40}, not a finite number"
                raise ConfigError(f"{name} {key}: {self.group_where[g]} {what}")
            values[g] = number
        return values[self.groups]

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
    fields: list[dict[str, Any]] = []
    places: list[str] = []
    base, group = 0, 0
    for r, rec in enumerate(dataset.recordings):
        # With stride 1 a segment of n samples holds n - window + 1 windows, numbered in order.
        segments, offsets = rec.segments, []
        for _, n in segments:
            offsets.append(base)
            base += max(n - window + 1, 0)
        for i, ann in enumerate(read_annotations(rec)):
            if ann.label is None:
                continue
            found = [
                (offsets[k] + s - segments[k][0], group, ann.label, r, s)
                for k, s in _annotation_starts(segments, ann.sample_start, ann.sample_count, window)
            ]
            rows += found
            if found:
                fields.append(ann.fields)
                places.append(f"{rec.meta_path}: annotations[{i}]")
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
        group_fields=tuple(fields),
        group_where=tuple(places),
    )


# --------------------------------------------------------------------------- features


def probe_features(
    model: NextPatchModel,
    labelled: LabelledSet,
    data: DataConfig,
    *,
    batch_size: int = FEATURE_BATCH,
) -> torch.Tensor:
    """``[len(labelled), dim]`` fp32 CPU: final hidden states mean-pooled over patches (see
    :func:`layer_features`)."""
    final = model.config.layers
    return layer_features(model, labelled, data, [final], batch_size=batch_size)[final]


def layer_features(
    model: NextPatchModel,
    labelled: LabelledSet,
    data: DataConfig,
    layers: Sequence[int],
    *,
    batch_size: int = FEATURE_BATCH,
) -> dict[int, torch.Tensor]:
    """``{layer: [len(labelled), dim]}`` of ``layers`` (:meth:`NextPatchModel.layer_states`
    numbering: 0 the patch embeddings, ``model.layers`` the final hidden states), mean-pooled
    over patches, from one forward per batch.

    Each window is normalised and patched exactly as training does (``data.patch_len``,
    ``data.norm``, ``data.prefix_patches``), on the model's device, in fp32 (autocast off),
    in eval mode under no_grad; the model's train/eval mode is restored afterwards.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
    try:
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            for raw in labelled.batches(batch_size):
                patches, _ = prepare_iq_input_reference(
                    torch.from_numpy(raw).to(device),
                    data.patch_len,
                    norm=data.norm,
                    prefix_patches=data.prefix_patches,
                )
                states = model.layer_states(patches)
                for k in out:
                    out[k].append(states[k].float().mean(dim=1).cpu())
    finally:
        model.train(was_training)
    features = {k: torch.cat(v) for k, v in out.items()}
    for f in features.values():
        _check_finite(f, labelled)
    return features


def _check_finite(features: torch.Tensor, labelled: LabelledSet) -> None:
    bad = (~torch.isfinite(features).all(dim=1)).nonzero().flatten().tolist()
    if bad:  # one such row would turn every standardised feature into NaN
        i = bad[0]
        rec = labelled.dataset.recordings[int(labelled.recordings[i])]
        raise DataError(
            f"{rec.data_path}: the window at sample {int(labelled.starts[i])} gives non-finite "
            f"features ({len(bad)} window(s) in all; non-finite samples in the recording?)"
        )


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
    # The held-out prediction of every window (what per-bin accuracies are read from).
    predicted: np.ndarray | None = field(default=None, compare=False, repr=False)

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
    return ProbeScore(accuracy, per_class, confusion.tolist(), np.asarray(predicted))


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


# --------------------------------------------------------------------------- accuracy by a field

#: ``--bins`` default: 5 dB wide bins, the field's SNR axis.
DEFAULT_BIN_WIDTH = 5.0


def parse_bins(text: str | None, name: str = "--bins") -> float | list[float]:
    """``--bins``: one number (a bin width, the edges on its multiples) or comma-separated
    edges, strictly increasing, at least two; ConfigError naming ``name`` otherwise."""
    if text is None:
        return DEFAULT_BIN_WIDTH
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise ConfigError(
            f"{name}: expected a width (5) or comma-separated edges (-20,-10,0,10,20), got {text!r}"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(f"{name}: edges and widths must be finite, got {text!r}")
    if len(values) == 1:
        if not values[0] > 0:
            raise ConfigError(f"{name}: a bin width must be > 0, got {text!r}")
        return values[0]
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ConfigError(f"{name}: edges must be strictly increasing, got {text!r}")
    return values


#: The most bins a ``--bins`` width may make: more is a mistake (and 1e-300 would never end).
MAX_BY_BINS = 1000
#: A value this many widths below a multiple of the width counts as on it: decimal widths are
#: not exact in binary (0.3 / 0.1 = 2.9999999999999996), and SNRs are written in decimal.
BIN_SNAP = 1e-9


def bin_edges(values: np.ndarray, bins: float | list[float], name: str = "--bins") -> list[float]:
    """The edges of the bins: explicit ones as given; for a width ``w``, ``k·w`` for every
    integer k from ``floor(min / w + BIN_SNAP)`` to ``floor(max / w + BIN_SNAP) + 1`` (each
    value v then lies in bin ``floor(v / w + BIN_SNAP)``). More than :data:`MAX_BY_BINS` bins
    is a ConfigError naming ``name``."""
    if isinstance(bins, list):
        return bins
    lo_v, hi_v = float(values.min()), float(values.max())
    try:
        lo, hi = math.floor(lo_v / bins + BIN_SNAP), math.floor(hi_v / bins + BIN_SNAP)
    except (OverflowError, ValueError):
        lo, hi = 0, MAX_BY_BINS + 1  # an infinite quotient: far too many bins
    if hi - lo + 1 > MAX_BY_BINS:
        raise ConfigError(
            f"{name}: a width of {bins:g} cuts the values {lo_v:g} to {hi_v:g} into more than "
            f"{MAX_BY_BINS} bins; choose a wider one"
        )
    return [k * bins for k in range(lo, hi + 2)]


def bin_index(values: np.ndarray, edges: Sequence[float], width: float | None = None) -> np.ndarray:
    """Bin of each value, -1 outside. Explicit edges: ``[edge_k, edge_k+1)``, the last bin
    closed. A ``width`` (``edges`` from :func:`bin_edges`): ``floor(v / width + BIN_SNAP)``
    counted from the first edge's multiple, so a value on a multiple of the width opens its bin
    whatever the rounding of ``v / width``."""
    if width is not None:
        first = round(edges[0] / width)
        return np.floor(values / width + BIN_SNAP).astype(np.int64) - first
    idx = np.searchsorted(np.asarray(edges), values, side="right") - 1
    idx[values == edges[-1]] = len(edges) - 2
    idx[(values < edges[0]) | (values > edges[-1])] = -1
    return idx


def check_bins(
    values: np.ndarray,
    edges: Sequence[float],
    key: str,
    name: str,
    width: float | None = None,
) -> np.ndarray:
    """:func:`bin_index` of ``values``, refusing a bin without windows (ConfigError)."""
    idx = bin_index(values, edges, width)
    counts = np.bincount(idx[idx >= 0], minlength=len(edges) - 1)
    for k, n in enumerate(counts):
        if n == 0:
            close = "]" if k == len(edges) - 2 and width is None else ")"
            raise ConfigError(
                f"{name}: the bin [{edges[k]:g}, {edges[k + 1]:g}{close} of {key} holds no "
                f"window (values span {values.min():g} to {values.max():g}); choose other bins"
            )
    return idx


def bin_windows(
    labelled: LabelledSet,
    key: str,
    bins: float | list[float],
    names: tuple[str, str] = ("--by", "--bins"),
) -> tuple[list[float], np.ndarray]:
    """``(edges, bin of each window)`` of annotation field ``key`` cut by ``bins`` (a width or
    edges), every refusal a ConfigError naming ``names`` (the option or config key of the
    field, and of the bins): what ``iqtrain probe --by`` and ``[probe] by`` share."""
    values = labelled.numeric(key, name=names[0])
    edges = bin_edges(values, bins, names[1])
    width = None if isinstance(bins, list) else bins
    return edges, check_bins(values, edges, key, names[1], width)


def accuracy_by(
    key: str,
    edges: Sequence[float],
    idx: np.ndarray,
    labels: np.ndarray,
    scores: dict[str, ProbeScore],
) -> dict[str, Any]:
    """``{"key", "outside", "bins": [{"lo", "hi", "windows", <name>: accuracy, ...}]}`` from
    the held-out predictions of each score (its pooled cross-validation)."""
    rows = []
    for k in range(len(edges) - 1):
        inside = idx == k
        row: dict[str, Any] = {
            "lo": float(edges[k]),
            "hi": float(edges[k + 1]),
            "windows": int(inside.sum()),
        }
        for name, sc in scores.items():
            assert sc.predicted is not None
            row[name] = float((sc.predicted[inside] == labels[inside]).mean())
        rows.append(row)
    return {"key": key, "outside": int((idx < 0).sum()), "bins": rows}


# --------------------------------------------------------------------------- the whole probe


def classical_score(labelled: LabelledSet, folds: int, seed: int) -> ProbeScore:
    """The classical AMC features (:mod:`iqtrain.eval.classical`) of the same windows, scored
    by the same grouped cross-validation (same folds, same classifier)."""
    from iqtrain.eval.classical import labelled_classical_features

    features = torch.from_numpy(labelled_classical_features(labelled))
    _check_finite(features, labelled)
    return cross_validate(
        features, labelled.labels, labelled.groups, folds, seed, classes=labelled.classes
    )


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
    classical: ProbeScore | None = None
    layer: int | None = None  # the features' layer (layer_states numbering)
    by: dict[str, Any] | None = None  # accuracy_by
    by_layer: list[dict[str, Any]] | None = None  # --layer all: every layer's accuracies

    def to_dict(self) -> dict[str, Any]:
        out = {
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
            "layer": self.layer,
        }
        if self.classical is not None:
            out["classical"] = self.classical.to_dict()
        if self.by is not None:
            out["by"] = self.by
        if self.by_layer is not None:
            out["by_layer"] = self.by_layer
        return out


def parse_layer(text: str | int | None, layers: int) -> int | str:
    """``--layer``: ``None`` (the final hidden states, ``layers``), an integer in
    ``[0, layers]`` or ``"all"``; ConfigError naming ``--layer`` otherwise."""
    if text is None:
        return layers
    if text == "all":
        return "all"
    # Plain ASCII digits only: int() would also take " 1", "01", "+1", "-0" and "١".
    plain = (
        isinstance(text, int)
        and not isinstance(text, bool)
        or (isinstance(text, str) and re.fullmatch(r"0|[1-9][0-9]*", text) is not None)
    )
    n = int(text) if plain else -1
    if not 0 <= n <= layers:
        raise ConfigError(
            f"--layer: expected 'all' or an integer in [0, {layers}] (0 the patch embeddings, "
            f"{layers} the final hidden states of this {layers}-block model), got {text!r}"
        )
    return n


def _layer_scores(
    models: dict[str, NextPatchModel],
    labelled: LabelledSet,
    data: DataConfig,
    layers: list[int],
    folds: int,
    seed: int,
) -> dict[str, dict[int, ProbeScore]]:
    out: dict[str, dict[int, ProbeScore]] = {}
    for name, m in models.items():
        feats = layer_features(m, labelled, data, layers)
        out[name] = {
            k: cross_validate(
                f, labelled.labels, labelled.groups, folds, seed, classes=labelled.classes
            )
            for k, f in feats.items()
        }
    return out


def run_probe(
    attempt: str | os.PathLike,
    patterns: str | Sequence[str] | None,
    from_: str = "latest",
    folds: int = 5,
    *,
    by: str | None = None,
    bins: str | None = None,
    layer: str | int | None = None,
) -> ProbeResult:
    """Probe checkpoint ``from_`` of ``attempt`` on the labelled windows of ``patterns``,
    beside a random-init model, the classical features and chance.

    ``by``: an annotation field (``iqtrain:snr_db``); accuracies per bin of it (``bins``:
    :func:`parse_bins`). ``layer``: :func:`parse_layer`. Errors a user can cause (bad
    --folds, --from, --layer, --by, --bins, attempt, checkpoint or data) raise ConfigError,
    CheckpointError or DataError with one line naming what is wrong, before any feature is
    computed.
    """
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"--folds: must be an integer >= 2, got {folds!r}")
    spec = parse_bins(bins) if by is not None else None
    if bins is not None and by is None:
        raise ConfigError("--bins: needs --by KEY (the annotation field to bin)")
    model, config, ckpt, step = load_checkpoint_model(attempt, from_)
    chosen = parse_layer(layer, config.model.layers)
    if not patterns:  # the attempt's validation recordings (synthetic: its cached set)
        patterns = validation_patterns(config.data)
    labelled = labelled_windows(patterns, config.data.window)
    seed = config.run.seed
    assign_folds(labelled.labels, labelled.groups, folds, seed, key="--folds")  # refuse early
    binned = None
    if by is not None and spec is not None:
        binned = bin_windows(labelled, by, spec)
    layers = list(range(config.model.layers + 1)) if chosen == "all" else [int(chosen)]
    main_layer = config.model.layers if chosen == "all" else int(chosen)
    models = {"pretrained": model, "random_init": random_init_model(config.model, seed)}
    per_layer = _layer_scores(models, labelled, config.data, layers, folds, seed)
    scores = {name: per_layer[name][main_layer] for name in models}
    scores["classical"] = classical_score(labelled, folds, seed)
    counts = np.bincount(labelled.labels, minlength=len(labelled.classes))
    return ProbeResult(
        attempt=Path(attempt),
        checkpoint=ckpt.name,
        step=step,
        classes=labelled.classes,
        windows=len(labelled),
        annotations=labelled.num_annotations,
        folds=folds,
        pretrained=scores["pretrained"],
        random_init=scores["random_init"],
        chance=float(counts.max() / counts.sum()),
        classical=scores["classical"],
        layer=main_layer,
        by=None if binned is None else accuracy_by(by or "", *binned, labelled.labels, scores),
        by_layer=None
        if chosen != "all"
        else [
            {
                "layer": k,
                "pretrained": per_layer["pretrained"][k].accuracy,
                "random_init": per_layer["random_init"][k].accuracy,
            }
            for k in layers
        ],
    )


def format_table(result: ProbeResult) -> str:
    """The readable report: accuracies side by side (pretrained, random init, classical
    features, chance), per class, per bin of ``--by`` and per layer when asked, then the
    pretrained confusion matrix."""
    r = result
    cols = [("pretrained", r.pretrained), ("random-init", r.random_init)]
    if r.classical is not None:
        cols.append(("classical", r.classical))
    layer = "" if r.layer is None else f", features of layer {r.layer}"
    lines = [
        f"linear probe of {r.attempt} at {r.checkpoint} (step {r.step}): {r.windows} windows "
        f"in {r.annotations} annotations, {len(r.classes)} classes, {r.folds} folds grouped "
        f"by annotation{layer}",
        "",
        f"{'':<16}" + "".join(f"{name:>13}" for name, _ in cols) + f"{'chance':>9}",
        f"{'accuracy':<16}"
        + "".join(f"{sc.accuracy:>13.4f}" for _, sc in cols)
        + f"{r.chance:>9.4f}",
    ]
    for c in r.classes:
        lines.append(f"  {c:<14}" + "".join(f"{sc.per_class[c]:>13.4f}" for _, sc in cols))
    lines += _by_lines(r) + _layer_lines(r)
    width = max(7, *(len(c) + 1 for c in r.classes))
    lines += ["", "confusion of the pretrained model (rows true, columns predicted):"]
    lines.append(" " * 16 + "".join(f"{c:>{width}}" for c in r.classes))
    for c, row in zip(r.classes, r.pretrained.confusion, strict=True):
        lines.append(f"  {c:<14}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def _by_lines(r: ProbeResult) -> list[str]:
    if r.by is None:
        return []
    names = [n for n in ("pretrained", "random_init", "classical") if n in r.by["bins"][0]]
    outside = f" ({r.by['outside']} windows outside the bins)" if r.by["outside"] else ""
    lines = ["", f"accuracy by {r.by['key']}{outside}:"]
    lines.append(f"  {'bin':<18}{'windows':>8}" + "".join(f"{n:>13}" for n in names))
    for b in r.by["bins"]:
        span = f"[{b['lo']:g}, {b['hi']:g})"
        lines.append(f"  {span:<18}{b['windows']:>8}" + "".join(f"{b[n]:>13.4f}" for n in names))
    return lines


def _layer_lines(r: ProbeResult) -> list[str]:
    if r.by_layer is None:
        return []
    lines = ["", "accuracy by layer (0 the patch embeddings, the last the final hidden states):"]
    lines.append(f"  {'layer':<8}{'pretrained':>13}{'random-init':>13}")
    for row in r.by_layer:
        lines.append(f"  {row['layer']:<8}{row['pretrained']:>13.4f}{row['random_init']:>13.4f}")
    return lines

"""Linear probe: how linearly decodable labels are from a frozen model's features
(docs/design.md section 10).

Labelled examples are windows of the model's length lying wholly inside one SigMF annotation
that has a ``core:label`` (:func:`labelled_windows`). Features are the final hidden states
(after the final norm, before the output head), mean-pooled over patches, computed in eval mode
without gradients after the training's normalisation (:func:`probe_features`). A multinomial
logistic regression on standardised features is scored by k-fold cross-validation with folds
grouped by annotation, so windows cut from one burst never sit on both sides of a split
(:class:`FoldPlan`). :func:`run_probe` does all of it for one checkpoint of an attempt, beside
a randomly initialised model of the same config and seed, the classical features, both feature
sets together, and the majority-class rate; with ``shots`` also the few-shot accuracies
(K labelled annotations per class).

Every accuracy comes with its standard error over annotations (:func:`cluster_se`): windows
cut from one burst are not independent examples, so the annotation is the unit of sampling.

Nothing here draws from or reseeds torch's or numpy's global RNG (fold assignment and the
few-shot draws use local generators, the classifier starts from zeros, the random-init model is
built under ``fork_rng``), so a probe run inside training leaves the training stream and its
exact resume untouched.
"""

from __future__ import annotations

import decimal
import math
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.config.sections import DataConfig
from iqtrain.data.sources import probe_patterns
from iqtrain.data.windows import FEATURE_BATCH, LabelledSet, labelled_windows
from iqtrain.errors import ConfigError, DataError
from iqtrain.model.transformer import NextPatchModel
from iqtrain.pretrained.load import (
    load_pretrained,
    nonfinite_rows,
    parse_layer,
    source_ref,
    window_features,
)

__all__ = [
    "DEFAULT_BIN_WIDTH",
    "DEFAULT_SEEDS",
    "L2",
    "LBFGS_ITERATIONS",
    "FoldPlan",
    "LogisticProbe",
    "ProbeResult",
    "ProbeScore",
    "Shots",
    "accuracy_by",
    "assign_folds",
    "bin_edges",
    "bin_index",
    "bin_windows",
    "check_bins",
    "classical_matrix",
    "classical_score",
    "cluster_se",
    "combined_features",
    "cross_validate",
    "fit_logistic",
    "fit_logistic_many",
    "format_table",
    "layer_features",
    "merge_shots",
    "parse_bins",
    "probe_features",
    "probe_model",
    "run_probe",
    "score",
]

# L2 on the weights (not the bias), relative to the mean cross-entropy, on standardised
# features: small enough not to cost accuracy on separable data, large enough that the optimum
# is finite when a training fold is separable (it often is: dim >= 64 features, few windows).
L2 = 1e-3
# The most L-BFGS iterations of one fit. Preconditioned (see _Batch), cross-validation fits
# reach TOL_GRAD in tens of iterations, few-shot fits on separable windows in a few hundred;
# the cap only bounds the time a pathological set can take.
LBFGS_ITERATIONS = 1000
LBFGS_HISTORY = 20
# A fit stops when the largest component of its gradient is at most TOL_GRAD (the loss is a mean
# over windows of standardised features, so this is scale-free), when its loss or its step
# changes by at most TOL_CHANGE, or when no step along its direction lowers the loss.
TOL_GRAD = 1e-6
TOL_CHANGE = 1e-12
ARMIJO = 1e-4  # sufficient decrease of the backtracking line search
HALVINGS = 40  # backtracking halvings before a fit is declared stuck (a step of 2^-40)
# float64 elements of standardised features held at once by one batch of fits (256 MiB);
# fits beyond it go to the next batch.
BATCH_ELEMENTS = 1 << 25


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
    """``{layer: [len(labelled), dim]}`` of ``layers``, mean-pooled over patches, from one
    forward per batch: :func:`iqtrain.pretrained.load.window_features` in fp32 (autocast off),
    the path ``Pretrained.embed`` takes. A window with non-finite features is a DataError
    naming its recording and sample."""
    features = window_features(model, data, labelled.batches(batch_size), layers)
    for f in features.values():
        _check_finite(f, labelled)
    return features


def _check_finite(features: torch.Tensor, labelled: LabelledSet) -> None:
    bad = nonfinite_rows(features.numpy()).tolist()
    if bad:  # one such row would turn every standardised feature into NaN
        i = bad[0]
        rec = labelled.dataset.recordings[int(labelled.recordings[i])]
        raise DataError(
            f"{rec.data_path}: the window at sample {int(labelled.starts[i])} gives non-finite "
            f"features ({len(bad)} window(s) in all; non-finite samples in the recording?)"
        )


def combined_features(classical: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """The classical features and a model's, side by side (float64, classical first): the
    classifier standardises every column by its training windows, so neither set's scale
    weighs on the other."""
    return torch.cat([classical.double(), model.double()], dim=1)


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
    labels: torch.Tensor | np.ndarray,
    num_classes: int,
    *,
    l2: float = L2,
    iterations: int = LBFGS_ITERATIONS,
) -> LogisticProbe:
    """Fit softmax regression on ``features`` standardised by their own mean and std: one
    :func:`fit_logistic_many` fit over every row."""
    y = torch.as_tensor(labels).long().numpy()
    rows = [np.arange(len(features))]
    return fit_logistic_many(features, y, rows, num_classes, l2=l2, iterations=iterations)[0]


def fit_logistic_many(
    features: torch.Tensor,
    labels: np.ndarray,
    rows: Sequence[np.ndarray],
    num_classes: int,
    *,
    l2: float = L2,
    iterations: int = LBFGS_ITERATIONS,
) -> list[LogisticProbe]:
    """One softmax regression per entry of ``rows`` (the training windows of that fit), fitted
    side by side: independent problems in one batch, so the many small fits of cross-validation
    and of the few-shot draws cost a few large tensor operations instead of many small ones.

    Each fit: features standardised by its rows' mean and population std (std <= 1e-12 -> 1),
    float64; ``W [dim, classes]`` and ``b`` from zeros; loss mean cross-entropy
    + ``l2 / 2 * |W|^2``; L-BFGS (history 20) preconditioned by the rows' second moments, with a
    backtracking (Armijo) line search, until TOL_GRAD / TOL_CHANGE or ``iterations``. A fit's
    iterates depend on its own rows only. Deterministic; no RNG.
    """
    labels = np.asarray(labels, dtype=np.int64)
    fits: list[LogisticProbe] = []
    for chunk in _chunks(rows, features.shape[1]):
        batch = _Batch(features, labels, chunk, num_classes, l2)
        fits += batch.fits(_lbfgs(batch.loss_grad, batch.precondition, batch.start(), iterations))
    return fits


def _chunks(rows: Sequence[np.ndarray], dim: int) -> Iterator[list[np.ndarray]]:
    """``rows`` in order, cut into batches of at most BATCH_ELEMENTS padded elements (one fit
    per batch when a single one is larger)."""
    chunk: list[np.ndarray] = []
    longest = 0
    for r in rows:
        n = max(longest, len(r))
        if chunk and (len(chunk) + 1) * n * (dim + 1) > BATCH_ELEMENTS:
            yield chunk
            chunk, n = [], len(r)
        chunk.append(np.asarray(r))
        longest = n
    if chunk:
        yield chunk


class _Batch:
    """The standardised training windows of a batch of fits, padded to the longest: ``z``
    ``[P, n, dim + 1]`` (the last column ones: the bias), ``w`` ``[P, n]`` (1/rows of the fit,
    0 on padding), ``y`` ``[P, n]``. Parameters ``x [P, (dim + 1) * classes]``: ``[W; b]``."""

    def __init__(
        self,
        features: torch.Tensor,
        labels: np.ndarray,
        rows: list[np.ndarray],
        classes: int,
        l2: float,
    ):
        p, n, dim = len(rows), max(len(r) for r in rows), features.shape[1]
        self.classes, self.dim = classes, dim
        self.z = torch.zeros(p, n, dim + 1, dtype=torch.float64)
        self.z[:, :, dim] = 1.0
        self.w = torch.zeros(p, n, dtype=torch.float64)
        self.y = torch.zeros(p, n, dtype=torch.int64)
        self.mean, self.std = [], []
        for i, r in enumerate(rows):
            x = features[torch.from_numpy(r)].double()
            mean = x.mean(dim=0)
            std = x.std(dim=0, unbiased=False)
            std = torch.where(std > 1e-12, std, torch.ones_like(std))
            self.z[i, : len(r), :dim] = (x - mean) / std
            self.w[i, : len(r)] = 1.0 / len(r)
            self.y[i, : len(r)] = torch.from_numpy(labels[r])
            self.mean.append(mean)
            self.std.append(std)
        self.decay = torch.full((dim + 1, 1), l2, dtype=torch.float64)
        self.decay[dim] = 0.0  # the bias is not penalised
        # Preconditioner: the rows' weighted second moments (bias column included) plus a ridge,
        # which is about `classes` times the Hessian at the start (softmax curvature ~1/classes):
        # L-BFGS then steps as if the features were decorrelated, and fits of correlated model
        # features converge in tens of iterations instead of hundreds (the objective is the same).
        moments = torch.bmm(self.z.transpose(1, 2) * self.w.unsqueeze(1), self.z)
        ridge = max(classes * l2, 1e-9) * torch.eye(dim + 1, dtype=torch.float64)
        # Applied as an explicit inverse (one batched matmul per use; the matrix is SPD and at
        # worst as ill-conditioned as moments / ridge, which float64 holds comfortably).
        self._inverse = torch.cholesky_inverse(torch.linalg.cholesky(moments + ridge))

    def start(self) -> torch.Tensor:
        return torch.zeros(len(self.z), (self.dim + 1) * self.classes, dtype=torch.float64)

    def loss_grad(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss [P], gradient [P, params])`` of every fit at ``x``."""
        a = x.view(len(x), self.dim + 1, self.classes)
        logits = torch.bmm(self.z, a)
        lse = torch.logsumexp(logits, dim=2)
        picked = logits.gather(2, self.y.unsqueeze(2)).squeeze(2)
        reg = self.decay * a
        loss = (self.w * (lse - picked)).sum(dim=1) + 0.5 * (reg * a).sum(dim=(1, 2))
        g = torch.exp(logits - lse.unsqueeze(2))
        g.scatter_add_(2, self.y.unsqueeze(2), torch.full_like(picked, -1.0).unsqueeze(2))
        g = g * self.w.unsqueeze(2)
        return loss, (torch.bmm(self.z.transpose(1, 2), g) + reg).reshape(len(x), -1)

    def precondition(self, v: torch.Tensor) -> torch.Tensor:
        a = v.view(len(v), self.dim + 1, self.classes)
        return torch.bmm(self._inverse, a).reshape(len(v), -1)

    def fits(self, x: torch.Tensor) -> list[LogisticProbe]:
        a = x.view(len(x), self.dim + 1, self.classes)
        return [
            LogisticProbe(self.mean[i], self.std[i], a[i, : self.dim].clone(), a[i, -1].clone())
            for i in range(len(x))
        ]


_LossGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _lbfgs(
    loss_grad: _LossGrad,
    precondition: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    iterations: int,
) -> torch.Tensor:
    """Preconditioned L-BFGS on a batch of independent problems (rows of ``x``); every scalar
    (step, curvature pair, stopping test) is per problem, so a problem's iterates never depend
    on the others'. A problem that has stopped keeps its parameters."""
    f, g = loss_grad(x)
    active = g.abs().amax(dim=1) > TOL_GRAD
    memory = _Memory(precondition, len(x), x.dtype)
    for _ in range(iterations):
        if not bool(active.any()):
            break
        d = memory.direction(g)
        gtd = (g * d).sum(dim=1)
        active &= gtd < -TOL_CHANGE  # not a descent direction any more: at the optimum
        x_new, f_new, g_new, t, moved = _armijo(loss_grad, x, f, gtd, d, active)
        keep = moved.unsqueeze(1)
        memory.push(torch.where(keep, x_new - x, 0.0), torch.where(keep, g_new - g, 0.0))
        small = (
            (g_new.abs().amax(dim=1) <= TOL_GRAD)
            | ((f - f_new).abs() <= TOL_CHANGE)
            | ((t.unsqueeze(1) * d).abs().amax(dim=1) <= TOL_CHANGE)
        )
        x, f, g = (
            torch.where(keep, x_new, x),
            torch.where(moved, f_new, f),
            torch.where(keep, g_new, g),
        )
        active &= moved & ~small
    return x


def _armijo(
    loss_grad: _LossGrad,
    x: torch.Tensor,
    f: torch.Tensor,
    gtd: torch.Tensor,
    d: torch.Tensor,
    active: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backtracking from a step of 1, halving until the loss falls by ARMIJO of the slope:
    ``(x, f, g at the accepted steps, the steps, which problems moved)``."""
    t = torch.ones_like(f)
    pending = active.clone()
    x_new, f_new, g_new = x.clone(), f.clone(), torch.zeros_like(x)
    for _ in range(HALVINGS):
        xt = x + t.unsqueeze(1) * d
        ft, gt = loss_grad(xt)
        ok = pending & (ft <= f + ARMIJO * t * gtd)  # NaN compares False: a shorter step
        x_new[ok], f_new[ok], g_new[ok] = xt[ok], ft[ok], gt[ok]
        pending &= ~ok
        if not bool(pending.any()):
            break
        t = torch.where(pending, 0.5 * t, t)
    return x_new, f_new, g_new, t, active & ~pending


class _Memory:
    """The last LBFGS_HISTORY curvature pairs of every problem (a pair with ``s·y <= 1e-10``,
    or of a problem that did not move, is stored as a no-op: ``rho = 0``)."""

    def __init__(
        self, precondition: Callable[[torch.Tensor], torch.Tensor], p: int, dtype: torch.dtype
    ):
        self.precondition = precondition
        self.pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.gamma = torch.ones(p, dtype=dtype)

    def push(self, s: torch.Tensor, y: torch.Tensor) -> None:
        sy = (s * y).sum(dim=1)
        good = sy > 1e-10
        rho = torch.where(good, 1.0 / torch.where(good, sy, 1.0), 0.0)
        y_hy = (y * self.precondition(y)).sum(dim=1)
        self.gamma = torch.where(
            good & (y_hy > 0), sy / torch.where(y_hy > 0, y_hy, 1.0), self.gamma
        )
        self.pairs.append((s, y, rho))
        if len(self.pairs) > LBFGS_HISTORY:
            self.pairs.pop(0)

    def direction(self, g: torch.Tensor) -> torch.Tensor:
        """The two-loop recursion: ``-H g`` with ``H0 = gamma * M^-1``."""
        q, alphas = -g, []
        for s, y, rho in reversed(self.pairs):
            a = rho * (s * q).sum(dim=1)
            q = q - a.unsqueeze(1) * y
            alphas.append(a)
        r = self.gamma.unsqueeze(1) * self.precondition(q)
        for (s, y, rho), a in zip(self.pairs, reversed(alphas), strict=True):
            b = rho * (y * r).sum(dim=1)
            r = r + (a - b).unsqueeze(1) * s
        return r


# --------------------------------------------------------------------------- folds and scores


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


def cluster_se(correct: np.ndarray, groups: np.ndarray) -> float | None:
    """Standard error of the accuracy ``mean(correct)`` over the clusters ``groups`` (the
    annotations): ``sqrt(G / (G - 1) * sum_g (c_g - acc * n_g)^2) / sum_g n_g`` for G groups, c_g
    correct of n_g windows (the cluster-robust, CR1 sandwich estimator of a ratio). None with
    fewer than two groups (no spread to measure). Deterministic: sums in group order."""
    correct = np.asarray(correct, dtype=np.float64)
    if correct.size == 0:
        return None
    _, inverse = np.unique(np.asarray(groups), return_inverse=True)
    n = np.bincount(inverse).astype(np.float64)
    c = np.bincount(inverse, weights=correct)
    if n.size < 2:
        return None
    total = float(n.sum())
    acc = float(c.sum()) / total
    return math.sqrt(n.size / (n.size - 1) * float(np.sum((c - acc * n) ** 2))) / total


@dataclass(frozen=True)
class ProbeScore:
    """Pooled held-out accuracy, accuracy per true class, confusion (rows true, cols predicted),
    and the standard errors over annotations of the accuracy and of each class's accuracy."""

    accuracy: float
    per_class: dict[str, float]
    confusion: list[list[int]]
    # The held-out prediction of every window (what per-bin accuracies are read from).
    predicted: np.ndarray | None = field(default=None, compare=False, repr=False)
    accuracy_se: float | None = None
    per_class_se: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "accuracy": self.accuracy,
            "accuracy_se": self.accuracy_se,
            "per_class": self.per_class,
            "per_class_se": self.per_class_se,
            "confusion": self.confusion,
        }


def score(
    labels: np.ndarray,
    predicted: np.ndarray,
    classes: Sequence[str],
    groups: np.ndarray | None = None,
) -> ProbeScore:
    """The accuracies of ``predicted``; with ``groups`` (each window's annotation) their
    standard errors over annotations (:func:`cluster_se`)."""
    labels, predicted = np.asarray(labels), np.asarray(predicted)
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    totals = confusion.sum(axis=1)
    per_class = {
        c: float(confusion[i, i] / totals[i]) if totals[i] else math.nan
        for i, c in enumerate(classes)
    }
    accuracy = float(np.trace(confusion) / confusion.sum())
    se, per_class_se = None, {}
    if groups is not None:
        correct = labels == predicted
        se = cluster_se(correct, groups)
        per_class_se = {
            c: cluster_se(correct[labels == i], groups[labels == i]) for i, c in enumerate(classes)
        }
    return ProbeScore(
        accuracy,
        per_class,
        confusion.tolist(),
        predicted,
        accuracy_se=se,
        per_class_se=per_class_se,
    )


@dataclass(frozen=True, eq=False)
class FoldPlan:
    """The grouped folds of one labelled set, shared by every score of a probe: each model,
    layer and feature set is fitted on the same training windows and scored on the same
    held-out windows, and the few-shot draws are the same for all of them."""

    labels: np.ndarray
    groups: np.ndarray
    fold_of: np.ndarray
    folds: int
    classes: tuple[str, ...]
    seed: int

    @classmethod
    def build(
        cls,
        labels: np.ndarray,
        groups: np.ndarray,
        folds: int,
        seed: int,
        classes: Sequence[str] | None = None,
        key: str = "folds",
    ) -> FoldPlan:
        """:func:`assign_folds` (a ConfigError naming ``key`` for too few annotations)."""
        labels = np.asarray(labels, dtype=np.int64)
        groups = np.asarray(groups)
        names = tuple(classes) if classes is not None else tuple(map(str, range(labels.max() + 1)))
        fold_of = assign_folds(labels, groups, folds, seed, key=key)
        return cls(labels, groups, fold_of, folds, names, seed)

    @classmethod
    def of(cls, labelled: LabelledSet, folds: int, seed: int, key: str = "folds") -> FoldPlan:
        return cls.build(labelled.labels, labelled.groups, folds, seed, labelled.classes, key)

    def training_rows(self) -> list[np.ndarray]:
        return [np.flatnonzero(self.fold_of != f) for f in range(self.folds)]

    def predict(self, features: torch.Tensor, fits: Sequence[LogisticProbe]) -> np.ndarray:
        """Each window's prediction by the fit of the folds it is held out from (``fits[f]``
        for fold f): every window predicted once."""
        predicted = np.empty_like(self.labels)
        for f, fit in enumerate(fits):
            held = np.flatnonzero(self.fold_of == f)
            predicted[held] = fit.predict(features[torch.from_numpy(held)]).numpy()
        return predicted

    def score(self, features: torch.Tensor) -> ProbeScore:
        """Pooled held-out score of :func:`fit_logistic_many` over the folds: standardisation
        statistics from each training fold only; a class absent from a training fold is never
        predicted for that fold's held-out windows."""
        fits = fit_logistic_many(features, self.labels, self.training_rows(), len(self.classes))
        return score(self.labels, self.predict(features, fits), self.classes, self.groups)

    # ------------------------------------------------------------------ few-shot draws

    def _candidates(self) -> list[list[np.ndarray]]:
        """``[fold][class]``: the training annotations (group ids, ascending) of each class
        when the fold is held out."""
        uniq, first = np.unique(self.groups, return_index=True)
        group_class, group_fold = self.labels[first], self.fold_of[first]
        return [
            [uniq[(group_class == c) & (group_fold != f)] for c in range(len(self.classes))]
            for f in range(self.folds)
        ]

    def check_shots(self, shots: Sequence[int], key: str = "--shots") -> None:
        """Refuse a K larger than some class's training annotations in some fold (ConfigError
        naming ``key``, the class and how many it has), before any feature is computed."""
        if not shots:
            return
        fewest = [
            min(len(per_fold[c]) for per_fold in self._candidates())
            for c in range(len(self.classes))
        ]
        k = max(shots)
        for c, n in enumerate(fewest):
            if n < k:
                fix = (
                    f"use K <= {min(fewest)}"
                    if min(fewest) > 0
                    else "it has fewer annotations than folds: use fewer folds or more data"
                )
                raise ConfigError(
                    f"{key}: K = {k} annotations per class, but class {self.classes[c]!r} has "
                    f"only {n} training annotations when its fold is held out "
                    f"({self.folds} folds); {fix}"
                )

    def draw(self, k: int, s: int) -> list[np.ndarray]:
        """The training windows of draw ``s`` of ``k`` annotations per class, per fold.

        A local PCG64 seeded by ``SeedSequence([seed, k, s])`` gives one raw 64-bit key per
        candidate annotation (fold by fold, class by class, candidates in ascending order); the
        ``k`` candidates with the smallest keys are drawn (a uniform draw without replacement).
        The bit stream of a BitGenerator is stable across numpy versions."""
        bits = np.random.PCG64(np.random.SeedSequence([self.seed, k, s]))
        rows = []
        for per_class in self._candidates():
            picked = [c[np.argsort(bits.random_raw(c.size), kind="stable")[:k]] for c in per_class]
            rows.append(np.flatnonzero(np.isin(self.groups, np.concatenate(picked))))
        return rows

    def shots(
        self, features: dict[str, torch.Tensor], shots: Sequence[int], seeds: int
    ) -> list[dict[str, Any]]:
        """``[{"k", "seeds", <name>: {"mean", "std", "se", "draws"}}]``, K ascending: for each
        K, ``seeds`` draws of K annotations per class from each training fold, fitted on their
        windows and scored on the held-out fold's windows, pooled over the folds (each window
        predicted once per draw). ``draws``: the accuracy of each draw; ``mean`` and ``std``
        (``ddof=1``; None for one draw) over the draws; ``se`` the mean over draws of each
        draw's standard error over annotations."""
        out = []
        for k in sorted(shots):
            rows = [r for s in range(seeds) for r in self.draw(k, s)]
            entry: dict[str, Any] = {"k": k, "seeds": seeds}
            for name, x in features.items():
                fits = fit_logistic_many(x, self.labels, rows, len(self.classes))
                accuracies, ses = [], []
                for s in range(seeds):
                    correct = (
                        self.predict(x, fits[s * self.folds : (s + 1) * self.folds]) == self.labels
                    )
                    accuracies.append(float(correct.mean()))
                    ses.append(cluster_se(correct, self.groups))
                entry[name] = _spread(accuracies, ses)
            out.append(entry)
        return out


def _spread(accuracies: list[float], ses: list[float | None]) -> dict[str, Any]:
    known = [v for v in ses if v is not None]
    return {
        "mean": float(np.mean(accuracies)),
        "std": float(np.std(accuracies, ddof=1)) if len(accuracies) > 1 else None,
        "se": float(np.mean(known)) if len(known) == len(ses) else None,
        "draws": accuracies,
    }


def merge_shots(*parts: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The entries of several :meth:`FoldPlan.shots` results over the same K, one per K
    (a training probe scores its baselines once and the model at every probe)."""
    given = [p for p in parts if p is not None]
    if not given:
        return None
    return [
        {k: v for entry in entries for k, v in entry.items()}
        for entries in zip(*given, strict=True)
    ]


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
    """Grouped k-fold cross-validation of the classifier, pooled over held-out windows
    (:meth:`FoldPlan.score`); ``classes`` names the label indices (default: their numbers)."""
    return FoldPlan.build(labels, groups, folds, seed, classes, key).score(features)


def probe_model(
    model: NextPatchModel, labelled: LabelledSet, data: DataConfig, folds: int, seed: int
) -> ProbeScore:
    """Features of ``model`` on ``labelled``, scored by grouped cross-validation: the part a
    training run can call (it needs no attempt and touches no global RNG)."""
    return FoldPlan.of(labelled, folds, seed).score(probe_features(model, labelled, data))


@dataclass(frozen=True)
class Shots:
    """The few-shot request: ``ks`` (distinct K >= 1, ascending) and ``seeds`` draws per K."""

    ks: tuple[int, ...]
    seeds: int = 5

    @classmethod
    def parse(
        cls,
        text: str | Sequence[int] | None,
        seeds: int | None = None,
        names: tuple[str, str] = ("--shots", "--seeds"),
    ) -> Shots | None:
        """``--shots K[,K...]`` (plain ASCII digits, or a list of integers) and ``--seeds S``
        (default 5); None without shots. ConfigError naming ``names`` for a bad K or seed
        count, a K given twice, or seeds without shots."""
        if seeds is not None and (
            isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1
        ):
            raise ConfigError(f"{names[1]}: must be an integer >= 1, got {seeds!r}")
        if text is None or (not isinstance(text, str) and len(text) == 0):
            if seeds is not None and text is None:
                raise ConfigError(f"{names[1]}: needs {names[0]} K[,K...] (the draws to repeat)")
            return None
        items = str(text).split(",") if isinstance(text, str) else list(text)
        values = [_shot(item, text, names[0]) for item in items]
        if len(set(values)) != len(values):
            raise ConfigError(f"{names[0]}: each K once, got {text!r}")
        return cls(tuple(sorted(values)), DEFAULT_SEEDS if seeds is None else seeds)


def _shot(item: Any, text: Any, name: str) -> int:
    if isinstance(item, str) and re.fullmatch(r"[1-9][0-9]*", item.strip()):
        return int(item.strip())
    if isinstance(item, int) and not isinstance(item, bool) and item >= 1:
        return item
    raise ConfigError(
        f"{name}: expected annotations per class, positive integers (1,5,10), got {text!r}"
    )


#: ``--seeds`` default: draws per K.
DEFAULT_SEEDS = 5


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


def _width_edge(k: int, width: decimal.Decimal) -> float:
    """Edge ``k`` of a width: ``k · width`` computed in decimal (the width as written: the
    shortest decimal of its float) and rounded once to a float, so 3 · 0.1 is 0.3, not
    0.30000000000000004, and the edges print as the multiples a reader expects."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        return float(k * width)


def _width_bin(v: float, width: float, step: decimal.Decimal, name: str) -> int:
    """The k with ``edge(k) <= v < edge(k + 1)`` (a ConfigError naming ``name`` when the edges
    around v cannot be told apart: the width is below the values' float resolution)."""
    k = math.floor(v / width)
    for _ in range(4):  # v / width is within an ulp or two of the true quotient
        if _width_edge(k, step) > v:
            k -= 1
        elif _width_edge(k + 1, step) <= v:
            k += 1
        else:
            return k
    raise ConfigError(
        f"{name}: a width of {width:g} is finer than the float resolution of the values near "
        f"{v:g}; choose a wider one"
    )


def bin_edges(values: np.ndarray, bins: float | list[float], name: str = "--bins") -> list[float]:
    """The edges of the bins: explicit ones as given; for a width ``w``, the edges ``k · w``
    (:func:`_width_edge`) for every k from the bin of the smallest value to one past the bin of
    the largest, each value v in the bin ``[edge_k, edge_k+1)`` with ``edge_k <= v`` compared
    as floats (negative values included, for any width). More than :data:`MAX_BY_BINS` bins is
    a ConfigError naming ``name``."""
    if isinstance(bins, list):
        return bins
    lo_v, hi_v = float(values.min()), float(values.max())
    spread = hi_v / bins - lo_v / bins
    if not spread <= MAX_BY_BINS:  # inf and NaN included (an overflowing quotient)
        raise ConfigError(
            f"{name}: a width of {bins:g} cuts the values {lo_v:g} to {hi_v:g} into more than "
            f"{MAX_BY_BINS} bins; choose a wider one"
        )
    step = decimal.Decimal(repr(float(bins)))
    lo, hi = _width_bin(lo_v, bins, step, name), _width_bin(hi_v, bins, step, name)
    if hi - lo + 1 > MAX_BY_BINS:
        raise ConfigError(
            f"{name}: a width of {bins:g} cuts the values {lo_v:g} to {hi_v:g} into more than "
            f"{MAX_BY_BINS} bins; choose a wider one"
        )
    return [_width_edge(k, step) for k in range(lo, hi + 2)]


def bin_index(values: np.ndarray, edges: Sequence[float], width: float | None = None) -> np.ndarray:
    """Bin of each value, -1 outside: ``edges[k] <= v < edges[k + 1]`` compared as floats; with
    explicit edges (``width`` None) the last bin is closed. (Edges of a width, from
    :func:`bin_edges`, end past the largest value, so its last bin never needs closing.)"""
    e = np.asarray(edges, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    idx = np.searchsorted(e, values, side="right") - 1
    if width is None:
        idx[values == e[-1]] = len(e) - 2
    idx[(idx < 0) | (idx > len(e) - 2)] = -1
    return idx


def _number(x: float) -> str:
    """A bin edge as printed: ``:g`` when that is the edge exactly, else the shortest repr (so
    a printed edge is never rounded to the other side of a value)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def _span(lo: float, hi: float, closed: bool) -> str:
    return f"[{_number(lo)}, {_number(hi)}{']' if closed else ')'}"


def check_bins(
    values: np.ndarray,
    edges: Sequence[float],
    key: str,
    name: str,
    width: float | None = None,
) -> np.ndarray:
    """:func:`bin_index` of ``values``. A bin without windows stays a bin (shown with 0
    windows and no accuracy); no window in any bin is a ConfigError naming ``name``."""
    idx = bin_index(values, edges, width)
    if not bool((idx >= 0).any()):
        raise ConfigError(
            f"{name}: no window's {key} lies in the bins {_span(edges[0], edges[-1], True)} "
            f"(values span {_number(float(values.min()))} to {_number(float(values.max()))}); "
            "choose other bins"
        )
    return idx


def bin_windows(
    labelled: LabelledSet,
    key: str,
    bins: float | list[float],
    names: tuple[str, str] = ("--by", "--bins"),
) -> tuple[list[float], np.ndarray, float | None]:
    """``(edges, bin of each window, width or None)`` of annotation field ``key`` cut by
    ``bins`` (a width or edges), every refusal a ConfigError naming ``names`` (the option or
    config key of the field, and of the bins): what ``iqtrain probe --by`` and ``[probe] by``
    share."""
    values = labelled.numeric(key, name=names[0])
    edges = bin_edges(values, bins, names[1])
    width = None if isinstance(bins, list) else float(bins)
    return edges, check_bins(values, edges, key, names[1], width), width


def accuracy_by(
    key: str,
    edges: Sequence[float],
    idx: np.ndarray,
    width: float | None,
    labels: np.ndarray,
    groups: np.ndarray,
    scores: dict[str, ProbeScore],
) -> dict[str, Any]:
    """``{"key", "width", "outside", "bins": [{"lo", "hi", "windows", <name>, <name>_se, ...}]}``
    from the held-out predictions of each score (its pooled cross-validation). A bin without
    windows has ``windows`` 0 and None for every accuracy and standard error; ``width`` is
    None for explicit edges (whose last bin is closed)."""
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
            correct = sc.predicted[inside] == labels[inside]
            row[name] = float(correct.mean()) if correct.size else None
            row[f"{name}_se"] = cluster_se(correct, groups[inside])
        rows.append(row)
    return {"key": key, "width": width, "outside": int((idx < 0).sum()), "bins": rows}


# --------------------------------------------------------------------------- the whole probe


def classical_score(labelled: LabelledSet, folds: int, seed: int) -> ProbeScore:
    """The classical AMC features (:mod:`iqtrain.eval.classical`) of the same windows, scored
    by the same grouped cross-validation (same folds, same classifier)."""
    return FoldPlan.of(labelled, folds, seed).score(classical_matrix(labelled))


def classical_matrix(labelled: LabelledSet) -> torch.Tensor:
    """``[len(labelled), 12]`` float64: the classical features of every window (a window with
    non-finite samples is a DataError naming it)."""
    from iqtrain.eval.classical import labelled_classical_features

    features = torch.from_numpy(labelled_classical_features(labelled))
    _check_finite(features, labelled)
    return features


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
    combined: ProbeScore | None = None  # classical + pretrained features
    shots: list[dict[str, Any]] | None = None  # FoldPlan.shots

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
        for name in ("classical", "combined"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value.to_dict()
        for name in ("by", "by_layer", "shots"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def _checked_options(folds: int, by: str | None, bins: str | None) -> float | list[float] | None:
    """``--folds`` and ``--bins`` (with ``--by``), refused before any work."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"--folds: must be an integer >= 2, got {folds!r}")
    if bins is not None and by is None:
        raise ConfigError("--bins: needs --by KEY (the annotation field to bin)")
    return parse_bins(bins) if by is not None else None


def _scores(
    plan: FoldPlan,
    per_layer: dict[str, dict[int, torch.Tensor]],
    classical: torch.Tensor,
    main: int,
) -> tuple[dict[str, dict[int, ProbeScore]], dict[str, ProbeScore], dict[str, torch.Tensor]]:
    """Every layer's scores of each model, the main layer's four scores, and the main layer's
    four feature matrices (each computed once: the folds, layers and shots share them)."""
    by_layer = {
        name: {k: plan.score(f) for k, f in feats.items()} for name, feats in per_layer.items()
    }
    features = {
        "pretrained": per_layer["pretrained"][main],
        "random_init": per_layer["random_init"][main],
        "classical": classical,
        "combined": combined_features(classical, per_layer["pretrained"][main]),
    }
    scores = {name: by_layer[name][main] for name in per_layer}
    scores["classical"] = plan.score(classical)
    scores["combined"] = plan.score(features["combined"])
    return by_layer, scores, features


def run_probe(
    attempt: str | os.PathLike,
    patterns: str | Sequence[str] | None,
    from_: str = "latest",
    folds: int = 5,
    *,
    by: str | None = None,
    bins: str | None = None,
    layer: str | int | None = None,
    shots: Shots | None = None,
) -> ProbeResult:
    """Probe checkpoint ``from_`` of ``attempt`` on the labelled windows of ``patterns``,
    beside a random-init model, the classical features, both feature sets together and chance.

    ``by``: an annotation field (``iqtrain:snr_db``); accuracies per bin of it (``bins``:
    :func:`parse_bins`). ``layer``: :func:`parse_layer`. ``shots`` (:meth:`Shots.parse`):
    the few-shot accuracies (:meth:`FoldPlan.shots`). Errors a user can cause (bad --folds,
    --from, --layer, --by, --bins, --shots, attempt, checkpoint or data) raise ConfigError,
    CheckpointError or DataError with one line naming what is wrong, before any feature is
    computed.
    """
    spec = _checked_options(folds, by, bins)
    source_ref(attempt, from_, name="--from")  # a bad --from is named as such
    pre = load_pretrained(attempt, which=from_, precision="fp32")
    config = pre.config
    chosen = parse_layer(layer, config.model.layers)
    if not patterns:  # the attempt's probe set (probe.data, synthetic probe set, or val)
        patterns = probe_patterns(config.probe, config.data)
    labelled = labelled_windows(patterns, config.data.window)
    plan = FoldPlan.of(labelled, folds, config.run.seed, key="--folds")  # refuse early
    binned = None
    if by is not None and spec is not None:
        binned = bin_windows(labelled, by, spec)
    plan.check_shots(shots.ks if shots else (), "--shots")
    layers = list(range(config.model.layers + 1)) if chosen == "all" else [int(chosen)]
    main = config.model.layers if chosen == "all" else int(chosen)
    models = {"pretrained": pre.model, "random_init": pre.random_init().model}
    per_layer = {n: layer_features(m, labelled, config.data, layers) for n, m in models.items()}
    by_layer, scores, features = _scores(plan, per_layer, classical_matrix(labelled), main)
    counts = np.bincount(labelled.labels, minlength=len(labelled.classes))
    return ProbeResult(
        attempt=Path(attempt),
        checkpoint=pre.checkpoint.name,
        step=pre.step,
        classes=labelled.classes,
        windows=len(labelled),
        annotations=labelled.num_annotations,
        folds=folds,
        pretrained=scores["pretrained"],
        random_init=scores["random_init"],
        chance=float(counts.max() / counts.sum()),
        classical=scores["classical"],
        layer=main,
        by=None
        if binned is None
        else accuracy_by(by or "", *binned, plan.labels, plan.groups, scores),
        by_layer=None if chosen != "all" else _layer_rows(by_layer, layers),
        combined=scores["combined"],
        shots=plan.shots(features, shots.ks, shots.seeds) if shots else None,
    )


def _layer_rows(
    by_layer: dict[str, dict[int, ProbeScore]], layers: list[int]
) -> list[dict[str, Any]]:
    rows = []
    for k in layers:
        row: dict[str, Any] = {"layer": k}
        for name in ("pretrained", "random_init"):
            row[name] = by_layer[name][k].accuracy
            row[f"{name}_se"] = by_layer[name][k].accuracy_se
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- the table

#: The models of a probe in the order they are printed, with their column titles.
COLUMNS = (
    ("pretrained", "pretrained"),
    ("random_init", "random-init"),
    ("classical", "classical"),
    ("combined", "classical+pretrained"),
)
CELL = 22


def _cell(value: float | None, se: float | None, width: int = CELL) -> str:
    """``0.2861 ± 0.0123``; a dash for no accuracy (a bin without windows), ``± -`` for no
    standard error (fewer than two annotations)."""
    if value is None:
        return f"{'-':>{width}}"
    spread = "-" if se is None else f"{se:.4f}"
    return f"{f'{value:.4f} ± {spread}':>{width}}"


def format_table(result: ProbeResult) -> str:
    """The readable report: accuracies side by side (pretrained, random init, classical
    features, both feature sets, chance), each with its standard error over annotations, per
    class, per bin of ``--by``, per layer and per K of ``--shots`` when asked, then the
    pretrained confusion matrix."""
    r = result
    cols = [(title, getattr(r, name)) for name, title in COLUMNS if getattr(r, name) is not None]
    layer = "" if r.layer is None else f", features of layer {r.layer}"
    lines = [
        f"linear probe of {r.attempt} at {r.checkpoint} (step {r.step}): {r.windows} windows "
        f"in {r.annotations} annotations, {len(r.classes)} classes, {r.folds} folds grouped "
        f"by annotation{layer}",
        "accuracy ± its standard error over annotations (windows of one annotation are not "
        "independent)",
        "",
        f"{'':<16}" + "".join(f"{name:>{CELL}}" for name, _ in cols) + f"{'chance':>9}",
        f"{'accuracy':<16}"
        + "".join(_cell(sc.accuracy, sc.accuracy_se) for _, sc in cols)
        + f"{r.chance:>9.4f}",
    ]
    for c in r.classes:
        lines.append(
            f"  {c:<14}" + "".join(_cell(sc.per_class[c], sc.per_class_se.get(c)) for _, sc in cols)
        )
    lines += _by_lines(r) + _layer_lines(r) + _shot_lines(r)
    width = max(7, *(len(c) + 1 for c in r.classes))
    lines += ["", "confusion of the pretrained model (rows true, columns predicted):"]
    lines.append(" " * 16 + "".join(f"{c:>{width}}" for c in r.classes))
    for c, row in zip(r.classes, r.pretrained.confusion, strict=True):
        lines.append(f"  {c:<14}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def _by_lines(r: ProbeResult) -> list[str]:
    if r.by is None:
        return []
    bins = r.by["bins"]
    names = [(n, title) for n, title in COLUMNS if n in bins[0]]
    outside = f" ({r.by['outside']} windows outside the bins)" if r.by["outside"] else ""
    lines = ["", f"accuracy by {r.by['key']}{outside}:"]
    lines.append(f"  {'bin':<18}{'windows':>8}" + "".join(f"{t:>{CELL}}" for _, t in names))
    closed_last = r.by.get("width") is None
    for i, b in enumerate(bins):
        span = _span(b["lo"], b["hi"], closed_last and i == len(bins) - 1)
        cells = "".join(_cell(b[n], b.get(f"{n}_se")) for n, _ in names)
        lines.append(f"  {span:<18}{b['windows']:>8}" + cells)
    return lines


def _layer_lines(r: ProbeResult) -> list[str]:
    if r.by_layer is None:
        return []
    lines = ["", "accuracy by layer (0 the patch embeddings, the last the final hidden states):"]
    lines.append(f"  {'layer':<8}{'pretrained':>{CELL}}{'random-init':>{CELL}}")
    for row in r.by_layer:
        lines.append(
            f"  {row['layer']:<8}"
            + _cell(row["pretrained"], row.get("pretrained_se"))
            + _cell(row["random_init"], row.get("random_init_se"))
        )
    return lines


def _shot_lines(r: ProbeResult) -> list[str]:
    if not r.shots:
        return []
    seeds = r.shots[0]["seeds"]
    names = [(n, title) for n, title in COLUMNS if n in r.shots[0]]
    width = 26
    lines = [
        "",
        f"accuracy with K labelled annotations per class drawn from each training fold, {seeds} "
        "draws per K:",
        "  mean ± std over the draws (the draws' mean standard error over annotations)",
        f"  {'K':<6}" + "".join(f"{t:>{width}}" for _, t in names),
    ]
    for entry in r.shots:
        cells = []
        for n, _ in names:
            m = entry[n]
            std = "-" if m["std"] is None else f"{m['std']:.4f}"
            se = "-" if m["se"] is None else f"{m['se']:.4f}"
            text = f"{m['mean']:.4f} ± {std} ({se})"
            cells.append(f"{text:>{width}}")
        lines.append(f"  {entry['k']:<6}" + "".join(cells))
    return lines

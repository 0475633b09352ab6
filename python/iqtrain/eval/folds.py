"""Grouped cross-validation and its scores (docs/design.md "Linear probe": folds,
scores, standard errors, the few-shot draws of --shots).

Folds group windows by annotation, so windows cut from one burst never sit on both sides of a
split (:class:`FoldPlan`); every accuracy comes with its standard error over annotations
(:func:`cluster_se`). Fold assignment and the few-shot draws use local generators: nothing here
draws from or reseeds torch's or numpy's global RNG. Errors name the option or config key the
caller passes (``key``), never a flag of their own. Offers :func:`cross_validate` (features,
labels and groups to a :class:`ProbeScore`), :func:`assign_folds`, :class:`FoldPlan` and
:func:`cluster_se`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from iqtrain.data.windows import LabelledSet, show_class
from iqtrain.errors import ConfigError
from iqtrain.eval.logistic import LogisticProbe, fit_logistic_many

__all__ = [
    "DEFAULT_SEEDS",
    "FoldPlan",
    "ProbeScore",
    "Shots",
    "assign_folds",
    "check_folds",
    "cluster_se",
    "cross_validate",
    "merge_shots",
    "score",
]

#: Few-shot draws per K when none is given (``probe.seeds``, ``iqtrain probe --seeds``).
DEFAULT_SEEDS = 5


@dataclass(frozen=True)
class Shots:
    """The few-shot request: ``ks`` (distinct K >= 1, ascending) and ``seeds`` draws per K
    (validated where they are given: ``[probe]``, the command's flags)."""

    ks: tuple[int, ...]
    seeds: int = DEFAULT_SEEDS

    @classmethod
    def of(cls, ks: Sequence[int], seeds: int = DEFAULT_SEEDS) -> Shots | None:
        """The request for ``ks`` (any order), or None without any K (few-shot off)."""
        return cls(tuple(sorted(ks)), seeds) if len(ks) else None


def check_folds(folds: Any, key: str = "folds") -> None:
    """A fold count is an integer >= 2 (ConfigError naming ``key``)."""
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 2:
        raise ConfigError(f"{key}: must be an integer >= 2, got {folds!r}")


def assign_folds(
    labels: np.ndarray, groups: np.ndarray, folds: int, seed: int, *, key: str = "folds"
) -> np.ndarray:
    """The fold of each window; every window of one group (annotation) shares a fold.

    Groups are dealt round-robin to folds, class by class, each class's groups in a seeded
    order (a local torch.Generator): folds get near-equal numbers of annotations and each class
    spreads over as many folds as it has annotations. Fewer groups than folds is a ConfigError
    naming ``key``. A group's class is the label of its first window.
    """
    check_folds(folds, key)
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

    def check_shots(self, shots: Sequence[int], key: str = "shots") -> None:
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
                name = show_class(self.classes[c])
                raise ConfigError(
                    f"{key}: K = {k} annotations per class, but class {name} has only {n} "
                    f"training annotations when its fold is held out "
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

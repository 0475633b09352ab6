"""``[probe]``: the linear probe of ``iqtrain probe``, run during training.

Every ``probe.every`` validations (and at the last), rank 0 probes the live model on the
labelled windows (``probe.data``, else the synthetic probe set or the validation recordings:
:func:`iqtrain.data.sources.probe_patterns`) and writes one ``probe`` record: the pretrained
accuracy and per-class accuracy with their standard errors over annotations, the random-init,
classical-feature and classical + pretrained baselines, chance, with ``probe.by`` the accuracies
per bin of that annotation field (``by``) and with ``probe.shots`` the few-shot accuracies
(``shots``), both as ``iqtrain probe --json`` writes them. The random-init and classical scores
(and their few-shot scores) are computed once: they do not change during training. The probe
only reads the model, in eval mode and under no_grad, and draws no number from the global
generators (its folds and few-shot draws use local generators, the random-init model is built
under ``fork_rng``), so the training stream, the RNG and therefore exact resume are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import EllipsisType
from typing import Any

import numpy as np
from torch import Tensor

from iqtrain.config.sections import DataConfig, ModelConfig, ProbeConfig
from iqtrain.data.dataset import ReadOptions
from iqtrain.data.sigmf import expand, read_recording
from iqtrain.data.sources import ensure_synthetic, probe_patterns
from iqtrain.data.windows import LabelledSet
from iqtrain.errors import DataError, NoLabelledWindowError
from iqtrain.eval.bins import accuracy_by, bin_windows
from iqtrain.eval.features import classical_matrix, combined_features, probe_features
from iqtrain.eval.folds import FoldPlan, ProbeScore, Shots, merge_shots
from iqtrain.eval.probe import note_probe_set, open_probe_set
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import random_init_model
from iqtrain.pretrained.recordings import check_rate

__all__ = ["TrainingProbe", "open_training_probe_set", "probe_due", "training_rate"]


def probe_due(every: int, validations: int, last: bool) -> bool:
    """Whether the validation just counted is followed by a probe (the same on every rank)."""
    return every > 0 and (validations % every == 0 or last)


def training_rate(d: DataConfig) -> float | None:
    """The sample rate the model trains at, as ``data.sample_rate`` has had the data checked
    (:func:`~iqtrain.data.sources.check_sample_rates`): the number itself, or with ``"same"``
    the rate of the first training recording that can be read (every one shares it; None: no
    rate recorded). Read before the attempt exists, after its data was opened."""
    if isinstance(d.sample_rate, float):
        return d.sample_rate
    train = ensure_synthetic(d.synthetic)[0] if d.is_synthetic else d.train
    for source in expand(train).sources:
        try:
            return read_recording(source, channel=d.channel)[0].sample_rate
        except DataError:  # read past (data.skip_invalid): the others have the rate
            continue
    return None


def _probe_source(probe: ProbeConfig, d: DataConfig) -> str:
    """Which setting gives the probe its data (:func:`~iqtrain.data.sources.probe_patterns`)."""
    if probe.data:
        return "probe.data"
    if d.is_synthetic and probe.synthetic_annotations:
        return "probe.synthetic_annotations"
    return "data.val"


def open_training_probe_set(
    probe: ProbeConfig, data: DataConfig, rate: float | None | EllipsisType = ...
) -> LabelledSet:
    """The in-training probe's labelled windows (:func:`~iqtrain.data.sources.probe_patterns`,
    labelled by ``probe.label_key``, read as ``[data]`` reads), refused in one line (exit 2)
    before the attempt exists: data that cannot be read, without a labelled window (the line
    names ``probe.every`` and how to turn the probe off), or at another sample rate than the
    training data's (``rate``: ``open_datasets(data).sample_rate``; ``...``: read here, by
    :func:`training_rate`), unless ``data.sample_rate = "any"``. Noted as ``run`` notes its
    data."""
    source = _probe_source(probe, data)
    where = source if probe.data else f"the probe's data ({source})"
    read = ReadOptions(data.channel, data.skip_invalid)
    try:
        labelled = open_probe_set(
            probe_patterns(probe, data),
            data.window,
            probe.label_key,
            read,
            where,
            "data.skip_invalid = true reads the others",
        )
    except NoLabelledWindowError as exc:
        empty = " (probe.data is empty)" if source == "data.val" else ""
        raise NoLabelledWindowError(
            f"probe.every = {probe.every}: the probe reads {source}{empty}: {exc}; point "
            "probe.data at labelled recordings or probe.label_key at the annotation field that "
            "holds their class, or set probe.every = 0 to train without the probe"
        ) from None
    if data.sample_rate != "any":
        check_rate(
            training_rate(data) if rate is ... else rate,
            labelled.dataset,
            where,
            "data.sample_rate is {rate}"
            if isinstance(data.sample_rate, float)
            else "the training data has {rate}",
            'data.sample_rate = "any" probes them anyway; probe.every = 0 turns the probe off',
            none_known=True,  # "same": training data without a rate has none
        )
    # data.val's reading was noted as data.val: only what the labels add is said again.
    note_probe_set(
        where, labelled, probe.label_key, "data.skip_invalid", read_notes=source != "data.val"
    )
    return labelled


class _Baselines:
    """What one training's probes share and compute once: the random-init and classical
    scores, the classical features (the combined score needs them at every probe) and the
    baselines' few-shot scores."""

    def __init__(self, probe: TrainingProbe):
        model = random_init_model(probe.model, probe.seed)
        self.random_init_features = probe_features(model, probe.labelled, probe.data)
        self.classical_features = classical_matrix(probe.labelled)
        self.random_init = probe.plan.score(self.random_init_features)
        self.classical = probe.plan.score(self.classical_features)
        self.shots = None
        if probe.shots is not None:
            features = {
                "random_init": self.random_init_features,
                "classical": self.classical_features,
            }
            self.shots = probe.plan.shots(features, probe.shots.ks, probe.shots.seeds)


class TrainingProbe:
    """Built before the attempt exists, so bad probe data (unreadable, unlabelled, at another
    sample rate than the training data's, ``sample_rate``: :func:`open_training_probe_set`),
    too few annotations for ``probe.folds`` or a ``probe.shots`` K larger than a class's
    training annotations is exit 2 naming the file or key."""

    def __init__(
        self,
        probe: ProbeConfig,
        data: DataConfig,
        model: ModelConfig,
        seed: int,
        sample_rate: float | None | EllipsisType = ...,
    ):
        self.every, self.folds, self.data, self.model, self.seed = (
            probe.every,
            probe.folds,
            data,
            model,
            seed,
        )
        self.labelled = open_training_probe_set(probe, data, sample_rate)
        self.plan = FoldPlan.of(self.labelled, probe.folds, seed, key="probe.folds")
        counts = np.bincount(self.labelled.labels, minlength=len(self.labelled.classes))
        self.chance = float(counts.max() / counts.sum())
        self.by = probe.by
        self._bins: tuple[list[float], np.ndarray, float | None] | None = None
        if probe.by:  # refused now (exit 2 naming probe.by or probe.bins), not mid-run
            names = ("probe.by", "probe.bins")
            self._bins = bin_windows(self.labelled, probe.by, probe.bins, names)
        self.shots = Shots.of(probe.shots, probe.seeds)  # [probe] has checked them
        self.plan.check_shots(self.shots.ks if self.shots else (), "probe.shots")
        self._baselines: _Baselines | None = None

    def record(self, model: IQTransformer | Mapping[str, Tensor], step: int) -> dict[str, Any]:
        """The ``probe`` record of ``model`` (a module, or a whole model's state dict) at
        ``step`` (without its ``time_s``)."""
        if isinstance(model, Mapping):
            weights = model
            model = random_init_model(self.model, self.seed)  # every weight is overwritten
            model.load_state_dict(weights, strict=True)
        if self._baselines is None:
            self._baselines = _Baselines(self)
        base = self._baselines
        features = probe_features(model, self.labelled, self.data)
        combined = combined_features(base.classical_features, features)
        scores = {
            "pretrained": self.plan.score(features),
            "random_init": base.random_init,
            "classical": base.classical,
            "combined": self.plan.score(combined),
        }
        record = self._fields(scores)
        record["step"] = step
        if self._bins is not None:
            plan = self.plan
            record["by"] = accuracy_by(self.by, *self._bins, plan.labels, plan.groups, scores)
        if self.shots is not None:
            mine = {"pretrained": features, "combined": combined}
            ks, seeds = self.shots.ks, self.shots.seeds
            record["shots"] = merge_shots(self.plan.shots(mine, ks, seeds), base.shots)
        return record

    def _fields(self, scores: dict[str, ProbeScore]) -> dict[str, Any]:
        pre, rand, classical, combined = (
            scores[k] for k in ("pretrained", "random_init", "classical", "combined")
        )
        return {
            "kind": "probe",
            "step": None,
            "accuracy": pre.accuracy,
            "accuracy_se": pre.accuracy_se,
            "random_init_accuracy": rand.accuracy,
            "random_init_accuracy_se": rand.accuracy_se,
            "classical_accuracy": classical.accuracy,
            "classical_accuracy_se": classical.accuracy_se,
            "combined_accuracy": combined.accuracy,
            "combined_accuracy_se": combined.accuracy_se,
            "chance": self.chance,
            "per_class": pre.per_class,
            "per_class_se": pre.per_class_se,
            "classical_per_class": classical.per_class,
            "classical_per_class_se": classical.per_class_se,
            "windows": len(self.labelled),
            "annotations": self.labelled.num_annotations,
            "folds": self.folds,
        }

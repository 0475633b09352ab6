"""``[probe]``: the linear probe of ``iqtrain probe``, run during training.

Every ``probe.every`` validations (and at the last), rank 0 probes the live model on the
labelled windows (``probe.data``, or the validation recordings) and writes one ``probe`` record:
the pretrained accuracy and per-class accuracy, the random-init and classical-feature baselines
(each computed once: they do not change during training), chance and, with ``probe.by``, the
accuracies per bin of that annotation field (``by``, as ``iqtrain probe --json`` writes it).
The probe only reads the model, in eval mode and under no_grad, and draws no number from the
global generators (its folds use a local generator, the random-init model is built under
``fork_rng``), so the training stream, the RNG and therefore exact resume are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import Tensor

from iqtrain.config.sections import DataConfig, ModelConfig, ProbeConfig
from iqtrain.data.sources import validation_patterns
from iqtrain.eval.probe import (
    ProbeScore,
    accuracy_by,
    assign_folds,
    bin_windows,
    classical_score,
    labelled_windows,
    probe_model,
    random_init_model,
)
from iqtrain.model.transformer import NextPatchModel

__all__ = ["TrainingProbe", "probe_due"]


def probe_due(every: int, validations: int, last: bool) -> bool:
    """Whether the validation just counted is followed by a probe (the same on every rank)."""
    return every > 0 and (validations % every == 0 or last)


class TrainingProbe:
    """Built before the attempt exists, so bad probe data or too few annotations for
    ``probe.folds`` is exit 2 naming the file or key."""

    def __init__(self, probe: ProbeConfig, data: DataConfig, model: ModelConfig, seed: int):
        self.every, self.folds, self.data, self.model, self.seed = (
            probe.every,
            probe.folds,
            data,
            model,
            seed,
        )
        self.labelled = labelled_windows(probe.data or validation_patterns(data), data.window)
        assign_folds(
            self.labelled.labels, self.labelled.groups, probe.folds, seed, key="probe.folds"
        )
        counts = np.bincount(self.labelled.labels, minlength=len(self.labelled.classes))
        self.chance = float(counts.max() / counts.sum())
        self.by = probe.by
        self._bins: tuple[list[float], np.ndarray] | None = None
        if probe.by:  # refused now (exit 2 naming probe.by or probe.bins), not mid-run
            names = ("probe.by", "probe.bins")
            self._bins = bin_windows(self.labelled, probe.by, probe.bins, names)
        self._random_init: ProbeScore | None = None
        self._classical: ProbeScore | None = None

    def record(self, model: NextPatchModel | Mapping[str, Tensor], step: int) -> dict[str, Any]:
        """The ``probe`` record of ``model`` (a module, or a whole model's state dict) at
        ``step`` (without its ``time_s``)."""
        if isinstance(model, Mapping):
            weights = model
            model = random_init_model(self.model, self.seed)  # every weight is overwritten
            model.load_state_dict(weights, strict=True)
        score = probe_model(model, self.labelled, self.data, self.folds, self.seed)
        if self._random_init is None or self._classical is None:
            baseline = random_init_model(self.model, self.seed)
            self._random_init = probe_model(
                baseline, self.labelled, self.data, self.folds, self.seed
            )
            self._classical = classical_score(self.labelled, self.folds, self.seed)
        record: dict[str, Any] = {
            "kind": "probe",
            "step": step,
            "accuracy": score.accuracy,
            "random_init_accuracy": self._random_init.accuracy,
            "classical_accuracy": self._classical.accuracy,
            "chance": self.chance,
            "per_class": score.per_class,
            "classical_per_class": self._classical.per_class,
            "windows": len(self.labelled),
            "annotations": self.labelled.num_annotations,
            "folds": self.folds,
        }
        if self._bins is not None:
            scores = {
                "pretrained": score,
                "random_init": self._random_init,
                "classical": self._classical,
            }
            record["by"] = accuracy_by(self.by, *self._bins, self.labelled.labels, scores)
        return record

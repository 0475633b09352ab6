"""Linear probe: how linearly decodable labels are from a frozen model's features
(docs/design.md "Linear probe").

:func:`run_probe` probes one checkpoint of an attempt: the labelled windows of
:func:`~iqtrain.data.windows.labelled_windows`, their features
(:mod:`iqtrain.eval.features`), a logistic classifier (:mod:`iqtrain.eval.logistic`) scored by
cross-validation with folds grouped by annotation (:mod:`iqtrain.eval.folds`), beside a
randomly initialised model of the same config and seed, the classical features, both feature
sets together and the majority-class rate; with ``by`` the accuracies per bin of an annotation
field (:mod:`iqtrain.eval.bins`), with ``shots`` the few-shot accuracies. Its table is
:mod:`iqtrain.eval.table`'s; the command and its flags are :mod:`iqtrain.cli.probe`'s, which
passes the flags' names (:class:`ProbeNames`) for the errors to name.

Nothing here draws from or reseeds torch's or numpy's global RNG (fold assignment and the
few-shot draws use local generators, the classifier starts from zeros, the random-init model is
built under ``fork_rng``), so a probe run inside training leaves the training stream and its
exact resume untouched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.config.schema import Config
from iqtrain.config.sections import DataConfig
from iqtrain.data.dataset import ReadOptions
from iqtrain.data.sources import probe_patterns
from iqtrain.data.windows import LabelledSet, labelled_windows
from iqtrain.errors import ConfigError, DataError, NoLabelledWindowError, RecordingsRefused
from iqtrain.eval.bins import DEFAULT_BIN_WIDTH, accuracy_by, bin_windows
from iqtrain.eval.features import (
    classical_matrix,
    combined_features,
    layer_features,
    probe_features,
)
from iqtrain.eval.folds import FoldPlan, ProbeScore, Shots, check_folds
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import Pretrained, load_pretrained, parse_layer, source_ref
from iqtrain.pretrained.recordings import (
    check_label_key,
    check_rate,
    report_blank,
    report_read,
    report_unused,
)

__all__ = [
    "OPTION_NAMES",
    "ProbeNames",
    "ProbeOptions",
    "ProbeResult",
    "classical_score",
    "note_probe_set",
    "open_probe_set",
    "probe_attempt",
    "probe_model",
    "run_probe",
]


@dataclass(frozen=True)
class ProbeNames:
    """What the caller calls each option of :func:`run_probe`, for the errors to name: by
    default the option's own name; ``iqtrain probe`` passes its flags."""

    from_: str = "from"
    folds: str = "folds"
    layer: str = "layer"
    by: str = "by"
    bins: str = "bins"
    shots: str = "shots"
    data: str = "patterns"
    label_key: str = "label_key"
    any_rate: str = "any_rate"
    skip_invalid: str = "skip_invalid"


#: The options' own names (:func:`run_probe` called as a library function).
OPTION_NAMES = ProbeNames()


def classical_score(labelled: LabelledSet, folds: int, seed: int) -> ProbeScore:
    """The classical AMC features (:mod:`iqtrain.eval.classical`) of the same windows, scored
    by the same grouped cross-validation (same folds, same classifier)."""
    return FoldPlan.of(labelled, folds, seed).score(classical_matrix(labelled))


def open_probe_set(
    patterns: str | Sequence[str],
    window: int,
    key: str,
    read: ReadOptions | None,
    where: str,
    skip: str,
) -> LabelledSet:
    """The labelled windows of ``patterns`` (``key``: the annotation field, or path, of the
    class), every refusal said of data list ``where``: recordings that cannot be read (with
    ``skip``, what reads the others), labels or classes that do not do. No labelled window at
    all is the caller's to say (:class:`~iqtrain.errors.NoLabelledWindowError`: it knows what
    needs the labels)."""
    try:
        return labelled_windows(patterns, window, key=key, read=read)
    except RecordingsRefused as exc:
        raise exc.context(where, skip) from None
    except NoLabelledWindowError:
        raise
    except DataError as exc:
        raise type(exc)(f"{where}: {exc}") from None


def note_probe_set(
    where: str, labelled: LabelledSet, key: str, skip: str, *, read_notes: bool = True
) -> None:
    """The notes on a probe set, as ``run`` gives them of its data: what the reader tolerated,
    the inputs read past (``skip``) and the recordings that yield no window (all three
    unless ``read_notes`` is False: said already), the recordings without a window inside an
    annotation labelled by ``key`` and the labels read as blank."""
    ds, window = labelled.dataset, labelled.dataset.window_len
    if read_notes:
        report_read(where, ds, window, skip)
    report_unused(where, ds, labelled.recordings, window, f"inside an annotation with a {key}")
    report_blank(where, labelled.blank)


def probe_model(
    model: IQTransformer, labelled: LabelledSet, data: DataConfig, folds: int, seed: int
) -> ProbeScore:
    """Features of ``model`` on ``labelled``, scored by grouped cross-validation: the part a
    training run can call (it needs no attempt and touches no global RNG)."""
    return FoldPlan.of(labelled, folds, seed).score(probe_features(model, labelled, data))


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


def _checked_options(
    folds: int, by: str | None, bins: float | list[float] | None, names: ProbeNames
) -> float | list[float] | None:
    """The fold count, and the bins (only with ``by``), refused before any work."""
    check_folds(folds, names.folds)
    if bins is not None and by is None:
        raise ConfigError(f"{names.bins}: needs {names.by} KEY (the annotation field to bin)")
    if by is None:
        return None
    return DEFAULT_BIN_WIDTH if bins is None else bins


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


@dataclass(frozen=True)
class ProbeOptions:
    """What :func:`probe_attempt` is asked (each option as :func:`run_probe` describes it), and
    what the caller calls each option (``names``), for the errors to name."""

    from_: str = "latest"
    folds: int = 5
    by: str | None = None
    bins: float | list[float] | None = None
    layer: str | int | None = None
    shots: Shots | None = None
    names: ProbeNames = OPTION_NAMES
    label_key: str | None = None  # None: the attempt's probe.label_key
    read: ReadOptions | None = None  # a channel of None: the attempt's data.channel
    any_rate: bool = False


def run_probe(
    attempt: str | os.PathLike,
    patterns: str | Sequence[str] | None,
    from_: str = "latest",
    folds: int = 5,
    **options: Any,
) -> ProbeResult:
    """Probe checkpoint ``from_`` of ``attempt`` on the labelled windows of ``patterns``,
    beside a random-init model, the classical features, both feature sets together and chance.

    ``patterns`` None: the attempt's probe set (:func:`~iqtrain.data.sources.probe_patterns`).
    The other options, by keyword (:class:`ProbeOptions`' fields):

    - ``by``: an annotation field (``iqtrain:snr_db``); accuracies per bin of it (``bins``: a
      width, default :data:`~iqtrain.eval.bins.DEFAULT_BIN_WIDTH`, or the edges, increasing);
    - ``layer``: :func:`~iqtrain.pretrained.load.parse_layer`;
    - ``shots``: the few-shot accuracies (:meth:`FoldPlan.shots`);
    - ``label_key``: the annotation field (or path, ``signal:detail.mod_class``) of the class;
      None: the attempt's ``probe.label_key``;
    - ``read``: how the recordings are read (a :class:`~iqtrain.data.dataset.ReadOptions`:
      channel, skip_invalid; a channel of None: the attempt's ``data.channel``);
    - ``any_rate``: read recordings at another sample rate than the model was trained at (or
      with none, when it was trained at one), refused (a DataError) without it.

    Errors a user can cause (a bad fold count, checkpoint name, layer, field, bins or K,
    attempt, checkpoint or data) raise ConfigError, CheckpointError or DataError with one line
    naming what is wrong (an option by its name here), before any feature is computed.
    """
    return probe_attempt(attempt, patterns, ProbeOptions(from_, folds, **options))


def _probe_set(
    pre: Pretrained, patterns: str | Sequence[str] | None, o: ProbeOptions
) -> LabelledSet:
    """The labelled windows ``o`` asks for (``patterns``; none: the attempt's probe set),
    refused in one line naming the data list, its sample rates checked against the model's,
    noted as they were read."""
    config, names = pre.config, o.names
    key = config.probe.label_key if o.label_key is None else o.label_key
    check_label_key(key, names.label_key)
    read = o.read or ReadOptions()
    channel = config.data.channel if read.channel is None else read.channel
    read = ReadOptions(channel, read.skip_invalid)
    where = names.data
    if not patterns:  # the attempt's probe set (probe.data, synthetic probe set, or val)
        patterns = probe_patterns(config.probe, config.data)
        where = f"the attempt's probe set ({_probe_source(config)})"
        # Read as training read it: what training read past, this reads past too.
        read = ReadOptions(channel, read.skip_invalid or config.data.skip_invalid)
    skip = f"{names.skip_invalid} reads the others"
    try:
        labelled = open_probe_set(patterns, config.data.window, key, read, where, skip)
    except NoLabelledWindowError as exc:
        raise NoLabelledWindowError(
            f"{where}: {exc}: nothing to probe ({names.data} names labelled recordings, "
            f"{names.label_key} the annotation field that holds their class)"
        ) from None
    if not o.any_rate:
        hint = f"{names.any_rate} reads them anyway"
        check_rate(
            pre.sample_rate, labelled.dataset, where, "the model was trained at {rate}", hint
        )
    note_probe_set(where, labelled, key, names.skip_invalid)
    return labelled


def _probe_source(config: Config) -> str:
    """Where an attempt's probe set comes from (:func:`~iqtrain.data.sources.probe_patterns`),
    as a config key."""
    if config.probe.data:
        return "probe.data"
    if config.data.is_synthetic and config.probe.synthetic_annotations:
        return "probe.synthetic_annotations"
    return "data.val"


def probe_attempt(
    attempt: str | os.PathLike, patterns: str | Sequence[str] | None, options: ProbeOptions
) -> ProbeResult:
    """:func:`run_probe` with its options in ``options``, each error naming an option as
    ``options.names`` does (``iqtrain probe``: by its flag)."""
    o = options
    from_, folds, by, bins, layer, shots, names = (
        o.from_,
        o.folds,
        o.by,
        o.bins,
        o.layer,
        o.shots,
        o.names,
    )
    spec = _checked_options(folds, by, bins, names)
    source_ref(attempt, from_, names.from_, ConfigError)  # a bad checkpoint name, named as such
    pre = load_pretrained(attempt, which=from_, precision="fp32")
    config = pre.config
    chosen = parse_layer(layer, config.model.layers, names.layer, ConfigError)
    labelled = _probe_set(pre, patterns, o)
    plan = FoldPlan.of(labelled, folds, config.run.seed, key=names.folds)  # refuse early
    binned = None
    if by is not None and spec is not None:
        binned = bin_windows(labelled, by, spec, (names.by, names.bins))
    plan.check_shots(shots.ks if shots else (), names.shots)
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

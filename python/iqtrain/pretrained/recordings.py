"""A pretrained model over SigMF recordings: what ``iqtrain embed``, ``iqtrain score`` and
``iqtrain predict`` do (docs/design.md "A trained model as a product").

Rows are windows or annotations of the recordings (:mod:`iqtrain.data.windows`):

- ``per="window"`` (and ``score --per recording``, which averages them per recording): every
  window of each capture segment on a grid of one window from its start, labelled where a
  labelled annotation holds it whole (-1 elsewhere);
- ``per="annotation"``: the windows inside each labelled annotation, on a grid anchored at its
  start (the probe's windows), mean-pooled (embed) or averaged (score) per annotation;
  ``predict --per annotation`` reads every annotation, labelled or not, and averages its
  windows' log-probabilities.

Embeddings are written as one safetensors file (:func:`write_embeddings`) through a temporary
name and a rename: an existing file is refused unless ``force``.
"""

from __future__ import annotations

import json
import math
import os
import struct
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import numpy as np

from iqtrain.console import note
from iqtrain.data.dataset import IQDataset, ReadOptions, shown_path
from iqtrain.data.sources import format_rate, report_dataset
from iqtrain.data.windows import (
    FEATURE_BATCH,
    ClassRule,
    LabelledSet,
    WindowGrid,
    grid_windows,
    labelled_windows,
)
from iqtrain.errors import (
    ConfigError,
    DataError,
    NoLabelledWindowError,
    RecordingsRefused,
    WindowTooLongError,
)
from iqtrain.pretrained.load import Pretrained, nonfinite_rows, parse_layer
from iqtrain.storage import check_output_file, write_bytes_atomic

__all__ = [
    "EMBED_PER",
    "EmbedPer",
    "FORMAT",
    "PREDICT_PER",
    "PredictPer",
    "SCORE_PER",
    "ScorePer",
    "Embeddings",
    "PredictRow",
    "Prediction",
    "Scores",
    "ScoreRow",
    "ScoreTable",
    "accuracy_scores",
    "check_label_key",
    "check_output",
    "check_rate",
    "embed_recordings",
    "mean_log_probs",
    "predict_recordings",
    "predicted",
    "report_blank",
    "report_read",
    "report_unused",
    "score_recordings",
    "unit_of",
    "write_embeddings",
]

#: What one row of ``embed``, ``score`` and ``predict`` is (each command's ``--per``).
EmbedPer = Literal["window", "annotation"]
EMBED_PER: tuple[EmbedPer, ...] = get_args(EmbedPer)
ScorePer = Literal["recording", "annotation", "window"]
SCORE_PER: tuple[ScorePer, ...] = get_args(ScorePer)
#: The safetensors metadata ``format`` of an embeddings file.
FORMAT = "iqtrain-embeddings-1"
#: Seconds between progress notes on long work.
PROGRESS_EVERY_S = 10.0
#: How embed, score and predict name their data list, and what reads past what they refuse.
DATA = "--data"
SKIP_HINT = "--skip-invalid reads the others"
ANY_RATE_HINT = "--any-rate reads them anyway"

_T = TypeVar("_T")


def _same_rate(a: float | None, b: float | None) -> bool:
    """The same sample rate within one part in 10**9 (as ``Pretrained`` warns), or both none."""
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9)


def check_rate(
    rate: float | None,
    ds: IQDataset,
    where: str,
    against: str,
    hint: str,
    *,
    none_known: bool = False,
) -> None:
    """A DataError, one line, when a recording of ``ds`` has another sample rate than ``rate``:
    ``where`` names the data list, ``against`` says whose rate ``rate`` is (``the model was
    trained at {rate}``), ``hint`` what reads them anyway. ``rate`` None: not known, nothing
    to compare (the recordings pass), unless ``none_known``: then it is known that there is
    none, and a recording with one is another rate."""
    if rate is None and not none_known:
        return
    wrong: dict[float | None, list[Path]] = {}
    for rec in ds.recordings:
        if not _same_rate(rec.sample_rate, rate):
            wrong.setdefault(rec.sample_rate, []).append(rec.meta_path)
    if not wrong:
        return
    listed = ", ".join(
        f"{len(p)} recording(s) have {format_rate(r)} (e.g. {shown_path(p[0])})"
        for r, p in sorted(wrong.items(), key=lambda kv: -len(kv[1]))
    )
    raise DataError(
        f"{where}: {against.format(rate=format_rate(rate))}, but {listed}; a model sees "
        f"samples, not seconds ({hint})"
    )


def check_label_key(key: str | None, name: str = "--label-key") -> None:
    """A ConfigError naming ``name`` for an empty label key (None: the default, fine)."""
    if key is not None and not key.strip():
        raise ConfigError(f"{name}: must not be empty (a field, or a path: signal:detail.class)")


def report_read(where: str, ds: IQDataset, window: int, skip: str = "--skip-invalid") -> None:
    """The notes on data list ``where`` as ``run`` gives them
    (:func:`iqtrain.data.sources.report_dataset`; ``skip`` names the flag that reads past)."""
    report_dataset(where, ds, window, skip)


def report_unused(where: str, ds: IQDataset, used: np.ndarray, window: int, inside: str) -> None:
    """A note naming the recordings of ``ds`` that hold windows, but none that a row reads
    (``used``: the recording index of every window read), e.g. none inside an annotation with
    a label (``inside``: where the windows are cut); those without any window are
    :func:`report_read`'s."""
    short = {p for p, _ in ds.skipped}
    seen = set(np.unique(used).tolist())
    names = [
        shown_path(r.meta_path)
        for i, r in enumerate(ds.recordings)
        if i not in seen and os.fspath(r.meta_path) not in short
    ]
    if names:
        shown = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        note(
            f"{where}: {len(names)} recording(s) yield no window of {window} samples {inside}, "
            f"skipped: {shown}"
        )


def report_blank(where: str, blank: str | None) -> None:
    """The note on labels read as blank (``LabelledSet.blank``, ``WindowGrid.blank``), if any."""
    if blank:
        note(f"{where}: {blank}")


def _opened(open_: Callable[[], _T]) -> _T:
    """``open_()``, its refusal of recordings said of ``--data`` (with what reads the rest),
    of too short recordings and of unlabelled ones too."""
    try:
        return open_()
    except RecordingsRefused as exc:
        raise exc.context(DATA, SKIP_HINT) from None
    except WindowTooLongError as exc:
        raise WindowTooLongError(f"{DATA}: {exc}") from None
    except NoLabelledWindowError as exc:
        raise NoLabelledWindowError(
            f"{DATA}: {exc}; --label-key names the field that holds the class (--per window "
            "needs no label)"
        ) from None


def _checked(pre: Pretrained, ds: IQDataset, any_rate: bool, blank: str | None = None) -> None:
    """What embed, score and predict check and say of the data before the model reads it: the
    sample rates against the model's (unless ``any_rate``), then the reader's notes and the
    labels read as blank."""
    if not any_rate:
        check_rate(pre.sample_rate, ds, DATA, "the model was trained at {rate}", ANY_RATE_HINT)
    report_read(DATA, ds, pre.window)
    report_blank(DATA, blank)


def _labelled(
    pre: Pretrained, patterns: Sequence[str], key: str, read: ReadOptions | None, any_rate: bool
) -> LabelledSet:
    """The windows of every annotation labelled by ``key`` (one class is enough), checked and
    noted; a recording without one is named."""
    ls = _opened(lambda: labelled_windows(patterns, pre.window, min_classes=1, key=key, read=read))
    _checked(pre, ls.dataset, any_rate, ls.blank)
    report_unused(DATA, ls.dataset, ls.recordings, pre.window, f"inside an annotation with a {key}")
    return ls


def _grid(
    pre: Pretrained, patterns: Sequence[str], key: str, read: ReadOptions | None, any_rate: bool
) -> WindowGrid:
    """Every window on a grid of one window (labelled by ``key``), checked and noted."""
    grid = _opened(lambda: grid_windows(patterns, pre.window, key=key, read=read))
    _checked(pre, grid.dataset, any_rate, grid.blank)
    return grid


def _progress(batches: Iterable[np.ndarray], total: int, what: str) -> Iterator[np.ndarray]:
    """``batches`` as they are, with a note every :data:`PROGRESS_EVERY_S` seconds."""
    done, last = 0, time.monotonic()
    for raw in batches:
        yield raw
        done += len(raw)
        if time.monotonic() - last >= PROGRESS_EVERY_S and done < total:
            last = time.monotonic()
            note(f"{what}: {done}/{total} windows")


def _check_rows(bad: np.ndarray, recordings: Sequence[Path], rec: np.ndarray, start: np.ndarray):
    if bad.size:
        i = int(bad[0])
        raise DataError(
            f"{recordings[int(rec[i])]}: the window at sample {int(start[i])} gives non-finite "
            f"output ({bad.size} window(s) in all; non-finite samples in the recording?)"
        )


@dataclass(frozen=True)
class Embeddings:
    """One row per window or annotation: ``embeddings [n, dim]`` float32, ``recording``
    (index into ``recordings``), ``start`` (first sample of the window or annotation),
    ``windows`` (windows pooled into the row), ``label`` (index into ``classes``, -1 none;
    None when the data has no labelled annotation)."""

    embeddings: np.ndarray
    recording: np.ndarray
    start: np.ndarray
    windows: np.ndarray
    label: np.ndarray | None
    classes: tuple[str, ...]
    recordings: tuple[Path, ...]
    meta: dict[str, str] = field(default_factory=dict)


def _source_meta(pre: Pretrained, per: str, layer: int) -> dict[str, str]:
    return {
        "attempt": os.fspath(pre.attempt),
        "checkpoint": pre.checkpoint.name,
        "step": str(pre.step),
        "model_sha256": pre.model_sha256,
        "layer": str(layer),
        "per": per,
        "window": str(pre.window),
    }


def _group_mean(values: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """Mean of ``values`` rows per group (``groups`` numbered 0..count-1), in float64 (NaN for
    a group without a row: a recording too short for a window)."""
    sums = np.zeros((count, *values.shape[1:]), dtype=np.float64)
    np.add.at(sums, groups, values.astype(np.float64))
    n = np.bincount(groups, minlength=count).astype(np.float64)
    n = n.reshape(-1, *([1] * (values.ndim - 1)))
    return np.divide(sums, n, out=np.full_like(sums, np.nan), where=n > 0)


def embed_recordings(
    pre: Pretrained,
    patterns: Sequence[str],
    *,
    per: EmbedPer = "window",
    layer: Any = None,
    key: str = "core:label",
    read: ReadOptions | None = None,
    any_rate: bool = False,
) -> Embeddings:
    """Embeddings of ``patterns`` (mean-pooled over patches; ``layer`` as ``--layer``), read
    with ``read`` (channel, skip_invalid), labelled by annotation field ``key`` (a path
    too: :class:`~iqtrain.data.windows.ClassRule`).

    ``per="annotation"`` needs labelled annotations (a DataError naming the data otherwise).
    Recordings at another sample rate than the model's (unless ``any_rate``) are a DataError
    before the model reads them. A row with non-finite features is a DataError naming its
    recording and sample."""
    if per not in EMBED_PER:
        raise ConfigError(f"--per: expected one of {', '.join(EMBED_PER)}, got {per!r}")
    check_label_key(key)
    k = parse_layer(layer, pre.config.model.layers, name="--layer", error=ConfigError)
    if k == "all":
        raise ConfigError("--layer: embed writes one layer (an integer), not 'all'")
    layer_n = int(k)
    if per == "annotation":
        ls = _labelled(pre, patterns, key, read, any_rate)
        rows = _progress(ls.batches(FEATURE_BATCH), len(ls), "embed")
        feats = pre.features(rows, [layer_n])[layer_n].numpy()
        recs = tuple(r.meta_path for r in ls.dataset.recordings)
        _check_rows(nonfinite_rows(feats), recs, ls.recordings, ls.starts)
        groups = ls.groups
        count = int(groups.max()) + 1
        first = np.unique(groups, return_index=True)[1]
        return Embeddings(
            embeddings=_group_mean(feats, groups, count).astype(np.float32),
            recording=ls.recordings[first],
            start=np.array([ls.group_start(g) for g in range(count)], dtype=np.int64),
            windows=np.bincount(groups, minlength=count).astype(np.int64),
            label=ls.labels[first],
            classes=ls.classes,
            recordings=recs,
            meta=_source_meta(pre, per, layer_n),
        )
    grid = _grid(pre, patterns, key, read, any_rate)
    rows = _progress(grid.batches(FEATURE_BATCH), len(grid), "embed")
    feats = pre.features(rows, [layer_n])[layer_n].numpy()
    recs = tuple(r.meta_path for r in grid.dataset.recordings)
    _check_rows(nonfinite_rows(feats), recs, grid.recordings, grid.starts)
    return Embeddings(
        embeddings=feats.astype(np.float32),
        recording=grid.recordings,
        start=grid.starts,
        windows=np.ones(len(grid), dtype=np.int64),
        label=grid.labels if grid.classes else None,
        classes=grid.classes,
        recordings=recs,
        meta=_source_meta(pre, per, layer_n),
    )


# --------------------------------------------------------------------------- writing


def check_output(path: Path, force: bool) -> None:
    """``--out`` refused before any work (:func:`iqtrain.storage.check_output_file`)."""
    check_output_file(path, force, "--out", "embed")


def write_embeddings(path: Path, emb: Embeddings) -> None:
    """One safetensors file: ``embeddings`` float32 ``[n, dim]``, ``recording``, ``start``,
    ``windows`` and (labelled data) ``label`` int64 ``[n]``; metadata: ``format``, ``classes``
    and ``recordings`` (JSON lists: names by index) and the source's ``attempt``,
    ``checkpoint``, ``step``, ``model_sha256``, ``layer``, ``per``, ``window``. Written to a
    temporary sibling, fsynced and renamed (StorageError naming the file)."""
    from safetensors.numpy import save

    tensors: dict[str, np.ndarray] = {
        "embeddings": np.ascontiguousarray(emb.embeddings, dtype=np.float32),
        "recording": np.ascontiguousarray(emb.recording, dtype=np.int64),
        "start": np.ascontiguousarray(emb.start, dtype=np.int64),
        "windows": np.ascontiguousarray(emb.windows, dtype=np.int64),
    }
    if emb.label is not None:
        tensors["label"] = np.ascontiguousarray(emb.label, dtype=np.int64)
    meta = {
        "format": FORMAT,
        "classes": json.dumps(list(emb.classes)),
        "recordings": json.dumps([os.fspath(p) for p in emb.recordings]),
        **emb.meta,
    }
    write_bytes_atomic(path, sorted_metadata(save(tensors, metadata=meta)))


def sorted_metadata(data: bytes) -> bytes:
    """Safetensors bytes with the header's ``__metadata__`` in sorted key order (safetensors
    writes it in a hash map's order, which changes between processes): the same tensors and
    metadata give the same bytes. The header keeps its length (the same characters, padded
    with spaces as safetensors pads it)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    if "__metadata__" in header:
        rest = {k: v for k, v in header.items() if k != "__metadata__"}
        header = {"__metadata__": dict(sorted(header["__metadata__"].items())), **rest}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(text) <= n, "a re-ordered header is no longer than the original"
    return data[:8] + text.ljust(n) + data[8 + n :]


# --------------------------------------------------------------------------- scores


@dataclass(frozen=True)
class ScoreRow:
    """One scored row: the mean window score of a recording, annotation or window."""

    score: float
    recording: Path
    start: int  # the window's, the annotation's first sample; 0 for a recording
    windows: int
    label: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "recording": os.fspath(self.recording),
            "start": self.start,
            "windows": self.windows,
            "label": self.label,
        }


@dataclass(frozen=True)
class ScoreTable:
    """``score_recordings``' rows, highest first, and ``given``: what they are rows of
    (``per="recording"``: every recording read, those too short for a window included; else
    the rows themselves)."""

    rows: list[ScoreRow]
    given: int


def score_recordings(
    pre: Pretrained,
    patterns: Sequence[str],
    *,
    per: ScorePer,
    key: str = "core:label",
    read: ReadOptions | None = None,
    any_rate: bool = False,
) -> ScoreTable:
    """Every row's score (the mean of its windows' :meth:`Pretrained.score`), highest first
    (ties in data order); labels by annotation field ``key``, recordings read with ``read``.
    Recordings at another sample rate than the model's (unless ``any_rate``) and a window
    that cannot be scored (non-finite samples) are DataErrors naming them."""
    if per not in SCORE_PER:
        raise ConfigError(f"--per: expected one of {', '.join(SCORE_PER)}, got {per!r}")
    check_label_key(key)
    if per == "annotation":
        ls = _labelled(pre, patterns, key, read, any_rate)
        recs = tuple(r.meta_path for r in ls.dataset.recordings)
        scores = pre.losses(_progress(ls.batches(FEATURE_BATCH), len(ls), "score"))
        _check_rows(nonfinite_rows(scores), recs, ls.recordings, ls.starts)
        count = int(ls.groups.max()) + 1
        mean = _group_mean(scores, ls.groups, count)
        first = np.unique(ls.groups, return_index=True)[1]
        sizes = np.bincount(ls.groups, minlength=count)
        rows = [
            ScoreRow(
                float(mean[g]),
                recs[int(ls.recordings[first[g]])],
                ls.group_start(g),
                int(sizes[g]),
                ls.classes[int(ls.labels[first[g]])],
            )
            for g in range(count)
        ]
    else:
        grid = _grid(pre, patterns, key, read, any_rate)
        recs = tuple(r.meta_path for r in grid.dataset.recordings)
        scores = pre.losses(_progress(grid.batches(FEATURE_BATCH), len(grid), "score"))
        _check_rows(nonfinite_rows(scores), recs, grid.recordings, grid.starts)
        rows = _grid_rows(grid, scores, recs, per)
    given = len(recs) if per == "recording" else len(rows)
    return ScoreTable(sorted(rows, key=lambda r: -r.score), given)


def _grid_rows(
    grid: Any, scores: np.ndarray, recs: Sequence[Path], per: ScorePer
) -> list[ScoreRow]:
    if per == "window":
        return [
            ScoreRow(
                float(s),
                recs[int(r)],
                int(st),
                1,
                grid.classes[int(lab)] if lab >= 0 else None,
            )
            for s, r, st, lab in zip(scores, grid.recordings, grid.starts, grid.labels, strict=True)
        ]
    count = len(recs)
    mean = _group_mean(scores, grid.recordings, count)
    sizes = np.bincount(grid.recordings, minlength=count)
    # A recording without a window (too short: noted as it was read) has no score: no row.
    return [ScoreRow(float(mean[r]), recs[r], 0, int(sizes[r])) for r in range(count) if sizes[r]]


def unit_of(pre: Pretrained) -> str:
    """What a score counts, in the units validation records."""
    return pre.objective.loss_unit


# --------------------------------------------------------------------------- predictions

PredictPer = Literal["annotation", "window"]
PREDICT_PER: tuple[PredictPer, ...] = get_args(PredictPer)


@dataclass(frozen=True)
class PredictRow:
    """One predicted row: an annotation (its windows' mean log-probabilities) or a window.

    ``predicted`` (a class of the model), ``probability`` (the softmax of the row's log-prob
    vector at ``predicted``), ``label`` (the row's ``data.label_key`` value; None when it has
    none; it may be a class the model does not know)."""

    recording: Path
    start: int  # the annotation's core:sample_start, or the window's first sample
    windows: int
    predicted: str
    probability: float
    label: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "recording": os.fspath(self.recording),
            "start": self.start,
            "windows": self.windows,
            "predicted": self.predicted,
            "probability": self.probability,
            "label": self.label,
        }


@dataclass(frozen=True)
class Scores:
    """Accuracy of predictions against known labels (indices into ``classes``): ``accuracy``
    (None without a known label), ``class_accuracy`` (per class, None for a class no row has),
    ``confusion`` ``[C][C]`` (rows the true class, columns the predicted, ``classes`` order)
    and ``labelled`` (the rows counted)."""

    labelled: int
    accuracy: float | None
    class_accuracy: dict[str, float | None]
    confusion: list[list[int]]


@dataclass(frozen=True)
class Prediction:
    """What ``iqtrain predict`` reports: ``rows`` in data order, ``classes`` (the model's, in
    the order of its outputs), ``scores`` over the rows whose label is one of ``classes``
    (``unknown``: how many rows carry each label the model does not know; not scored), and
    with ``per="annotation"`` ``window_scores`` (each window's own prediction against its
    annotation's label: the validation record's accuracy, for its recordings and windows)."""

    per: PredictPer
    classes: tuple[str, ...]
    rows: list[PredictRow]
    scores: Scores
    unknown: dict[str, int]
    window_scores: Scores | None = None
    label_key: str = "core:label"

    def to_dict(self) -> dict[str, Any]:
        s = self.scores
        out: dict[str, Any] = {
            "per": self.per,
            "label_key": self.label_key,
            "classes": list(self.classes),
            "rows": [r.to_dict() for r in self.rows],
            "labelled": s.labelled,
            "accuracy": s.accuracy,
            "class_accuracy": s.class_accuracy,
            "confusion": s.confusion,
            "unknown_labels": dict(self.unknown),
        }
        if self.window_scores is not None:
            out["windows"] = self.window_scores.labelled
            out["window_accuracy"] = self.window_scores.accuracy
            out["window_class_accuracy"] = self.window_scores.class_accuracy
        return out


def mean_log_probs(log_probs: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """``[count, classes]`` float64: the mean of each group's rows of ``log_probs``."""
    return _group_mean(np.asarray(log_probs, dtype=np.float64), groups, count)


def predicted(log_probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``log_probs`` ``[n, classes]`` (log-probabilities, or a mean of them): the
    class maximising it (the first on a tie) and its probability under the softmax of the row
    (for a row of true log-probabilities, exp of its maximum)."""
    lp = np.asarray(log_probs, dtype=np.float64)
    if not len(lp):
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    k = lp.argmax(axis=1)
    top = lp[np.arange(len(lp)), k]
    return k.astype(np.int64), 1.0 / np.exp(lp - top[:, None]).sum(axis=1)


def accuracy_scores(truth: np.ndarray, guess: np.ndarray, classes: Sequence[str]) -> Scores:
    """:class:`Scores` of predictions ``guess`` against ``truth`` (class indices; a negative
    truth is not scored)."""
    truth = np.asarray(truth, dtype=np.int64)
    guess = np.asarray(guess, dtype=np.int64)
    known = truth >= 0
    c = len(classes)
    confusion = np.zeros((c, c), dtype=np.int64)
    np.add.at(confusion, (truth[known], guess[known]), 1)
    per = confusion.sum(axis=1)
    n = int(known.sum())
    return Scores(
        labelled=n,
        accuracy=float(np.trace(confusion) / n) if n else None,
        class_accuracy={
            name: (float(confusion[k, k] / per[k]) if per[k] else None)
            for k, name in enumerate(classes)
        },
        confusion=confusion.tolist(),
    )


def _number(labels: Sequence[str | None], classes: Sequence[str]) -> tuple[np.ndarray, dict]:
    """Labels as indices into ``classes`` (-1: none, or one the model does not know), and the
    count of each unknown label."""
    index = {c: i for i, c in enumerate(classes)}
    unknown: dict[str, int] = {}
    out = np.full(len(labels), -1, dtype=np.int64)
    for i, lab in enumerate(labels):
        if lab is None:
            continue
        if lab in index:
            out[i] = index[lab]
        else:
            unknown[lab] = unknown.get(lab, 0) + 1
    return out, dict(sorted(unknown.items()))


def predict_recordings(
    pre: Pretrained,
    patterns: Sequence[str],
    *,
    per: PredictPer = "annotation",
    stride: int | None = None,
    key: str | None = None,
    read: ReadOptions | None = None,
    any_rate: bool = False,
) -> Prediction:
    """A fine-tuned model's predictions over ``patterns`` (docs/design.md "A trained model as a
    product"), read with
    ``read`` (channel, skip_invalid).

    ``per="annotation"``: every SigMF annotation holding at least one whole window, labelled or
    not, its windows on a grid of ``stride`` samples (default: one window; the run's
    ``data.stride`` gives its validation windows) from its first sample; the
    prediction is the class maximising the mean of its windows' log-probabilities, and its
    probability the softmax of that mean vector at that class. ``per="window"``: every window
    on a grid of one window from each capture segment's start (:func:`grid_windows`), each
    with the class of highest log-probability and exp of it. A row's label is the value of
    annotation field ``key`` (default ``data.label_key``: the field the model was trained on;
    a path too) of its annotation, or, for a window, of the first annotation carrying the key
    that holds it whole. Accuracy, per-class accuracy and the confusion matrix count the rows
    whose label is one of the model's classes.

    Labels follow :class:`~iqtrain.data.windows.ClassRule` (a value that is no class name is a
    DataError naming its annotation); a label the model does not know is predicted but not
    scored. A pretraining model is a ConfigError naming the attempt; recordings at another
    sample rate than the model's (unless ``any_rate``), no annotation holding a window
    (``per="annotation"``) and a window with non-finite output are DataErrors naming the data.
    """
    if per not in PREDICT_PER:
        raise ConfigError(f"--per: expected one of {', '.join(PREDICT_PER)}, got {per!r}")
    check_label_key(key)
    pre.objective.require("predict", pre.attempt)
    assert pre.classes is not None  # a model that predicts has classes
    classes = tuple(pre.classes)
    key = pre.config.data.label_key if key is None else key
    if per == "annotation":
        return _predict_annotations(pre, patterns, classes, key, stride, read, any_rate)
    grid = _grid(pre, patterns, key, read, any_rate)
    recs = tuple(r.meta_path for r in grid.dataset.recordings)
    lp = pre.log_probs(_progress(grid.batches(FEATURE_BATCH), len(grid), "predict"))
    _check_rows(nonfinite_rows(lp), recs, grid.recordings, grid.starts)
    guess, prob = predicted(lp)
    labels = [grid.classes[k] if k >= 0 else None for k in grid.labels.tolist()]
    truth, unknown = _number(labels, classes)
    rows = [
        PredictRow(recs[int(r)], int(s), 1, classes[int(k)], float(p), lab)
        for r, s, k, p, lab in zip(grid.recordings, grid.starts, guess, prob, labels, strict=True)
    ]
    return Prediction(
        per, classes, rows, accuracy_scores(truth, guess, classes), unknown, label_key=key
    )


def _predict_annotations(
    pre: Pretrained,
    patterns: Sequence[str],
    classes: tuple[str, ...],
    key: str,
    stride: int | None,
    read: ReadOptions | None,
    any_rate: bool,
) -> Prediction:
    try:
        ls = _opened(
            lambda: labelled_windows(
                patterns, pre.window, min_classes=1, key=None, stride=stride, read=read
            )
        )
    except NoLabelledWindowError:
        where = ", ".join(map(os.fspath, [patterns] if isinstance(patterns, str) else patterns))
        raise DataError(
            f"{DATA}: {where}: no annotation holds a whole window of {pre.window} samples "
            "(data.seq_patches * data.patch_len): nothing to predict per annotation "
            "(--per window predicts every window)"
        ) from None
    count = int(ls.groups.max()) + 1
    rule = ClassRule(key)
    labels = [rule.of(ls.group_fields[g], ls.group_where[g]) for g in range(count)]
    _checked(pre, ls.dataset, any_rate, rule.note_blank())
    report_unused(DATA, ls.dataset, ls.recordings, pre.window, "inside an annotation")
    recs = tuple(r.meta_path for r in ls.dataset.recordings)
    lp = pre.log_probs(_progress(ls.batches(FEATURE_BATCH), len(ls), "predict"))
    _check_rows(nonfinite_rows(lp), recs, ls.recordings, ls.starts)
    guess, prob = predicted(mean_log_probs(lp, ls.groups, count))
    truth, unknown = _number(labels, classes)
    first = np.unique(ls.groups, return_index=True)[1]
    sizes = np.bincount(ls.groups, minlength=count)
    rows = [
        PredictRow(
            recs[int(ls.recordings[first[g]])],
            ls.group_start(g),
            int(sizes[g]),
            classes[int(guess[g])],
            float(prob[g]),
            labels[g],
        )
        for g in range(count)
    ]
    window_guess, _ = predicted(lp)
    return Prediction(
        "annotation",
        classes,
        rows,
        accuracy_scores(truth, guess, classes),
        unknown,
        window_scores=accuracy_scores(truth[ls.groups], window_guess, classes),
        label_key=key,
    )

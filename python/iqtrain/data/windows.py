"""Which windows of a set of recordings a model reads outside training (docs/design.md 10.2).

Two ways to cut them, both windows of ``window`` samples that never cross a capture boundary:

- :func:`labelled_windows`: inside every SigMF annotation that carries a ``core:label`` (or
  another key), on a grid anchored at the annotation's first sample with a stride of one window
  (what the probe, ``iqtrain embed --per annotation`` and ``iqtrain score --per annotation``
  read) or ``data.stride`` (a fine-tune's training windows), each with its class and its
  annotation (``groups``);
- :func:`grid_windows`: every window of each capture segment on a grid of one window from the
  segment's start (what ``IQDataset(window=L)`` enumerates: the validation windows when
  ``data.stride`` is the window), each with the label of the labelled annotation that holds it
  whole, if one does (``iqtrain embed|score --per window|recording``).

Imports no torch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from iqtrain.data.dataset import IQDataset
from iqtrain.data.sigmf_meta import read_annotations
from iqtrain.errors import ConfigError, DataError, NoLabelledWindowError

__all__ = [
    "FEATURE_BATCH",
    "LabelledSet",
    "WindowGrid",
    "class_name",
    "grid_windows",
    "labelled_windows",
]

# A fixed batch: a matmul's rounding can depend on the batch size, and features must not.
FEATURE_BATCH = 256


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

    def group_start(self, group: int) -> int:
        """The first sample of annotation ``group`` (its ``core:sample_start``)."""
        return int(self.group_fields[group]["core:sample_start"])

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
    segments: list[tuple[int, int]], start: int, count: int, window: int, stride: int
) -> Iterator[tuple[int, int]]:
    """``(segment index, first sample)`` of each window of one annotation.

    The grid starts at the annotation's first sample with a step of ``stride``; a window that
    would cross a capture boundary is dropped (training never reads one either), and the grid
    stays anchored at the annotation's start on the far side.
    """
    end = start + count
    for k, (a, n) in enumerate(segments):
        lo = start if start >= a else start + -(-(a - start) // stride) * stride
        for s in range(lo, min(end, a + n) - window + 1, stride):
            yield k, s


def class_name(value: Any) -> str | None:
    """An annotation field's value as a class name: a printable string that is not blank (no
    newline, NUL or other control character: names go into reports, TensorBoard tags and JSON
    as they are), or an integer (its decimal digits); None for anything else."""
    if isinstance(value, str) and value.strip() and value.isprintable():
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def labelled_windows(
    patterns: str | Sequence[str],
    window: int,
    *,
    min_classes: int = 2,
    stride: int | None = None,
    key: str = "core:label",
    classes: Sequence[str] | None = None,
    select: bool = False,
    name: str = "",
) -> LabelledSet:
    """Every window of ``window`` samples inside a SigMF annotation that carries ``key``
    (``core:label`` by default), on a grid of ``stride`` (default: ``window``) from each such
    annotation's first sample, never crossing its end or a capture boundary.

    ``patterns``: .sigmf-meta paths or glob patterns, validated as training data is (a bad or
    missing file, or a pattern matching nothing, is a DataError naming it). Samples outside such
    annotations are ignored. A class is the field's value (a non-empty string, or an integer as
    its digits; anything else is a DataError naming the annotation). No labelled window at all,
    or fewer than ``min_classes`` classes (a probe needs two; ``iqtrain embed`` one), is a
    DataError (:class:`~iqtrain.errors.NoLabelledWindowError` for the first). ``classes``: the
    class names to number labels by (a fine-tune's validation set takes its training set's): a
    label outside them is a DataError naming its annotation.

    ``select``: ``dataset`` holds exactly these windows (``IQDataset(select=...)``: ``ids`` are
    then ``0..n-1`` in this order), for a training stream; otherwise it holds every stride-1
    window and ``ids`` index them. ``name`` prefixes every error (the config key).
    """
    dataset = IQDataset(patterns, window=window, stride=1)
    rows, fields, places = _labelled_rows(
        dataset, window, window if stride is None else stride, key, name
    )
    where = ", ".join(map(os.fspath, [patterns] if isinstance(patterns, str) else patterns))
    if not rows:
        raise NoLabelledWindowError(
            f"{name}{where}: no labelled window: no annotation with a {key} holds a whole "
            f"window of {window} samples (data.seq_patches * data.patch_len)"
        )
    if classes is None:
        classes = tuple(sorted({row[2] for row in rows}))
        if len(classes) < min_classes:
            raise DataError(
                f"{name}{where}: every labelled window is {classes[0]!r}; at least "
                f"{min_classes} classes are needed"
            )
    classes = tuple(classes)
    index = {c: i for i, c in enumerate(classes)}
    for row in rows:
        if row[2] not in index:
            raise DataError(
                f"{name}{places[row[1]]}: class {row[2]!r} is not one of the training set's "
                f"{len(classes)} classes ({', '.join(map(repr, classes[:8]))}"
                f"{', ...' if len(classes) > 8 else ''})"
            )
    ids = np.array([row[0] for row in rows], dtype=np.uint64)
    if select:
        dataset = IQDataset(patterns, window=window, stride=1, select=ids)
        ids = np.arange(len(rows), dtype=np.uint64)
    return LabelledSet(
        dataset=dataset,
        ids=ids,
        labels=np.array([index[row[2]] for row in rows], dtype=np.int64),
        groups=np.array([row[1] for row in rows], dtype=np.int64),
        recordings=np.array([row[3] for row in rows], dtype=np.int64),
        starts=np.array([row[4] for row in rows], dtype=np.int64),
        classes=classes,
        group_fields=tuple(fields),
        group_where=tuple(places),
    )


def _labelled_rows(
    dataset: IQDataset, window: int, stride: int, key: str, name: str
) -> tuple[list[tuple[int, int, str, int, int]], list[dict[str, Any]], list[str]]:
    """:func:`labelled_windows`' windows of ``dataset`` (opened with stride 1): ``(stride-1 id,
    annotation, class name, recording, first sample)`` each, with each annotation's fields and
    where it was written."""
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
            if key not in ann.fields:
                continue
            label = class_name(ann.fields[key])
            if label is None:
                raise DataError(
                    f"{name}{rec.meta_path}: annotations[{i}] {key} is {ann.fields[key]!r:.60}, "
                    "not a class name (a printable, non-blank string or an integer)"
                )
            found = [
                (offsets[k] + s - segments[k][0], group, label, r, s)
                for k, s in _annotation_starts(
                    segments, ann.sample_start, ann.sample_count, window, stride
                )
            ]
            rows += found
            if found:
                fields.append(ann.fields)
                places.append(f"{rec.meta_path}: annotations[{i}]")
            group += bool(found)
    assert base == dataset.num_windows, "window numbering disagrees with the native dataset"
    return rows, fields, places


@dataclass(frozen=True)
class WindowGrid:
    """Every window of ``dataset`` (stride one window), in id order: ``recordings`` (index into
    ``dataset.recordings``) and ``starts`` (first sample) of each, and ``labels`` (index into
    ``classes``; -1 where no labelled annotation holds the window whole)."""

    dataset: IQDataset
    recordings: np.ndarray
    starts: np.ndarray
    labels: np.ndarray
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.starts)

    def batches(self, batch_size: int = FEATURE_BATCH) -> Iterator[np.ndarray]:
        """The windows in order, ``[b, window, 2]`` in the storage dtype, never all at once."""
        n = len(self)
        for lo in range(0, n, batch_size):
            yield self.dataset.windows(np.arange(lo, min(lo + batch_size, n), dtype=np.uint64))


def grid_windows(patterns: str | Sequence[str], window: int) -> WindowGrid:
    """Every window of ``window`` samples of ``patterns`` (validated as training data is), on a
    grid of one window from each capture segment's start; labelled where a labelled annotation
    holds a window whole (the first such annotation in metadata order; ``classes``: the sorted
    labels that label a window)."""
    dataset = IQDataset(patterns, window=window)
    recordings: list[np.ndarray] = []
    starts: list[np.ndarray] = []
    held: list[tuple[int, int, str]] = []  # first and last window id + 1, label
    base = 0
    for r, rec in enumerate(dataset.recordings):
        # Segments ascend, so a recording's window starts ascend too: O(log n) per annotation.
        first = np.concatenate(
            [np.arange(a, a + n - window + 1, window, dtype=np.int64) for a, n in rec.segments]
        )
        starts.append(first)
        recordings.append(np.full(first.size, r, dtype=np.int64))
        for ann in read_annotations(rec):
            if ann.label is None:
                continue
            lo = int(np.searchsorted(first, ann.sample_start, side="left"))
            hi = int(np.searchsorted(first, ann.sample_start + ann.sample_count - window, "right"))
            if hi > lo:
                held.append((base + lo, base + hi, ann.label))
        base += first.size
    assert base == dataset.num_windows, "window numbering disagrees with the native dataset"
    names = sorted({label for _, _, label in held})
    number = {c: i for i, c in enumerate(names)}
    provisional = np.full(base, -1, dtype=np.int64)
    for lo, hi, label in reversed(held):  # the first annotation in metadata order wins
        provisional[lo:hi] = number[label]
    used = np.unique(provisional[provisional >= 0])  # a label every window of lost: no class
    classes = tuple(names[k] for k in used)
    labels = np.full(base, -1, dtype=np.int64)
    labelled = provisional >= 0
    labels[labelled] = np.searchsorted(used, provisional[labelled])
    return WindowGrid(
        dataset,
        np.concatenate(recordings),
        np.concatenate(starts),
        labels,
        classes,
    )

"""Which windows of a set of recordings a model reads outside training (docs/design.md
"A trained model as a product", "Linear probe").

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

from iqtrain.checkpoint.state import sort_classes
from iqtrain.data.dataset import IQDataset, ReadOptions
from iqtrain.data.sigmf import MISSING, field_at, read_annotations
from iqtrain.errors import ConfigError, DataError, NoLabelledWindowError

__all__ = [
    "FEATURE_BATCH",
    "ClassRule",
    "LabelledSet",
    "WindowGrid",
    "grid_windows",
    "labelled_windows",
    "show_class",
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
    #: The note to give about labels read as blank (:meth:`ClassRule.note_blank`), or None.
    blank: str | None = None

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
    segments: Sequence[tuple[int, int]], start: int, count: int, window: int, stride: int
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


def show_class(name: str) -> str:
    """A class name as every command prints it: as written, or quoted (``' 16QAM'``) when it
    has white space at either end or a quote there, so two classes never look the same."""
    if name and name == name.strip() and name[0] not in "'\"" and name[-1] not in "'\"":
        return name
    return repr(name)


class ClassRule:
    """The one rule every command reads a label by (docs/data.md, labels).

    The label is the value of ``key`` in an annotation (a field, or a path into its objects:
    :func:`~iqtrain.data.sigmf.field_at`). Absent, ``null``, an empty or all-white-space
    string: the annotation is unlabelled (``blank`` counts the strings). A string is its class
    as written (white space inside or around it included: ``" 16QAM"`` and ``"16QAM"`` are two
    classes, printed apart by :func:`show_class`); an integer is the class of its decimal
    digits. Anything else, a string with a control character, or one class written both as the
    integer 5 and the string "5", is a DataError naming the annotation. Classes sort
    numerically when every one is an integer, else as strings
    (:func:`~iqtrain.checkpoint.state.sort_classes`).
    """

    def __init__(self, key: str = "core:label") -> None:
        self.key = key
        self.blank = 0
        self._first: dict[str, tuple[bool, str]] = {}  # class -> (written as an int?, where)

    def of(self, fields: dict[str, Any], where: str) -> str | None:
        """The class of the annotation with ``fields`` (written at ``where``), or None."""
        value = field_at(fields, self.key)
        if value is MISSING or value is None:
            return None
        if isinstance(value, str) and not value.strip():
            self.blank += 1
            return None
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise DataError(
                f"{where} {self.key} is {value!r:.60}, not a class name (a string or an integer)"
            )
        if isinstance(value, str) and not value.isprintable():
            raise DataError(
                f"{where} {self.key} is {value!r:.60}: a class name holds no control "
                "character (newline, tab, NUL, ...)"
            )
        text = str(value)
        as_int = isinstance(value, int)
        first = self._first.setdefault(text, (as_int, where))
        if first[0] != as_int:
            other = f"the integer {text}" if first[0] else f"the string {text!r}"
            raise DataError(
                f"{where} {self.key} is {value!r}, but {first[1]} writes this class "
                f"as {other}: write one class one way"
            )
        return text

    def note_blank(self) -> str | None:
        """The note to give when blank labels were read as unlabelled, or None."""
        if not self.blank:
            return None
        return f"{self.blank} annotation(s) with an empty {self.key} are read as unlabelled"


def _stride_one(
    patterns: str | Sequence[str], window: int, read: ReadOptions, select: Any = None
) -> IQDataset:
    """Every stride-1 window of ``patterns`` (or the ``select``-ed ones)."""
    return IQDataset(
        patterns,
        window=window,
        stride=1,
        select=select,
        channel=read.channel,
        skip_invalid=read.skip_invalid,
    )


class _Every(ClassRule):
    """Every annotation, labelled or not, as one class (``labelled_windows(key=None)``)."""

    def of(self, fields: dict[str, Any], where: str) -> str | None:
        return "annotation"


def labelled_windows(
    patterns: str | Sequence[str],
    window: int,
    *,
    min_classes: int = 2,
    stride: int | None = None,
    key: str | None = "core:label",
    classes: Sequence[str] | None = None,
    select: bool = False,
    read: ReadOptions | None = None,
) -> LabelledSet:
    """Every window of ``window`` samples inside a SigMF annotation labelled by ``key``
    (:class:`ClassRule`: ``core:label`` by default, or a path such as
    ``signal:detail.mod_class``), on a grid of ``stride`` (default: ``window``) from each such
    annotation's first sample, never crossing its end or a capture boundary.

    ``patterns``: what ``IQDataset`` reads (``read``: its options), validated as training data
    is (a bad or missing file, or a pattern matching nothing, is a DataError
    naming it). Samples outside labelled annotations are ignored. No labelled window at all,
    or fewer than ``min_classes`` classes (a probe needs two; ``iqtrain embed`` one), is a
    DataError (:class:`~iqtrain.errors.NoLabelledWindowError` for the first). ``classes``: the
    class names to number labels by (a fine-tune's validation set takes its training set's): a
    label outside them is a DataError naming its annotation.

    ``select``: ``dataset`` holds exactly these windows (``IQDataset(select=...)``: ``ids`` are
    then ``0..n-1`` in this order), for a training stream; otherwise it holds every stride-1
    window and ``ids`` index them. ``key=None``: the windows of every annotation, labelled or
    not, as one class (``iqtrain predict``).
    """
    read = read or ReadOptions()
    dataset = _stride_one(patterns, window, read)
    rule = ClassRule(key) if key is not None else _Every("")
    rows, fields, places = _labelled_rows(
        dataset, window, window if stride is None else stride, rule
    )
    where = ", ".join(map(os.fspath, [patterns] if isinstance(patterns, str) else patterns))
    if not rows:
        raise NoLabelledWindowError(
            f"{where}: no labelled window: no annotation with a {key or 'sample'} holds a "
            f"whole window of {window} samples (data.seq_patches * data.patch_len)"
        )
    if classes is None:
        classes = tuple(sort_classes(row[2] for row in rows))
        if len(classes) < min_classes:
            raise DataError(
                f"{where}: every labelled window is {show_class(classes[0])}; at least "
                f"{min_classes} classes are needed"
            )
    classes = tuple(classes)
    index = {c: i for i, c in enumerate(classes)}
    for row in rows:
        if row[2] not in index:
            raise DataError(
                f"{places[row[1]]}: class {show_class(row[2])} is not one of the training "
                f"set's {len(classes)} classes ({', '.join(map(show_class, classes[:8]))}"
                f"{', ...' if len(classes) > 8 else ''})"
            )
    ids = np.array([row[0] for row in rows], dtype=np.uint64)
    if select:
        dataset = _stride_one(patterns, window, read, select=ids)
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
        blank=rule.note_blank(),
    )


def _labelled_rows(
    dataset: IQDataset, window: int, stride: int, rule: ClassRule
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
            place = f"{rec.meta_path}: annotations[{i}]"
            label = rule.of(ann.fields, place)
            if label is None:
                continue
            found = [
                (offsets[k] + s - segments[k][0], group, label, r, s)
                for k, s in _annotation_starts(
                    segments, ann.sample_start, ann.sample_count, window, stride
                )
            ]
            rows += found
            if found:
                fields.append(ann.fields)
                places.append(place)
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
    #: The note to give about labels read as blank (:meth:`ClassRule.note_blank`), or None.
    blank: str | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def batches(self, batch_size: int = FEATURE_BATCH) -> Iterator[np.ndarray]:
        """The windows in order, ``[b, window, 2]`` in the storage dtype, never all at once."""
        n = len(self)
        for lo in range(0, n, batch_size):
            yield self.dataset.windows(np.arange(lo, min(lo + batch_size, n), dtype=np.uint64))


def grid_windows(
    patterns: str | Sequence[str],
    window: int,
    *,
    key: str = "core:label",
    read: ReadOptions | None = None,
) -> WindowGrid:
    """Every window of ``window`` samples of ``patterns`` (what ``IQDataset`` reads, validated
    as training data is), on a grid of one window from each capture segment's start; labelled
    (by ``key``, :class:`ClassRule`) where a labelled annotation holds a window whole (the first
    such annotation in metadata order; ``classes``: the labels that label a window, sorted)."""
    read = read or ReadOptions()
    dataset = IQDataset(
        patterns, window=window, channel=read.channel, skip_invalid=read.skip_invalid
    )
    rule = ClassRule(key)
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
        for i, ann in enumerate(read_annotations(rec)):
            label = rule.of(ann.fields, f"{rec.meta_path}: annotations[{i}]")
            if label is None:
                continue
            lo = int(np.searchsorted(first, ann.sample_start, side="left"))
            hi = int(np.searchsorted(first, ann.sample_start + ann.sample_count - window, "right"))
            if hi > lo:
                held.append((base + lo, base + hi, label))
        base += first.size
    assert base == dataset.num_windows, "window numbering disagrees with the native dataset"
    names = sort_classes(label for _, _, label in held)
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
        blank=rule.note_blank(),
    )

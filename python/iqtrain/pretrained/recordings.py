"""A pretrained model over SigMF recordings: what ``iqtrain embed`` and ``iqtrain score`` do
(docs/design.md section 10.6).

Rows are windows or annotations of the recordings (:mod:`iqtrain.data.windows`):

- ``per="window"`` (and ``score --per recording``, which averages them per recording): every
  window of each capture segment on a grid of one window from its start, labelled where a
  labelled annotation holds it whole (-1 elsewhere);
- ``per="annotation"``: the windows inside each labelled annotation, on a grid anchored at its
  start (the probe's windows), mean-pooled (embed) or averaged (score) per annotation.

Embeddings are written as one safetensors file (:func:`write_embeddings`) through a temporary
name and a rename: an existing file is refused unless ``force``.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from iqtrain.console import note
from iqtrain.data.windows import FEATURE_BATCH, grid_windows, labelled_windows
from iqtrain.errors import ConfigError, DataError
from iqtrain.pretrained.load import Pretrained, nonfinite_rows, parse_layer
from iqtrain.storage import write_bytes_atomic

__all__ = [
    "EMBED_PER",
    "FORMAT",
    "SCORE_PER",
    "Embeddings",
    "ScoreRow",
    "check_output",
    "embed_recordings",
    "score_recordings",
    "unit_of",
    "write_embeddings",
]

EMBED_PER = ("window", "annotation")
SCORE_PER = ("recording", "annotation", "window")
#: The safetensors metadata ``format`` of an embeddings file.
FORMAT = "iqtrain-embeddings-1"
#: Seconds between progress notes on long work.
PROGRESS_EVERY_S = 10.0


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
    """Mean of ``values`` rows per group (``groups`` numbered 0..count-1), in float64."""
    sums = np.zeros((count, *values.shape[1:]), dtype=np.float64)
    np.add.at(sums, groups, values.astype(np.float64))
    n = np.bincount(groups, minlength=count).astype(np.float64)
    return sums / n.reshape(-1, *([1] * (values.ndim - 1)))


def embed_recordings(
    pre: Pretrained, patterns: Sequence[str], *, per: str = "window", layer: Any = None
) -> Embeddings:
    """Embeddings of ``patterns`` (mean-pooled over patches; ``layer`` as ``--layer``).

    ``per="annotation"`` needs labelled annotations (a DataError naming the data otherwise).
    A row with non-finite features is a DataError naming its recording and sample."""
    if per not in EMBED_PER:
        raise ConfigError(f"--per: expected one of {', '.join(EMBED_PER)}, got {per!r}")
    k = parse_layer(layer, pre.config.model.layers)
    if k == "all":
        raise ConfigError("--layer: embed writes one layer (an integer), not 'all'")
    layer_n = int(k)
    if per == "annotation":
        ls = labelled_windows(patterns, pre.window, min_classes=1)
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
    grid = grid_windows(patterns, pre.window)
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
    """Refuse an output before any work (ConfigError naming ``--out``): a directory; anything
    there but a regular file (a device, a FIFO, a symbolic link: ``--force`` replaces a file,
    never those); an existing file without ``force``; a path inside an attempt directory (its
    files are evidence); a parent that is not a writable directory; a name too long for the
    temporary sibling."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"--out: {path}: {exc.strerror or exc}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"--out: {path} is a directory; name a file")
    if st is not None and not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise ConfigError(f"--out: {path} is {what}; embed writes (and --force replaces) files")
    if st is not None and not force:
        raise ConfigError(f"--out: {path} exists; pass --force to replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ConfigError(f"--out: {parent} is not a directory")
    for above in (parent.resolve(), *parent.resolve().parents):
        if (above / "attempt.json").is_file():
            raise ConfigError(f"--out: {path} is inside attempt {above}; its files are evidence")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--out: {parent} is not writable")
    if len(f".{path.name}.tmp-{os.getpid()}".encode()) > 255:
        raise ConfigError(f"--out: {path.name!r} is too long a file name")


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
    write_bytes_atomic(path, save(tensors, metadata=meta))


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


def score_recordings(pre: Pretrained, patterns: Sequence[str], *, per: str) -> list[ScoreRow]:
    """Every row's score (the mean of its windows' :meth:`Pretrained.score`), highest first
    (ties in data order). A window that cannot be scored (non-finite samples) is a DataError
    naming its recording and sample."""
    if per not in SCORE_PER:
        raise ConfigError(f"--per: expected one of {', '.join(SCORE_PER)}, got {per!r}")
    if per == "annotation":
        ls = labelled_windows(patterns, pre.window, min_classes=1)
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
        grid = grid_windows(patterns, pre.window)
        recs = tuple(r.meta_path for r in grid.dataset.recordings)
        scores = pre.losses(_progress(grid.batches(FEATURE_BATCH), len(grid), "score"))
        _check_rows(nonfinite_rows(scores), recs, grid.recordings, grid.starts)
        rows = _grid_rows(grid, scores, recs, per)
    return sorted(rows, key=lambda r: -r.score)


def _grid_rows(grid: Any, scores: np.ndarray, recs: Sequence[Path], per: str) -> list[ScoreRow]:
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
    # a recording without a window (too short) has no score: it is not a row
    return [ScoreRow(float(mean[r]), recs[r], 0, int(sizes[r])) for r in range(count) if sizes[r]]


def unit_of(pre: Pretrained) -> str:
    """What a score counts, in the units validation records."""
    if pre.config.model.objective == "mse":
        return "NMSE"
    return "nats per complex sample"

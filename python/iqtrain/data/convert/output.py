"""What ``iqtrain convert`` writes: a reader's examples as labelled SigMF recordings and
``convert.json``, published as one new directory (:mod:`iqtrain.data.convert.publish`).

A reader hands over :class:`Batch`es of consecutive examples; :func:`convert` writes them in
order, whole ones, at most :data:`MAX_RECORDING_SAMPLES` samples per recording
(``<dataset>_<NNNNN>.sigmf-meta/-data``, ``cf32_le``: the float32 samples bit for bit), one
capture and one annotation per example (``core:label``, ``iqtrain:snr_db``,
``iqtrain:source_row``), then ``convert.json`` (the source, classes, counts, tool version).
Imports no torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from sigmf import SigMFFile

from iqtrain.data.convert.publish import publish
from iqtrain.data.sigmf_write import attach_data, extensions, write_recording
from iqtrain.storage import write_json_atomic

__all__ = ["MAX_RECORDING_SAMPLES", "SAMPLE_RATE", "Batch", "ConvertResult", "Kind", "convert"]

#: Samples per written recording at most (8 MiB of cf32_le): 8192 RadioML 2016 examples, 1024
#: RadioML 2018 examples. A recording holds whole examples only.
MAX_RECORDING_SAMPLES = 1 << 20

#: Written as core:sample_rate: normalised frequency (the datasets state no rate per example).
SAMPLE_RATE = 1.0

_DATATYPE = "cf32_le"


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: ``recordings`` SigMF recordings of ``examples`` examples in
    ``out_dir``; ``classes`` the dataset's class names (2016: sorted; 2018: Y's column order)."""

    out_dir: Path
    recordings: int
    examples: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class Kind:
    """A source dataset: ``name`` (file prefix and convert.json's ``dataset``), ``title``, and
    ``example_len``, samples per example."""

    name: str
    title: str
    example_len: int


@dataclass(frozen=True)
class Batch:
    """Consecutive examples: ``iq`` [k, L, 2] float32 (I, Q), and per example its label (object
    array of str), SNR in dB and row in the source."""

    iq: np.ndarray
    labels: np.ndarray
    snrs: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.iq)

    def part(self, a: int, b: int) -> Batch:
        return Batch(self.iq[a:b], self.labels[a:b], self.snrs[a:b], self.rows[a:b])


@dataclass
class _Tally:
    recordings: int = 0
    examples: int = 0
    per_class: Counter[str] = field(default_factory=Counter)
    snrs: set[int] = field(default_factory=set)


def _recording_meta(kind: Kind, first: int, batch: Batch, data: bytes) -> SigMFFile:
    n, length = len(batch), kind.example_len
    starts = range(0, n * length, length)
    annotations = [
        {
            "core:sample_start": start,
            "core:sample_count": length,
            "core:label": str(label),
            "iqtrain:snr_db": snr,
            "iqtrain:source_row": row,
        }
        for start, label, snr, row in zip(
            starts, batch.labels.tolist(), batch.snrs.tolist(), batch.rows.tolist(), strict=True
        )
    ]
    description = (
        f"{kind.title} examples {first}..{first + n - 1} (in conversion order), converted by "
        f"iqtrain convert {kind.name}: one capture and one annotation per {length}-sample "
        "example (core:label: the dataset's modulation name; iqtrain:snr_db: its SNR in dB); "
        "core:sample_rate 1.0 is normalised frequency (the dataset states no sample rate)"
    )
    meta = SigMFFile(
        metadata={
            "global": {
                "core:datatype": _DATATYPE,
                "core:sample_rate": SAMPLE_RATE,
                "core:author": "iqtrain convert",
                "core:recorder": f"iqtrain convert {kind.name}",
                "core:description": description,
                # iqtrain:snr_db and iqtrain:source_row: sigmf wants the namespace declared.
                "core:extensions": extensions(),
            },
            # Each capture names its example: captures that differ only in their start are one
            # segment to a SigMF reader (docs/design.md "Recordings, capture segments, windows"),
            # and examples must not run together.
            "captures": [
                {"core:sample_start": start, "iqtrain:source_row": row}
                for start, row in zip(starts, batch.rows.tolist(), strict=True)
            ],
            "annotations": annotations,
        }
    )
    attach_data(meta, data)
    return meta


def _write_recording(tmp: Path, kind: Kind, tally: _Tally, batch: Batch) -> None:
    data = np.ascontiguousarray(batch.iq, dtype="<f4").tobytes()  # interleaved I, Q
    meta = _recording_meta(kind, tally.examples, batch, data)
    # A full disk: the StorageError naming the data file; publish removes the directory.
    write_recording(meta, tmp / f"{kind.name}_{tally.recordings:05d}", durable=True)
    tally.recordings += 1
    tally.examples += len(batch)
    tally.per_class.update(batch.labels.tolist())
    tally.snrs.update(batch.snrs.tolist())


def _write_batches(tmp: Path, kind: Kind, batches: Iterable[Batch]) -> _Tally:
    """Write the examples in order, whole ones, at most MAX_RECORDING_SAMPLES per recording."""
    per = max(1, MAX_RECORDING_SAMPLES // kind.example_len)
    tally = _Tally()
    pending: list[Batch] = []
    filled = 0
    for batch in batches:
        pos = 0
        while pos < len(batch):
            take = min(per - filled, len(batch) - pos)
            pending.append(batch.part(pos, pos + take))
            filled, pos = filled + take, pos + take
            if filled == per:
                _write_recording(tmp, kind, tally, _concat(pending))
                pending, filled = [], 0
    if pending:
        _write_recording(tmp, kind, tally, _concat(pending))
    return tally


def _concat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
        return parts[0]
    return Batch(
        np.concatenate([p.iq for p in parts]),
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.snrs for p in parts]),
        np.concatenate([p.rows for p in parts]),
    )


def _sidecar(
    kind: Kind, source: dict[str, Any], classes: tuple[str, ...], tally: _Tally
) -> dict[str, Any]:
    import iqtrain

    return {
        "tool": "iqtrain convert",
        "version": str(iqtrain.__version__),
        "dataset": kind.name,
        "dataset_title": kind.title,
        "source": source,
        "classes": list(classes),
        "examples": tally.examples,
        "examples_per_class": {c: tally.per_class.get(c, 0) for c in classes},
        "snr_db": sorted(tally.snrs),
        "recordings": tally.recordings,
        "samples_per_example": kind.example_len,
        "max_recording_samples": MAX_RECORDING_SAMPLES,
        "datatype": _DATATYPE,
        "sample_rate": SAMPLE_RATE,
    }


def convert(
    kind: Kind,
    out: Path,
    batches: Iterable[Batch],
    classes: tuple[str, ...],
    source: dict[str, Any],
    class_order: str,
) -> ConvertResult:
    """Write ``batches`` (``classes`` their class names, ``source`` convert.json's record of the
    file, ``class_order`` where the names' order comes from) as a new ``out``: all or nothing."""

    def write(tmp: Path) -> _Tally:
        tally = _write_batches(tmp, kind, batches)
        sidecar = _sidecar(kind, source, classes, tally) | {"class_order": class_order}
        write_json_atomic(tmp / "convert.json", sidecar)
        return tally

    tally = publish(out, write)
    return ConvertResult(out, tally.recordings, tally.examples, classes)

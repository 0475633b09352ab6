"""The metric stream: ``metrics.jsonl``, one JSON record per line, append-only.

Floats are written with ``repr`` (what ``json`` does), so a stream read back compares exactly.
The writer keeps a cursor — records and bytes written and the SHA-256 of that prefix — which
every checkpoint stores: a resumed attempt copies exactly that prefix from its parent and
continues, and anyone can check the inherited prefix against the parent's hash.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iqtrain.errors import CheckpointError

__all__ = ["MetricCursor", "MetricWriter", "TIMING_FIELDS", "read_metrics", "strip_timing"]

# Fields that measure wall-clock time: excluded when streams are compared across runs.
TIMING_FIELDS = frozenset({"step_time_s", "samples_per_s", "time_s"})


@dataclass(frozen=True)
class MetricCursor:
    records: int
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MetricCursor:
        return cls(records=int(d["records"]), bytes=int(d["bytes"]), sha256=str(d["sha256"]))


def encode_record(record: dict[str, Any]) -> bytes:
    # allow_nan=False: a non-finite number in the evidence is a bug upstream, never written.
    return (json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n").encode()


def _hash_prefix(path: Path, nbytes: int) -> tuple[str, int]:
    h = hashlib.sha256()
    lines = 0
    with open(path, "rb") as f:
        remaining = nbytes
        while remaining:
            chunk = f.read(min(remaining, 1 << 20))
            if not chunk:
                break
            h.update(chunk)
            lines += chunk.count(b"\n")
            remaining -= len(chunk)
    if remaining:
        raise CheckpointError(f"{path}: shorter than the {nbytes} bytes the cursor records")
    return h.hexdigest(), lines


def verify_prefix(path: Path, cursor: MetricCursor) -> None:
    """Raise CheckpointError unless the first ``cursor.bytes`` of ``path`` match the cursor."""
    try:
        digest, lines = _hash_prefix(path, cursor.bytes)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: metric stream missing") from None
    if digest != cursor.sha256 or lines != cursor.records:
        raise CheckpointError(
            f"{path}: the first {cursor.bytes} bytes do not match the checkpoint's metric cursor"
        )


class MetricWriter:
    """Appends records to ``metrics.jsonl``, keeping the running cursor."""

    def __init__(
        self, path: Path, inherit_from: Path | None = None, cursor: MetricCursor | None = None
    ):
        self.path = path
        self._hash = hashlib.sha256()
        self.records = 0
        self.bytes = 0
        # "x": an attempt's stream is created once; nothing ever overwrites evidence.
        self._f = open(path, "xb")  # noqa: SIM115 - lives as long as the writer
        if inherit_from is not None:
            assert cursor is not None
            verify_prefix(inherit_from, cursor)
            with open(inherit_from, "rb") as src:
                prefix = src.read(cursor.bytes)
            self._write(prefix, cursor.records)

    def _write(self, data: bytes, records: int) -> None:
        self._f.write(data)
        self._f.flush()
        self._hash.update(data)
        self.bytes += len(data)
        self.records += records

    def write(self, record: dict[str, Any]) -> None:
        self._write(encode_record(record), 1)

    def cursor(self) -> MetricCursor:
        return MetricCursor(records=self.records, bytes=self.bytes, sha256=self._hash.hexdigest())

    def sync(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        if not self._f.closed:
            self.sync()
            self._f.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


def strip_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without wall-clock fields: what must match between equivalent runs."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]

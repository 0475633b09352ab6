"""The metric stream: ``metrics.jsonl``, one JSON record per line, append-only.

Floats are written with ``repr`` (what ``json`` does), so a stream read back compares exactly.
The writer keeps a cursor — records and bytes written and the SHA-256 of that prefix — which
every checkpoint stores: a resumed attempt copies exactly that prefix from its parent and
continues, and anyone can check the inherited prefix against the parent's hash.

The stream never keeps a torn record written by a live writer: a write that fails (disk full,
file too large, I/O error) is cut back to the last complete record, the cursor is left as it
was, and :class:`~iqtrain.errors.StorageError` names the file. Only a process killed in the
middle of a write can leave a torn trailing line; :func:`read_metric_stream` returns the complete
records and reports such a tail, while anything invalid before the last line is an error.

This module imports no torch: ``verify`` and ``report`` use it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from iqtrain.errors import CheckpointError, StorageError

__all__ = [
    "MetricCursor",
    "MetricStream",
    "MetricWriter",
    "TIMING_FIELDS",
    "read_metric_stream",
    "read_metrics",
    "strip_timing",
    "verify_prefix",
]

# Fields that measure wall-clock time: excluded when streams are compared across runs.
# Measurements of the machine, not of the training: they differ between equivalent runs.
TIMING_FIELDS = frozenset(
    {"step_time_s", "samples_per_s", "time_s", "tflops", "mfu", "peak_rss_bytes", "cuda_peak_bytes"}
)

_COPY_CHUNK = 1 << 20


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


def _storage_error(path: Path, exc: OSError, what: str = "cannot write") -> StorageError:
    """One line naming the file: ``<path>: cannot write: <reason>``."""
    return StorageError(f"{path}: {what}: {exc.strerror or exc}")


def _hash_prefix(path: Path, nbytes: int) -> tuple[str, int]:
    h = hashlib.sha256()
    lines = 0
    with open(path, "rb") as f:
        remaining = nbytes
        while remaining:
            chunk = f.read(min(remaining, _COPY_CHUNK))
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
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable: {exc.strerror or exc}") from None
    if digest != cursor.sha256 or lines != cursor.records:
        raise CheckpointError(
            f"{path}: the first {cursor.bytes} bytes do not match the checkpoint's metric cursor"
        )


class MetricWriter:
    """Appends records to ``metrics.jsonl``, keeping the running cursor.

    Every write, :meth:`sync` and :meth:`close` failure raises ``StorageError`` naming the file.
    After a failed :meth:`write` the file is cut back to the last complete record and the cursor
    is unchanged, so the writer stays usable. If that cut itself fails, or an fsync failed (the
    kernel may then have dropped the unwritten pages), what is on disk is no longer known to
    match the cursor: every later write or sync raises ``StorageError``.
    """

    def __init__(
        self, path: Path, inherit_from: Path | None = None, cursor: MetricCursor | None = None
    ):
        if inherit_from is not None and cursor is None:
            raise ValueError("inherit_from needs the cursor of the prefix to inherit")
        self.path = Path(path)
        self._hash = hashlib.sha256()
        self.records = 0
        self.bytes = 0
        self._broken: str | None = None
        # O_EXCL: an attempt's stream is created once; nothing ever overwrites evidence.
        # FileExistsError is a caller's bug and propagates as such.
        try:
            self._fd: int | None = os.open(
                self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644
            )
        except FileExistsError:
            raise
        except OSError as exc:
            raise _storage_error(self.path, exc, "cannot create") from exc
        if inherit_from is not None:
            assert cursor is not None
            try:
                self._inherit(Path(inherit_from), cursor)
            except BaseException:
                self._discard()
                raise

    # ---- writing --------------------------------------------------------------------------

    def _inherit(self, parent: Path, cursor: MetricCursor) -> None:
        """Copy the parent's first ``cursor.bytes``, checking them against the cursor as read."""
        try:
            src = open(parent, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            raise CheckpointError(f"{parent}: metric stream missing") from None
        except OSError as exc:
            raise CheckpointError(f"{parent}: unreadable: {exc.strerror or exc}") from None
        with src:
            remaining = cursor.bytes
            while remaining:
                try:
                    chunk = src.read(min(remaining, _COPY_CHUNK))
                except OSError as exc:
                    raise CheckpointError(f"{parent}: unreadable: {exc.strerror or exc}") from None
                if not chunk:
                    raise CheckpointError(
                        f"{parent}: shorter than the {cursor.bytes} bytes the cursor records"
                    )
                self._append(chunk, chunk.count(b"\n"))
                remaining -= len(chunk)
        if self.cursor() != cursor:
            raise CheckpointError(
                f"{parent}: the first {cursor.bytes} bytes do not match the checkpoint's "
                "metric cursor"
            )

    def _discard(self) -> None:
        """Abandon a stream whose construction failed: empty it and close it, quietly."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            os.close(fd)
        self._hash = hashlib.sha256()
        self.records = self.bytes = 0

    def _check_usable(self) -> int:
        if self._fd is None:
            raise ValueError(f"{self.path}: metric writer is closed")
        if self._broken is not None:
            raise StorageError(f"{self.path}: {self._broken}")
        return self._fd

    def _append(self, data: bytes, records: int) -> None:
        fd = self._check_usable()
        start = self.bytes
        try:
            view = memoryview(data)
            offset = start
            while view:
                n = os.pwrite(fd, view, offset)  # explicit offset: immune to a stray position
                if n <= 0:
                    raise OSError(errno.EIO, "write made no progress")
                view = view[n:]
                offset += n
        except OSError as exc:
            try:
                os.ftruncate(fd, start)  # drop the torn record: the stream ends complete
            except OSError as cut:
                self._broken = (
                    f"a write failed ({exc.strerror or exc}) and the torn record could not be "
                    f"removed ({cut.strerror or cut})"
                )
                raise StorageError(f"{self.path}: {self._broken}") from exc
            raise _storage_error(self.path, exc) from exc
        self._hash.update(data)
        self.bytes += len(data)
        self.records += records

    def write(self, record: dict[str, Any]) -> None:
        """Append one record (``ValueError`` for a non-finite number, before any write)."""
        self._append(encode_record(record), 1)

    def state_dict(self) -> dict[str, Any]:
        """The writer's state is its cursor; a resumed writer is built from its parent's
        stream and cursor (the constructor's ``inherit_from``/``cursor``)."""
        return self.cursor().to_dict()

    def cursor(self) -> MetricCursor:
        return MetricCursor(records=self.records, bytes=self.bytes, sha256=self._hash.hexdigest())

    def sync(self) -> None:
        """fsync the stream: afterwards the cursor never points past what is on disk."""
        fd = self._check_usable()
        try:
            os.fsync(fd)
        except OSError as exc:
            self._broken = f"an fsync failed ({exc.strerror or exc}); the stream is not durable"
            raise _storage_error(self.path, exc, "cannot sync") from exc

    def close(self) -> None:
        """fsync and close (idempotent). The descriptor is closed even if the fsync fails."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        error: OSError | None = None
        try:
            os.fsync(fd)
        except OSError as exc:
            error = exc
        try:
            os.close(fd)
        except OSError as exc:
            error = error or exc
        if error is not None:
            raise _storage_error(self.path, error, "cannot sync") from error


# ------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class MetricStream:
    """What :func:`read_metric_stream` found in a ``metrics.jsonl``.

    ``records``: every complete record, in order. ``complete_bytes``: the bytes they occupy.
    ``torn_bytes``: the bytes of a torn trailing line after them (0 if none) — left by a process
    killed in the middle of a write; it is not a record.
    """

    path: Path
    records: list[dict[str, Any]]
    complete_bytes: int
    torn_bytes: int

    @property
    def torn(self) -> bool:
        return self.torn_bytes > 0


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _parse_record(line: bytes) -> dict[str, Any] | None:
    """The record on a complete line (with its newline), or None if it is not one."""
    try:
        record = json.loads(line, parse_constant=_reject_constant)
    except ValueError:  # includes UnicodeDecodeError
        return None
    return record if isinstance(record, dict) else None


def read_metric_stream(path: str | os.PathLike) -> MetricStream:
    """Read a metric stream, tolerating one torn trailing line.

    The last line is torn if it has no newline or is not a JSON object; it is reported in
    ``torn_bytes``, not returned. Any earlier line that is not a JSON object (NaN and Infinity
    included) raises ``CheckpointError`` naming the file and the line; so does a missing or
    unreadable file.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: metric stream missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable: {exc.strerror or exc}") from None
    records: list[dict[str, Any]] = []
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        end = len(data) if nl < 0 else nl + 1
        record = _parse_record(data[pos:end]) if nl >= 0 else None
        if record is None:
            if end == len(data):
                return MetricStream(path, records, pos, end - pos)
            raise CheckpointError(f"{path}: line {len(records) + 1}: not a JSON record")
        records.append(record)
        pos = end
    return MetricStream(path, records, pos, 0)


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a complete stream; strict.

    Unlike :func:`read_metric_stream` this does not tolerate a torn trailing line: it raises
    ``CheckpointError`` naming the file and the line, so a comparison of two streams can never
    silently pass over a damaged one. Use :func:`read_metric_stream` to read what a crashed
    attempt left.
    """
    stream = read_metric_stream(path)
    if stream.torn:
        raise CheckpointError(
            f"{stream.path}: line {len(stream.records) + 1}: torn record "
            f"({stream.torn_bytes} bytes) at the end of the stream"
        )
    return stream.records


def strip_timing(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records without wall-clock fields: what must match between equivalent runs."""
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records]

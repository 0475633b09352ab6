"""The exception hierarchy of iqtrain.

Every error a user can cause is an :class:`IQTrainError`. The Rust extension raises the same
classes (it imports them from here with ``pyo3::import_exception!``), so one ``except`` clause
covers both halves of the data path.
"""

from __future__ import annotations

__all__ = [
    "IQTrainError",
    "ConfigError",
    "DataError",
    "CursorMismatchError",
    "WindowTooLongError",
    "NonFiniteError",
    "CheckpointError",
    "TrainingError",
    "StorageError",
]


class IQTrainError(Exception):
    """Base class of every iqtrain error."""


class ConfigError(IQTrainError, ValueError):
    """A configuration value is missing, unknown, mistyped or out of range (names the key)."""


class DataError(IQTrainError):
    """A recording or its metadata cannot be used (names the file and the field)."""


class CursorMismatchError(DataError):
    """A loader cursor does not belong to this dataset, window or stride."""


class WindowTooLongError(DataError):
    """No recording (or capture segment) of a dataset is as long as one window."""


class NonFiniteError(IQTrainError, ArithmeticError):
    """A loss, gradient norm or tensor is NaN or infinite."""


class CheckpointError(IQTrainError):
    """A checkpoint, manifest or attempt directory fails verification."""


class TrainingError(IQTrainError):
    """A failure while an attempt was running (exit code 1; the attempt stays verifiable)."""


class StorageError(TrainingError):
    """Writing evidence failed (disk full, I/O error, file too large); names the file.

    Whatever was written before stays intact: a checkpoint is never left half-written under its
    real name and the metric stream never keeps a torn record.
    """

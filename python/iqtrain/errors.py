"""The exception hierarchy of iqtrain.

Every error a user can cause is an :class:`IQTrainError`. The Rust extension raises the same
classes (it imports them from here with ``pyo3::import_exception!``), so one ``except`` clause
covers both halves of the data path.

Each class carries the exit code the ``iqtrain`` command ends with when it reaches the top
(docs/design.md "Exit codes"): 2 for input a user can fix before anything exists (config, data,
a checkpoint or attempt that fails verification), 1 for a failure of a run. :func:`exit_code`
is the one lookup every caller uses (the CLI, the ranks' agreement).

A wrong argument to a Python call is no iqtrain error: a ``TypeError`` or ``ValueError`` naming
the argument (:func:`int_argument`, the integer rule); :class:`ConfigError` is a config value or
a command-line flag. Where a flag or a config key reaches such a call, its boundary turns the
argument's error into a ConfigError naming the flag or key (:func:`as_config_error`).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator, Mapping
from typing import SupportsIndex

__all__ = [
    "IQTrainError",
    "ConfigError",
    "DataError",
    "CursorMismatchError",
    "NoLabelledWindowError",
    "RecordingsRefused",
    "WindowTooLongError",
    "InputError",
    "ObjectiveError",
    "NonFiniteError",
    "CheckpointError",
    "TrainingError",
    "StorageError",
    "as_config_error",
    "exit_code",
    "int_argument",
    "one_line",
]

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2


class IQTrainError(Exception):
    """Base class of every iqtrain error."""

    exit_code = EXIT_FAILURE


class ConfigError(IQTrainError, ValueError):
    """A configuration value is missing, unknown, mistyped or out of range (names the key)."""

    exit_code = EXIT_BAD_INPUT


class DataError(IQTrainError):
    """A recording or its metadata cannot be used (names the file and the field)."""

    exit_code = EXIT_BAD_INPUT


class CursorMismatchError(DataError):
    """A loader cursor does not belong to this dataset, window or stride."""


class WindowTooLongError(DataError):
    """No recording (or capture segment) of a dataset is as long as one window."""


class RecordingsRefused(DataError):
    """Recordings of a dataset that cannot be read, every one at once: ``problems`` holds
    ``(path, one line)`` of each (docs/design.md "Recordings, capture segments, windows"). The
    message is that line when there is
    one, else a count and the first :data:`SHOWN` lines; :meth:`context` names the data list
    and the setting that reads the rest instead."""

    SHOWN = 20

    def __init__(
        self, problems: list[tuple[str, str]], total: int, where: str = "", hint: str = ""
    ):
        # One line each, whatever a path or a field holds (a name may hold a newline).
        self.problems = [(path, one_line(line)) for path, line in problems]
        self.total = total
        self.where = where
        self.hint = hint
        n = len(self.problems)
        head = f"{where}: " if where else ""
        tail = f" ({hint})" if hint else ""
        if n == 1:  # one line, as every refusal of one file is
            super().__init__(f"{head}{self.problems[0][1]}{tail}")
            return
        lines = [f"{head}{n} of {total} recording(s) cannot be read{tail}:"]
        lines += [f"  {line}" for _, line in self.problems[: self.SHOWN]]
        if n > self.SHOWN:
            lines.append(f"  ... and {n - self.SHOWN} more")
        super().__init__("\n".join(lines))

    def context(self, where: str, hint: str = "") -> RecordingsRefused:
        """The same refusal, said of data list ``where`` with ``hint``."""
        return RecordingsRefused(self.problems, self.total, where, hint)


def one_line(text: str) -> str:
    """``text`` on one line: its line breaks escaped (``\\n``), for a message that names what
    a user's data holds (a file name, a member of an archive may hold a newline)."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


class NoLabelledWindowError(DataError):
    """No annotation that carries the label key holds a whole window (``labelled_windows``)."""


class InputError(DataError, ValueError):
    """An array given to a pretrained model has the wrong shape or dtype (names the window the
    model expects); a ValueError too, as a Python API's argument error."""


class ObjectiveError(IQTrainError, ValueError):
    """A model is asked for what its objective does not give (``score`` of a classifier,
    ``predict`` of a pretraining model): names the model and the objectives that give it; a
    ValueError too, as a Python API's misuse."""

    exit_code = EXIT_BAD_INPUT


class NonFiniteError(IQTrainError, ArithmeticError):
    """A loss, gradient norm or tensor is NaN or infinite."""


class CheckpointError(IQTrainError):
    """A checkpoint, manifest or attempt directory fails verification."""

    exit_code = EXIT_BAD_INPUT


class TrainingError(IQTrainError):
    """A failure while an attempt was running (exit code 1; the attempt stays verifiable)."""


class StorageError(TrainingError):
    """Writing evidence failed (disk full, I/O error, file too large); names the file.

    Whatever was written before stays intact: a checkpoint is never left half-written under its
    real name and the metric stream never keeps a torn record.
    """


def exit_code(exc: BaseException) -> int:
    """The exit code ``exc`` ends the command with: its class's (or, for :class:`Interrupted
    <iqtrain.console.Interrupted>` and a rank's agreed exit, the instance's) ``exit_code``;
    1 for anything else (an ``OSError`` that escaped, a bug)."""
    code = getattr(exc, "exit_code", EXIT_FAILURE)
    return code if isinstance(code, int) and not isinstance(code, bool) else EXIT_FAILURE


def int_argument(name: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """``value``, the argument ``name``, as a Python int within ``[minimum, maximum]``: an int or
    a numpy integer (anything with ``__index__``), not a bool (nor ``8.0`` or ``"8"``). A
    TypeError naming ``name`` for a value of another type, a ValueError naming it for one out of
    range (the rule of every setting too: :func:`iqtrain.config.sections.require_int`)."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TypeError(f"{name}: must be an integer, got {value!r}")
    try:
        v = operator.index(value)  # numpy's bool has __index__ and refuses here
    except TypeError:
        raise TypeError(f"{name}: must be an integer, got {value!r}") from None
    if v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    if maximum is not None and v > maximum:
        raise ValueError(f"{name}: must be <= {maximum}, got {v}")
    return v


@contextlib.contextmanager
def as_config_error(rename: Mapping[str, str] | None = None, prefix: str = "") -> Iterator[None]:
    """Around a call that takes config values or flags as arguments: the ``TypeError`` or
    ``ValueError`` of a bad argument (its message starts ``name: ``) becomes a
    :class:`ConfigError`, ``prefix`` and the same line, so the command ends in that one line and
    exit 2. With ``rename`` (an argument's name -> the flag or key it came from), only an
    argument ``rename`` holds is turned, and said of its flag or key. An iqtrain error, and any
    other error, passes as it is."""
    try:
        yield
    except IQTrainError:
        raise
    except (TypeError, ValueError) as exc:
        line = str(exc)
        if rename is not None:
            name, sep, rest = line.partition(": ")
            if not sep or name not in rename:
                raise
            line = f"{rename[name]}: {rest}"
        raise ConfigError(f"{prefix}{line}") from None

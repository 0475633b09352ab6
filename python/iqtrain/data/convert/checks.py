"""What every reader of ``iqtrain convert`` checks its source with, and how it names a value.

A source is a regular file (:func:`regular_file`), its samples float32 (:func:`is_float32`) and
finite (:func:`check_iq`), an SNR within :data:`MAX_ABS_SNR_DB`; a message is one line
(:func:`one_line`) showing a value of any size or depth by a bounded repr (:func:`short`).
Imports no torch.
"""

from __future__ import annotations

import os
import reprlib
import stat
from pathlib import Path
from typing import Any

import numpy as np

from iqtrain.errors import DataError

__all__ = [
    "MAX_ABS_SNR_DB",
    "check_iq",
    "is_float32",
    "one_line",
    "regular_file",
    "short",
    "source_info",
    "twice",
]

#: The largest |SNR| in dB a RadioML 2016 key or a RadioML 2018 ``Z`` may hold (the datasets
#: span -20..30 dB): a larger one is a damaged source, refused before it can wrap or overflow
#: the int64 it is written as.
MAX_ABS_SNR_DB = 1000


def one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return " ".join(str(exc).split())[:300] or type(exc).__name__


class _ShortRepr(reprlib.Repr):
    """repr for one line: a pickle's values nest and grow as they like (repr of a key thousands
    of tuples deep recurses past the interpreter's limit); this one stops at 6 levels and 80
    characters per item."""

    def __init__(self) -> None:
        super().__init__()
        self.maxtuple = self.maxlist = self.maxdict = self.maxset = self.maxfrozenset = 20
        self.maxstring = self.maxlong = self.maxother = 80

    repr_bytes = reprlib.Repr.repr_str  # slices, as for a str: never the whole of a big one


_REPR = _ShortRepr()


def short(value: object) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def twice(path: Path, key: object, how: str = "") -> DataError:
    """``<file>: key K appears twice``: a dict keeps one value of a key given twice, and the
    rows of the other would be lost without a word."""
    return DataError(f"{path}: key {short(key)} appears twice{how}")


def regular_file(value: object, key: str) -> tuple[Path, int]:
    """``value`` (the argument ``key``) as the path of a regular file, and its size in bytes:
    a FIFO would block, a character device (``/dev/zero``) never end, a directory is a
    mistake."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{key}: must be a path, got {value!r}")
    path = Path(value)
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {one_line(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{path}: not a regular file")
    return path, st.st_size


def source_info(path: Path, size: int, sha256: str | None) -> dict[str, Any]:
    """convert.json's ``source``: the file's name, absolute path, bytes and SHA-256 (None where
    the source is not read a second time to hash it)."""
    return {"name": path.name, "path": os.path.abspath(path), "bytes": size, "sha256": sha256}


def is_float32(dtype: np.dtype) -> bool:
    # Either byte order (written as <f4); a float32 with fields or a subarray is not one.
    return dtype.kind == "f" and dtype.itemsize == 4 and dtype.fields is None and not dtype.shape


def check_iq(path: Path, where: str, iq: np.ndarray, first_row: int = 0) -> None:
    finite = np.isfinite(iq).reshape(len(iq), -1).all(axis=1)
    if not finite.all():
        row = first_row + int(np.flatnonzero(~finite)[0])
        raise DataError(f"{path}: {where} row {row}: non-finite sample (NaN or infinity)")

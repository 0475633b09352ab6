"""RadioML 2018.01A (``GOLD_XYZ_OSC.0001_1024.hdf5``) as labelled SigMF (docs/data.md "RadioML").

HDF5 with ``X`` float32 [N, 1024, 2] (I, Q), ``Y`` int one-hot [N, 24], ``Z`` int [N, 1] (SNR
dB), read :data:`RML2018_CHUNK` examples at a time (the file is 20 GB) in the file's own row
order. The layout, and that X, Y, Z are stored whole in the file (not virtual, not external,
no chunk unwritten), are checked before anything is written. The class names are not in the
file, and the ``classes.txt`` distributed with it does not match ``Y``:
:data:`RML2018_CLASSES` is the paper's order, or a class list file gives one name per line (as
many as ``Y`` has columns). Imports no torch; h5py only inside :func:`convert_radioml2018`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from iqtrain.data.convert.checks import (
    MAX_ABS_SNR_DB,
    check_iq,
    is_float32,
    one_line,
    regular_file,
    short,
    source_info,
)
from iqtrain.data.convert.output import Batch, ConvertResult, Kind, convert
from iqtrain.data.convert.publish import check_out_dir
from iqtrain.errors import ConfigError, DataError

__all__ = [
    "MAX_CLASSES_BYTES",
    "RML2018",
    "RML2018_CHUNK",
    "RML2018_CLASSES",
    "ClassCountError",
    "convert_radioml2018",
]

RML2018 = Kind("radioml2018", "RadioML 2018.01A", 1024)

#: RadioML 2018.01A examples read from the HDF5 file at a time (32 MiB of X).
RML2018_CHUNK = 4096

#: The column order of RadioML 2018.01A's one-hot ``Y``: the class list of the dataset's paper,
#: T. O'Shea, T. Roy, T. C. Clancy, "Over-the-Air Deep Learning Based Radio Signal
#: Classification", IEEE JSTSP 12(1), 2018. The classes.txt shipped with the dataset lists
#: another order that does not match Y (github.com/radioML/dataset, issue 25).
RML2018_CLASSES = (
    "OOK",
    "4ASK",
    "8ASK",
    "BPSK",
    "QPSK",
    "8PSK",
    "16PSK",
    "32PSK",
    "16APSK",
    "32APSK",
    "64APSK",
    "128APSK",
    "16QAM",
    "32QAM",
    "64QAM",
    "128QAM",
    "256QAM",
    "AM-SSB-WC",
    "AM-SSB-SC",
    "AM-DSB-WC",
    "AM-DSB-SC",
    "FM",
    "GMSK",
    "OQPSK",
)

#: The largest class list file read, in bytes (a class list is a few hundred).
MAX_CLASSES_BYTES = 1 << 20


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ConfigError("radioml2018 needs h5py: pip install 'iqtrain[radioml]'") from None
    return h5py


def _read_classes(classes_file: str | os.PathLike) -> tuple[str, ...]:
    path, size = regular_file(classes_file, "classes_file")
    if size > MAX_CLASSES_BYTES:
        raise DataError(
            f"{path}: {size} bytes, more than a class list may have ({MAX_CLASSES_BYTES})"
        )
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CLASSES_BYTES + 1)  # it may have grown since
        text = data.decode("utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {one_line(exc)}") from None
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text (one class name per line)") from None
    if len(data) > MAX_CLASSES_BYTES:
        raise DataError(f"{path}: more than a class list may have ({MAX_CLASSES_BYTES} bytes)")
    names = tuple(line.strip() for line in text.splitlines() if line.strip())
    if not names:
        raise DataError(f"{path}: no class names (one per line)")
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DataError(f"{path}: class {name!r} is listed twice")
        seen.add(name)
    return names


_RML2018_LAYOUT = "RadioML 2018.01A: X float32 [N, 1024, 2], Y int one-hot [N, 24], Z int [N, 1]"


def _dataset(h5py: Any, path: Path, f: Any, name: str) -> Any:
    try:
        link = f.get(name, getlink=True)
        ds = None if isinstance(link, h5py.ExternalLink) else f.get(name)
    except (RuntimeError, KeyError, OSError, ValueError) as exc:  # a soft link to itself
        raise DataError(f"{path}: cannot open {name}: {one_line(exc)}") from None
    if isinstance(link, h5py.ExternalLink) or (
        isinstance(ds, h5py.Dataset) and ds.id.fileno != f.id.fileno  # a soft link to one
    ):
        raise DataError(f"{path}: {name} is a link into another file (convert reads only this one)")
    if not isinstance(ds, h5py.Dataset):
        raise DataError(f"{path}: no dataset {name!r} ({_RML2018_LAYOUT})")
    if ds.shape is None:  # an empty dataspace (h5py.Empty): no shape, no data
        raise DataError(f"{path}: {name} has an empty dataspace (no shape; {_RML2018_LAYOUT})")
    return ds


def _check_stored(path: Path, name: str, ds: Any) -> None:
    """Refuse a dataset whose data is not all stored in ``path``: HDF5 reads what is not there
    (a virtual dataset's missing source, a chunk never written) as the fill value, zeros,
    without an error; external storage is another file, found from wherever convert runs."""
    if ds.is_virtual:
        why = "is a virtual dataset (mapped from other files; a missing one reads as zeros)"
    elif ds.external:
        why = f"has external storage (its data is in {short(ds.external[0][0])})"
    elif ds.chunks is not None:  # compressed chunks hold fewer bytes: count them instead
        want = math.prod(-(-n // c) for n, c in zip(ds.shape, ds.chunks, strict=True))
        have = ds.id.get_num_chunks()
        why = f"has {have} of its {want} chunks written (the others read as zeros)"
        why = why if have < want else ""
    else:  # contiguous (0 bytes until written) or compact
        have = ds.id.get_storage_size()
        why = f"has {have} of its {ds.nbytes} bytes stored (never written: it reads as zeros)"
        why = why if have < ds.nbytes else ""
    if why:
        raise DataError(f"{path}: {name} {why}; convert takes only data stored whole in it")


def _rml2018_layout(h5py: Any, path: Path, f: Any) -> tuple[Any, Any, Any]:
    x, y, z = (_dataset(h5py, path, f, name) for name in ("X", "Y", "Z"))
    n = x.shape[0] if len(x.shape) == 3 else 0
    checks = (
        ("X", x, (n, RML2018.example_len, 2), is_float32(x.dtype)),
        ("Y", y, (n, y.shape[-1] if y.shape else 0), np.issubdtype(y.dtype, np.integer)),
        ("Z", z, (n, 1), np.issubdtype(z.dtype, np.integer)),
    )
    for name, ds, shape, dtype_ok in checks:
        if n < 1 or ds.shape != shape or not dtype_ok:
            raise DataError(
                f"{path}: {name} is {ds.dtype} {list(ds.shape)}, not the layout of "
                f"{_RML2018_LAYOUT} (N >= 1 and equal)"
            )
    for name, ds, _, _ in checks:
        _check_stored(path, name, ds)
    return x, y, z


class ClassCountError(DataError):
    """``Y`` of ``path`` has ``width`` columns, not one per name of the RadioML 2018.01A class
    list (of ``listed``): another class list is needed, ``width`` names in a file. How to give
    it is the caller's to say (``classes_file`` here; the command names its own flag)."""

    def __init__(self, path: Path, width: int, listed: int) -> None:
        self.path, self.width, self.listed = path, width, listed
        super().__init__(f"{self.mismatch}; pass classes_file with {width} names, one per line")

    @property
    def mismatch(self) -> str:
        """``<file>: Y has C columns, the RadioML 2018.01A class list 24``."""
        return (
            f"{self.path}: Y has {self.width} columns, the RadioML 2018.01A class list "
            f"{self.listed}"
        )


def _check_width(path: Path, y: Any, classes: tuple[str, ...], classes_file: object) -> None:
    width = y.shape[1]
    if width == len(classes):
        return
    if classes_file is None:
        raise ClassCountError(path, width, len(classes))
    raise DataError(
        f"{classes_file}: {len(classes)} class names, but Y in {path} has {width} columns"
    )


def _one_hot_index(path: Path, onehot: np.ndarray, first_row: int) -> np.ndarray:
    ones = onehot == 1
    good = (ones.sum(axis=1) == 1) & (ones | (onehot == 0)).all(axis=1)
    if not good.all():
        bad = int(np.flatnonzero(~good)[0])
        raise DataError(
            f"{path}: Y row {first_row + bad} is not one-hot (exactly one 1, the rest 0): "
            f"{onehot[bad].tolist()}"
        )
    return ones.argmax(axis=1)


def _read_rows(path: Path, ds: tuple[Any, Any, Any], a: int, b: int) -> list[np.ndarray]:
    try:
        return [np.asarray(d[a:b]) for d in ds]
    except (OSError, RuntimeError, ValueError) as exc:  # a damaged or truncated file
        raise DataError(f"{path}: cannot read rows {a}..{b - 1}: {one_line(exc)}") from None


def _snr_column(path: Path, z: np.ndarray, first_row: int) -> np.ndarray:
    """``Z`` (any integer dtype) as int64, every value within :data:`MAX_ABS_SNR_DB` (a uint64
    of 2**63 would wrap to a negative int64)."""
    bad = (z < -MAX_ABS_SNR_DB) | (z > MAX_ABS_SNR_DB)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{path}: Z row {first_row + row}: SNR {int(z[row])} dB is out of range "
            f"(|SNR| <= {MAX_ABS_SNR_DB} dB)"
        )
    return z.astype(np.int64)


def _rml2018_batches(
    path: Path, ds: tuple[Any, Any, Any], classes: tuple[str, ...]
) -> Iterator[Batch]:
    names = np.array(classes, dtype=object)
    n = ds[0].shape[0]
    for a in range(0, n, RML2018_CHUNK):
        b = min(n, a + RML2018_CHUNK)
        iq, onehot, snr = _read_rows(path, ds, a, b)
        index = _one_hot_index(path, onehot, a)
        check_iq(path, "X", iq, a)
        snrs = _snr_column(path, snr[:, 0], a)
        yield Batch(iq, names[index], snrs, np.arange(a, b, dtype=np.int64))


def convert_radioml2018(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    classes_file: str | os.PathLike | None = None,
    *,
    class_order: str | None = None,
) -> ConvertResult:
    """Convert RadioML 2018.01A (``GOLD_XYZ_OSC.0001_1024.hdf5``) into labelled SigMF.

    Labels are :data:`RML2018_CLASSES` by Y's column, or the names of ``classes_file`` (one a
    line, as many as Y has columns). The layout is checked before anything is written; the
    examples are read and written :data:`RML2018_CHUNK` at a time, so a bad Y row (not exactly
    one 1) or a non-finite sample found on the way is a DataError naming the file and row, and
    leaves no ``out_dir``. Needs h5py (``pip install 'iqtrain[radioml]'``; a ConfigError
    without it). Errors as :func:`~iqtrain.data.convert.rml2016.convert_radioml2016`; a ``Y``
    wider or narrower than the default class list is a :class:`ClassCountError`.
    ``class_order``: where the names' order comes from, as convert.json records it (default:
    the paper, or ``classes_file`` and its absolute path).
    """
    path, size = regular_file(source, "source")
    out = check_out_dir(out_dir)
    classes = RML2018_CLASSES if classes_file is None else _read_classes(classes_file)
    h5py = _import_h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file: {one_line(exc)}") from None
    with f:
        ds = _rml2018_layout(h5py, path, f)
        _check_width(path, ds[1], classes, classes_file)
        if class_order is not None:
            order = class_order
        elif classes_file is not None:
            order = f"classes_file {os.path.abspath(classes_file)}"
        else:
            order = "O'Shea, Roy, Clancy, IEEE JSTSP 2018 (radioML/dataset issue 25)"
        info = source_info(path, size, None)
        batches = _rml2018_batches(path, ds, classes)
        return convert(RML2018, out, batches, classes, info, order)

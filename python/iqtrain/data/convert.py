"""The field's modulation datasets as labelled SigMF (``iqtrain convert radioml2016|radioml2018``).

Sources, read exactly as distributed:

- RadioML 2016.10A (``RML2016.10a_dict.pkl``): a Python 2 pickle of ``{(modulation, snr):
  float32 ndarray [N, 2, 128]}``, row 0 = I, row 1 = Q; modulation names are Python 2 str
  (read with ``encoding="latin1"``; bytes names are decoded the same way), SNR an int in dB.
  A pickle is code: it is loaded by :class:`_RestrictedUnpickler`, whose ``find_class`` hands
  out only inert stand-ins for numpy's array reconstruction (``numpy.ndarray``,
  ``numpy.dtype``, ``_reconstruct`` under ``numpy.core.multiarray`` and
  ``numpy._core.multiarray``) and for ``_codecs.encode`` limited to latin1 on a str (how a
  Python 3 protocol-2 pickle spells bytes), never numpy's own callables: they take exactly the
  state numpy pickles for a plain number dtype and array, and the arrays are built here (np.dtype,
  np.frombuffer). Any other global is a DataError naming the file and the global, and nothing of
  it runs; any other state (fields, objects, a subarray, sizes that do not match the data) is a
  DataError too.
- RadioML 2018.01A (``GOLD_XYZ_OSC.0001_1024.hdf5``): HDF5 with ``X`` float32 [N, 1024, 2]
  (I, Q), ``Y`` int one-hot [N, 24], ``Z`` int [N, 1] (SNR dB), read :data:`RML2018_CHUNK`
  examples at a time (the file is 20 GB). The class names are not in the file, and the
  ``classes.txt`` distributed with it does not match ``Y``: :data:`RML2018_CLASSES` is the
  paper's order, or ``--classes FILE`` gives one name per line (as many as ``Y`` has columns).

Output: ``OUT_DIR/<dataset>_<NNNNN>.sigmf-meta/-data`` (dataset ``radioml2016`` or
``radioml2018``), ``cf32_le`` (the float32 samples bit for bit), examples back to back, at most
:data:`MAX_RECORDING_SAMPLES` samples per recording; every example is one capture (so no
training window runs across two unrelated examples) and one annotation with ``core:label`` (the
dataset's own name), ``iqtrain:snr_db`` (int) and ``iqtrain:source_row`` (its row in the
source: in the (modulation, snr) array for 2016, in ``X`` for 2018). Order: radioml2016 by
(modulation, snr) key sorted, rows in array order; radioml2018 in the file's own row order.
``core:sample_rate`` is 1.0, i.e. normalised frequency: neither dataset states a sample rate per
example. ``OUT_DIR/convert.json`` records the source (name, path, bytes; sha256 for the pickle,
hashed while it is read), the dataset, classes, counts and the tool version.

Everything is checked before anything is written where it can be (arguments, OUT_DIR, the
whole pickle, the HDF5 layout and that X, Y, Z are stored whole in the file: not virtual, not
external, no chunk unwritten), and written under ``OUT_DIR.tmp-<pid>`` (a sibling) that is
renamed to ``OUT_DIR`` at the end: a failure (a bad ``Y`` row found in the middle, a full disk,
a signal) removes it, and leaves no ``OUT_DIR``. An ``OUT_DIR`` that exists and is not empty, a
symbolic link or a mount point is refused.
Imports no torch; h5py only inside :func:`convert_radioml2018`.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import reprlib
import shutil
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sigmf import SigMFFile

from iqtrain.errors import ConfigError, DataError
from iqtrain.storage import (
    creatable_dir,
    discard_dir,
    fsync_dir,
    fsync_file,
    missing_dirs,
    storage_error,
    write_json_atomic,
)

__all__ = [
    "MAX_ABS_SNR_DB",
    "MAX_RECORDING_SAMPLES",
    "RML2018_CLASSES",
    "ConvertResult",
    "convert_radioml2016",
    "convert_radioml2018",
]

#: Samples per written recording at most (8 MiB of cf32_le): 8192 RadioML 2016 examples, 1024
#: RadioML 2018 examples. A recording holds whole examples only.
MAX_RECORDING_SAMPLES = 1 << 20

#: RadioML 2018.01A examples read from the HDF5 file at a time (32 MiB of X).
RML2018_CHUNK = 4096

#: The largest |SNR| in dB a RadioML 2016 key or a RadioML 2018 ``Z`` may hold (the datasets
#: span -20..30 dB): a larger one is a damaged source, refused before it can wrap or overflow
#: the int64 it is written as.
MAX_ABS_SNR_DB = 1000

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

#: The largest ``--classes`` file read, in bytes (a class list is a few hundred).
MAX_CLASSES_BYTES = 1 << 20

#: Written as core:sample_rate: normalised frequency (the datasets state no rate per example).
SAMPLE_RATE = 1.0

_EXT_NAME = "iqtrain"
_EXT_VERSION = "1.0.0"
_DATATYPE = "cf32_le"
_T = TypeVar("_T")


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: ``recordings`` SigMF recordings of ``examples`` examples in
    ``out_dir``; ``classes`` the dataset's class names (2016: sorted; 2018: Y's column order)."""

    out_dir: Path
    recordings: int
    examples: int
    classes: tuple[str, ...]


@dataclass(frozen=True)
class _Kind:
    name: str  # file prefix and sidecar "dataset"
    title: str
    example_len: int  # samples per example


_RML2016 = _Kind("radioml2016", "RadioML 2016.10A", 128)
_RML2018 = _Kind("radioml2018", "RadioML 2018.01A", 1024)


@dataclass(frozen=True)
class _Batch:
    """Consecutive examples: ``iq`` [k, L, 2] float32 (I, Q), and per example its label (object
    array of str), SNR in dB and row in the source."""

    iq: np.ndarray
    labels: np.ndarray
    snrs: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.iq)

    def part(self, a: int, b: int) -> _Batch:
        return _Batch(self.iq[a:b], self.labels[a:b], self.snrs[a:b], self.rows[a:b])


@dataclass
class _Tally:
    recordings: int = 0
    examples: int = 0
    per_class: Counter[str] = field(default_factory=Counter)
    snrs: set[int] = field(default_factory=set)


def _one_line(exc: BaseException) -> str:
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


def _short(value: object) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _twice(path: Path, key: object, how: str = "") -> DataError:
    """``<file>: key K appears twice``: a dict keeps one value of a key given twice, and the
    rows of the other would be lost without a word."""
    return DataError(f"{path}: key {_short(key)} appears twice{how}")


# --------------------------------------------------------------------------------------------
# Arguments


def _regular_file(value: object, key: str) -> tuple[Path, int]:
    """``value`` (the argument ``key``) as the path of a regular file, and its size in bytes:
    a FIFO would block, a character device (``/dev/zero``) never end, a directory is a
    mistake."""
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{key}: must be a path, got {value!r}")
    path = Path(value)
    try:
        st = path.stat()
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {_one_line(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{path}: not a regular file")
    return path, st.st_size


def _tmp_dir(out: Path) -> Path:
    """Where :func:`_publish` writes ``out`` before renaming it: ``OUT_DIR.tmp-<pid>``."""
    return out.with_name(f"{out.name}.tmp-{os.getpid()}")


def _check_out_dir(out_dir: object) -> Path:
    """``out_dir`` made absolute: absent or an empty directory that a new directory can be
    renamed onto, whose temporary sibling (:func:`_tmp_dir`) can be created: all of it checked
    before the source is read, so no conversion fails at its end for the want of a place."""
    if not isinstance(out_dir, str | os.PathLike):
        raise ConfigError(f"out_dir: must be a path, got {out_dir!r}")
    out = Path(os.path.abspath(out_dir))
    try:
        st = os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):  # absent; creatable_dir says what is wrong
        pass
    except OSError as exc:  # a parent that is a symlink loop, a name too long
        raise ConfigError(f"{out}: cannot be created: {_one_line(exc)}") from None
    else:
        _check_existing_out(out, st)
    why = creatable_dir(_tmp_dir(out))
    if why is not None:
        raise ConfigError(f"{out}: cannot be created: {why}")
    return out


def _check_existing_out(out: Path, st: os.stat_result) -> None:
    """An ``out`` that exists must be an empty directory the new one can be renamed onto
    (rename(2) replaces neither a symbolic link by a directory nor a mount point)."""
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{out}: is a symbolic link (convert renames a new directory onto OUT_DIR; name "
            "the directory itself)"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{out}: exists and is not a directory")
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        raise ConfigError(f"{out}: cannot read: {_one_line(exc)}") from None
    if not empty:
        raise ConfigError(f"{out}: exists and is not empty (convert writes a new directory)")
    if os.path.ismount(out):
        raise ConfigError(
            f"{out}: is a mount point (convert renames a new directory onto OUT_DIR, which "
            "cannot replace a mount point; name a directory inside it)"
        )


# --------------------------------------------------------------------------------------------
# Writing: recordings under OUT_DIR.tmp-<pid>, renamed to OUT_DIR at the end


def _recording_meta(kind: _Kind, first: int, batch: _Batch, data: bytes) -> SigMFFile:
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
                "core:extensions": [{"name": _EXT_NAME, "version": _EXT_VERSION, "optional": True}],
            },
            "captures": [{"core:sample_start": start} for start in starts],
            "annotations": annotations,
        }
    )
    # sigmf computes core:sha512 over the buffer here and writes the buffer in tofile().
    meta.set_data_file(data_buffer=io.BytesIO(data))
    return meta


def _write_recording(tmp: Path, kind: _Kind, tally: _Tally, batch: _Batch) -> None:
    base = tmp / f"{kind.name}_{tally.recordings:05d}"
    data = np.ascontiguousarray(batch.iq, dtype="<f4").tobytes()  # interleaved I, Q
    meta = _recording_meta(kind, tally.examples, batch, data)
    files = [base.with_name(base.name + suffix) for suffix in (".sigmf-meta", ".sigmf-data")]
    try:
        meta.tofile(base)  # validates against the SigMF schema first
        for path in files:
            fsync_file(path)
    except OSError as exc:  # a full disk: the whole temporary directory goes
        raise storage_error(files[1], exc) from None
    tally.recordings += 1
    tally.examples += len(batch)
    tally.per_class.update(batch.labels.tolist())
    tally.snrs.update(batch.snrs.tolist())


def _write_batches(tmp: Path, kind: _Kind, batches: Iterable[_Batch]) -> _Tally:
    """Write the examples in order, whole ones, at most MAX_RECORDING_SAMPLES per recording."""
    per = max(1, MAX_RECORDING_SAMPLES // kind.example_len)
    tally = _Tally()
    pending: list[_Batch] = []
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


def _concat(parts: list[_Batch]) -> _Batch:
    if len(parts) == 1:
        return parts[0]
    return _Batch(
        np.concatenate([p.iq for p in parts]),
        np.concatenate([p.labels for p in parts]),
        np.concatenate([p.snrs for p in parts]),
        np.concatenate([p.rows for p in parts]),
    )


def _publish(out: Path, write: Callable[[Path], _T]) -> _T:
    """``write(tmp)`` into a fresh ``OUT_DIR.tmp-<pid>``, then renamed to ``out``; on any failure
    the temporary directory (and the parents made for it) are removed and ``out`` stays absent."""
    tmp = _tmp_dir(out)
    created = missing_dirs(tmp)
    try:
        shutil.rmtree(tmp, ignore_errors=True)  # our own name: a leftover of an earlier pid
        tmp.mkdir(parents=True)
        result = write(tmp)
        fsync_dir(tmp)
        os.rename(tmp, out)  # onto an empty OUT_DIR too
    except OSError as exc:
        discard_dir(tmp, created)
        raise storage_error(out, exc) from None
    except BaseException:
        discard_dir(tmp, created)
        raise
    try:
        fsync_dir(out.parent)  # OUT_DIR is complete now: a failure here does not remove it
    except OSError as exc:
        raise storage_error(out, exc) from None
    return result


def _sidecar(
    kind: _Kind, source: dict[str, Any], classes: tuple[str, ...], tally: _Tally
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


def _convert(
    kind: _Kind,
    out: Path,
    batches: Iterable[_Batch],
    classes: tuple[str, ...],
    source: dict[str, Any],
    class_order: str,
) -> ConvertResult:
    def write(tmp: Path) -> _Tally:
        tally = _write_batches(tmp, kind, batches)
        sidecar = _sidecar(kind, source, classes, tally) | {"class_order": class_order}
        write_json_atomic(tmp / "convert.json", sidecar)
        return tally

    tally = _publish(out, write)
    return ConvertResult(out, tally.recordings, tally.examples, classes)


def _source_info(path: Path, size: int, sha256: str | None) -> dict[str, Any]:
    return {"name": path.name, "path": os.path.abspath(path), "bytes": size, "sha256": sha256}


# --------------------------------------------------------------------------------------------
# RadioML 2016.10A: a restricted unpickler, then the structure
#
# A pickle never gets numpy itself: BUILD would hand attacker-chosen state to the real
# dtype.__setstate__ / ndarray.__setstate__ (a dtype whose fields are objects makes numpy read
# file bytes as object pointers). find_class hands out inert stand-ins instead, instances of
# __slots__ classes whose classes no opcode can reach (so NEWOBJ has no type to instantiate),
# and BUILD reaches only their __setstate__, which takes numpy's exact pickled state of a plain
# number dtype or array (or refuses). The arrays themselves are built by this code, with
# np.frombuffer from a dtype made by np.dtype("<f4") and the like.

#: Type codes a pickled ``numpy.dtype(code, False, True)`` may have: plain numbers, no fields,
#: subarray, objects or metadata. float32 is the dataset's; the others are taken only so that
#: the structure check can name them ("got float64 [...]").
_PLAIN_CODES = frozenset(
    ("f2", "f4", "f8", "c8", "c16", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8")
)
#: A plain number dtype's pickled state after (3, order): subarray, names, fields, elsize,
#: alignment, flags (numpy 1 and 2 alike).
_PLAIN_TAIL = (None, None, None, -1, -1, 0)
_NDIM_MAX = 32  # numpy 1's limit (numpy 2: 64)


def _exactly(value: object, want: object) -> bool:
    """``value == want`` and of the same type (1.0 is not 1, True is not 1, None only None)."""
    return type(value) is type(want) and value == want


def _is_flag(value: object, want: int) -> bool:
    """A flag as numpy 1 (Python 2: an int) or numpy 2 (a bool) pickles it."""
    return type(value) in (bool, int) and value == want


class _StandIn:
    """What ``find_class`` returns: no ``__dict__``, no slots, and BUILD on it is refused."""

    __slots__ = ()
    _spelling = "?"

    def __repr__(self) -> str:
        return self._spelling

    def __setstate__(self, state: object) -> None:
        raise pickle.UnpicklingError(f"refused BUILD on {self._spelling} (it takes no state)")


class _NdarrayStandIn(_StandIn):
    """``numpy.ndarray``: only a token for ``_reconstruct``'s first argument (not callable)."""

    __slots__ = ()
    _spelling = "numpy.ndarray"


class _DtypeStub:
    """A ``numpy.dtype(code, False, True)`` of the pickle, until BUILD gives it numpy's state."""

    __slots__ = ("_code", "dtype")

    def __init__(self, code: str) -> None:
        self._code = code
        self.dtype: np.dtype | None = None

    def __repr__(self) -> str:
        return f"numpy.dtype({self._code!r})"

    def __setstate__(self, state: object) -> None:
        if self.dtype is not None:
            raise pickle.UnpicklingError("refused a second state for one numpy.dtype")
        self.dtype = _plain_dtype(self._code, state)


def _plain_dtype(code: str, state: object) -> np.dtype:
    """The dtype of a plain number's state ``(3, order, None, None, None, -1, -1, 0)``: what
    numpy 1 and 2 pickle for one (order ``<`` or ``>``, ``|`` for a 1-byte type; ``=`` taken
    too); fields, subarray, object flags, sizes or metadata are refused."""
    size = np.dtype(code).itemsize
    orders = ("|",) if size == 1 else ("<", ">", "=")
    if (
        isinstance(state, tuple)
        and len(state) == 8
        and _exactly(state[0], 3)
        and type(state[1]) is str
        and state[1] in orders
        and all(_exactly(a, b) for a, b in zip(state[2:], _PLAIN_TAIL, strict=True))
    ):
        return np.dtype(code if size == 1 else state[1] + code)
    raise pickle.UnpicklingError(
        f"refused numpy.dtype({code!r}) state {_short(state)} (only a plain number's "
        "(3, '<' or '>', None, None, None, -1, -1, 0))"
    )


class _DtypeStandIn(_StandIn):
    """``numpy.dtype``: called as numpy pickles a plain number's dtype, ``(code, False, True)``."""

    __slots__ = ()
    _spelling = "numpy.dtype"

    def __call__(self, *args: object) -> _DtypeStub:
        if (
            len(args) == 3
            and type(args[0]) is str
            and args[0] in _PLAIN_CODES
            and _is_flag(args[1], 0)
            and _is_flag(args[2], 1)
        ):
            return _DtypeStub(args[0])
        raise pickle.UnpicklingError(
            f"refused numpy.dtype{_short(args)} (only a plain number's (code, False, True))"
        )


class _ArrayStub:
    """An array of ``_reconstruct``, until BUILD gives it numpy's state (then built here)."""

    __slots__ = ("array",)

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __repr__(self) -> str:
        return "numpy array"

    def __setstate__(self, state: object) -> None:
        if self.array is not None:
            raise pickle.UnpicklingError("refused a second state for one numpy array")
        self.array = _array_from_state(state)


def _shape(shape: object, itemsize: int) -> tuple[int, ...]:
    if (
        type(shape) is tuple
        and len(shape) <= _NDIM_MAX
        and all(type(d) is int and d >= 0 for d in shape)
        and math.prod(max(d, 1) for d in shape) * itemsize <= sys.maxsize
    ):
        return shape
    raise pickle.UnpicklingError(
        f"refused numpy array shape {_short(shape)} (a tuple of at most {_NDIM_MAX} ints >= 0, "
        "fewer than 2**63 bytes)"
    )


def _array_from_state(state: object) -> np.ndarray:
    """The array of numpy's state ``(1, shape, dtype, is_fortran, data)``: the dtype one of the
    pickle's plain dtypes, ``data`` exactly the array's bytes (bytes; a Python 2 str, read as
    latin1, is those bytes), in Fortran order when ``is_fortran``. A copy: it owns its memory."""
    if not (isinstance(state, tuple) and len(state) == 5 and _exactly(state[0], 1)):
        raise pickle.UnpicklingError(
            f"refused numpy array state {_short(state)} (only (1, shape, dtype, fortran, data))"
        )
    _, shape, stub, fortran, data = state
    dtype = stub.dtype if isinstance(stub, _DtypeStub) else None
    if dtype is None:
        raise pickle.UnpicklingError(
            f"refused numpy array dtype {_short(stub)} (only a numpy.dtype after its state)"
        )
    shape = _shape(shape, dtype.itemsize)
    if type(data) is str:
        try:
            data = data.encode("latin1")
        except UnicodeEncodeError:
            raise pickle.UnpicklingError("refused numpy array data: not latin1") from None
    if not (_is_flag(fortran, 0) or _is_flag(fortran, 1)) or type(data) is not bytes:
        raise pickle.UnpicklingError(
            f"refused numpy array state: fortran {_short(fortran)}, data {type(data).__name__}"
        )
    if len(data) != math.prod(shape) * dtype.itemsize:
        raise pickle.UnpicklingError(
            f"refused numpy array: {len(data)} bytes of data for {dtype} {list(shape)}"
        )
    flat = np.frombuffer(data, dtype=dtype)
    return flat.reshape(shape, order="F" if fortran else "C").copy()


class _ReconstructStandIn(_StandIn):
    """``numpy.core.multiarray._reconstruct`` (numpy 2: ``numpy._core``): called as numpy
    pickles an array, ``(numpy.ndarray, (0,), b"b")``; returns an :class:`_ArrayStub`."""

    __slots__ = ()
    _spelling = "_reconstruct"

    def __call__(self, *args: object) -> _ArrayStub:
        if (
            len(args) == 3
            and args[0] is _NDARRAY
            and type(args[1]) is tuple
            and len(args[1]) == 1
            and _exactly(args[1][0], 0)
            and (_exactly(args[2], b"b") or _exactly(args[2], "b"))
        ):
            return _ArrayStub()
        raise pickle.UnpicklingError(
            f"refused _reconstruct{_short(args)} (only (numpy.ndarray, (0,), b'b'))"
        )


class _Latin1Encode(_StandIn):
    """``_codecs.encode`` as a Python 3 protocol-2 pickle uses it for bytes, and nothing else."""

    __slots__ = ()
    _spelling = "_codecs.encode"

    def __call__(
        self, text: object, encoding: object = "utf-8", errors: object = "strict"
    ) -> bytes:
        if type(text) is str and encoding in ("latin1", "latin-1") and errors == "strict":
            return text.encode("latin1")
        raise pickle.UnpicklingError(
            f"_codecs.encode({encoding!r}): only latin1 of a str is allowed"
        )


_NDARRAY = _NdarrayStandIn()
_DTYPE = _DtypeStandIn()
_RECONSTRUCT = _ReconstructStandIn()
_ENCODE = _Latin1Encode()

#: All that ``find_class`` gives a pickle (numpy 1 writes ``numpy.core.multiarray``, numpy 2
#: ``numpy._core.multiarray``). numpy's scalar (``...multiarray.scalar``) is not here: the
#: RadioML 2016 keys hold Python ints (its generator's ``range(-20, 20, 2)``), so a key with a
#: numpy integer is refused as that global.
_ALLOWED: dict[tuple[str, str], _StandIn] = {
    ("numpy", "ndarray"): _NDARRAY,
    ("numpy", "dtype"): _DTYPE,
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("_codecs", "encode"): _ENCODE,
}


#: What a dict key may be while unpickling: hashing one (to put it in the dict) cannot recurse.
#: The RadioML keys are (str or bytes, int) tuples, numpy's dtype state has str keys.
_FLAT_KEYS = (str, bytes, int, float, bool, type(None))


def _flat_key(key: object) -> bool:
    """A str, bytes, int, float, bool or None, or a tuple of them: a key nested 10**5 tuples
    deep overflows the C stack when it is hashed, so none reaches a dict."""
    if type(key) is tuple:
        return all(type(item) in _FLAT_KEYS for item in key)
    return type(key) in _FLAT_KEYS


class _Opcodes(dict[int, Callable[[Any], None]]):
    """The unpickler's dispatch table: an opcode it does not have is a damaged pickle (the
    pure-Python unpickler would raise a bare KeyError)."""

    def __missing__(self, code: int) -> Callable[[Any], None]:
        raise pickle.UnpicklingError(f"invalid load key, {bytes([code])!r}")


class _RestrictedUnpickler(pickle._Unpickler):
    """Unpickles numpy arrays in dicts, tuples, str and int; any other global is refused.

    Python's own unpickler (``pickle._Unpickler``, what the C one implements), with the opcodes
    that fill a dict (SETITEM, SETITEMS, DICT) taking each key once and only flat ones
    (:func:`_flat_key`): a key given twice is refused where a dict would keep its last value,
    and a key nested deeper than a hash can recurse never reaches one. Sets (EMPTY_SET,
    ADDITEMS, FROZENSET) hash their items too: a RadioML 2016 pickle has none, they are refused.
    """

    stack: list[Any]  # pickle._Unpickler's, not in its type stub
    pop_mark: Callable[[], list[Any]]
    append: Callable[[Any], None]

    def __init__(self, file: Any, source: Path) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 str: bytes -> str, 1:1
        self._source = source

    def find_class(self, module: str, name: str, /) -> Any:
        found = _ALLOWED.get((module, name))
        if found is None:
            raise DataError(
                f"{self._source}: refused pickle global {module}.{name} (a RadioML 2016 pickle "
                "needs only numpy's array reconstruction; the global was not called)"
            )
        return found

    def _fill(self, target: object, items: list[Any]) -> None:
        if type(target) is not dict:
            raise pickle.UnpicklingError(f"refused SETITEM on {_short(target)} (only on a dict)")
        if len(items) % 2:
            raise pickle.UnpicklingError("refused a dict item without its value")
        for key, value in zip(items[::2], items[1::2], strict=True):
            if not _flat_key(key):
                raise pickle.UnpicklingError(
                    f"refused dict key {_short(key)} (a key is a str, bytes or number, or a "
                    "tuple of them)"
                )
            if key in target:
                raise _twice(self._source, key)
            target[key] = value

    def _load_setitem(self) -> None:
        value = self.stack.pop()
        key = self.stack.pop()
        self._fill(self.stack[-1], [key, value])

    def _load_setitems(self) -> None:
        items = self.pop_mark()
        self._fill(self.stack[-1], items)

    def _load_dict(self) -> None:
        items = self.pop_mark()
        target: dict[Any, Any] = {}
        self._fill(target, items)
        self.append(target)

    def _refuse_set(self) -> None:
        raise pickle.UnpicklingError("refused a set (a RadioML 2016 pickle holds none)")

    dispatch = _Opcodes(pickle._Unpickler.dispatch)
    dispatch |= {
        pickle.SETITEM[0]: _load_setitem,
        pickle.SETITEMS[0]: _load_setitems,
        pickle.DICT[0]: _load_dict,
        pickle.EMPTY_SET[0]: _refuse_set,
        pickle.ADDITEMS[0]: _refuse_set,
        pickle.FROZENSET[0]: _refuse_set,
    }


def _materialise(obj: object) -> object:
    """The loaded dict with each array stub (a value) replaced by its array; anything else is
    left to the structure check (a stub elsewhere is not a str, int or array there)."""
    if not isinstance(obj, dict):
        return obj
    found = {}
    for key, value in obj.items():
        if isinstance(value, _ArrayStub):
            if value.array is None:
                raise pickle.UnpicklingError(f"key {_short(key)}: a numpy array without state")
            value = value.array
        found[key] = value
    return found


class _HashingReader:
    """A binary file as the unpickler reads it (read, readinto, readline), hashed on the way."""

    def __init__(self, f: io.BufferedReader) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha256.update(data)
        return data

    def readinto(self, buf: Any) -> int:
        n = self._f.readinto(buf)
        self.sha256.update(memoryview(buf)[:n])
        return n

    def readline(self) -> bytes:
        data = self._f.readline()
        self.sha256.update(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 22):
            pass


def _unpickle(path: Path) -> tuple[object, dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            reader = _HashingReader(f)
            obj = _materialise(_RestrictedUnpickler(reader, path).load())
            reader.drain()  # whatever follows STOP, so the digest is the file's
    except DataError:
        raise
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {_one_line(exc)}") from None
    except Exception as exc:  # anything a damaged pickle makes the unpickler raise
        raise DataError(f"{path}: not a RadioML 2016 pickle: {_one_line(exc)}") from None
    return obj, _source_info(path, size, reader.sha256.hexdigest())


def _rml2016_key(path: Path, key: object) -> tuple[str, int]:
    if isinstance(key, tuple) and len(key) == 2:
        mod, snr = key
        if isinstance(mod, bytes):
            mod = mod.decode("latin1")
        if isinstance(mod, str) and mod and isinstance(snr, int) and not isinstance(snr, bool):
            if abs(snr) > MAX_ABS_SNR_DB:
                raise DataError(
                    f"{path}: key {_short(key)}: SNR {snr} dB is out of range "
                    f"(|SNR| <= {MAX_ABS_SNR_DB} dB)"
                )
            return mod, snr
    raise DataError(
        f"{path}: key {_short(key)}: expected a (modulation name, SNR int) tuple "
        "(RadioML 2016 layout: {(modulation, snr): float32 [N, 2, 128]})"
    )


def _is_float32(dtype: np.dtype) -> bool:
    # Either byte order (written as <f4); a float32 with fields or a subarray is not one.
    return dtype.kind == "f" and dtype.itemsize == 4 and dtype.fields is None and not dtype.shape


def _check_iq(path: Path, where: str, iq: np.ndarray, first_row: int = 0) -> None:
    finite = np.isfinite(iq).reshape(len(iq), -1).all(axis=1)
    if not finite.all():
        row = first_row + int(np.flatnonzero(~finite)[0])
        raise DataError(f"{path}: {where} row {row}: non-finite sample (NaN or infinity)")


def _rml2016_array(path: Path, key: tuple[str, int], value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        got = type(value).__name__
    elif not (_is_float32(value.dtype) and value.ndim == 3 and value.shape[0] >= 1) or (
        value.shape[1:] != (2, _RML2016.example_len)
    ):
        got = f"{value.dtype} {list(value.shape)}"
    else:
        _check_iq(path, f"key {key!r}", value)
        return value
    raise DataError(f"{path}: key {key!r}: expected a float32 array [N, 2, 128], got {got}")


def _check_rml2016(path: Path, obj: object) -> dict[tuple[str, int], np.ndarray]:
    if not isinstance(obj, dict) or not obj:
        got = "an empty dict" if isinstance(obj, dict) else f"a {type(obj).__name__}"
        raise DataError(
            f"{path}: not a RadioML 2016 dataset: expected a dict "
            f"{{(modulation, snr): float32 [N, 2, 128]}}, got {got}"
        )
    arrays: dict[tuple[str, int], np.ndarray] = {}
    for raw_key, value in obj.items():
        key = _rml2016_key(path, raw_key)
        if key in arrays:
            raise _twice(path, key, " (as str and as bytes)")
        arrays[key] = _rml2016_array(path, key, value)
    return arrays


def _rml2016_batches(arrays: dict[tuple[str, int], np.ndarray]) -> Iterator[_Batch]:
    for (mod, snr), arr in sorted(arrays.items()):
        n = len(arr)
        yield _Batch(
            iq=arr.transpose(0, 2, 1),  # [N, 2, 128] rows I, Q -> [N, 128, 2] interleaved
            labels=np.full(n, mod, dtype=object),
            snrs=np.full(n, snr, dtype=np.int64),
            rows=np.arange(n, dtype=np.int64),
        )


def convert_radioml2016(source: str | os.PathLike, out_dir: str | os.PathLike) -> ConvertResult:
    """Convert RadioML 2016.10A (``RML2016.10a_dict.pkl``) into labelled SigMF in ``out_dir``.

    The whole pickle is loaded (restricted: only numpy arrays) and checked before anything is
    written. Raises :class:`DataError` naming the file for a missing, unreadable, forged or
    mis-shaped source, :class:`ConfigError` for an ``out_dir`` that exists and is not empty,
    :class:`~iqtrain.errors.StorageError` when writing fails; each leaves no ``out_dir``.
    """
    path, _ = _regular_file(source, "source")
    out = _check_out_dir(out_dir)
    obj, info = _unpickle(path)
    arrays = _check_rml2016(path, obj)
    classes = tuple(sorted({mod for mod, _ in arrays}))
    order = "sorted modulation names of the pickle's keys"
    return _convert(_RML2016, out, _rml2016_batches(arrays), classes, info, order)


# --------------------------------------------------------------------------------------------
# RadioML 2018.01A: HDF5, in chunks


def _import_h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise ConfigError("radioml2018 needs h5py: pip install 'iqtrain[radioml]'") from None
    return h5py


def _read_classes(classes_file: str | os.PathLike) -> tuple[str, ...]:
    path, size = _regular_file(classes_file, "classes_file")
    if size > MAX_CLASSES_BYTES:
        raise DataError(
            f"{path}: {size} bytes, more than a class list may have ({MAX_CLASSES_BYTES})"
        )
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CLASSES_BYTES + 1)  # it may have grown since
        text = data.decode("utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {_one_line(exc)}") from None
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
        raise DataError(f"{path}: cannot open {name}: {_one_line(exc)}") from None
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
        why = f"has external storage (its data is in {_short(ds.external[0][0])})"
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
        ("X", x, (n, _RML2018.example_len, 2), _is_float32(x.dtype)),
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


def _check_width(path: Path, y: Any, classes: tuple[str, ...], classes_file: object) -> None:
    width = y.shape[1]
    if width == len(classes):
        return
    if classes_file is None:
        raise DataError(
            f"{path}: Y has {width} columns, the RadioML 2018.01A class list {len(classes)}; "
            f"pass --classes FILE with {width} names, one per line"
        )
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
        raise DataError(f"{path}: cannot read rows {a}..{b - 1}: {_one_line(exc)}") from None


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
) -> Iterator[_Batch]:
    names = np.array(classes, dtype=object)
    n = ds[0].shape[0]
    for a in range(0, n, RML2018_CHUNK):
        b = min(n, a + RML2018_CHUNK)
        iq, onehot, snr = _read_rows(path, ds, a, b)
        index = _one_hot_index(path, onehot, a)
        _check_iq(path, "X", iq, a)
        snrs = _snr_column(path, snr[:, 0], a)
        yield _Batch(iq, names[index], snrs, np.arange(a, b, dtype=np.int64))


def convert_radioml2018(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    classes_file: str | os.PathLike | None = None,
) -> ConvertResult:
    """Convert RadioML 2018.01A (``GOLD_XYZ_OSC.0001_1024.hdf5``) into labelled SigMF.

    Labels are :data:`RML2018_CLASSES` by Y's column, or the names of ``classes_file`` (one a
    line, as many as Y has columns). The layout is checked before anything is written; the
    examples are read and written :data:`RML2018_CHUNK` at a time, so a bad Y row (not exactly
    one 1) or a non-finite sample found on the way is a DataError naming the file and row, and
    leaves no ``out_dir``. Needs h5py (``pip install 'iqtrain[radioml]'``; a ConfigError
    without it). Errors as :func:`convert_radioml2016`.
    """
    path, size = _regular_file(source, "source")
    out = _check_out_dir(out_dir)
    classes = RML2018_CLASSES if classes_file is None else _read_classes(classes_file)
    h5py = _import_h5py()
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise DataError(f"{path}: not a readable HDF5 file: {_one_line(exc)}") from None
    with f:
        ds = _rml2018_layout(h5py, path, f)
        _check_width(path, ds[1], classes, classes_file)
        order = (
            f"--classes {os.path.abspath(classes_file)}"
            if classes_file is not None
            else "O'Shea, Roy, Clancy, IEEE JSTSP 2018 (radioML/dataset issue 25)"
        )
        info = _source_info(path, size, None)
        batches = _rml2018_batches(path, ds, classes)
        return _convert(_RML2018, out, batches, classes, info, order)

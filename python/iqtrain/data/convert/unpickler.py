"""The RadioML 2016.10A pickle, read without running it (docs/data.md "RadioML").

A pickle is code, and numpy's own ``__setstate__`` is a memory-corruption primitive (a ``V8``
dtype with an object field built onto file bytes makes numpy read them as ``PyObject*``). So
the unpickler (:class:`~iqtrain.storage.RestrictedUnpickler`) hands the pickle only inert
stand-ins for numpy's array reconstruction (``numpy.ndarray``, ``numpy.dtype``,
``_reconstruct`` under ``numpy.core.multiarray`` and ``numpy._core.multiarray``) and for
``_codecs.encode`` limited to latin1 on a str (how a Python 3 protocol-2 pickle spells bytes),
never numpy's own callables: they take exactly the state numpy pickles for a plain number dtype
and array, and the arrays are built here (np.dtype, np.frombuffer). Any other global is a
DataError naming the file and the global, and nothing of it runs; any other state (fields,
objects, a subarray, sizes that do not match the data) is a DataError too. Dict keys are flat
and given once; sets are refused. :func:`unpickle` reads a file so, hashing it on the way.
Imports no torch.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

from iqtrain.data.convert.checks import one_line, short, source_info, twice
from iqtrain.errors import DataError
from iqtrain.storage import RestrictedUnpickler

__all__ = ["unpickle"]

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
        f"refused numpy.dtype({code!r}) state {short(state)} (only a plain number's "
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
            f"refused numpy.dtype{short(args)} (only a plain number's (code, False, True))"
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
        f"refused numpy array shape {short(shape)} (a tuple of at most {_NDIM_MAX} ints >= 0, "
        "fewer than 2**63 bytes)"
    )


def _array_from_state(state: object) -> np.ndarray:
    """The array of numpy's state ``(1, shape, dtype, is_fortran, data)``: the dtype one of the
    pickle's plain dtypes, ``data`` exactly the array's bytes (bytes; a Python 2 str, read as
    latin1, is those bytes), in Fortran order when ``is_fortran``. A copy: it owns its memory."""
    if not (isinstance(state, tuple) and len(state) == 5 and _exactly(state[0], 1)):
        raise pickle.UnpicklingError(
            f"refused numpy array state {short(state)} (only (1, shape, dtype, fortran, data))"
        )
    _, shape, stub, fortran, data = state
    dtype = stub.dtype if isinstance(stub, _DtypeStub) else None
    if dtype is None:
        raise pickle.UnpicklingError(
            f"refused numpy array dtype {short(stub)} (only a numpy.dtype after its state)"
        )
    shape = _shape(shape, dtype.itemsize)
    if type(data) is str:
        try:
            data = data.encode("latin1")
        except UnicodeEncodeError:
            raise pickle.UnpicklingError("refused numpy array data: not latin1") from None
    if not (_is_flag(fortran, 0) or _is_flag(fortran, 1)) or type(data) is not bytes:
        raise pickle.UnpicklingError(
            f"refused numpy array state: fortran {short(fortran)}, data {type(data).__name__}"
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
            f"refused _reconstruct{short(args)} (only (numpy.ndarray, (0,), b'b'))"
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


class _RadioMLUnpickler(RestrictedUnpickler):
    """Unpickles numpy arrays in dicts, tuples, str and int; any other global is refused.

    The restricted unpickler of :mod:`iqtrain.storage` admitting only the stand-ins of
    :data:`_ALLOWED`, with the opcodes that fill a dict (SETITEM, SETITEMS, DICT) taking each
    key once and only flat ones (:func:`_flat_key`): a key given twice is refused where a dict
    would keep its last value, and a key nested deeper than a hash can recurse never reaches
    one. Sets (EMPTY_SET, ADDITEMS, FROZENSET) hash their items too: a RadioML 2016 pickle has
    none, they are refused.
    """

    def __init__(self, file: Any, source: Path) -> None:
        super().__init__(file, encoding="latin1")  # Python 2 str: bytes -> str, 1:1
        self._source = source

    def admit(self, module: str, name: str) -> Any | None:
        return _ALLOWED.get((module, name))

    def refused(self, module: str, name: str) -> Exception:
        return DataError(
            f"{self._source}: refused pickle global {module}.{name} (a RadioML 2016 pickle "
            "needs only numpy's array reconstruction; the global was not called)"
        )

    def _fill(self, target: object, items: list[Any]) -> None:
        if type(target) is not dict:
            raise pickle.UnpicklingError(f"refused SETITEM on {short(target)} (only on a dict)")
        if len(items) % 2:
            raise pickle.UnpicklingError("refused a dict item without its value")
        for key, value in zip(items[::2], items[1::2], strict=True):
            if not _flat_key(key):
                raise pickle.UnpicklingError(
                    f"refused dict key {short(key)} (a key is a str, bytes or number, or a "
                    "tuple of them)"
                )
            if key in target:
                raise twice(self._source, key)
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

    dispatch = RestrictedUnpickler.with_opcodes(
        {
            pickle.SETITEM[0]: _load_setitem,
            pickle.SETITEMS[0]: _load_setitems,
            pickle.DICT[0]: _load_dict,
            pickle.EMPTY_SET[0]: _refuse_set,
            pickle.ADDITEMS[0]: _refuse_set,
            pickle.FROZENSET[0]: _refuse_set,
        }
    )


def _materialise(obj: object) -> object:
    """The loaded dict with each array stub (a value) replaced by its array; anything else is
    left to the structure check (a stub elsewhere is not a str, int or array there)."""
    if not isinstance(obj, dict):
        return obj
    found = {}
    for key, value in obj.items():
        if isinstance(value, _ArrayStub):
            if value.array is None:
                raise pickle.UnpicklingError(f"key {short(key)}: a numpy array without state")
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


def unpickle(path: Path) -> tuple[object, dict[str, Any]]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            reader = _HashingReader(f)
            obj = _materialise(_RadioMLUnpickler(reader, path).load())
            reader.drain()  # whatever follows STOP, so the digest is the file's
    except DataError:
        raise
    except OSError as exc:
        raise DataError(f"{path}: cannot read: {one_line(exc)}") from None
    except Exception as exc:  # anything a damaged pickle makes the unpickler raise
        raise DataError(f"{path}: not a RadioML 2016 pickle: {one_line(exc)}") from None
    return obj, source_info(path, size, reader.sha256.hexdigest())

"""What a user hands a pretrained model: IQ windows as arrays (docs/design.md
"A trained model as a product").

:func:`check_windows` accepts complex ``[..., window]`` (complex64, complex128) or real
``[..., window, 2]`` (I, Q; int8, int16, float32, float64), in either byte order, as a numpy
array, anything ``numpy.asarray`` takes, or a torch tensor (its values, on the CPU); it checks
the shape and dtype without converting anything. :func:`loader_batches` then converts one batch
at a time into ``[b, window, 2]`` in a dtype the loader yields and ``prepare_iq_input`` reads
(int8, int16, float32), so a window is normalised and patched exactly as in training and a
large input is never copied whole. Anything else is an :class:`~iqtrain.errors.InputError`
naming the window the model expects. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from iqtrain.errors import InputError

__all__ = ["check_windows", "loader_batches"]

#: (kind, bytes per value) -> the dtype a batch is converted to.
_REAL = {("i", 1): np.int8, ("i", 2): np.int16, ("f", 4): np.float32, ("f", 8): np.float32}
_COMPLEX = (("c", 8), ("c", 16))


def _expected(window: int) -> str:
    return (
        f"complex [..., {window}] (complex64, complex128) or real [..., {window}, 2] "
        f"(I, Q: int8, int16, float32, float64)"
    )


def _refused(name: str, window: int, what: str) -> InputError:
    return InputError(f"{name}: expected {_expected(window)}, got {what}")


def _as_array(iq: Any, window: int, name: str) -> np.ndarray:
    if hasattr(iq, "detach") and hasattr(iq, "cpu"):  # a torch tensor: its values, on the CPU
        what = f"a tensor of {iq.dtype} on {iq.device}"
        if iq.device.type == "meta":  # a shape without values
            raise _refused(name, window, what)
        try:
            iq = iq.detach().cpu().numpy()
        except (TypeError, RuntimeError):  # a dtype numpy has not (bfloat16)
            raise _refused(name, window, what) from None
    try:
        return np.asarray(iq)  # a plain ndarray: subclasses (np.matrix) reshape as arrays do
    except (ValueError, TypeError) as exc:  # ragged nesting, objects numpy cannot take
        raise _refused(name, window, f"{type(iq).__name__} ({exc})") from None


def check_windows(iq: Any, window: int, name: str = "iq") -> np.ndarray:
    """``iq`` as ``[N, window]`` complex or ``[N, window, 2]`` real, its dtype and byte order
    as given (a view where numpy can make one); the leading dimensions flattened into N.

    Raises InputError naming ``name``, the expected window and what was given."""
    arr = _as_array(iq, window, name)
    key = (arr.dtype.kind, arr.dtype.itemsize)
    what = f"{arr.dtype} [{'x'.join(map(str, arr.shape)) or 'scalar'}]"
    if key in _COMPLEX:
        if arr.ndim < 1 or arr.shape[-1] != window:
            raise _refused(name, window, what)
        return _flatten(arr, (window,))
    if key not in _REAL or arr.ndim < 2 or arr.shape[-2:] != (window, 2):
        raise _refused(name, window, what)
    return _flatten(arr, (window, 2))


class _Rows:
    """``arr`` with its leading dimensions flattened into rows, without a copy where a reshape
    would make one (a broadcast view): a slice of rows is read when asked for."""

    def __init__(self, arr: np.ndarray, tail: tuple[int, ...]) -> None:
        self.arr, self.lead = arr, arr.shape[: arr.ndim - len(tail)]
        self.shape = (int(np.prod(self.lead)), *tail)
        self.dtype, self.ndim = arr.dtype, len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, rows: slice) -> np.ndarray:
        return self.arr[np.unravel_index(np.arange(*rows.indices(len(self))), self.lead)]


def _flatten(arr: np.ndarray, tail: tuple[int, ...]) -> Any:
    """``arr`` as rows of shape ``tail``: a view where numpy can make one, else :class:`_Rows`
    (never a copy of the whole input)."""
    if arr.ndim == len(tail) + 1:
        return arr
    try:
        return np.reshape(arr, (-1, *tail), copy=False)
    except (ValueError, TypeError):  # a copy would be needed (or numpy < 2.1: no copy=)
        return _Rows(arr, tail)


def _check_float32_range(part: np.ndarray, out: np.ndarray, lo: int, name: str) -> None:
    """A float64 window rounded to float32 that became infinite or all zeros (values beyond
    float32's range either way: ~3.4e38 above, ~1.4e-45 below) is an InputError naming it:
    both would be another signal than the one given."""
    rows = len(out)
    fine = np.isfinite(part).reshape(rows, -1).all(axis=1)
    inf = ~np.isfinite(out).reshape(rows, -1).all(axis=1) & fine
    zero = ~out.reshape(rows, -1).any(axis=1) & part.reshape(rows, -1).any(axis=1)
    for bad, what in (
        (inf, "beyond float32's range (it would be infinite)"),
        (zero, "below float32's range (it would be all zeros)"),
    ):
        row = np.flatnonzero(bad)
        if row.size:
            raise InputError(f"{name}: window {lo + int(row[0])} holds values {what}")


def loader_batches(windows: np.ndarray, batch_size: int, name: str = "iq") -> Iterator[np.ndarray]:
    """Batches of :func:`check_windows`' result as ``[b, window, 2]`` int8, int16 or float32,
    native byte order, new writable arrays: complex128 and float64 rounded to float32 (what a
    cf32 recording stores). A finite value that float32 cannot hold is an InputError naming
    its window (it would be infinite)."""
    complex_ = windows.dtype.kind == "c"
    for lo in range(0, len(windows), batch_size):
        part = windows[lo : lo + batch_size]
        with np.errstate(over="ignore"):  # a value float32 cannot hold is found below
            if complex_:
                out = np.empty((*part.shape, 2), dtype=np.float32)
                out[..., 0], out[..., 1] = part.real, part.imag
            else:
                out = part.astype(_REAL[(part.dtype.kind, part.dtype.itemsize)], order="C")
        if part.dtype.itemsize >= 8 * (1 + complex_) and out.dtype == np.float32:
            _check_float32_range(part, out, lo, name)
        yield out

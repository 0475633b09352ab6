"""RadioML 2016.10A (``RML2016.10a_dict.pkl``) as labelled SigMF (docs/data.md "RadioML").

A Python 2 pickle of ``{(modulation, snr): float32 ndarray [N, 2, 128]}``, row 0 = I, row 1 =
Q; modulation names are Python 2 str (read with ``encoding="latin1"``; bytes names are decoded
the same way), SNR an int in dB. The whole pickle is read by the restricted unpickler
(:mod:`iqtrain.data.convert.unpickler`) and its structure checked before anything is written;
examples are written by (modulation, snr) key sorted, rows in array order. Imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from iqtrain.data.convert.checks import (
    MAX_ABS_SNR_DB,
    check_iq,
    is_float32,
    regular_file,
    short,
    twice,
)
from iqtrain.data.convert.output import Batch, ConvertResult, Kind, convert
from iqtrain.data.convert.publish import check_out_dir
from iqtrain.data.convert.unpickler import unpickle
from iqtrain.errors import DataError

__all__ = ["RML2016", "convert_radioml2016"]

RML2016 = Kind("radioml2016", "RadioML 2016.10A", 128)


def _rml2016_key(path: Path, key: object) -> tuple[str, int]:
    if isinstance(key, tuple) and len(key) == 2:
        mod, snr = key
        if isinstance(mod, bytes):
            mod = mod.decode("latin1")
        if isinstance(mod, str) and mod and isinstance(snr, int) and not isinstance(snr, bool):
            if abs(snr) > MAX_ABS_SNR_DB:
                raise DataError(
                    f"{path}: key {short(key)}: SNR {snr} dB is out of range "
                    f"(|SNR| <= {MAX_ABS_SNR_DB} dB)"
                )
            return mod, snr
    raise DataError(
        f"{path}: key {short(key)}: expected a (modulation name, SNR int) tuple "
        "(RadioML 2016 layout: {(modulation, snr): float32 [N, 2, 128]})"
    )


def _rml2016_array(path: Path, key: tuple[str, int], value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        got = type(value).__name__
    elif not (is_float32(value.dtype) and value.ndim == 3 and value.shape[0] >= 1) or (
        value.shape[1:] != (2, RML2016.example_len)
    ):
        got = f"{value.dtype} {list(value.shape)}"
    else:
        check_iq(path, f"key {key!r}", value)
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
            raise twice(path, key, " (as str and as bytes)")
        arrays[key] = _rml2016_array(path, key, value)
    return arrays


def _rml2016_batches(arrays: dict[tuple[str, int], np.ndarray]) -> Iterator[Batch]:
    for (mod, snr), arr in sorted(arrays.items()):
        n = len(arr)
        yield Batch(
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
    path, _ = regular_file(source, "source")
    out = check_out_dir(out_dir)
    obj, info = unpickle(path)
    arrays = _check_rml2016(path, obj)
    classes = tuple(sorted({mod for mod, _ in arrays}))
    order = "sorted modulation names of the pickle's keys"
    return convert(RML2016, out, _rml2016_batches(arrays), classes, info, order)

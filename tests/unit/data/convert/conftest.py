"""Shared by the tests of iqtrain.data.convert: the RadioML 2016 source in its distributed
layout (a Python 2 pickle byte for byte), and reading what a conversion wrote straight from the
bytes with numpy (as fixtures: ``examples``, ``read_back``, ``assert_nothing_written``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

MODS = ("8PSK", "AM-DSB", "BPSK", "QAM16")
SNRS = (-20, -2, 0, 18)


def rml2016_dict(rng: np.random.Generator, n: int = 3) -> dict:
    return {
        (mod, snr): rng.standard_normal((n + i % 2, 2, 128)).astype(np.float32)
        for i, (mod, snr) in enumerate((m, s) for m in MODS for s in SNRS)
    }


def _py2_str(b: bytes) -> bytes:
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b  # SHORT_BINSTRING
    return b"T" + struct.pack("<i", len(b)) + b  # BINSTRING


def _int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)  # BININT


def py2_pickle(d: dict) -> bytes:
    """What Python 2's ``cPickle.dump(d, f, 2)`` writes for ``{(str, int): float32 ndarray}``
    with numpy 1.x (the RML2016.10a_dict.pkl layout): Python 2 str are BINSTRING opcodes (bytes;
    Python 3 reads them as str only with encoding="latin1"), an array is
    ``numpy.core.multiarray._reconstruct(ndarray, (0,), 'b')`` then BUILD with its dtype (a
    ``numpy.dtype('f4', 0, 1)`` with state version 3) and its raw bytes as one str."""
    out = [b"\x80\x02}("]  # PROTO 2, EMPTY_DICT, MARK
    dtype = (
        b"cnumpy\ndtype\n" + _py2_str(b"f4") + _int(0) + _int(1) + b"\x87R"  # TUPLE3 REDUCE
        b"(" + _int(3) + _py2_str(b"<") + b"NNN" + _int(-1) + _int(-1) + _int(0) + b"tb"
    )
    for (mod, snr), arr in d.items():
        out.append(_py2_str(mod.encode()) + _int(snr) + b"\x86")  # the key: TUPLE2
        out.append(
            b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
            + _int(0)
            + b"\x85"  # TUPLE1
            + _py2_str(b"b")
            + b"\x87R"
        )
        shape = b"(" + b"".join(_int(x) for x in arr.shape) + b"t"
        raw = _py2_str(np.ascontiguousarray(arr, "<f4").tobytes())
        out.append(b"(" + _int(1) + shape + dtype + b"\x89" + raw + b"tb")  # NEWFALSE, BUILD
    out.append(b"u.")  # SETITEMS, STOP
    return b"".join(out)


def _read_back(out: Path) -> list[tuple[dict, np.ndarray]]:
    """(metadata, samples [n, 2] float32) of each recording, in name order."""
    found = []
    for meta_path in sorted(out.glob("*.sigmf-meta")):
        meta = json.loads(meta_path.read_text())
        data = np.fromfile(meta_path.with_suffix(".sigmf-data"), dtype="<f4").reshape(-1, 2)
        found.append((meta, data))
    return found


def _examples(out: Path) -> list[tuple[str, int, int, np.ndarray]]:
    """(label, snr, source row, [L, 2] samples) of every annotation of every recording."""
    found = []
    for meta, data in _read_back(out):
        for ann in meta["annotations"]:
            a, n = ann["core:sample_start"], ann["core:sample_count"]
            found.append(
                (
                    ann["core:label"],
                    ann["iqtrain:snr_db"],
                    ann["iqtrain:source_row"],
                    data[a : a + n],
                )
            )
    return found


def _assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}.tmp-")]


@pytest.fixture
def read_back():
    """(metadata, samples [n, 2] float32) of each recording of a directory, in name order."""
    return _read_back


@pytest.fixture
def examples():
    """(label, snr, source row, [L, 2] samples) of every annotation of every recording."""
    return _examples


@pytest.fixture
def assert_nothing_written():
    """Neither OUT_DIR nor its temporary sibling is there."""
    return _assert_nothing_written


@pytest.fixture
def rng():
    return np.random.default_rng(5)


@pytest.fixture
def rml2016(tmp_path, rng):
    d = rml2016_dict(rng)
    path = tmp_path / "RML2016.10a_dict.pkl"
    path.write_bytes(py2_pickle(d))
    return path, d

"""Tests of iqtrain.data.convert: RadioML 2016.10A / 2018.01A in their exact layouts to SigMF.

Each source is built small here in the distributed layout (a Python 2 pickle byte for byte, an
HDF5 file with X, Y, Z), converted, and read back with numpy straight from the bytes.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import pickle
import pickletools
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sigmf
from helpers import deep_key_pickle, h5py_or_skip

import iqtrain
from iqtrain.data import convert
from iqtrain.data.convert import (
    MAX_RECORDING_SAMPLES,
    RML2018_CLASSES,
    ConvertResult,
    convert_radioml2016,
    convert_radioml2018,
)
from iqtrain.data.sigmf_meta import read_recording
from iqtrain.errors import ConfigError, DataError, StorageError

MODS = ("8PSK", "AM-DSB", "BPSK", "QAM16")
SNRS = (-20, -2, 0, 18)


# ------------------------------------------------------------------------------------ sources


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


def write_rml2018(path: Path, rng: np.random.Generator, n: int = 150, width: int = 24):
    h5py = h5py_or_skip()
    x = rng.standard_normal((n, 1024, 2)).astype(np.float32)
    cls = rng.integers(0, width, n)
    y = np.zeros((n, width), dtype=np.int64)
    y[np.arange(n), cls] = 1
    z = rng.choice(np.arange(-20, 31, 2), n).astype(np.int64)[:, None]
    with h5py.File(path, "w") as f:
        f["X"], f["Y"], f["Z"] = x, y, z
    return x, cls, z[:, 0]


def read_back(out: Path) -> list[tuple[dict, np.ndarray]]:
    """(metadata, samples [n, 2] float32) of each recording, in name order."""
    found = []
    for meta_path in sorted(out.glob("*.sigmf-meta")):
        meta = json.loads(meta_path.read_text())
        data = np.fromfile(meta_path.with_suffix(".sigmf-data"), dtype="<f4").reshape(-1, 2)
        found.append((meta, data))
    return found


def examples(out: Path) -> list[tuple[str, int, int, np.ndarray]]:
    """(label, snr, source row, [L, 2] samples) of every annotation of every recording."""
    found = []
    for meta, data in read_back(out):
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


def assert_nothing_written(out: Path) -> None:
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f"{out.name}.tmp-")]


@pytest.fixture
def rng():
    return np.random.default_rng(5)


@pytest.fixture
def rml2016(tmp_path, rng):
    d = rml2016_dict(rng)
    path = tmp_path / "RML2016.10a_dict.pkl"
    path.write_bytes(py2_pickle(d))
    return path, d


# ------------------------------------------------------------------------------- RadioML 2016


def test_the_py2_builder_is_a_py2_pickle(rml2016):
    path, d = rml2016
    with pytest.raises(UnicodeDecodeError):  # Python 2 str: needs encoding="latin1" ...
        pickle.loads(path.read_bytes())
    back = pickle.loads(path.read_bytes(), encoding="latin1")  # ... and then is the dict
    assert back.keys() == d.keys()
    assert all(np.array_equal(back[k], d[k]) and back[k].dtype == np.float32 for k in d)


def test_rml2016_round_trip(rml2016, tmp_path):
    path, d = rml2016
    out = tmp_path / "out"
    result = convert_radioml2016(path, out)
    total = sum(len(a) for a in d.values())
    assert result == ConvertResult(out, 1, total, tuple(sorted(MODS)))
    assert sorted(p.name for p in out.iterdir()) == [
        "convert.json",
        "radioml2016_00000.sigmf-data",
        "radioml2016_00000.sigmf-meta",
    ]
    # Keys sorted by (modulation, snr), rows in array order, examples back to back.
    expected = [
        (mod, snr, row, arr[row].T)
        for (mod, snr), arr in sorted(d.items())
        for row in range(len(arr))
    ]
    got = examples(out)
    assert len(got) == total
    for (label, snr, row, iq), (mod, s, r, want) in zip(got, expected, strict=True):
        assert (label, snr, row) == (mod, s, r) and type(snr) is int
        assert iq.tobytes() == np.ascontiguousarray(want, "<f4").tobytes()  # bit for bit
    ((meta, data),) = read_back(out)
    assert len(data) == 128 * total
    starts = [128 * i for i in range(total)]
    assert [a["core:sample_start"] for a in meta["annotations"]] == starts
    assert {a["core:sample_count"] for a in meta["annotations"]} == {128}
    assert [c["core:sample_start"] for c in meta["captures"]] == starts  # a capture per example
    g = meta["global"]
    assert g["core:datatype"] == "cf32_le" and g["core:sample_rate"] == 1.0
    assert "normalised frequency" in g["core:description"]
    assert {"name": "iqtrain", "version": "1.0.0", "optional": True} in g["core:extensions"]
    assert list(meta) == ["global", "captures", "annotations"]
    assert list(g) == sorted(g)  # sorted keys, as synth writes them


def test_rml2016_sidecar(rml2016, tmp_path):
    path, d = rml2016
    convert_radioml2016(path, tmp_path / "out")
    side = json.loads((tmp_path / "out" / "convert.json").read_text())
    assert side["source"] == {
        "name": path.name,
        "path": os.fspath(path),
        "bytes": path.stat().st_size,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    assert side["dataset"] == "radioml2016" and side["classes"] == sorted(MODS)
    assert side["examples"] == sum(len(a) for a in d.values()) and side["recordings"] == 1
    assert side["examples_per_class"] == {
        m: sum(len(a) for (mod, _), a in d.items() if mod == m) for m in sorted(MODS)
    }
    assert side["snr_db"] == sorted(SNRS)
    assert side["version"] == iqtrain.__version__ and side["tool"] == "iqtrain convert"
    assert side["max_recording_samples"] == MAX_RECORDING_SAMPLES == 1 << 20
    assert side["samples_per_example"] == 128 and side["datatype"] == "cf32_le"


def test_rml2016_python3_protocol2_pickle_with_bytes_and_str_names(tmp_path, rng):
    # pickle.dumps(protocol=2) from Python 3: bytes via _codecs.encode(str, "latin1"),
    # numpy._core names under numpy 2; a name may be bytes or str.
    d = {
        (b"BPSK", 0): rng.standard_normal((2, 2, 128)).astype(np.float32),
        ("QPSK", -4): rng.standard_normal((3, 2, 128)).astype(">f4"),
    }
    path = tmp_path / "py3.pkl"
    path.write_bytes(pickle.dumps(d, protocol=2))
    result = convert_radioml2016(path, tmp_path / "out")
    assert result.classes == ("BPSK", "QPSK") and result.examples == 5
    got = examples(tmp_path / "out")
    assert [(label, snr) for label, snr, _, _ in got] == [("BPSK", 0)] * 2 + [("QPSK", -4)] * 3
    want = np.concatenate([d[(b"BPSK", 0)], d[("QPSK", -4)].astype("<f4")])
    assert np.array_equal(np.stack([iq for *_, iq in got]), want.transpose(0, 2, 1))


def test_rml2016_recordings_are_capped_and_hold_whole_examples(rml2016, tmp_path, monkeypatch):
    path, d = rml2016
    monkeypatch.setattr(convert, "MAX_RECORDING_SAMPLES", 128 * 11 + 5)  # 11 examples each
    total = sum(len(a) for a in d.values())
    result = convert_radioml2016(path, tmp_path / "out")
    assert result.recordings == -(-total // 11)
    recs = read_back(tmp_path / "out")
    assert total % 11 and [len(data) for _, data in recs] == [
        128 * min(11, total - 11 * i) for i in range(result.recordings)
    ]
    names = sorted(p.name for p in (tmp_path / "out").glob("*.sigmf-meta"))
    assert names == [f"radioml2016_{i:05d}.sigmf-meta" for i in range(result.recordings)]
    # Every recording starts its own annotations at 0; together they are the source in order.
    for meta, _ in recs:
        assert meta["annotations"][0]["core:sample_start"] == 0
    want = [arr[r].T for _, arr in sorted(d.items()) for r in range(len(arr))]
    got = [iq for *_, iq in examples(tmp_path / "out")]
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_rml2016_output_is_valid_sigmf_for_sigmf_and_for_iqtrain(rml2016, tmp_path):
    path, d = rml2016
    out = tmp_path / "out"
    convert_radioml2016(path, out)
    meta_path = out / "radioml2016_00000.sigmf-meta"
    handle = sigmf.fromfile(os.fspath(meta_path))  # schema and core:sha512 checked
    handle.validate()
    assert len(handle.get_annotations()) == sum(len(a) for a in d.values())
    rec, _ = read_recording(meta_path)
    assert rec.datatype == "cf32_le" and len(rec.segments) == len(handle.get_captures())


def test_rml2016_labelled_windows_find_every_example_once(rml2016, tmp_path):
    from iqtrain.data.windows import labelled_windows

    path, d = rml2016
    out = tmp_path / "out"
    convert_radioml2016(path, out)
    found = labelled_windows([os.fspath(out / "*.sigmf-meta")], window=128)
    total = sum(len(a) for a in d.values())
    assert len(found) == found.num_annotations == total
    assert found.classes == tuple(sorted(MODS))
    labels = [found.classes[i] for i in found.labels]
    assert labels == [mod for (mod, _), arr in sorted(d.items()) for _ in range(len(arr))]
    assert found.starts.tolist() == [128 * i for i in range(total)]


class _Forged:
    """Pickles as a call of ``fn(*args)`` (what a forged dataset would hide in a value)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def _forged_pickles(marker: Path) -> dict[str, bytes]:
    create = f"open({os.fspath(marker)!r}, 'w').close()"
    return {
        "posix.system": pickle.dumps({("BPSK", 0): _Forged(os.system, f"touch '{marker}'")}, 2),
        "__builtin__.eval": pickle.dumps({("BPSK", 0): _Forged(eval, create)}, 2),
        "builtins.exec": pickle.dumps({("BPSK", 0): _Forged(exec, create)}, 4),
    }


def test_the_forged_pickles_are_live(tmp_path):
    marker = tmp_path / "marker"
    pickle.loads(_forged_pickles(marker)["__builtin__.eval"])  # a plain unpickler runs it
    assert marker.exists()


@pytest.mark.parametrize("refused", ["posix.system", "__builtin__.eval", "builtins.exec"])
def test_a_forged_pickle_runs_nothing(tmp_path, refused):
    marker = tmp_path / "marker"
    path = tmp_path / "forged.pkl"
    path.write_bytes(_forged_pickles(marker)[refused])
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    assert str(info.value).startswith(f"{path}: refused pickle global {refused} ")
    assert not marker.exists()
    assert_nothing_written(tmp_path / "out")


def test_codecs_encode_is_latin1_of_a_str_only(tmp_path):
    # _codecs.encode is allowed for a Python 3 pickle's bytes; any other codec is refused.
    path = tmp_path / "codec.pkl"
    path.write_bytes(pickle.dumps({("BPSK", 0): _Forged(codecs.encode, "x", "rot13")}, 2))
    assert b"c_codecs\nencode\n" in path.read_bytes()
    with pytest.raises(DataError, match=r"not a RadioML 2016 pickle: _codecs.encode\('rot13'\)"):
        convert_radioml2016(path, tmp_path / "out")


F32 = np.zeros((2, 2, 128), np.float32)
NAN_ROW_1 = np.where(np.arange(2)[:, None, None] == 1, np.nan, F32).astype(np.float32)


@pytest.mark.parametrize(
    "obj, message",
    [
        ([F32], "expected a dict {(modulation, snr): float32 [N, 2, 128]}, got a list"),
        ({}, "got an empty dict"),
        ({"BPSK": F32}, "key 'BPSK': expected a (modulation name, SNR int) tuple"),
        ({("BPSK", 0.0): F32}, "key ('BPSK', 0.0): expected a (modulation name, SNR int)"),
        ({("BPSK", True): F32}, "key ('BPSK', True): expected"),
        (
            {("BPSK", 2**63): F32},
            "key ('BPSK', 9223372036854775808): SNR 9223372036854775808 dB is out of range "
            "(|SNR| <= 1000 dB)",
        ),
        ({("BPSK", -1001): F32}, "key ('BPSK', -1001): SNR -1001 dB is out of range"),
        ({("BPSK", 0, 1): F32}, "key ('BPSK', 0, 1): expected"),
        ({("", 0): F32}, "key ('', 0): expected"),
        (
            {("BPSK", 0): F32.astype(np.float64)},
            "expected a float32 array [N, 2, 128], got float64 [2, 2, 128]",
        ),
        ({("BPSK", 0): F32[:, :, :64]}, "got float32 [2, 2, 64]"),
        ({("BPSK", 0): F32.transpose(0, 2, 1)}, "got float32 [2, 128, 2]"),
        ({("BPSK", 0): F32[:0]}, "got float32 [0, 2, 128]"),
        ({("BPSK", 0): F32[0]}, "got float32 [2, 128]"),
        ({("BPSK", 0): F32.tolist()}, "got list"),
        ({("BPSK", 0): F32, (b"BPSK", 0): F32}, "key ('BPSK', 0) appears twice"),
        ({("BPSK", 0): NAN_ROW_1}, "key ('BPSK', 0) row 1: non-finite sample"),
    ],
)
def test_rml2016_structure_is_checked(tmp_path, obj, message):
    path = tmp_path / "bad.pkl"
    # Protocol 4 (bytes as opcodes): a protocol-2 pickle spells an empty array's b"" as a call
    # of bytes(), a global the restricted unpickler refuses before any structure is seen.
    path.write_bytes(pickle.dumps(obj, protocol=4))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize("damage", ["truncated", "text", "missing", "directory", "empty"])
def test_rml2016_unreadable_sources(rml2016, tmp_path, damage):
    path, _ = rml2016
    src = tmp_path / "src.pkl"
    if damage == "truncated":
        src.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "text":
        src.write_text("modulation,snr\nBPSK,0\n")
    elif damage == "directory":
        src.mkdir()
    elif damage == "empty":
        src.write_bytes(b"")
    with pytest.raises(DataError) as info:
        convert_radioml2016(src, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{src}: ") and "\n" not in text
    expected = {"missing": "cannot read", "directory": "not a regular file"}
    assert expected.get(damage, "not a RadioML 2016 pickle") in text
    assert_nothing_written(tmp_path / "out")


def _key_value_ops(value: np.ndarray) -> bytes:
    return _ops(("BPSK", 0)) + _ops(value)


@pytest.mark.parametrize(
    "how",
    [
        b"}(%s%su.",  # SETITEMS: what pickle.dump writes for a dict
        b"}%ss%ss.",  # SETITEM, one pair at a time
        b"(%s%sd.",  # DICT (protocol 0/1)
    ],
    ids=["SETITEMS", "SETITEM", "DICT"],
)
def test_rml2016_a_key_given_twice_is_refused(tmp_path, how):
    # A dict keeps the last value of a key given twice: the first rows would go unnoticed.
    path = tmp_path / "twice.pkl"
    first, second = _key_value_ops(F32), _key_value_ops(F32[:1])
    path.write_bytes(b"\x80\x02" + how % (first, second))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    assert str(info.value) == f"{path}: key ('BPSK', 0) appears twice"
    assert_nothing_written(tmp_path / "out")


def test_rml2016_a_key_nested_thousands_deep_is_one_line(tmp_path):
    # repr of the key recursed past the interpreter's limit (a RecursionError, no DataError).
    path = tmp_path / "deep.pkl"
    path.write_bytes(deep_key_pickle(5000))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{path}: not a RadioML 2016 pickle: refused dict key ((((((")
    assert "\n" not in text and len(text) < len(str(path)) + 300, text
    assert_nothing_written(tmp_path / "out")


# ----------------------------------------------------------------- RadioML 2016: numpy's state
#
# find_class never hands out numpy: a forged dtype or array state (BUILD) reaches only the
# stand-ins, which take exactly what numpy pickles for a plain number dtype and array.

RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's own, pickled by name (numpy._core...)
F4_STATE = (3, "<", None, None, None, -1, -1, 0)


class _Reduced:
    """Pickles as ``fn(*args)``, then BUILD with ``state`` (none when None): how a forged
    dtype or array spells itself with numpy's own globals."""

    def __init__(self, fn, args, state=None):
        self.fn, self.args, self.state = fn, args, state

    def __reduce__(self):
        return (self.fn, self.args) if self.state is None else (self.fn, self.args, self.state)


def _dtype(state=F4_STATE, args=("f4", False, True)):
    return _Reduced(np.dtype, args, state)


def _array(state, args=(np.ndarray, (0,), b"b")):
    return _Reduced(RECONSTRUCT, args, state)


def _array_state(shape=(1, 2, 128), dtype=None, fortran=False, data=None, version=1):
    n = int(np.prod(shape)) * 4
    data = bytes(range(256)) * (n // 256) + bytes(n % 256) if data is None else data
    return (version, shape, _dtype() if dtype is None else dtype, fortran, data)


def _ops(obj) -> bytes:
    """``obj``'s protocol-2 opcodes without PROTO and STOP, to splice into a pickle."""
    data = pickle.dumps(obj, 2)
    assert data[:2] == b"\x80\x02" and data[-1:] == b"."
    return data[2:-1]


def _dict_pickle(*value_ops: bytes) -> bytes:
    """``{("BPSK", 0): value}`` where ``value_ops`` are the opcodes that leave the value."""
    return b"\x80\x02}" + _ops(("BPSK", 0)) + b"".join(value_ops) + b"s."


#: The reviewer's pickle: a V8 dtype whose field "a" is an object at offset 0, BUILD onto an
#: array of b"A" * 8: numpy's own unpickler reads those bytes as a PyObject pointer.
V8_OBJECT_FIELD = _dtype(
    (3, "|", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0x01), ("V8", False, True)
)
REVIEWERS = _array((1, (1,), V8_OBJECT_FIELD, False, b"A" * 8))
OBJECT_FIELD_F4 = _dtype((3, "<", None, ("a",), {"a": (np.dtype("O"), 0)}, 8, 1, 0x3F))

FORGED_STATES = {
    "reviewer's V8 with an object field": (REVIEWERS, "refused numpy.dtype('V8', False, True)"),
    "float32 with an object field": (  # the field's dtype('O') is refused first
        _array(_array_state((1,), OBJECT_FIELD_F4, data=b"A" * 8)),
        "refused numpy.dtype('O8', False, True) (only a plain number's (code, False, True))",
    ),
    "float32 with a field named by code": (
        _dtype((3, "<", None, ("a",), {"a": ("O", 0)}, 8, 1, 0x3F)),
        "refused numpy.dtype('f4') state (3, '<', None, ('a',), {'a': ('O', 0)}, 8, 1, 63)",
    ),
    "float32 with a float32 field": (
        _array(_array_state(dtype=_dtype((3, "<", None, ("a",), {"a": (F32.dtype, 0)}, 4, 1, 0)))),
        "refused numpy.dtype('f4') state",
    ),
    "object dtype": (
        _array(_array_state((1,), _dtype((3, "|", None, None, None, -1, -1, 63), ("O8", 0, 1)))),
        "refused numpy.dtype('O8', 0, 1) (only a plain number's (code, False, True))",
    ),
    "subarray dtype": (
        _array(_array_state(dtype=_dtype((3, "<", (np.dtype("<f4"), (2,)), None, None, 8, 4, 0)))),
        "refused numpy.dtype('f4') state",
    ),
    "object flags": (
        _array(_array_state(dtype=_dtype((3, "<", None, None, None, -1, -1, 63)))),
        "refused numpy.dtype('f4') state (3, '<', None, None, None, -1, -1, 63)",
    ),
    "elsize": (_dtype((3, "<", None, None, None, 8, 4, 0)), "refused numpy.dtype('f4') state"),
    "version 4 (metadata)": (
        _dtype((4, "<", None, None, None, -1, -1, 0, {"a": 1})),
        "refused numpy.dtype('f4') state",
    ),
    "order | for float32": (_dtype((3, "|", *F4_STATE[2:])), "refused numpy.dtype('f4') state"),
    "order < for int8": (
        _dtype((3, "<", *F4_STATE[2:]), ("i1", False, True)),
        "refused numpy.dtype('i1') state",
    ),
    "elsize -1.0": (_dtype((*F4_STATE[:5], -1.0, -1, 0)), "refused numpy.dtype('f4') state"),
    "aligned": (_dtype(args=("f4", True, True)), "refused numpy.dtype('f4', True, True)"),
    "dtype args as floats": (_dtype(args=("f4", 0.0, 1.0)), "refused numpy.dtype('f4', 0.0"),
    "dtype code <f4": (_dtype(args=("<f4", False, True)), "refused numpy.dtype('<f4'"),
    "dtype without its state": (
        _array(_array_state(dtype=_dtype(None))),
        "refused numpy array dtype numpy.dtype('f4') (only a numpy.dtype after its state)",
    ),
    "dtype a str": (_array(_array_state(dtype="f4")), "refused numpy array dtype 'f4'"),
    "short data": (
        _array(_array_state(data=bytes(1020))),
        "refused numpy array: 1020 bytes of data for float32 [1, 2, 128]",
    ),
    "long data": (
        _array(_array_state(data=bytes(1028))),
        "refused numpy array: 1028 bytes of data for float32 [1, 2, 128]",
    ),
    "negative shape": (
        _array(_array_state((-1, 2, 128), data=bytes(4))),
        "refused numpy array shape (-1, 2, 128) (a tuple of at most 32 ints >= 0, fewer than",
    ),
    "huge shape": (
        _array(_array_state((0, 2**62, 2**62), data=b"x")),
        "refused numpy array shape (0, 4611686018427387904, 4611686018427387904)",
    ),
    "shape over int64": (_array(_array_state((2**64,), data=b"x")), "refused numpy array shape"),
    "float shape": (_array(_array_state((1.0, 2, 128))), "refused numpy array shape (1.0, 2, 128)"),
    "bool shape": (_array(_array_state((True, 2, 128))), "refused numpy array shape (True, 2"),
    "33 dimensions": (_array(_array_state((1,) * 33)), "refused numpy array shape"),
    "shape a list": (_array(_array_state([1, 2, 128])), "refused numpy array shape [1, 2, 128]"),
    "4-tuple state": (_array(_array_state()[1:]), "refused numpy array state ((1, 2, 128), "),
    "version 2": (_array(_array_state(version=2)), "refused numpy array state (2, "),
    "data a list": (
        _array(_array_state(data=[0.0] * 256)),
        "refused numpy array state: fortran False, data list",
    ),
    "data not latin1": (
        _array(_array_state(data="\u0100" * 1024)),
        "refused numpy array data: not latin1",
    ),
    "fortran 2": (_array(_array_state(fortran=2)), "refused numpy array state: fortran 2"),
    "reconstruct of numpy.dtype": (
        _array(_array_state(), (np.dtype, (0,), b"b")),
        "refused _reconstruct(numpy.dtype, (0,), b'b') (only (numpy.ndarray, (0,), b'b'))",
    ),
    "reconstruct of (1,)": (
        _array(_array_state(), (np.ndarray, (1,), b"b")),
        "refused _reconstruct(numpy.ndarray, (1,), b'b')",
    ),
    "reconstruct of (False,)": (
        _array(_array_state(), (np.ndarray, (False,), b"b")),
        "refused _reconstruct(numpy.ndarray, (False,), b'b')",
    ),
    "reconstruct typecode O": (
        _array(_array_state(), (np.ndarray, (0,), b"O")),
        "refused _reconstruct(numpy.ndarray, (0,), b'O')",
    ),
    "an array without its state": (_array(None), "key ('BPSK', 0): a numpy array without state"),
}


def test_the_reviewers_pickle_is_live_for_numpy(tmp_path):
    # numpy's own unpickler makes an array of objects out of b"A" * 8 (reading it would crash;
    # the child leaves with os._exit before the array is freed).
    path = tmp_path / "reviewer.pkl"
    path.write_bytes(pickle.dumps({("BPSK", 0): REVIEWERS}, 2))
    code = (
        "import os, pickle, sys; "
        "a = pickle.loads(open(sys.argv[1], 'rb').read(), encoding='latin1')[('BPSK', 0)]; "
        "print(a.dtype.hasobject, a.dtype.fields['a'][0], flush=True); os._exit(0)"
    )
    proc = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "True object\n", proc.stderr


@pytest.mark.parametrize(
    "value, refused",
    [
        (REVIEWERS, "numpy.dtype('V8', False, True)"),
        (_array(_array_state((1,), OBJECT_FIELD_F4, data=b"A" * 8)), "numpy.dtype('O8'"),
    ],
    ids=["reviewer's V8", "float32 with an object field"],
)
def test_a_forged_numpy_state_cannot_crash_the_command(tmp_path, value, refused):
    # In a child process, so that a crash fails the test instead of the test run: before the
    # fix `iqtrain convert radioml2016` died of SIGSEGV here (returncode -11, a shell's 139).
    src = tmp_path / "RML2016.10a_dict.pkl"
    src.write_bytes(pickle.dumps({("BPSK", 0): value}, 2))
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.fspath(Path(iqtrain.__file__).parents[1])}
    cmd = [sys.executable, "-m", "iqtrain", "convert", "radioml2016", src, out]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)  # -11: the segfault
    assert proc.stderr.startswith(
        f"iqtrain: error: {src}: not a RadioML 2016 pickle: refused {refused}"
    )
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert_nothing_written(out)


@pytest.mark.parametrize("forged", list(FORGED_STATES))
def test_a_forged_numpy_state_is_refused(tmp_path, forged):
    value, message = FORGED_STATES[forged]
    path = tmp_path / "forged.pkl"
    path.write_bytes(pickle.dumps({("BPSK", 0): value}, 2))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{path}: not a RadioML 2016 pickle: "), text
    assert message in text and "\n" not in text, text
    assert_nothing_written(tmp_path / "out")


GOOD_STATE = _array_state()

SPLICED = {
    "array state twice": (
        _dict_pickle(_ops(_array(GOOD_STATE)), _ops(GOOD_STATE) + b"b"),
        "refused a second state for one numpy array",
    ),
    "dtype state twice": (
        _dict_pickle(_ops(_dtype()), _ops(F4_STATE) + b"b"),
        "refused a second state for one numpy.dtype",
    ),
    "NEWOBJ of numpy.dtype": (
        _dict_pickle(b"cnumpy\ndtype\n" + _ops(()) + b"\x81"),
        "not a RadioML 2016 pickle: ",
    ),
    "NEWOBJ of numpy.ndarray": (
        _dict_pickle(b"cnumpy\nndarray\n" + _ops(()) + b"\x81"),
        "not a RadioML 2016 pickle: ",
    ),
    "SETITEM on an array": (
        _dict_pickle(_ops(_array(GOOD_STATE)) + _ops("shape") + _ops(1) + b"s"),
        "not a RadioML 2016 pickle: ",
    ),
}


@pytest.mark.parametrize("spliced", list(SPLICED))
def test_a_spliced_pickle_is_refused(tmp_path, spliced):
    data, message = SPLICED[spliced]
    path = tmp_path / "spliced.pkl"
    path.write_bytes(data)
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{path}: not a RadioML 2016 pickle: ") and message in text, text
    assert "\n" not in text


@pytest.mark.parametrize(
    "global_",
    ["_codecs encode", "numpy dtype", "numpy ndarray", "numpy.core.multiarray _reconstruct"],
)
@pytest.mark.parametrize(
    "state",
    [
        {"__defaults__": ("latin1", "strict")},  # BUILD: __dict__.update
        (None, {"__defaults__": ("latin1", "strict"), "__call__": None}),  # BUILD: setattr
        (None, {"_spelling": "x"}),
    ],
)
def test_build_cannot_change_the_stand_ins(tmp_path, global_, state):
    module, name = global_.split()
    path = tmp_path / "build.pkl"
    path.write_bytes(_dict_pickle(f"c{module}\n{name}\n".encode() + _ops(state) + b"b"))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    spelling = {"encode": "_codecs.encode", "dtype": "numpy.dtype", "ndarray": "numpy.ndarray"}
    assert str(info.value) == (
        f"{path}: not a RadioML 2016 pickle: refused BUILD on "
        f"{spelling.get(name, name)} (it takes no state)"
    )
    # The stand-ins are as they were: no __dict__, nothing numpy's, the same restrictions.
    for stand_in in convert._ALLOWED.values():
        assert not isinstance(stand_in, type) and not hasattr(stand_in, "__dict__")
        assert type(stand_in).__module__ == "iqtrain.data.convert"
    assert convert._ENCODE("x", "latin1") == b"x"
    with pytest.raises(pickle.UnpicklingError):
        convert._ENCODE("x")


def test_the_allowed_globals_are_exactly_numpys_array_reconstruction():
    assert set(convert._ALLOWED) == {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"),
    }


def test_a_numpy_integer_key_is_refused(tmp_path):
    # RML2016.10a's keys hold Python ints: numpy's scalar is not among the globals.
    path = tmp_path / "np_int.pkl"
    path.write_bytes(pickle.dumps({("BPSK", np.int64(0)): F32}, 2))
    with pytest.raises(
        DataError, match=r"refused pickle global numpy\._?core\.multiarray\.scalar "
    ):
        convert_radioml2016(path, tmp_path / "out")


def _converted(tmp_path, data: bytes) -> np.ndarray:
    """The [N, 2, 128] samples ``convert_radioml2016`` writes for a one-key pickle."""
    path = tmp_path / "one.pkl"
    path.write_bytes(data)
    convert_radioml2016(path, tmp_path / "out")
    return np.stack([iq for *_, iq in examples(tmp_path / "out")]).transpose(0, 2, 1)


def test_a_fortran_array_is_converted_in_its_own_order(tmp_path, rng):
    arr = np.asfortranarray(rng.standard_normal((3, 2, 128)).astype(np.float32))
    assert arr.__reduce__()[2][3] is True  # pickled as Fortran-ordered bytes
    got = _converted(tmp_path, pickle.dumps({("BPSK", 0): arr}, 2))
    assert got.tobytes() == np.ascontiguousarray(arr).tobytes()


@pytest.mark.parametrize("order", ["<", ">", "="])
def test_either_byte_order_is_converted(tmp_path, rng, order):
    arr = rng.standard_normal((2, 2, 128)).astype(np.float32)
    data = arr.astype(order + "f4").tobytes()
    state = (1, arr.shape, _dtype((3, order, *F4_STATE[2:])), False, data)
    got = _converted(tmp_path, pickle.dumps({("BPSK", 0): _array(state)}, 2))
    assert got.tobytes() == arr.tobytes()


@pytest.mark.parametrize("module", [b"numpy.core.multiarray", b"numpy._core.multiarray"])
@pytest.mark.parametrize("protocol", [2, 3, 4])
def test_numpy_1_and_2_module_names_and_protocols(tmp_path, rng, module, protocol):
    # numpy 1 writes numpy.core.multiarray._reconstruct, numpy 2 numpy._core; SNR +-1000 is in.
    d = {
        ("A", -1000): rng.standard_normal((2, 2, 128)).astype(np.float32),
        ("B", 1000): np.asfortranarray(rng.standard_normal((1, 2, 128)).astype(">f4")),
    }
    data = pickle.dumps(d, protocol)
    ours = (
        b"numpy._core.multiarray" if b"numpy._core.multiarray" in data else b"numpy.core.multiarray"
    )
    data = data.replace(ours + b"\n", module + b"\n")  # GLOBAL (protocols 2, 3)
    short_unicode = b"\x8c%c%s"  # STACK_GLOBAL's module (4): FRAME lengths redone
    data = data.replace(short_unicode % (len(ours), ours), short_unicode % (len(module), module))
    data = pickletools.optimize(data)
    assert module in data and (module == ours or ours not in data)
    got = _converted(tmp_path, data)
    assert got.tobytes() == np.concatenate([d[k] for k in sorted(d)]).astype("<f4").tobytes()


def test_a_protocol_5_out_of_band_pickle_is_refused(tmp_path):
    path = tmp_path / "p5.pkl"
    path.write_bytes(pickle.dumps({("BPSK", 0): F32}, 5))
    with pytest.raises(
        DataError, match=r"refused pickle global numpy\._?core\.numeric\._frombuffer "
    ):
        convert_radioml2016(path, tmp_path / "out")


# ------------------------------------------------------------------------------------ OUT_DIR


def test_out_dir_must_be_absent_or_empty(rml2016, tmp_path):
    path, _ = rml2016
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        convert_radioml2016(path, full)
    assert [p.name for p in full.iterdir()] == ["keep"]
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        convert_radioml2016(path, full / "keep")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert_radioml2016(path, empty).recordings == 1
    nested = tmp_path / "a" / "b" / "out"  # parents are made
    assert convert_radioml2016(path, nested).out_dir == nested


def test_a_write_failure_leaves_nothing(rml2016, tmp_path, monkeypatch):
    path, _ = rml2016
    monkeypatch.setattr(convert, "MAX_RECORDING_SAMPLES", 128 * 4)
    calls = []

    def failing_fsync(p):
        calls.append(p)
        if len(calls) == 5:  # the third recording's metadata
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(convert, "fsync_file", failing_fsync)
    out = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(StorageError) as info:
        convert_radioml2016(path, out)
    assert str(info.value).endswith(
        "radioml2016_00002.sigmf-data: cannot write: No space left on device"
    )
    assert not (tmp_path / "new").exists()  # the parents it made go too


def test_an_interrupted_conversion_leaves_nothing(rml2016, tmp_path, monkeypatch):
    path, _ = rml2016

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "write_json_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_radioml2016(path, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def _long_name(tmp_path: Path) -> Path:
    # As long as a name may be, so OUT_DIR.tmp-<pid> (its sibling, written first) is too long.
    return tmp_path / ("o" * os.pathconf(tmp_path, "PC_NAME_MAX"))


def _symlink_loop(tmp_path: Path) -> Path:
    (tmp_path / "loop").symlink_to("loop")
    return tmp_path / "loop" / "out"


def _symlink_to_a_directory(tmp_path: Path) -> Path:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    return tmp_path / "link"


@pytest.mark.parametrize(
    "make, message",
    [
        (_symlink_to_a_directory, "is a symbolic link"),
        (_symlink_loop, "cannot be created: "),
        (_long_name, "cannot be created: "),
    ],
    ids=["symlink to a directory", "parent a symlink loop", "name too long for OUT.tmp-<pid>"],
)
def test_an_out_dir_that_cannot_take_the_result_is_refused_before_reading(
    rml2016, tmp_path, monkeypatch, make, message
):
    path, _ = rml2016
    out = make(tmp_path)

    def unread(*args):
        raise AssertionError("the source was read before OUT_DIR was checked")

    monkeypatch.setattr(convert, "_unpickle", unread)
    with pytest.raises(ConfigError) as info:
        convert_radioml2016(path, out)
    text = str(info.value)
    assert text.startswith(f"{out}: ") and message in text and "\n" not in text, text
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_mount_point_out_dir_is_refused(rml2016, tmp_path, monkeypatch):
    # rename(2) cannot put the new directory onto a mount point (EBUSY, after the whole work).
    path, _ = rml2016
    out = tmp_path / "mnt"
    out.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) == os.fspath(out) or real(p))
    with pytest.raises(ConfigError) as info:
        convert_radioml2016(path, out)
    assert str(info.value).startswith(f"{out}: is a mount point")
    assert list(out.iterdir()) == []


# ------------------------------------------------------------------------------- RadioML 2018


def test_rml2018_classes_are_the_papers_24():
    assert len(RML2018_CLASSES) == len(set(RML2018_CLASSES)) == 24
    assert RML2018_CLASSES[:5] == ("OOK", "4ASK", "8ASK", "BPSK", "QPSK")
    assert RML2018_CLASSES[-3:] == ("FM", "GMSK", "OQPSK")


def test_rml2018_round_trip_in_chunks(tmp_path, rng, monkeypatch):
    src = tmp_path / "GOLD_XYZ_OSC.0001_1024.hdf5"
    x, cls, snr = write_rml2018(src, rng, n=150)
    # Chunks of 64 and recordings of 50 examples: recordings straddle chunks.
    monkeypatch.setattr(convert, "RML2018_CHUNK", 64)
    monkeypatch.setattr(convert, "MAX_RECORDING_SAMPLES", 1024 * 50)
    out = tmp_path / "out"
    result = convert_radioml2018(src, out)
    assert result == ConvertResult(out, 3, 150, RML2018_CLASSES)
    got = examples(out)
    assert [row for _, _, row, _ in got] == list(range(150))  # the file's own order
    assert [label for label, *_ in got] == [RML2018_CLASSES[c] for c in cls]
    assert [s for _, s, _, _ in got] == snr.tolist()
    assert np.stack([iq for *_, iq in got]).tobytes() == x.tobytes()  # X is already I, Q
    side = json.loads((out / "convert.json").read_text())
    assert side["dataset"] == "radioml2018" and side["classes"] == list(RML2018_CLASSES)
    assert side["source"]["bytes"] == src.stat().st_size and side["source"]["name"] == src.name
    assert "O'Shea, Roy, Clancy" in side["class_order"]
    assert sum(side["examples_per_class"].values()) == 150
    assert side["samples_per_example"] == 1024


def test_rml2018_labelled_windows_and_classes_file(tmp_path, rng):
    from iqtrain.data.windows import labelled_windows

    src = tmp_path / "small.hdf5"
    _, cls, _ = write_rml2018(src, rng, n=40, width=5)
    names = tmp_path / "classes.txt"
    names.write_text("A\nB\n  C  \n\nD\nE\n")
    result = convert_radioml2018(src, tmp_path / "out", classes_file=names)
    assert result.classes == ("A", "B", "C", "D", "E")
    found = labelled_windows([os.fspath(tmp_path / "out" / "*.sigmf-meta")], window=1024)
    assert len(found) == found.num_annotations == 40
    assert [found.classes[i] for i in found.labels] == ["ABCDE"[c] for c in cls]
    assert found.starts.tolist() == [1024 * i for i in range(40)]


def test_rml2018_class_count_must_match_y(tmp_path, rng):
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=4, width=11)
    with pytest.raises(DataError, match=r"Y has 11 columns, the RadioML 2018.01A class list 24"):
        convert_radioml2018(src, tmp_path / "out")
    names = tmp_path / "names.txt"
    names.write_text("\n".join(map(str, range(24))))
    with pytest.raises(DataError, match=rf"^{names}: 24 class names, but Y in {src} has 11"):
        convert_radioml2018(src, tmp_path / "out", classes_file=names)
    names.write_text("a\nb\na\n")
    with pytest.raises(DataError, match=r"class 'a' is listed twice"):
        convert_radioml2018(src, tmp_path / "out", classes_file=names)
    with pytest.raises(DataError, match="cannot read"):
        convert_radioml2018(src, tmp_path / "out", classes_file=tmp_path / "absent.txt")
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize(
    "row, value", [(0, [0] * 24), (130, [1] * 2 + [0] * 22), (149, [2] + [0] * 23)]
)
def test_rml2018_a_row_that_is_not_one_hot_is_named(tmp_path, rng, monkeypatch, row, value):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=150)
    with h5py.File(src, "r+") as f:
        f["Y"][row] = value
    monkeypatch.setattr(convert, "RML2018_CHUNK", 64)  # found after recordings were written
    monkeypatch.setattr(convert, "MAX_RECORDING_SAMPLES", 1024 * 30)
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == (
        f"{src}: Y row {row} is not one-hot (exactly one 1, the rest 0): {value}"
    )
    assert_nothing_written(tmp_path / "out")


def _layout_variants(rng):
    n = 6
    good = {
        "X": np.zeros((n, 1024, 2), np.float32),
        "Y": np.eye(24, dtype=np.int64)[np.arange(n)],
        "Z": np.zeros((n, 1), np.int64),
    }
    return {
        "X too short": (
            {**good, "X": np.zeros((n, 128, 2), np.float32)},
            "X is float32 [6, 128, 2]",
        ),
        "X float64": ({**good, "X": np.zeros((n, 1024, 2))}, "X is float64 [6, 1024, 2]"),
        "X as [N, 2, 1024]": ({**good, "X": np.zeros((n, 2, 1024), np.float32)}, "X is float32"),
        "no Z": ({"X": good["X"], "Y": good["Y"]}, "no dataset 'Z'"),
        "Z rows": ({**good, "Z": np.zeros((n + 1, 1), np.int64)}, "Z is int64 [7, 1]"),
        "Z float": ({**good, "Z": np.zeros((n, 1))}, "Z is float64 [6, 1]"),
        "Y float": ({**good, "Y": good["Y"].astype(np.float32)}, "Y is float32 [6, 24]"),
        "Y 1-d": ({**good, "Y": np.zeros(n, np.int64)}, "Y is int64 [6]"),
        "empty": ({k: v[:0] for k, v in good.items()}, "X is float32 [0, 1024, 2]"),
        "X NaN": (
            {
                **good,
                "X": np.where(np.arange(n)[:, None, None] == 4, np.nan, good["X"]).astype(
                    np.float32
                ),
            },
            "X row 4: non-finite",
        ),
    }


@pytest.mark.parametrize("variant", list(_layout_variants(np.random.default_rng(0))))
def test_rml2018_layout_is_checked(tmp_path, variant):
    h5py = h5py_or_skip()
    datasets, message = _layout_variants(np.random.default_rng(0))[variant]
    src = tmp_path / "s.hdf5"
    with h5py.File(src, "w") as f:
        for name, value in datasets.items():
            f[name] = value
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{src}: ") and message in text and "\n" not in text, text
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize("name", ["X", "Y", "Z"])
def test_rml2018_an_empty_dataspace_is_refused(tmp_path, rng, name):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=4)
    with h5py.File(src, "r+") as f:
        dtype = f[name].dtype
        del f[name]
        f[name] = h5py.Empty(dtype)  # a dataset with no shape: ds.shape is None
        assert f[name].shape is None
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == (
        f"{src}: {name} has an empty dataspace (no shape; RadioML 2018.01A: X float32 "
        "[N, 1024, 2], Y int one-hot [N, 24], Z int [N, 1])"
    )
    assert_nothing_written(tmp_path / "out")


@pytest.mark.parametrize(
    "dtype, row, value",
    [(np.uint64, 130, 2**63), (np.uint64, 0, 1001), (np.int64, 149, -1001), (np.int8, 3, -128)],
)
def test_rml2018_an_snr_out_of_range_is_named(tmp_path, rng, monkeypatch, dtype, row, value):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=150)
    z = np.zeros((150, 1), dtype)
    z[row] = value
    with h5py.File(src, "r+") as f:
        del f["Z"]
        f["Z"] = z
    monkeypatch.setattr(convert, "RML2018_CHUNK", 64)  # found after recordings were written
    monkeypatch.setattr(convert, "MAX_RECORDING_SAMPLES", 1024 * 30)
    monkeypatch.setattr(convert, "MAX_ABS_SNR_DB", 100)  # the bound is read when checking
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == (
        f"{src}: Z row {row}: SNR {value} dB is out of range (|SNR| <= 100 dB)"
    )
    assert_nothing_written(tmp_path / "out")


def test_rml2018_snrs_at_the_bound_and_of_any_integer_type(tmp_path, rng):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=4)
    with h5py.File(src, "r+") as f:
        del f["Z"]
        f["Z"] = np.array([[1000], [0], [7], [1000]], np.uint16)
    convert_radioml2018(src, tmp_path / "out")
    assert [snr for _, snr, _, _ in examples(tmp_path / "out")] == [1000, 0, 7, 1000]


@pytest.mark.parametrize("damage", ["truncated", "text", "missing"])
def test_rml2018_unreadable_sources(tmp_path, rng, damage):
    h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=20)
    if damage == "truncated":
        src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    elif damage == "text":
        src.write_text("not hdf5\n")
    else:
        src.unlink()
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{src}: ") and "\n" not in text, text
    assert_nothing_written(tmp_path / "out")


def _storage_variants(h5py, tmp_path: Path, n: int) -> dict:
    """X datasets whose data is not all stored in the file: each reads as zeros (the fill
    value) without an error."""
    shape = (n, 1024, 2)
    (tmp_path / "ext.bin").write_bytes(bytes(n * 1024 * 2 * 4))
    layout = h5py.VirtualLayout(shape, np.float32)
    layout[:] = h5py.VirtualSource(tmp_path / "gone.h5", "X", shape=shape)
    return {
        "virtual, its source missing": (
            lambda f: f.create_virtual_dataset("X", layout),
            "X is a virtual dataset",
        ),
        "chunked, no chunk written": (
            lambda f: f.create_dataset("X", shape, np.float32, chunks=(1, 1024, 2)),
            "X has 0 of its 4 chunks written",
        ),
        "chunked, one chunk written": (
            lambda f: f.create_dataset("X", shape, np.float32, chunks=(1, 1024, 2)).__setitem__(
                0, 1.0
            ),
            "X has 1 of its 4 chunks written",
        ),
        "contiguous, never written": (
            lambda f: f.create_dataset("X", shape, np.float32),
            "X has 0 of its 32768 bytes stored",
        ),
        "external storage": (
            lambda f: f.create_dataset(
                "X", shape, np.float32, external=[(os.fspath(tmp_path / "ext.bin"), 0, 32768)]
            ),
            "X has external storage",
        ),
        "a soft link to itself": (
            lambda f: f.__setitem__("X", h5py.SoftLink("/X")),
            "cannot open X: ",
        ),
        "an external link": (
            lambda f: f.__setitem__("X", h5py.ExternalLink(tmp_path / "gone.h5", "/X")),
            "X is a link into another file",
        ),
    }


@pytest.mark.parametrize(
    "variant",
    [
        "virtual, its source missing",
        "chunked, no chunk written",
        "chunked, one chunk written",
        "contiguous, never written",
        "external storage",
        "a soft link to itself",
        "an external link",
    ],
)
def test_rml2018_data_not_stored_in_the_file_is_refused(tmp_path, variant):
    h5py = h5py_or_skip()
    n = 4
    make, message = _storage_variants(h5py, tmp_path, n)[variant]
    src = tmp_path / "s.hdf5"
    with h5py.File(src, "w") as f:
        f["Y"], f["Z"] = np.eye(24, dtype=np.int64)[:n], np.zeros((n, 1), np.int64)
        make(f)
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    text = str(info.value)
    assert text.startswith(f"{src}: ") and message in text and "\n" not in text, text
    assert_nothing_written(tmp_path / "out")


def test_rml2018_compressed_chunks_all_written_are_converted(tmp_path, rng):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    x, _, _ = write_rml2018(src, rng, n=5)
    with h5py.File(src, "r+") as f:
        del f["X"]
        f.create_dataset("X", data=x, chunks=(2, 1024, 2), compression="gzip")
        assert f["X"].id.get_storage_size() < f["X"].nbytes  # compressed: fewer bytes
    assert convert_radioml2018(src, tmp_path / "out").examples == 5
    assert np.array_equal(np.stack([e[3] for e in examples(tmp_path / "out")]), x)


def test_rml2018_a_classes_file_must_be_a_small_regular_file(tmp_path, rng):
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=2)
    for classes, message in [
        (tmp_path, "not a regular file"),
        (Path("/dev/null"), "not a regular file"),
    ]:
        with pytest.raises(DataError) as info:
            convert_radioml2018(src, tmp_path / "out", classes_file=classes)
        assert str(info.value) == f"{classes}: {message}"
    big = tmp_path / "big.txt"
    with big.open("wb") as f:
        f.truncate(convert.MAX_CLASSES_BYTES + 1)  # sparse: no disk used
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out", classes_file=big)
    assert str(info.value) == (
        f"{big}: {convert.MAX_CLASSES_BYTES + 1} bytes, more than a class list may have "
        f"({convert.MAX_CLASSES_BYTES})"
    )
    assert_nothing_written(tmp_path / "out")


def test_rml2018_without_h5py_is_one_line(tmp_path, rng, monkeypatch):
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=2)
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    with pytest.raises(ConfigError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == "radioml2018 needs h5py: pip install 'iqtrain[radioml]'"
    assert_nothing_written(tmp_path / "out")


def test_importing_convert_loads_neither_h5py_nor_torch():
    code = "import sys, iqtrain.data.convert; print(sorted({'h5py', 'torch'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": os.fspath(Path(iqtrain.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr

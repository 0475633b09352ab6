"""The RadioML 2016 pickle read without running it (iqtrain.data.convert.unpickler): forged
globals run nothing, numpy's state reaches only the stand-ins, dict keys are flat and given
once. Each through convert_radioml2016, as a user meets it."""

from __future__ import annotations

import codecs
import os
import pickle
import pickletools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import Forged, deep_key_pickle

import iqtrain
from iqtrain.data.convert import convert_radioml2016, unpickler
from iqtrain.errors import DataError


def _forged_pickles(marker: Path) -> dict[str, bytes]:
    create = f"open({os.fspath(marker)!r}, 'w').close()"
    return {
        "posix.system": pickle.dumps({("BPSK", 0): Forged(os.system, f"touch '{marker}'")}, 2),
        "__builtin__.eval": pickle.dumps({("BPSK", 0): Forged(eval, create)}, 2),
        "builtins.exec": pickle.dumps({("BPSK", 0): Forged(exec, create)}, 4),
    }


def test_the_forged_pickles_are_live(tmp_path):
    marker = tmp_path / "marker"
    pickle.loads(_forged_pickles(marker)["__builtin__.eval"])  # a plain unpickler runs it
    assert marker.exists()


@pytest.mark.parametrize("refused", ["posix.system", "__builtin__.eval", "builtins.exec"])
def test_a_forged_pickle_runs_nothing(tmp_path, refused, assert_nothing_written):
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
    path.write_bytes(pickle.dumps({("BPSK", 0): Forged(codecs.encode, "x", "rot13")}, 2))
    assert b"c_codecs\nencode\n" in path.read_bytes()
    with pytest.raises(DataError, match=r"not a RadioML 2016 pickle: _codecs.encode\('rot13'\)"):
        convert_radioml2016(path, tmp_path / "out")


F32 = np.zeros((2, 2, 128), np.float32)


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
def test_rml2016_a_key_given_twice_is_refused(tmp_path, how, assert_nothing_written):
    # A dict keeps the last value of a key given twice: the first rows would go unnoticed.
    path = tmp_path / "twice.pkl"
    first, second = _key_value_ops(F32), _key_value_ops(F32[:1])
    path.write_bytes(b"\x80\x02" + how % (first, second))
    with pytest.raises(DataError) as info:
        convert_radioml2016(path, tmp_path / "out")
    assert str(info.value) == f"{path}: key ('BPSK', 0) appears twice"
    assert_nothing_written(tmp_path / "out")


def test_rml2016_a_key_nested_thousands_deep_is_one_line(tmp_path, assert_nothing_written):
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
def test_a_forged_numpy_state_cannot_crash_the_command(
    tmp_path, value, refused, assert_nothing_written
):
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
def test_a_forged_numpy_state_is_refused(tmp_path, forged, assert_nothing_written):
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
    for stand_in in unpickler._ALLOWED.values():
        assert not isinstance(stand_in, type) and not hasattr(stand_in, "__dict__")
        assert type(stand_in).__module__ == "iqtrain.data.convert.unpickler"
    assert unpickler._ENCODE("x", "latin1") == b"x"
    with pytest.raises(pickle.UnpicklingError):
        unpickler._ENCODE("x")


def test_the_allowed_globals_are_exactly_numpys_array_reconstruction():
    assert set(unpickler._ALLOWED) == {
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
    """The [N, 2, 128] samples ``convert_radioml2016`` writes for a small pickle (one recording:
    its examples back to back, [N, 128, 2] interleaved I, Q)."""
    path = tmp_path / "one.pkl"
    path.write_bytes(data)
    convert_radioml2016(path, tmp_path / "out")
    raw = np.fromfile(tmp_path / "out" / "radioml2016_00000.sigmf-data", dtype="<f4")
    return raw.reshape(-1, 128, 2).transpose(0, 2, 1)


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

"""RadioML 2018.01A to labelled SigMF (iqtrain.data.convert.rml2018): an HDF5 file with X, Y, Z
in the distributed layout, converted in chunks and read back; its layout, storage and class
list checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import h5py_or_skip

import iqtrain
from iqtrain.data.convert import (
    RML2018_CLASSES,
    ClassCountError,
    ConvertResult,
    convert_radioml2018,
    output,
    rml2018,
)
from iqtrain.errors import ConfigError, DataError


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


def test_rml2018_labels_are_the_papers_class_names_by_y_column(tmp_path, examples):
    # The file holds no names: without a class list, Y's column k is the paper's k-th class
    # (O'Shea, Roy, Clancy, IEEE JSTSP 2018), not classes.txt's order.
    h5py = h5py_or_skip()
    columns = [0, 1, 3, 4, 17, 21, 22, 23]
    src = tmp_path / "GOLD_XYZ_OSC.0001_1024.hdf5"
    with h5py.File(src, "w") as f:
        f["X"] = np.zeros((len(columns), 1024, 2), np.float32)
        f["Y"] = np.eye(24, dtype=np.int64)[columns]
        f["Z"] = np.zeros((len(columns), 1), np.int64)
    result = convert_radioml2018(src, tmp_path / "out")
    labels = [label for label, *_ in examples(tmp_path / "out")]
    assert labels == ["OOK", "4ASK", "BPSK", "QPSK", "AM-SSB-WC", "FM", "GMSK", "OQPSK"]
    side = json.loads((tmp_path / "out" / "convert.json").read_text())
    assert side["classes"] == list(result.classes) and len(set(result.classes)) == 24
    assert side["examples_per_class"]["OOK"] == 1 and side["examples_per_class"]["32PSK"] == 0


def test_rml2018_round_trip_in_chunks(tmp_path, rng, monkeypatch, examples):
    src = tmp_path / "GOLD_XYZ_OSC.0001_1024.hdf5"
    x, cls, snr = write_rml2018(src, rng, n=150)
    # Chunks of 64 and recordings of 50 examples: recordings straddle chunks.
    monkeypatch.setattr(rml2018, "RML2018_CHUNK", 64)
    monkeypatch.setattr(output, "MAX_RECORDING_SAMPLES", 1024 * 50)
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
    side = json.loads((tmp_path / "out" / "convert.json").read_text())
    assert side["class_order"] == f"classes_file {names}"


def test_rml2018_class_count_must_match_y(tmp_path, rng, assert_nothing_written):
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=4, width=11)
    with pytest.raises(ClassCountError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == (  # the library names its parameter (the command, its flag)
        f"{src}: Y has 11 columns, the RadioML 2018.01A class list 24; "
        "pass classes_file with 11 names, one per line"
    )
    assert isinstance(info.value, DataError) and info.value.width == 11
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
def test_rml2018_a_row_that_is_not_one_hot_is_named(
    tmp_path, rng, monkeypatch, row, value, assert_nothing_written
):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=150)
    with h5py.File(src, "r+") as f:
        f["Y"][row] = value
    monkeypatch.setattr(rml2018, "RML2018_CHUNK", 64)  # found after recordings were written
    monkeypatch.setattr(output, "MAX_RECORDING_SAMPLES", 1024 * 30)
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
def test_rml2018_layout_is_checked(tmp_path, variant, assert_nothing_written):
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
def test_rml2018_an_empty_dataspace_is_refused(tmp_path, rng, name, assert_nothing_written):
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
def test_rml2018_an_snr_out_of_range_is_named(
    tmp_path, rng, monkeypatch, dtype, row, value, assert_nothing_written
):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=150)
    z = np.zeros((150, 1), dtype)
    z[row] = value
    with h5py.File(src, "r+") as f:
        del f["Z"]
        f["Z"] = z
    monkeypatch.setattr(rml2018, "RML2018_CHUNK", 64)  # found after recordings were written
    monkeypatch.setattr(output, "MAX_RECORDING_SAMPLES", 1024 * 30)
    monkeypatch.setattr(rml2018, "MAX_ABS_SNR_DB", 100)  # the bound is read when checking
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out")
    assert str(info.value) == (
        f"{src}: Z row {row}: SNR {value} dB is out of range (|SNR| <= 100 dB)"
    )
    assert_nothing_written(tmp_path / "out")


def test_rml2018_snrs_at_the_bound_and_of_any_integer_type(tmp_path, rng, examples):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    write_rml2018(src, rng, n=4)
    with h5py.File(src, "r+") as f:
        del f["Z"]
        f["Z"] = np.array([[1000], [0], [7], [1000]], np.uint16)
    convert_radioml2018(src, tmp_path / "out")
    assert [snr for _, snr, _, _ in examples(tmp_path / "out")] == [1000, 0, 7, 1000]


@pytest.mark.parametrize("damage", ["truncated", "text", "missing"])
def test_rml2018_unreadable_sources(tmp_path, rng, damage, assert_nothing_written):
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
def test_rml2018_data_not_stored_in_the_file_is_refused(tmp_path, variant, assert_nothing_written):
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


def test_rml2018_compressed_chunks_all_written_are_converted(tmp_path, rng, examples):
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    x, _, _ = write_rml2018(src, rng, n=5)
    with h5py.File(src, "r+") as f:
        del f["X"]
        f.create_dataset("X", data=x, chunks=(2, 1024, 2), compression="gzip")
        assert f["X"].id.get_storage_size() < f["X"].nbytes  # compressed: fewer bytes
    assert convert_radioml2018(src, tmp_path / "out").examples == 5
    assert np.array_equal(np.stack([e[3] for e in examples(tmp_path / "out")]), x)


def test_rml2018_a_classes_file_must_be_a_small_regular_file(tmp_path, rng, assert_nothing_written):
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
        f.truncate(rml2018.MAX_CLASSES_BYTES + 1)  # sparse: no disk used
    with pytest.raises(DataError) as info:
        convert_radioml2018(src, tmp_path / "out", classes_file=big)
    assert str(info.value) == (
        f"{big}: {rml2018.MAX_CLASSES_BYTES + 1} bytes, more than a class list may have "
        f"({rml2018.MAX_CLASSES_BYTES})"
    )
    assert_nothing_written(tmp_path / "out")


def test_rml2018_without_h5py_is_one_line(tmp_path, rng, monkeypatch, assert_nothing_written):
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

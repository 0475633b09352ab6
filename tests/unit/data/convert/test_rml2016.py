"""RadioML 2016.10A to labelled SigMF (iqtrain.data.convert.rml2016): the pickle in its
distributed layout, converted and read back; its structure checked before anything is written."""

from __future__ import annotations

import hashlib
import json
import os
import pickle

import numpy as np
import pytest

import iqtrain
from iqtrain.data.convert import MAX_RECORDING_SAMPLES, ConvertResult, convert_radioml2016
from iqtrain.errors import DataError


def test_the_py2_builder_is_a_py2_pickle(rml2016):
    path, d = rml2016
    with pytest.raises(UnicodeDecodeError):  # Python 2 str: needs encoding="latin1" ...
        pickle.loads(path.read_bytes())
    back = pickle.loads(path.read_bytes(), encoding="latin1")  # ... and then is the dict
    assert back.keys() == d.keys()
    assert all(np.array_equal(back[k], d[k]) and back[k].dtype == np.float32 for k in d)


def test_rml2016_round_trip(rml2016, tmp_path, examples, read_back):
    path, d = rml2016
    out = tmp_path / "out"
    result = convert_radioml2016(path, out)
    total = sum(len(a) for a in d.values())
    assert result == ConvertResult(out, 1, total, tuple(sorted({mod for mod, _ in d})))
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
    assert side["dataset"] == "radioml2016" and side["classes"] == sorted({mod for mod, _ in d})
    assert side["examples"] == sum(len(a) for a in d.values()) and side["recordings"] == 1
    assert side["examples_per_class"] == {
        m: sum(len(a) for (mod, _), a in d.items() if mod == m)
        for m in sorted({mod for mod, _ in d})
    }
    assert side["snr_db"] == sorted({snr for _, snr in d})
    assert side["version"] == iqtrain.__version__ and side["tool"] == "iqtrain convert"
    assert side["max_recording_samples"] == MAX_RECORDING_SAMPLES == 1 << 20
    assert side["samples_per_example"] == 128 and side["datatype"] == "cf32_le"


def test_rml2016_python3_protocol2_pickle_with_bytes_and_str_names(tmp_path, rng, examples):
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


def test_rml2016_labelled_windows_find_every_example_once(rml2016, tmp_path):
    from iqtrain.data.windows import labelled_windows

    path, d = rml2016
    out = tmp_path / "out"
    convert_radioml2016(path, out)
    found = labelled_windows([os.fspath(out / "*.sigmf-meta")], window=128)
    total = sum(len(a) for a in d.values())
    assert len(found) == found.num_annotations == total
    assert found.classes == tuple(sorted({mod for mod, _ in d}))
    labels = [found.classes[i] for i in found.labels]
    assert labels == [mod for (mod, _), arr in sorted(d.items()) for _ in range(len(arr))]
    assert found.starts.tolist() == [128 * i for i in range(total)]


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
def test_rml2016_structure_is_checked(tmp_path, obj, message, assert_nothing_written):
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
def test_rml2016_unreadable_sources(rml2016, tmp_path, damage, assert_nothing_written):
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

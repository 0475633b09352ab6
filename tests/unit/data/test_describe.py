"""``iqtrain describe``: a raw SDR capture one command away from training, its metadata checked
by sigmf-python and by iqtrain's reader, nothing written on a refusal."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import sigmf

from iqtrain.cli.main import main
from iqtrain.data.dataset import IQDataset
from iqtrain.data.describe import RawCapture, describe_raw
from iqtrain.errors import ConfigError, DataError


def _raw(path, n=512, header=b"", trailer=b""):
    iq = np.random.default_rng(0).integers(0, 256, size=(n, 2), dtype=np.uint8)
    path.write_bytes(header + iq.tobytes() + trailer)
    return iq


def test_an_rtl_sdr_capture_becomes_a_recording_sigmf_and_iqtrain_read(tmp_path):
    iq = _raw(tmp_path / "fm.cu8", header=b"H" * 16, trailer=b"T" * 4)
    capture = RawCapture(
        datatype="cu8",
        sample_rate=2.4e6,
        frequency=100.1e6,
        header_bytes=16,
        trailing_bytes=4,
        label="FM",
    )
    meta, samples = describe_raw(tmp_path / "fm.cu8", capture)
    assert meta == tmp_path / "fm.sigmf-meta" and samples == 512
    md = json.loads(meta.read_text())
    assert md["global"]["core:dataset"] == "fm.cu8" and md["global"]["core:sample_rate"] == 2.4e6
    assert md["captures"] == [
        {"core:sample_start": 0, "core:header_bytes": 16, "core:frequency": 100.1e6}
    ]
    handle = sigmf.fromfile(os.fspath(meta))  # core:sha512 checked by sigmf-python
    handle.validate()
    assert handle.sample_count == 512
    ds = IQDataset([meta], window=64)
    np.testing.assert_array_equal(ds.window(2), iq[128:192].astype(np.int16) - 128)
    assert ds.verify_content() == []
    assert ds.recordings[0].sample_rate == 2.4e6


def test_sdr_tool_names_are_datatypes(tmp_path):
    (tmp_path / "h.cs8").write_bytes(bytes(64))
    meta, _ = describe_raw(tmp_path / "h.cs8", RawCapture(datatype="cs8", sample_rate=8e6))
    assert json.loads(meta.read_text())["global"]["core:datatype"] == "ci8"
    (tmp_path / "g.cf32").write_bytes(bytes(64))
    meta, _ = describe_raw(tmp_path / "g.cf32", RawCapture(datatype="cf32", sample_rate=1e6))
    assert json.loads(meta.read_text())["global"]["core:datatype"] == "cf32_le"


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        ({"datatype": "rf32_le"}, ConfigError, "--datatype"),
        ({"datatype": "wav"}, ConfigError, "--datatype"),
        ({"sample_rate": 0.0}, ConfigError, "--sample-rate"),
        ({"sample_rate": float("nan")}, ConfigError, "--sample-rate"),
        ({"header_bytes": -1}, ConfigError, "--header-bytes"),
        ({"label": " "}, ConfigError, "--label"),
        ({"header_bytes": 3}, DataError, "not a whole, non-zero number"),
        ({"header_bytes": 1024}, DataError, "not a whole, non-zero number"),
    ],
)
def test_a_description_that_cannot_be_right_writes_nothing(tmp_path, kw, exc, words):
    _raw(tmp_path / "c.cu8", n=256)
    capture = RawCapture(**{"datatype": "cu8", "sample_rate": 1e6, **kw})
    with pytest.raises(exc, match=words):
        describe_raw(tmp_path / "c.cu8", capture)
    assert sorted(os.listdir(tmp_path)) == ["c.cu8"]


def test_the_command_refuses_to_overwrite_and_names_its_flags(tmp_path, capsys):
    _raw(tmp_path / "c.cu8", n=256)
    args = [
        "describe",
        os.fspath(tmp_path / "c.cu8"),
        "--datatype",
        "cu8",
        "--sample-rate",
        "2.4e6",
    ]
    assert main(args) == 0
    assert "256 samples" in capsys.readouterr().out
    before = (tmp_path / "c.sigmf-meta").read_bytes()
    assert main(args + ["--label", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"iqtrain: error: --out: {tmp_path / 'c.sigmf-meta'} exists; pass --force to replace it"
    ]
    assert (tmp_path / "c.sigmf-meta").read_bytes() == before
    assert main(args + ["--label", "x", "--force"]) == 0
    assert (
        json.loads((tmp_path / "c.sigmf-meta").read_text())["annotations"][0]["core:label"] == "x"
    )
    for bad in (["--out", os.fspath(tmp_path / "elsewhere" / "c.sigmf-meta")], ["--out", "c.json"]):
        assert main(args + bad) == 2
        assert capsys.readouterr().err.count("\n") == 1
    assert main(["describe", os.fspath(tmp_path / "missing.cu8"), "--datatype", "cu8",
                 "--sample-rate", "1"]) == 2  # fmt: skip
    assert "missing.cu8: cannot be read" in capsys.readouterr().err

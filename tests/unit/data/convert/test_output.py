"""What a conversion writes (iqtrain.data.convert.output): recordings of whole examples, at most
MAX_RECORDING_SAMPLES each, valid SigMF for sigmf and for iqtrain."""

from __future__ import annotations

import os

import numpy as np
import sigmf

from iqtrain.data.convert import convert_radioml2016, output
from iqtrain.data.sigmf import read_recording


def test_rml2016_recordings_are_capped_and_hold_whole_examples(
    rml2016, tmp_path, monkeypatch, examples, read_back
):
    path, d = rml2016
    monkeypatch.setattr(output, "MAX_RECORDING_SAMPLES", 128 * 11 + 5)  # 11 examples each
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

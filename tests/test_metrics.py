"""The metric stream: exact floats, cursor hashes, inherited prefixes."""

from __future__ import annotations

import hashlib

import pytest

from iqtrain.errors import CheckpointError
from iqtrain.metrics import MetricWriter, read_metrics, strip_timing, verify_prefix


def test_floats_round_trip_exactly_and_cursor_hashes_the_prefix(tmp_path):
    path = tmp_path / "m.jsonl"
    w = MetricWriter(path)
    values = [0.1 + 0.2, 1 / 3, 1e-300, 123456789.123456789]
    for i, v in enumerate(values):
        w.write({"kind": "train", "step": i, "loss": v, "step_time_s": 0.5})
    cur = w.cursor()
    w.close()
    data = path.read_bytes()
    assert cur.records == 4 and cur.bytes == len(data)
    assert cur.sha256 == hashlib.sha256(data).hexdigest()
    assert [r["loss"] for r in read_metrics(path)] == values
    assert "step_time_s" not in strip_timing(read_metrics(path))[0]


def test_inheriting_a_prefix(tmp_path):
    parent = tmp_path / "p.jsonl"
    w = MetricWriter(parent)
    for i in range(5):
        w.write({"step": i})
        if i == 2:
            cur = w.cursor()
    w.close()
    child = MetricWriter(tmp_path / "c.jsonl", inherit_from=parent, cursor=cur)
    child.write({"step": 3})
    child.close()
    assert read_metrics(tmp_path / "c.jsonl") == [{"step": i} for i in range(4)]
    with pytest.raises(FileExistsError):  # an attempt's stream is never overwritten
        MetricWriter(tmp_path / "c.jsonl")


def test_tampered_prefix_is_refused(tmp_path):
    path = tmp_path / "m.jsonl"
    w = MetricWriter(path)
    w.write({"loss": 1.0})
    cur = w.cursor()
    w.close()
    path.write_bytes(path.read_bytes().replace(b"1.0", b"2.0"))
    with pytest.raises(CheckpointError, match="do not match"):
        verify_prefix(path, cur)
    with pytest.raises(ValueError):
        MetricWriter(tmp_path / "n.jsonl").write({"loss": float("nan")})

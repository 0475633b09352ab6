"""The metric stream: exact floats, cursor hashes, inherited prefixes, no torn records."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

import iqtrain.evidence.metrics as metrics_mod
from iqtrain.errors import CheckpointError, StorageError
from iqtrain.evidence.metrics import (
    MetricWriter,
    read_metric_stream,
    read_metrics,
    strip_timing,
    verify_prefix,
)


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


# ------------------------------------------------------------------------------ write failures


def _consistent(path, w):
    """The file holds exactly the cursor's prefix, and it is all complete records."""
    data = path.read_bytes()
    cur = w.cursor()
    assert len(data) == cur.bytes and hashlib.sha256(data).hexdigest() == cur.sha256
    assert data == b"" or data.endswith(b"\n")
    assert len(read_metrics(path)) == cur.records


def _eio(code=errno.EIO):
    return OSError(code, os.strerror(code))


# Imports iqtrain.evidence.metrics without running iqtrain/__init__ (which imports torch): fast, and
# proves the module stands alone.
_STANDALONE = """
import importlib.util, sys, types
spec = importlib.util.find_spec("iqtrain")
pkg = types.ModuleType("iqtrain")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["iqtrain"] = pkg
"""


def test_a_real_efbig_leaves_the_stream_at_its_last_complete_record(tmp_path):
    script = _STANDALONE + textwrap.dedent(
        """
        import json, resource, signal
        from pathlib import Path
        from iqtrain.errors import StorageError
        from iqtrain.evidence.metrics import MetricWriter

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        w = MetricWriter(Path("metrics.jsonl"))
        errors = []
        for step in range(100):
            try:
                w.write({"kind": "train", "step": step, "loss": 1 / (step + 3)})
            except StorageError as exc:
                errors.append(str(exc))
                if len(errors) == 2:
                    break
        w.close()
        print(json.dumps({"errors": errors, "cursor": w.cursor().to_dict(),
                          "torch": "torch" in sys.modules}))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert not out["torch"]
    assert len(out["errors"]) == 2  # a failed write leaves the writer usable (and failing)
    for message in out["errors"]:
        assert message == "metrics.jsonl: cannot write: File too large"
    data = (tmp_path / "metrics.jsonl").read_bytes()
    assert 900 < len(data) <= 1000 and data.endswith(b"\n")
    assert out["cursor"]["bytes"] == len(data)
    assert out["cursor"]["sha256"] == hashlib.sha256(data).hexdigest()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(out["cursor"]["records"]))


def test_a_torn_write_is_cut_back_and_the_cursor_kept(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    w = MetricWriter(path)
    w.write({"step": 0, "loss": 0.5})
    before = w.cursor()
    real_pwrite = os.pwrite

    def half_then_enospc(fd, data, offset):
        real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise _eio(errno.ENOSPC)

    monkeypatch.setattr(metrics_mod.os, "pwrite", half_then_enospc)
    with pytest.raises(StorageError) as info:
        w.write({"step": 1, "loss": 0.25})
    assert str(info.value) == f"{path}: cannot write: No space left on device"
    assert w.cursor() == before
    _consistent(path, w)
    monkeypatch.undo()  # space is back: the stream continues without a gap or a duplicate
    w.write({"step": 1, "loss": 0.25})
    w.close()
    _consistent(path, w)
    assert read_metrics(path) == [{"step": 0, "loss": 0.5}, {"step": 1, "loss": 0.25}]


def test_when_the_torn_record_cannot_be_cut_the_writer_refuses_more(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    w = MetricWriter(path)
    w.write({"step": 0})
    real_pwrite = os.pwrite

    def torn(fd, data, offset):
        real_pwrite(fd, bytes(data[:3]), offset)
        raise _eio()

    def ftruncate(fd, size):
        raise _eio()

    monkeypatch.setattr(metrics_mod.os, "pwrite", torn)
    monkeypatch.setattr(metrics_mod.os, "ftruncate", ftruncate)
    with pytest.raises(StorageError, match="torn record could not be removed"):
        w.write({"step": 1})
    monkeypatch.undo()
    with pytest.raises(StorageError, match=str(path)):
        w.write({"step": 1})  # would land after the torn bytes
    with pytest.raises(StorageError):
        w.sync()  # a checkpoint must not bind a cursor to this file
    w.close()
    stream = read_metric_stream(path)  # a reader still gets the complete record
    assert stream.records == [{"step": 0}] and stream.torn_bytes == 3


def test_sync_and_close_failures_raise_storage_error(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    w = MetricWriter(path)
    w.write({"step": 0})

    def fsync(fd):
        raise _eio()

    monkeypatch.setattr(metrics_mod.os, "fsync", fsync)
    with pytest.raises(StorageError, match="cannot sync: Input/output error"):
        w.sync()
    with pytest.raises(StorageError, match="fsync failed"):
        w.write({"step": 1})  # after a failed fsync nothing more is trusted
    fd = w._fd
    with pytest.raises(StorageError, match=f"{path}: cannot sync"):
        w.close()
    with pytest.raises(OSError):
        os.fstat(fd)  # closed all the same
    w.close()  # idempotent
    monkeypatch.undo()
    assert read_metrics(path) == [{"step": 0}]


def test_inheriting_from_a_short_or_changed_parent_is_refused(tmp_path):
    parent = tmp_path / "p.jsonl"
    w = MetricWriter(parent)
    for i in range(3):
        w.write({"step": i})
    cur = w.cursor()
    w.close()
    parent.write_bytes(parent.read_bytes()[:-4])
    with pytest.raises(CheckpointError, match="shorter than"):
        MetricWriter(tmp_path / "c1.jsonl", inherit_from=parent, cursor=cur)
    assert (tmp_path / "c1.jsonl").read_bytes() == b""
    parent.write_bytes(b'{"step":0}\n{"step":9}\n{"step":2}\n')
    with pytest.raises(CheckpointError, match="do not match"):
        MetricWriter(tmp_path / "c2.jsonl", inherit_from=parent, cursor=cur)
    assert (tmp_path / "c2.jsonl").read_bytes() == b""


# ------------------------------------------------------------------------------ reading


@pytest.mark.parametrize(
    "tail",
    [b'{"step":2,"lo', b'{"step":2,"loss":0.1', b"\x00\x00\x00", b'{"step":2,"lo\n', b"\n"],
)
def test_a_torn_trailing_line_is_reported_not_returned(tmp_path, tail):
    path = tmp_path / "metrics.jsonl"
    good = b'{"step":0}\n{"step":1}\n'
    path.write_bytes(good + tail)
    stream = read_metric_stream(path)
    assert stream.records == [{"step": 0}, {"step": 1}]
    assert stream.torn and stream.complete_bytes == len(good) and stream.torn_bytes == len(tail)
    # read_metrics is strict: it never passes over a damaged stream in silence
    with pytest.raises(CheckpointError, match=f"{path}: line 3: torn record"):
        read_metrics(path)


@pytest.mark.parametrize(
    "bad", [b'{"step":1', b"[1]", b'{"loss":NaN}', b"", b'{"step":1}{"step":2}', b"\xff"]
)
def test_an_invalid_line_before_the_last_is_an_error_naming_file_and_line(tmp_path, bad):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step":0}\n' + bad + b'\n{"step":2}\n')
    with pytest.raises(CheckpointError, match=f"{path}: line 2: not a JSON record"):
        read_metric_stream(path)


def test_reading_complete_empty_and_missing_streams(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"")
    assert read_metric_stream(path).records == [] and not read_metric_stream(path).torn
    path.write_bytes(b'{"step":0}\n')
    stream = read_metric_stream(path)
    assert stream.records == [{"step": 0}] and stream.torn_bytes == 0
    with pytest.raises(CheckpointError, match="missing"):
        read_metric_stream(tmp_path / "absent.jsonl")

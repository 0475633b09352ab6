"""IQDataset / TrainStream: contents, determinism, resume, ranks and errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import COMPONENT_DTYPES, write_sigmf

from iqtrain.data import IQDataset, TrainStream
from iqtrain.errors import ConfigError, CursorMismatchError, DataError, IQTrainError


def _sigmf_read(meta, start, count):
    from sigmf.sigmffile import fromfile

    samples = fromfile(str(meta), autoscale=False).read_samples(start, count)
    return np.stack([samples.real, samples.imag], axis=-1)


@pytest.fixture
def ds(make_recording, tmp_path):
    for n in (1000, 700, 1300):
        make_recording(n, "ci16_le")
    return IQDataset(str(tmp_path / "rec" / "*.sigmf-meta"), window=64)


# --- window contents -------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", sorted(COMPONENT_DTYPES))
def test_window_equals_sigmf_read(make_recording, datatype):
    meta, iq = make_recording(500, datatype)
    ds = IQDataset([meta], window=48, stride=20)
    expected_dtype = {"c": "int8", "ci16": "int16", "cf32": "float32"}
    key = "c" if datatype in ("ci8", "cu8") else datatype[:4]
    assert ds.dtype == np.dtype(expected_dtype[key])
    assert ds.num_windows == (500 - 48) // 20 + 1
    offset = 128 if datatype == "cu8" else 0  # cu8 is offset binary: sample - 128
    for i in (0, 1, ds.num_windows - 1):
        got = ds.window(i)
        assert got.shape == (48, 2) and got.dtype == ds.dtype
        ref = _sigmf_read(meta, i * 20, 48) - offset
        np.testing.assert_array_equal(got.astype(np.float64), ref.astype(np.float64))
        np.testing.assert_array_equal(got, iq[i * 20 : i * 20 + 48].astype(np.float64) - offset)


def test_windows_enumerate_recordings_in_sorted_order(make_recording, tmp_path):
    mb, ib = make_recording(300, name="b")
    ma, ia = make_recording(200, name="a")
    ds = IQDataset([mb, ma], window=100)
    assert [r.meta_path.name for r in ds.recordings] == ["a.sigmf-meta", "b.sigmf-meta"]
    assert ds.num_windows == 2 + 3
    np.testing.assert_array_equal(ds.window(1), ia[100:200])
    np.testing.assert_array_equal(ds.window(2), ib[0:100])
    # a recording shorter than the window contributes nothing, and never crosses into the next
    mc, _ = make_recording(50, name="c")
    ds2 = IQDataset([ma, mb, mc], window=100)
    assert ds2.num_windows == 5


def test_mixed_datatypes_promote_to_float32_by_value(make_recording):
    m8, i8 = make_recording(200, "cu8")
    m16, i16 = make_recording(200, "ci16_be")
    mf, if32 = make_recording(200, "cf32_le")
    ds = IQDataset([m8, m16, mf], window=100)
    assert ds.dtype == np.float32
    by_name = {r.meta_path: k for k, r in enumerate(ds.recordings)}
    np.testing.assert_array_equal(ds.window(2 * by_name[m8.resolve()]), i8[:100].astype("f4") - 128)
    np.testing.assert_array_equal(ds.window(2 * by_name[m16.resolve()] + 1), i16[100:200])
    np.testing.assert_array_equal(ds.window(2 * by_name[mf.resolve()]), if32[:100])


def test_val_batches_visit_each_window_once_in_id_order(ds):
    batches = list(ds.val_batches(7))
    assert sum(len(b) for b in batches) == ds.num_windows
    assert all(len(b) == 7 for b in batches[:-1]) and 1 <= len(batches[-1]) <= 7
    stacked = np.concatenate(batches)
    for i in range(ds.num_windows):
        np.testing.assert_array_equal(stacked[i], ds.window(i))


# --- the stream ------------------------------------------------------------------------------


def _ids(stream, k):
    out = []
    for _ in range(k):
        next(stream)
        out.append(stream.last_ids().copy())
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def test_every_window_exactly_once_per_epoch(ds):
    n = ds.num_windows
    stream = TrainStream(ds, batch_size=5, seed=3)  # 5 does not divide n: batches straddle epochs
    ids = _ids(stream, (3 * n) // 5 + 1)
    for e in range(3):
        epoch = ids[e * n : (e + 1) * n]
        assert sorted(epoch.tolist()) == list(range(n)), f"epoch {e}"
    assert not np.array_equal(ids[:n], ids[n : 2 * n]), "epochs must be reshuffled"
    assert not np.array_equal(ids[:n], np.arange(n)), "must be shuffled"


def test_batch_rows_are_the_windows_named_by_last_ids(ds):
    stream = TrainStream(ds, batch_size=8, seed=1)
    for _ in range(3):
        batch = next(stream)
        assert batch.shape == (8, 64, 2) and batch.dtype == np.int16
        assert batch.flags.c_contiguous
        np.testing.assert_array_equal(batch, ds.windows(stream.last_ids()))


def test_same_seed_same_stream_different_seed_differs(ds):
    a = _ids(TrainStream(ds, batch_size=8, seed=11), 5)
    b = _ids(TrainStream(ds, batch_size=8, seed=11), 5)
    c = _ids(TrainStream(ds, batch_size=8, seed=12), 5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("prefetch", [0, 1, 4])
def test_prefetch_does_not_change_results(ds, prefetch):
    ref = TrainStream(ds, batch_size=8, seed=5, prefetch=2)
    other = TrainStream(ds, batch_size=8, seed=5, prefetch=prefetch)
    for _ in range(12):
        np.testing.assert_array_equal(next(ref), next(other))
        np.testing.assert_array_equal(ref.last_ids(), other.last_ids())


@pytest.mark.parametrize("saved_after", ["start", "mid_epoch", "epoch_boundary"])
def test_exact_resume_from_cursor(ds, saved_after):
    n = ds.num_windows  # 50 windows: 15 + 10 + 25... batch 10 puts an epoch boundary at batch 5
    batch = 10
    k = {"start": 0, "mid_epoch": 2, "epoch_boundary": n // batch}[saved_after]
    straight = TrainStream(ds, batch_size=batch, seed=9)
    _ids(straight, k)
    cursor = json.loads(json.dumps(straight.state_dict()))  # must survive JSON
    assert cursor["samples_consumed"] == k * batch
    expected = [next(straight).copy() for _ in range(4)]
    resumed = TrainStream(ds, batch_size=batch, seed=9)
    next(resumed)  # the restore must drop anything already prefetched
    resumed.load_state_dict(cursor)
    assert resumed.batches_consumed == k
    for want in expected:
        np.testing.assert_array_equal(next(resumed), want)


def test_exact_resume_in_a_fresh_process(ds, tmp_path):
    stream = TrainStream(ds, batch_size=6, seed=21)
    _ids(stream, 7)
    cursor = stream.state_dict()
    expected = _ids(stream, 3)
    pattern = os.fspath(ds.recordings[0].meta_path.parent / "*.sigmf-meta")
    code = (
        "import json, sys, numpy as np\n"
        "from iqtrain.data import IQDataset, TrainStream\n"
        f"ds = IQDataset({pattern!r}, window=64)\n"
        "s = TrainStream(ds, batch_size=6, seed=21)\n"
        "s.load_state_dict(json.loads(sys.argv[1]))\n"
        "ids = []\n"
        "for _ in range(3):\n"
        "    next(s); ids += s.last_ids().tolist()\n"
        "print(json.dumps(ids))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cursor)], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == expected.tolist()


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_rank_slices_concatenate_to_the_global_batch(ds, world_size):
    full = TrainStream(ds, batch_size=8, seed=4)
    ranks = [
        TrainStream(ds, batch_size=8, seed=4, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for _ in range(9):  # crosses an epoch boundary (50 windows)
        want = next(full)
        parts = [next(s) for s in ranks]
        assert all(p.shape[0] == 8 // world_size for p in parts)
        np.testing.assert_array_equal(np.concatenate(parts), want)
        np.testing.assert_array_equal(
            np.concatenate([s.last_ids() for s in ranks]), full.last_ids()
        )


def test_cursor_saved_at_world_size_4_resumes_at_2(ds):
    w4 = [TrainStream(ds, batch_size=8, seed=4, rank=r, world_size=4) for r in range(4)]
    for _ in range(3):
        for s in w4:
            next(s)
    cursor = w4[0].state_dict()
    assert all(s.state_dict() == cursor for s in w4)
    full = TrainStream(ds, batch_size=8, seed=4)
    full.load_state_dict(cursor)
    want = [next(full).copy() for _ in range(3)]
    w2 = [TrainStream(ds, batch_size=8, seed=4, rank=r, world_size=2) for r in range(2)]
    for s in w2:
        s.load_state_dict(cursor)
    for w in want:
        np.testing.assert_array_equal(np.concatenate([next(s) for s in w2]), w)


def test_python_thread_progresses_while_a_batch_is_assembled(make_recording):
    # Large windows and batch, no prefetch: next() itself does the assembly, with the GIL released.
    meta, _ = make_recording(1 << 20, "cf32_le")
    ds = IQDataset([meta], window=1 << 14, stride=64)
    stream = TrainStream(ds, batch_size=512, seed=0, prefetch=0)
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = ticks
        for _ in range(3):
            next(stream)
        during = ticks - before
    finally:
        stop.set()
        t.join()
    assert during > 0


def test_opening_a_billion_window_dataset_is_o_recordings(tmp_path):
    # A sparse 2 GB ci8 file with window 1: 10^9 windows. O(windows) opening would take minutes
    # and gigabytes; the benchmark measures the actual time.
    with open(tmp_path / "big.sigmf-data", "wb") as f:
        f.truncate(2 * 10**9)
    _raw_meta(tmp_path / "big.sigmf-meta", **{"core:datatype": "ci8"})
    ds = IQDataset([tmp_path / "big.sigmf-meta"], window=1)
    assert ds.num_windows == 10**9
    stream = TrainStream(ds, batch_size=4, seed=0)
    assert next(stream).shape == (4, 1, 2)
    assert stream.last_ids().max() < 10**9


def test_fingerprint_tracks_content_not_location(make_recording, tmp_path):
    meta, iq = make_recording(5000, "ci16_le")
    fp = IQDataset([meta], window=100).fingerprint
    assert len(fp) == 64 and int(fp, 16) >= 0
    copy_dir = tmp_path / "copy"
    write_sigmf(copy_dir, meta.stem, iq, "ci16_le")
    assert IQDataset([copy_dir / meta.name], window=100).fingerprint == fp
    changed = iq.copy()
    changed[0, 0] ^= 1  # the first block is always sampled
    write_sigmf(tmp_path / "changed", meta.stem, changed, "ci16_le")
    assert IQDataset([tmp_path / "changed" / meta.name], window=100).fingerprint != fp


# --- errors ----------------------------------------------------------------------------------


def _raw_meta(path, **global_fields):
    meta = {
        "global": {"core:datatype": "ci16_le", "core:version": "1.2.0", **global_fields},
        "captures": [{"core:sample_start": 0}],
        "annotations": [],
    }
    path.write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"core:datatype": "rf32_le"}, "core:datatype"),
        ({"core:datatype": "ri16_le"}, "core:datatype"),
        ({"core:datatype": "cf64_le"}, "core:datatype"),
        ({"core:datatype": "cu16_le"}, "core:datatype"),
        ({"core:num_channels": 2}, "core:num_channels"),
        ({"core:offset": 10}, "core:offset"),
        ({"core:trailing_bytes": 8}, "core:trailing_bytes"),
    ],
)
def test_unsupported_metadata_is_rejected_naming_file_and_field(tmp_path, fields, field):
    meta = _raw_meta(tmp_path / "x.sigmf-meta", **fields)
    (tmp_path / "x.sigmf-data").write_bytes(bytes(64))
    with pytest.raises(DataError) as err:
        IQDataset([meta], window=4)
    assert str(meta) in str(err.value) and field in str(err.value)


def test_header_bytes_rejected(tmp_path):
    meta = tmp_path / "x.sigmf-meta"
    meta.write_text(
        json.dumps(
            {
                "global": {"core:datatype": "ci16_le", "core:version": "1.2.0"},
                "captures": [{"core:sample_start": 0, "core:header_bytes": 44}],
                "annotations": [],
            }
        )
    )
    (tmp_path / "x.sigmf-data").write_bytes(bytes(64))
    with pytest.raises(DataError, match="header_bytes"):
        IQDataset([meta], window=4)


def test_partial_sample_length_rejected(tmp_path):
    meta = _raw_meta(tmp_path / "x.sigmf-meta")
    (tmp_path / "x.sigmf-data").write_bytes(bytes(4 * 100 + 3))
    with pytest.raises(DataError, match=r"x\.sigmf-data: data length 403 bytes"):
        IQDataset([meta], window=4)


def test_missing_data_bad_json_and_no_match(tmp_path):
    meta = _raw_meta(tmp_path / "x.sigmf-meta")
    with pytest.raises(DataError, match=r"x\.sigmf-data: data file missing"):
        IQDataset([meta], window=4)
    bad = tmp_path / "bad.sigmf-meta"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="bad.sigmf-meta: not valid JSON"):
        IQDataset([bad], window=4)
    with pytest.raises(DataError, match="no recordings match"):
        IQDataset(str(tmp_path / "nothing" / "*.sigmf-meta"), window=4)
    with pytest.raises(DataError, match="no such file"):
        IQDataset([tmp_path / "absent.sigmf-meta"], window=4)


def test_schema_violation_names_the_field(tmp_path):
    meta = _raw_meta(tmp_path / "x.sigmf-meta", **{"core:sample_rate": "fast"})
    (tmp_path / "x.sigmf-data").write_bytes(bytes(64))
    with pytest.raises(DataError, match="core:sample_rate"):
        IQDataset([meta], window=4)


def test_window_longer_than_every_recording(make_recording):
    meta, _ = make_recording(100)
    with pytest.raises(DataError):
        IQDataset([meta], window=101)


def test_bad_arguments_are_config_errors(ds):
    with pytest.raises(ConfigError, match="window"):
        IQDataset([ds.recordings[0].meta_path], window=0)
    with pytest.raises(ConfigError, match="stride"):
        IQDataset([ds.recordings[0].meta_path], window=4, stride=0)
    with pytest.raises(ConfigError, match="batch_size"):
        TrainStream(ds, batch_size=6, seed=0, world_size=4)
    with pytest.raises(ConfigError, match="rank"):
        TrainStream(ds, batch_size=8, seed=0, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="seed"):
        TrainStream(ds, batch_size=8, seed=-1)
    with pytest.raises(IndexError):
        ds.window(ds.num_windows)
    assert issubclass(ConfigError, IQTrainError)


def test_cursor_mismatch(ds, make_recording, tmp_path):
    stream = TrainStream(ds, batch_size=8, seed=1)
    next(stream)
    cursor = stream.state_dict()
    other = IQDataset([ds.recordings[0].meta_path], window=64)
    with pytest.raises(CursorMismatchError, match="cursor.fingerprint"):
        TrainStream(other, batch_size=8, seed=1).load_state_dict(cursor)
    strided = IQDataset(str(tmp_path / "rec" / "*.sigmf-meta"), window=64, stride=32)
    with pytest.raises(CursorMismatchError, match="cursor.stride"):
        TrainStream(strided, batch_size=8, seed=1).load_state_dict(cursor)
    with pytest.raises(CursorMismatchError, match="cursor.seed"):
        TrainStream(ds, batch_size=8, seed=2).load_state_dict(cursor)
    with pytest.raises(CursorMismatchError, match="missing keys"):
        TrainStream(ds, batch_size=8, seed=1).load_state_dict({"seed": 1})
    assert issubclass(CursorMismatchError, DataError)

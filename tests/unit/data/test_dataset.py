"""IQDataset / TrainStream: contents, determinism, resume, ranks and errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import COMPONENT_DTYPES, as_read, misuse, random_iq, write_sigmf

from iqtrain._native import digest_files
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.errors import CursorMismatchError, DataError

PREAD_ONLY = 2**64 - 1  # map_min_bytes that maps nothing: every row is a positioned read


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
    expected_dtype = {"ci8": "int8", "cu8": "int8", "ci16": "int16", "cu16": "int16"}
    assert ds.dtype == np.dtype(expected_dtype.get(datatype[:4].rstrip("_"), "float32"))
    assert ds.num_windows == (500 - 48) // 20 + 1
    # Unsigned types are offset binary: sample - 2**(bits - 1).
    dt = COMPONENT_DTYPES[datatype]
    offset = 1 << (8 * dt.itemsize - 1) if dt.kind == "u" else 0
    for i in (0, 1, ds.num_windows - 1):
        got = ds.window(i)
        assert got.shape == (48, 2) and got.dtype == ds.dtype
        np.testing.assert_array_equal(got, as_read(iq[i * 20 : i * 20 + 48], datatype))
        if datatype.startswith("cu32"):
            continue  # sigmf rounds u32 to float32 before taking the offset off: not exact
        ref = _sigmf_read(meta, i * 20, 48) - offset
        np.testing.assert_array_equal(got.astype(np.float64), ref.astype(np.float64))


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
        "from iqtrain.data.dataset import IQDataset, TrainStream\n"
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
        ({"core:datatype": "cf128"}, "core:datatype"),
        ({"core:num_channels": 2}, "core:num_channels"),
        ({"core:offset": -1}, "core:offset"),
        ({"core:trailing_bytes": 80}, "core:trailing_bytes"),
    ],
)
def test_unreadable_metadata_is_refused_naming_file_and_field(tmp_path, fields, field):
    meta = _raw_meta(tmp_path / "x.sigmf-meta", **fields)
    (tmp_path / "x.sigmf-data").write_bytes(bytes(64))
    with pytest.raises(DataError) as err:
        IQDataset([meta], window=4)
    assert str(meta) in str(err.value) and field in str(err.value)


def test_header_and_trailing_bytes_and_the_offset_are_honoured(tmp_path):
    meta = tmp_path / "x.sigmf-meta"
    meta.write_text(
        json.dumps(
            {
                "global": {
                    "core:datatype": "ci16_le",
                    "core:version": "1.2.0",
                    "core:offset": 1000,
                    "core:trailing_bytes": 6,
                },
                "captures": [{"core:sample_start": 1000, "core:header_bytes": 44}],
                "annotations": [],
            }
        )
    )
    iq = np.arange(32, dtype="<i2").reshape(16, 2)
    (tmp_path / "x.sigmf-data").write_bytes(b"h" * 44 + iq.tobytes() + b"t" * 6)
    ds = IQDataset([meta], window=4)
    assert ds.num_windows == 4 and ds.recordings[0].segments == ((1000, 16),)
    np.testing.assert_array_equal(ds.windows(np.arange(4)).reshape(16, 2), iq)


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
    # JSON that Python's reader gives up on: an integer of 5000 digits, nesting 100000 deep.
    for text, why in (('{"x": ' + "9" * 5000 + "}", "digits"), ("[" * 100000, "too deep")):
        bad.write_text(text)
        with pytest.raises(DataError, match=f"bad.sigmf-meta: cannot be read as JSON: .*{why}"):
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


def test_bad_arguments_are_value_and_type_errors_naming_them(ds):
    meta = ds.recordings[0].meta_path
    with misuse("^window: must be >= 1"):
        IQDataset([meta], window=0)
    with misuse("^window: must be an integer", TypeError):
        IQDataset([meta], window=4.0)
    with misuse("^stride: must be >= 1"):
        IQDataset([meta], window=4, stride=0)
    with misuse("^channel: must be >= 0"):
        IQDataset([meta], window=4, channel=-1)
    with misuse("batch_size"):
        TrainStream(ds, batch_size=6, seed=0, world_size=4)
    with misuse("rank"):
        TrainStream(ds, batch_size=8, seed=0, rank=2, world_size=2)
    with misuse("^seed: must be >= 0"):
        TrainStream(ds, batch_size=8, seed=-1)
    with misuse("^seed: must be <= "):
        TrainStream(ds, batch_size=8, seed=1 << 64)
    with misuse("^batch_size: must be an integer", TypeError):
        TrainStream(ds, batch_size=True, seed=0)
    with misuse("^batch_size: must be >= 1"):
        list(ds.val_batches(0))
    with pytest.raises(IndexError):
        ds.window(ds.num_windows)


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


# --- capture segments ------------------------------------------------------------------------


def _write_captures(directory, name, iq, datatype, captures):
    """A SigMF recording written with the sigmf package; ``captures`` = [(start, fields), ...]."""
    from sigmf import SigMFFile

    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.sigmf-data"
    np.ascontiguousarray(iq, dtype=COMPONENT_DTYPES[datatype]).tofile(data)
    meta = SigMFFile(data_file=data, global_info={"core:datatype": datatype})
    for start, fields in captures:
        meta.add_capture(start, metadata=dict(fields))
    meta.tofile(directory / f"{name}.sigmf-meta")
    return directory / f"{name}.sigmf-meta"


def _ramp(n):
    """ci16 samples whose I is the sample index and Q its negation (n < 2**15)."""
    k = np.arange(n, dtype=np.int16)
    return np.stack([k, -k], axis=-1)


def test_two_captures_are_windowed_separately(tmp_path):
    # 915 MHz for 1000 samples, then a retune to 2.4 GHz after 5000 dropped samples.
    captures = [
        (0, {"core:frequency": 915e6, "core:global_index": 0}),
        (1000, {"core:frequency": 2.4e9, "core:global_index": 6000}),
    ]
    meta = _write_captures(tmp_path, "retune", _ramp(2500), "ci16_le", captures)
    ds = IQDataset([meta], window=128)
    assert ds.recordings[0].segments == ((0, 1000), (1000, 1500))
    # 7 windows in the first capture, 11 in the second; straight across would be 19, with
    # window 7 (samples 896..1024) mixing both frequencies.
    assert ds.num_windows == 7 + 11
    starts = [int(ds.window(i)[0, 0]) for i in range(ds.num_windows)]
    assert starts == [128 * k for k in range(7)] + [1000 + 128 * k for k in range(11)]
    assert ds.skipped == []


@pytest.mark.parametrize("datatype", ["ci16_le", "cf32_be", "ci8"])
def test_every_window_of_a_multi_capture_file_equals_sigmf_per_capture(tmp_path, datatype):
    from sigmf.sigmffile import fromfile

    iq = random_iq(np.random.default_rng(5), 3000, datatype)
    starts = [0, 700, 760, 1900]  # the 60-sample capture is too short for a window
    captures = [(s, {"core:frequency": 1e8 * (i + 1)}) for i, s in enumerate(starts)]
    meta = _write_captures(tmp_path, "multi", iq, datatype, captures)
    window, stride = 96, 40
    ds = IQDataset([meta], window=window, stride=stride)
    ref = fromfile(str(meta), autoscale=False)
    expected = []
    for c in range(len(starts)):
        samples = ref.read_samples_in_capture(c)
        seg = np.stack([samples.real, samples.imag], axis=-1)
        expected += [seg[k : k + window] for k in range(0, len(seg) - window + 1, stride)]
    assert ds.num_windows == len(expected)
    got = ds.windows(np.arange(ds.num_windows))
    np.testing.assert_array_equal(got.astype(np.float64), np.array(expected, dtype=np.float64))


def test_no_window_crosses_a_capture_boundary(tmp_path):
    # First capture at 100: samples 0..100 are a leading segment of their own.
    bounds = [0, 100, 450, 470, 1200, 2047, 3000]
    captures = [(s, {"core:frequency": 1e8 * (i + 1)}) for i, s in enumerate(bounds[1:-1])]
    meta = _write_captures(tmp_path, "many", _ramp(3000), "ci16_le", captures)
    other = _write_captures(tmp_path, "plain", _ramp(500), "ci16_le", [(0, {})])
    for window, stride in [(64, 64), (64, 7), (100, 100), (5, 1)]:
        ds = IQDataset([meta, other], window=window, stride=stride)
        seen = []
        for i in range(ds.num_windows):
            w = ds.window(i)
            first = int(w[0, 0])
            np.testing.assert_array_equal(w[:, 0], np.arange(first, first + window))
            seen.append(first)
        n_many = sum((n - window) // stride + 1 for n in np.diff(bounds) if n >= window)
        assert len(seen) == n_many + (500 - window) // stride + 1
        for first in seen[:n_many]:
            seg = np.searchsorted(bounds, first, side="right") - 1
            assert first + window <= bounds[seg + 1], (window, stride, first)
            assert (first - bounds[seg]) % stride == 0
        # ids: segments in order, windows in order, then the next recording from sample 0
        assert seen[:n_many] == sorted(seen[:n_many]) and seen[n_many] == 0


def _meta_with_captures(path, captures, datatype="ci16_le"):
    meta = {
        "global": {"core:datatype": datatype, "core:version": "1.2.0"},
        "captures": captures,
        "annotations": [],
    }
    path.write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    ("starts", "bad"),
    [
        ([0, 10, 5], 2),  # not sorted
        ([0, -3], 1),
        ([0, 1.5], 1),
        ([0, "8"], 1),
        ([True], 0),
    ],
)
def test_bad_capture_starts_name_file_and_field(tmp_path, starts, bad):
    meta = _meta_with_captures(
        tmp_path / "x.sigmf-meta", [{"core:sample_start": s} for s in starts]
    )
    (tmp_path / "x.sigmf-data").write_bytes(bytes(4 * 16))
    with pytest.raises(DataError) as err:
        IQDataset([meta], window=4)
    assert str(meta) in str(err.value)
    assert f"captures[{bad}].core:sample_start" in str(err.value)


def test_captures_at_or_past_the_end_are_ignored_and_equal_starts_leave_one_empty(tmp_path):
    caps = [{"core:sample_start": s, "core:frequency": f} for s, f in ((0, 1), (8, 2), (8, 3))]
    caps += [{"core:sample_start": 16}, {"core:sample_start": 17}]
    meta = _meta_with_captures(tmp_path / "x.sigmf-meta", caps)
    (tmp_path / "x.sigmf-data").write_bytes(bytes(4 * 16))
    ds = IQDataset([meta], window=4)
    assert ds.recordings[0].segments == ((0, 8), (8, 0), (8, 8))
    assert ds.num_windows == 4
    assert [f for _, f, _ in ds.notes] == [
        "captures[3].core:sample_start",
        "captures[4].core:sample_start",
    ]


def test_captures_that_only_continue_each_other_are_one_segment(tmp_path):
    # What a recorder writes at every buffer (GNU Radio's sink, a tag per block): only the
    # start and a global index that continues. A window runs across them.
    captures = [(s, {"core:frequency": 915e6, "core:global_index": 5000 + s}) for s in (0, 100)]
    meta = _write_captures(tmp_path, "cont", _ramp(300), "ci16_le", captures)
    ds = IQDataset([meta], window=128, stride=64)
    assert ds.recordings[0].segments == ((0, 300),)
    np.testing.assert_array_equal(ds.window(1)[:, 0], np.arange(64, 192))


def test_recordings_without_a_window_are_listed(tmp_path):
    rec = tmp_path / "rec"
    _write_captures(rec, "a_long", _ramp(1000), "ci16_le", [(0, {})])
    _write_captures(rec, "b_short", _ramp(50), "ci16_le", [(0, {})])
    # 300 samples, but every capture segment is shorter than the window.
    chopped = [(s, {"core:frequency": 1e6 * s}) for s in (0, 80, 160, 240)]
    _write_captures(rec, "c_chopped", _ramp(300), "ci16_le", chopped)
    (rec / "d_empty.sigmf-data").write_bytes(b"")  # the sigmf package cannot write this one
    _meta_with_captures(rec / "d_empty.sigmf-meta", [{"core:sample_start": 0}])
    ds = IQDataset(str(rec / "*.sigmf-meta"), window=100)
    meta = {r.meta_path.stem: os.fspath(r.meta_path) for r in ds.recordings}
    assert ds.skipped == [(meta["b_short"], 50), (meta["c_chopped"], 300), (meta["d_empty"], 0)]
    assert ds.num_windows == 10
    with pytest.raises(DataError, match="shorter than the window"):
        IQDataset(str(rec / "[bcd]*.sigmf-meta"), window=100)


# --- content identity: digests and core:sha512 -----------------------------------------------

# Official BLAKE3 test vectors: input byte i is i % 251.
_BLAKE3 = {
    1024: "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
    102400: "bc3e3d41a1146b069abffad3c0d44860cf664390afce4d9661f7902e7943e085",
}


def _vector_recording(directory, name, nbytes):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.sigmf-data").write_bytes((np.arange(nbytes) % 251).astype(np.uint8))
    return _meta_with_captures(directory / f"{name}.sigmf-meta", [{"core:sample_start": 0}], "ci8")


def test_content_digests_are_blake3_of_every_data_byte(tmp_path):
    b = _vector_recording(tmp_path, "b", 102400)
    a = _vector_recording(tmp_path, "a", 1024)
    ds = IQDataset([b, a], window=4)
    digests = ds.content_digests()
    a_data, b_data = (os.fspath(m.with_suffix(".sigmf-data").resolve()) for m in (a, b))
    assert list(digests) == [a_data, b_data]  # sorted, absolute: the window id order
    assert digests == {a_data: _BLAKE3[1024], b_data: _BLAKE3[102400]}
    assert digest_files([b_data, a_data]) == [_BLAKE3[102400], _BLAKE3[1024]]

    # A byte between the fingerprint's sampled blocks: the quick check misses it, the digest not.
    fingerprint = ds.fingerprint
    raw = bytearray(Path(b_data).read_bytes())
    raw[5000] ^= 0xFF
    Path(b_data).write_bytes(raw)
    again = IQDataset([a, b], window=4)
    assert again.fingerprint == fingerprint
    assert again.content_digests()[b_data] != _BLAKE3[102400]
    assert again.content_digests()[a_data] == _BLAKE3[1024]


def test_content_digests_report_a_changed_or_missing_file(tmp_path):
    a = _vector_recording(tmp_path, "a", 1024)
    data = a.with_suffix(".sigmf-data").resolve()
    ds = IQDataset([a], window=4)
    with open(data, "r+b") as f:
        f.truncate(512)
    with pytest.raises(DataError, match=rf"{data}: data file changed length .*expected 1024"):
        ds.content_digests()
    with pytest.raises(DataError, match=str(tmp_path / "missing")):
        digest_files([os.fspath(data), os.fspath(tmp_path / "missing")])


def test_verify_content_lists_sha512_problems(make_recording, tmp_path):
    good, _ = make_recording(2000, "ci16_le", name="good")  # sigmf writes core:sha512
    bad, _ = make_recording(2000, "ci16_le", name="bad")
    assert json.loads(bad.read_text())["global"]["core:sha512"]
    plain = _vector_recording(tmp_path / "rec", "plain", 1024)  # no core:sha512: not checked
    ds = IQDataset([good, bad, plain], window=16)
    assert ds.verify_content() == []

    bad_data = bad.with_suffix(".sigmf-data").resolve()
    raw = bytearray(bad_data.read_bytes())
    raw[1234] ^= 1
    bad_data.write_bytes(raw)
    problems = ds.verify_content()
    assert len(problems) == 1
    assert problems[0].startswith(f"{bad_data}: core:sha512 does not match the data")

    with open(bad_data, "r+b") as f:
        f.truncate(4000)
    problems = ds.verify_content()
    assert problems == [
        f"{bad_data}: data file changed length while being read (expected 8000 bytes, found 4000)"
    ]


# --- a data file that changes length while a run reads it ------------------------------------

_TRUNCATE_SCRIPT = r"""
import json, os, sys
import numpy as np
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.errors import DataError

meta, data, map_min_bytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
full = open(data, "rb").read()
ds = IQDataset([meta], window=64, map_min_bytes=map_min_bytes)
out = {"mapped": ds._native.mapped_recordings}
ids = np.arange(ds.num_windows)
before = ds.windows(ids).copy()
reference = TrainStream(ds, batch_size=8, seed=3, prefetch=0)
want = [next(reference).copy() for _ in range(12)]
stream = TrainStream(ds, batch_size=8, seed=3, prefetch=2)
next(stream), next(stream)  # the prefetch thread is running with batches queued
os.truncate(data, len(full) // 2)
try:
    ds.windows(ids)
except DataError as exc:
    out["windows"] = str(exc)
for _ in range(4):  # batches assembled before the truncation may still arrive first
    pos = stream.samples_consumed
    try:
        next(stream)
    except DataError as exc:
        out["next"] = str(exc)
        out["consumed_unchanged"] = stream.samples_consumed == pos
        break
with open(data, "r+b") as f:  # restored in place: the same open dataset reads again
    f.write(full)
out["windows_again"] = bool(np.array_equal(ds.windows(ids), before))
k = stream.samples_consumed // 8
out["next_again"] = bool(np.array_equal(next(stream), want[k]))
print(json.dumps(out))
"""


@pytest.mark.parametrize(
    "reader, flags",
    [("pread", []), ("mmap", []), ("mmap", ["-X", "faulthandler"])],
    ids=["pread", "mmap", "mmap-faulthandler-first"],
)
def test_truncated_data_file_is_a_data_error_not_a_crash(make_recording, reader, flags):
    meta, _ = make_recording(4096, "ci16_le")  # 16 KiB, 64 windows of 64
    data = meta.with_suffix(".sigmf-data").resolve()
    map_min_bytes = 0 if reader == "mmap" else PREAD_ONLY
    # In a child process: a SIGBUS there fails this test instead of killing the test session.
    # With Python's faulthandler enabled first, the guard chains to it and still absorbs ours.
    proc = subprocess.run(
        [sys.executable, *flags, "-c", _TRUNCATE_SCRIPT, str(meta), str(data), str(map_min_bytes)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout)
    assert out["mapped"] == (1 if reader == "mmap" else 0)
    message = (
        f"{data}: data file changed length while being read (expected 16384 bytes, found 8192)"
    )
    assert out["windows"] == message
    assert out["next"] == message
    assert out["consumed_unchanged"] and out["windows_again"] and out["next_again"]


_FOREIGN_SIGBUS_SCRIPT = r"""
import os, sys
import numpy as np
from iqtrain.data.dataset import IQDataset

meta, other, late = sys.argv[1], sys.argv[2], sys.argv[3] == "late"
ds = IQDataset([meta], window=64, map_min_bytes=0)  # installs the guard
assert ds._native.mapped_recordings == 1
if late:  # a handler installed after the guard: new datasets must not put the guard back
    import faulthandler
    faulthandler.enable()
    again = IQDataset([meta], window=64, map_min_bytes=0)
    assert again._native.mapped_recordings == 0, "mapped in front of a later handler"
mm = np.memmap(other, dtype=np.uint8, mode="r")
os.truncate(other, 0)
print("touching", flush=True)
print(int(mm[5000]))  # a fault in no guarded copy: not ours to absorb
"""


@pytest.mark.parametrize(
    "flags, late",
    [([], False), (["-X", "faulthandler"], False), ([], True)],
    ids=["plain", "faulthandler-first", "faulthandler-late"],
)
def test_a_sigbus_outside_the_loader_keeps_its_default_or_previous_handler(
    make_recording, tmp_path, flags, late
):
    meta, _ = make_recording(4096, "ci16_le")
    other = tmp_path / "other.bin"
    other.write_bytes(b"\1" * 8192)
    script = [_FOREIGN_SIGBUS_SCRIPT, str(meta), str(other), "late" if late else "first"]
    # A handler that re-raised into ours once looped forever: the timeout would catch it.
    proc = subprocess.run(
        [sys.executable, *flags, "-c", *script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == "touching\n"
    if flags or late:  # faulthandler ran (it prints once, then the default kills)
        assert proc.stderr.count("Fatal Python error: Bus error") == 1, proc.stderr[-2000:]


def _distinct_recordings(directory, n):
    """``n`` ci8 recordings of 32 samples, each with bytes of its own (r000, r001, ...)."""
    for i in range(n):
        meta = _vector_recording(directory, f"r{i:03d}", 64)
        meta.with_suffix(".sigmf-data").write_bytes(
            ((np.arange(64) + 7 * i) % 251).astype(np.uint8)
        )


@pytest.mark.parametrize("hard", ["raisable", "fixed"])
def test_many_recordings_fit_a_low_open_file_limit(tmp_path, hard):
    # Every usable recording keeps a descriptor open for positioned reads where the limit
    # allows: opening raises the soft limit up to the hard one. Where the hard limit is too low
    # as well (100,000 recordings), the dataset holds some and reopens the rest when read; the
    # bytes are the same either way.
    _distinct_recordings(tmp_path / "rec", 150)
    pattern = str(tmp_path / "rec" / "*.sigmf-meta")
    code = (
        "import hashlib, os, resource, sys\n"
        "from iqtrain.data.dataset import IQDataset\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "hard = 200 if sys.argv[2] == 'fixed' else hard\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, hard))\n"
        "in_use = len(os.listdir('/proc/self/fd')) - 1\n"  # less listdir's own
        "ds = IQDataset(sys.argv[1], window=4)\n"
        "assert ds.num_windows == 150 * 8, ds.num_windows\n"
        "ids = [(k * 37) % 1200 for k in range(2400)]\n"
        "print(hashlib.sha256(ds.windows(ids).tobytes()).hexdigest())\n"
        "print(*ds._native.open_files, in_use)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, pattern, hard], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    digest, held = proc.stdout.split("\n")[:2]
    ids = [(k * 37) % 1200 for k in range(2400)]
    want = hashlib.sha256(IQDataset(pattern, window=4).windows(ids).tobytes()).hexdigest()
    assert digest == want
    now, cap, in_use = map(int, held.split())
    if hard == "raisable":
        assert cap == 150 and now == 150
    else:  # 150 + 64 do not fit in 200: half of what is free beyond the 64
        assert abs(cap - (200 - in_use - 64) // 2) <= 1, (cap, in_use)
        assert now <= cap


def test_a_file_replaced_while_its_descriptor_was_closed_is_a_data_error(tmp_path):
    _distinct_recordings(tmp_path, 4)
    ds = IQDataset(str(tmp_path / "*.sigmf-meta"), window=4, max_open_files=1)
    assert ds._native.open_files == (1, 1)
    ds.windows([0, 8, 16, 24])  # each reopened in turn
    data = tmp_path / "r002.sigmf-data"
    fresh = tmp_path / "r002.new"
    fresh.write_bytes(data.read_bytes())
    os.replace(fresh, data)  # the same bytes, another file
    with pytest.raises(
        DataError, match=r"r002\.sigmf-data: data file was replaced while being read"
    ):
        ds.windows([16])
    ds.windows([0, 8, 24])
    # Deleted and written again (ext4 may hand the new file the freed inode number).
    (tmp_path / "r001.sigmf-data").unlink()
    (tmp_path / "r001.sigmf-data").write_bytes(data.read_bytes()[:64])
    with pytest.raises(DataError, match=r"r001\.sigmf-data: data file was replaced while being"):
        ds.windows([8])
    for bad in (0, -1, True, 2.0, "4"):
        with misuse("^max_open_files: must be ", (TypeError, ValueError)):
            IQDataset(str(tmp_path / "*.sigmf-meta"), window=4, max_open_files=bad)


def test_running_out_of_descriptors_mid_run_says_so(tmp_path):
    # Another part of the process took every descriptor the pool left free: the read that must
    # open a file names it and says what to change, and reads again once descriptors are back.
    _distinct_recordings(tmp_path / "rec", 40)
    code = (
        "import os, resource, sys\n"
        "from iqtrain.data.dataset import IQDataset\n"
        "from iqtrain.errors import DataError\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))\n"
        "ds = IQDataset(sys.argv[1], window=4, max_open_files=4)\n"
        "hog = []\n"
        "try:\n"
        "    while True:\n"
        "        hog.append(os.open(os.devnull, os.O_RDONLY))\n"
        "except OSError:\n"
        "    pass\n"
        "try:\n"
        "    ds.windows(list(range(0, 320, 8)))\n"
        "except DataError as exc:\n"
        "    print(exc)\n"
        "for fd in hog:\n"
        "    os.close(fd)\n"
        "print(ds.windows(list(range(0, 320, 8))).shape)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "rec" / "*.sigmf-meta")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    first, second = proc.stdout.strip().split("\n")
    assert re.fullmatch(
        r"\S+/rec/r\d{3}\.sigmf-data: data file cannot be opened: no file descriptor is left "
        r"\(Too many open files \(os error 24\)\); raise the open-file limit \(ulimit -n\) or "
        r"lower max_open_files",
        first,
    ), first
    assert second == "(40, 4, 2)"


# --- assembly into caller-owned ring buffers -------------------------------------------------


def _ring(ds, stream_rows, k, dtype=None):
    return [np.zeros((stream_rows, ds.window_len, 2), dtype or ds.dtype) for _ in range(k)]


@pytest.mark.parametrize(
    ("seed", "batch", "prefetch", "buffers", "hold"),
    [(5, 8, 0, 1, 1), (5, 8, 2, 3, 1), (7, 5, 1, 4, 3), (7, 5, 2, 5, 3), (1, 6, 4, 7, 3)],
)
def test_ring_batches_equal_next_batches(ds, seed, batch, prefetch, buffers, hold):
    # hold=3: a grad_accum-like step keeps 3 microbatches until it is done, then releases them
    # (out of order, scribbled on first: nothing the caller wrote leaks into a later batch).
    ref = TrainStream(ds, batch_size=batch, seed=seed, prefetch=0)
    stream = TrainStream(ds, batch_size=batch, seed=seed, prefetch=prefetch)
    ring = _ring(ds, batch, buffers)
    stream.use_ring(ring)
    held = []
    for k in range(3 * ds.num_windows // batch):
        want = next(ref)
        slot = stream.next_slot()
        np.testing.assert_array_equal(ring[slot], want, err_msg=f"batch {k}")
        np.testing.assert_array_equal(stream.last_ids(), ref.last_ids())
        assert stream.samples_consumed == ref.samples_consumed
        held.append(slot)
        if len(held) == hold:
            for s in (held[1:] + held[:1])[::-1]:
                ring[s].fill(-7)
                stream.release(s)
            held.clear()


def test_ring_is_a_view_of_caller_storage_and_refuses_next(ds):
    storage = np.zeros((3, 8, ds.window_len, 2), ds.dtype)  # e.g. torch tensors' numpy views
    stream = TrainStream(ds, batch_size=8, seed=2)
    first = next(stream).copy()  # pooled batches before the ring; then the ring continues
    stream.use_ring(list(storage))
    assert stream._native.ring_size == 3
    slot = stream.next_slot()
    np.testing.assert_array_equal(storage[slot], ds.windows(stream.last_ids()))
    assert not np.array_equal(storage[slot], first)
    with misuse("next_slot"):
        next(stream)


def test_ring_buffers_are_validated(ds):
    stream = TrainStream(ds, batch_size=8, seed=0, prefetch=2)
    good = _ring(ds, 8, 3)
    with misuse(r"need at least prefetch \+ 1 = 3"):
        stream.use_ring(good[:2])
    with misuse(r"buffers\[1\].*int16.*dtype float32"):
        stream.use_ring([good[0], good[1].astype(np.float32), good[2]])
    with misuse(r"buffers\[2\].*got shape \[4, 64, 2\]"):
        stream.use_ring([good[0], good[1], good[2][:4]])
    wide = np.zeros((8, 128, 2), np.int16)
    with misuse(r"buffers\[0\].*non-contiguous"):
        stream.use_ring([wide[:, ::2], good[1], good[2]])
    frozen = good[0].copy()
    frozen.flags.writeable = False
    with misuse(r"buffers\[0\].*cannot write"):
        stream.use_ring([frozen, good[1], good[2]])
    with misuse(r"buffers\[0\] and buffers\[2\] share memory"):
        stream.use_ring([good[0], good[1], good[0]])
    with misuse(r"buffers\[1\].*got a list"):
        stream.use_ring([good[0], [1, 2], good[2]])
    with misuse("use_ring"):
        stream.next_slot()
    # None of the failures above installed a ring or moved the stream.
    assert stream.samples_consumed == 0 and stream._native.ring_size == 0


def test_ring_release_errors_and_no_free_slot_is_an_error_not_a_deadlock(ds):
    for prefetch in (0, 2):
        stream = TrainStream(ds, batch_size=8, seed=0, prefetch=prefetch)
        stream.use_ring(_ring(ds, 8, prefetch + 1))
        held = [stream.next_slot() for _ in range(prefetch + 1)]
        assert sorted(held) == list(range(prefetch + 1))
        with misuse("all .* buffers are held"):
            stream.next_slot()
        assert stream.samples_consumed == 8 * (prefetch + 1)
        stream.release(held[-1])
        with misuse("not held"):
            stream.release(held[-1])
        with pytest.raises(IndexError):
            stream.release(prefetch + 1)
        with pytest.raises(IndexError):
            stream.release(-1)
        assert stream.next_slot() == held[-1]


def test_ring_seek_and_resume_drop_prefetched_batches(ds):
    straight = TrainStream(ds, batch_size=8, seed=9, prefetch=0)
    want = [next(straight).copy() for _ in range(12)]
    stream = TrainStream(ds, batch_size=8, seed=9, prefetch=2)
    ring = _ring(ds, 8, 4)
    stream.use_ring(ring)
    kept = stream.next_slot()  # held across the seek: never overwritten
    stream.release(stream.next_slot())  # the prefetch thread is ahead now
    for k in (7, 2, 7):
        cursor = {**stream.state_dict(), "samples_consumed": 8 * k}
        stream.load_state_dict(cursor)
        for j in range(3):
            slot = stream.next_slot()
            assert slot != kept
            np.testing.assert_array_equal(ring[slot], want[k + j])
            stream.release(slot)
    np.testing.assert_array_equal(ring[kept], want[0])


def test_ring_truncated_file_error_from_the_prefetch_thread(make_recording):
    meta, _ = make_recording(4096, "ci16_le")  # 64 windows of 64
    data = meta.with_suffix(".sigmf-data").resolve()
    full = data.read_bytes()
    ds = IQDataset([meta], window=64)
    ref = TrainStream(ds, batch_size=8, seed=3, prefetch=0)
    want = [next(ref).copy() for _ in range(12)]
    stream = TrainStream(ds, batch_size=8, seed=3, prefetch=2)
    ring = _ring(ds, 8, 3)
    stream.use_ring(ring)
    for _ in range(2):
        stream.release(stream.next_slot())  # the prefetch thread has batches ready
    os.truncate(data, len(full) // 2)
    try:
        for _ in range(4):  # batches assembled before the truncation may still arrive first
            pos = stream.samples_consumed
            try:
                stream.release(stream.next_slot())
            except DataError as exc:
                assert "changed length" in str(exc) and str(data) in str(exc)
                assert stream.samples_consumed == pos, "a failed batch is not consumed"
                break
        else:
            pytest.fail("no DataError")
    finally:
        data.write_bytes(full)
    slot = stream.next_slot()
    np.testing.assert_array_equal(ring[slot], want[pos // 8])


@pytest.mark.parametrize("datatype", ["ci8", "cf32_le"])
def test_ring_in_every_storage_dtype_and_replacing_the_ring(make_recording, datatype):
    meta, _ = make_recording(2000, datatype)
    ds = IQDataset([meta], window=50)
    ref = TrainStream(ds, batch_size=4, seed=8, prefetch=0)
    want = [next(ref).copy() for _ in range(6)]
    stream = TrainStream(ds, batch_size=4, seed=8, prefetch=1)
    with misuse(f"numpy {ds.dtype} array"):
        stream.use_ring(_ring(ds, 4, 2, np.int16))
    first = _ring(ds, 4, 2)
    stream.use_ring(first)
    old = stream.next_slot()
    np.testing.assert_array_equal(first[old], want[0])
    second = _ring(ds, 4, 3)
    stream.use_ring(second)  # the old ring's prefetched batch is dropped, the cursor kept
    for k in range(1, 6):
        slot = stream.next_slot()
        np.testing.assert_array_equal(second[slot], want[k])
        stream.release(slot)
    np.testing.assert_array_equal(first[old], want[0])  # the replaced ring is never written


def _skewed(shape, dtype, skew, spare=256):
    """A C-contiguous array starting ``skew`` bytes past a page boundary, and the ``spare``
    bytes after it (filled with 0xA5) to check that nothing is written past its end."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.full(nbytes + 4096 + spare, 0xA5, np.uint8)
    at = (skew - raw.ctypes.data) % 4096
    return raw[at : at + nbytes].view(dtype).reshape(shape), raw[at + nbytes : at + nbytes + spare]


@pytest.mark.parametrize(
    ("window", "skew"),
    # int16 rows, so even distances. Windows of 2048: 8 KiB rows at page-aligned file offsets,
    # so `skew` is the distance past the source (0 and >= 32: one memcpy; 2-30: pieces).
    # Windows of 1000: 4000-byte rows (the last piece short) at offsets that vary by row; the
    # first row (window 0, row 0) is at `skew` past its source, so skew 16 takes pieces.
    [(2048, s) for s in (0, 2, 16, 30, 32, 62, 64)] + [(1000, s) for s in (0, 16, 48)],
)
def test_mapped_rows_into_a_destination_at_any_distance_from_the_page(make_recording, window, skew):
    # Where glibc's rep movsb is slow, rows go in 1 KiB pieces (aligned.rs copy_bytes): the bytes
    # are the recording's, and nothing is written past the buffer.
    meta, iq = make_recording(40 * window, "ci16_le")
    ds = IQDataset([meta], window=window, map_min_bytes=0)
    assert ds._native.mapped_recordings == 1
    ids = np.array([0, 39, 17, 5, 22], dtype=np.uint64)
    want = np.stack([iq[i * window : (i + 1) * window] for i in ids.astype(int)])
    out, after = _skewed(want.shape, np.int16, skew)
    ds._native.gather(ids, out)
    np.testing.assert_array_equal(out, want)
    assert (after == 0xA5).all()
    stream = TrainStream(ds, batch_size=5, seed=3, prefetch=1)
    ring = [_skewed(want.shape, np.int16, skew) for _ in range(3)]
    stream.use_ring([buf for buf, _ in ring])
    for _ in range(4):
        slot = stream.next_slot()
        rows = [iq[i * window : (i + 1) * window] for i in stream.last_ids().astype(int)]
        np.testing.assert_array_equal(ring[slot][0], np.stack(rows))
        stream.release(slot)
    assert all((spare == 0xA5).all() for _, spare in ring)


# --- opening many recordings: the order, the fingerprint and the first error ----------------


def _pinned_set(directory):
    """Three ci8 recordings: whole-file sampling, block sampling (> 64 KiB), two segments (each
    capture tuned elsewhere); one directory name that sorts differently as a string ("b-c" <
    "b/") than as a path."""
    layout = (("b-c/x", 4000, [0]), ("b/x", 70_000, [0]), ("b/y", 8000, [0, 500]))
    for name, nbytes, starts in layout:
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{path}.sigmf-data").write_bytes((np.arange(nbytes) % 251).astype(np.uint8).tobytes())
        meta = {
            "global": {"core:datatype": "ci8", "core:version": "1.2.0"},
            "captures": [
                {"core:sample_start": s, "core:frequency": 1e8 * (i + 1)}
                for i, s in enumerate(starts)
            ],
            "annotations": [],
        }
        Path(f"{path}.sigmf-meta").write_text(json.dumps(meta))
    return os.fspath(directory / "**" / "*.sigmf-meta")


def test_the_fingerprint_and_the_order_are_pinned(tmp_path):
    # Computed by the opening before it read archives, offsets and header bytes (and, before
    # that, before it was made to grow gently): resumes of existing checkpoints depend on it.
    ds = IQDataset(_pinned_set(tmp_path), window=16)
    assert [os.fspath(r.meta_path.relative_to(tmp_path)) for r in ds.recordings] == [
        "b/x.sigmf-meta",
        "b/y.sigmf-meta",
        "b-c/x.sigmf-meta",
    ]
    assert ds.fingerprint == "7aefff6feedf891aebe1d7cd08cd67a8150572ff08d326a284dbfef05fd1578a"


def test_sorted_paths_are_path_order():
    import random

    from iqtrain.data.sigmf.inputs import sorted_as_paths as _sorted_as_paths

    parts = ["b", "b-c", "b.c", "b0", "B", "a b", "é", "b_", "bb", "~"]
    rng = random.Random(1)
    paths = {"/" + "/".join(rng.choices(parts, k=rng.randint(1, 4))) for _ in range(400)}
    assert _sorted_as_paths(paths) == [os.fspath(p) for p in sorted(map(Path, paths))]


def test_paths_resolve_through_linked_directories_and_files(tmp_path):
    from iqtrain.data.sigmf import expand

    def _expand(paths):
        found = expand(paths)
        return [s.meta for s in found.sources], found.links

    real = tmp_path / "real"
    for name in ("a", "b"):
        _vector_recording(real, name, 64)
    (tmp_path / "dirlink").symlink_to(real, target_is_directory=True)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "c.sigmf-meta").symlink_to(real / "b.sigmf-meta")
    metas, links = _expand(
        [os.fspath(tmp_path / "dirlink" / "*.sigmf-meta"), tmp_path / "files" / "c.sigmf-meta"]
    )
    assert metas == [(real / "a.sigmf-meta").resolve(), (real / "b.sigmf-meta").resolve()]
    assert links == {(real / "b.sigmf-meta").resolve(): tmp_path / "files" / "c.sigmf-meta"}
    (tmp_path / "files" / "d.sigmf-meta").symlink_to(tmp_path / "gone.sigmf-meta")
    with pytest.raises(DataError, match=r"d\.sigmf-meta: a symlink to .*gone\.sigmf-meta"):
        _expand([os.fspath(tmp_path / "files" / "*.sigmf-meta")])


def test_every_bad_recording_is_named_at_once_or_skipped_on_request(tmp_path, monkeypatch):
    import iqtrain.data.dataset as dataset
    from iqtrain.errors import RecordingsRefused

    for name in ("a", "b", "c", "d", "e"):
        _vector_recording(tmp_path, name, 64)
    (tmp_path / "d.sigmf-meta").write_text("{not json")
    (tmp_path / "e.sigmf-data").unlink()
    _meta_with_captures(tmp_path / "c.sigmf-meta", [{"core:sample_start": -1}], "ci8")
    real = dataset._sampled_digest

    def unreadable_b(path, base, nbytes):
        if Path(path).name == "b.sigmf-data":
            raise PermissionError(13, "Permission denied")
        return real(path, base, nbytes)

    monkeypatch.setattr(dataset, "_sampled_digest", unreadable_b)
    pattern = os.fspath(tmp_path / "*.sigmf-meta")
    with pytest.raises(RecordingsRefused) as err:
        IQDataset(pattern, window=4)
    lines = str(err.value).splitlines()
    assert lines[0] == "4 of 5 recording(s) cannot be read:"
    assert re.search(r"/b\.sigmf-data: data file: cannot be read \(Perm", lines[1])
    assert re.search(r"/c\.sigmf-meta: captures\[0\]\.core:sample_start", lines[2])
    assert re.search(r"/d\.sigmf-meta: not valid JSON", lines[3])
    assert re.search(r"/e\.sigmf-data: data file missing", lines[4])
    assert err.value.exit_code == 2
    ds = IQDataset(pattern, window=4, skip_invalid=True)
    assert [r.meta_path.name for r in ds.recordings] == ["a.sigmf-meta"]
    assert [Path(p).name for p, _ in ds.refused] == [f"{n}.sigmf-meta" for n in "bcde"]
    with pytest.raises(RecordingsRefused, match="3 of 3"):
        IQDataset(os.fspath(tmp_path / "[cde].sigmf-meta"), window=4, skip_invalid=True)


def test_a_refusal_lists_the_first_twenty_and_counts_the_rest(tmp_path):
    from iqtrain.errors import RecordingsRefused

    for i in range(25):
        (tmp_path / f"r{i:02d}.sigmf-meta").write_text("[]")
    with pytest.raises(RecordingsRefused) as err:
        IQDataset(os.fspath(tmp_path / "*.sigmf-meta"), window=4)
    lines = str(err.value).splitlines()
    assert len(lines) == 22 and lines[-1] == "  ... and 5 more"
    assert "r00.sigmf-meta: global: missing or not an object" in lines[1]
    said = err.value.context("data.train", "data.skip_invalid = true trains on the others")
    assert str(said).splitlines()[0] == (
        "data.train: 25 of 25 recording(s) cannot be read (data.skip_invalid = true trains on "
        "the others):"
    )


def test_the_hard_open_file_limit_is_raised_where_the_process_may(monkeypatch):
    import resource

    import iqtrain.data.dataset as dataset

    calls = []
    allowed = {"hard": True}
    limits = {"now": (100, 200)}

    def setrlimit(which, new):
        calls.append(new)
        if new[1] > 200 and not allowed["hard"]:
            raise ValueError("not allowed to raise maximum limit")
        limits["now"] = new

    monkeypatch.setattr(resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    monkeypatch.setattr(dataset, "_nr_open", lambda: 5000)
    monkeypatch.setattr(dataset.os, "listdir", lambda path: ["fd"] * 20)
    # More than even the ceiling: the most there is, and half of what is then free.
    for hard, want, budget in (
        (True, [(5000, 5000)], (5000 - 20 - 64) // 2),
        (False, [(5000, 5000), (200, 200)], (200 - 20 - 64) // 2),
    ):
        allowed["hard"] = hard
        limits["now"] = (100, 200)
        calls.clear()
        assert dataset._open_file_budget(10_000) == budget
        assert calls == want
    # Everything fits once the soft limit is raised: every file, and no more asked for.
    limits["now"] = (100, 200)
    calls.clear()
    assert dataset._open_file_budget(50) == 50
    assert calls == [(20 + 50 + 64, 200)]
    # A limit so low that half the free descriptors is less than 16: 16 (a read that then finds
    # no descriptor says so: test_running_out_of_descriptors_mid_run_says_so).
    limits["now"] = (90, 90)
    assert dataset._open_file_budget(1000) == 16

"""IQDataset(select=...): a dataset restricted to chosen windows, and the stream over it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import misuse

from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.errors import CursorMismatchError

WINDOW = 32


@pytest.fixture
def glob(make_recording, tmp_path):
    for n in (1000, 700, 1300):  # 31 + 21 + 40 = 92 windows of 32
        make_recording(n, "ci16_le")
    return str(tmp_path / "rec" / "*.sigmf-meta")


@pytest.fixture
def base(glob):
    return IQDataset(glob, window=WINDOW)


#: Every third window, shuffled: 92 base windows -> 31 selected.
def _table(n: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.permutation(np.arange(0, n, 3, dtype=np.uint64))


def _ids(stream, k):
    out = []
    for _ in range(k):
        next(stream)
        out.append(stream.last_ids().copy())
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def test_selected_windows_are_the_base_windows_they_name(glob, base):
    table = _table(base.num_windows)
    sel = IQDataset(glob, window=WINDOW, select=table)
    assert sel.num_windows == len(sel) == len(table)
    assert sel.base_num_windows == base.num_windows == base.base_num_windows
    np.testing.assert_array_equal(sel.selection, table)
    assert sel.selection.dtype == np.uint64 and base.selection is None
    for i, b in enumerate(table.tolist()):
        np.testing.assert_array_equal(sel.window(i), base.window(b))
    np.testing.assert_array_equal(sel.windows(np.arange(len(table))), base.windows(table))
    np.testing.assert_array_equal(np.concatenate(list(sel.val_batches(7))), base.windows(table))
    with pytest.raises(IndexError):
        sel.window(len(table))
    # Recordings are what they were: skipped and per-recording counts do not change.
    assert sel.skipped == base.skipped
    assert sel._native.recording_windows == base._native.recording_windows
    assert "31 of 92 windows selected" in repr(sel), repr(sel)
    assert "selected" not in repr(base)


def test_a_sequence_of_ints_and_strides_index_the_datasets_own_windows(glob):
    strided = IQDataset(glob, window=WINDOW, stride=16)
    sel = IQDataset(glob, window=WINDOW, stride=16, select=[5, 0, 5, strided.num_windows - 1])
    assert sel.num_windows == 4
    for i, b in enumerate([5, 0, 5, strided.num_windows - 1]):
        np.testing.assert_array_equal(sel.window(i), strided.window(b))
    # int64 arrays of non-negative ids are taken as they are.
    same = IQDataset(
        glob, window=WINDOW, stride=16, select=np.array([5, 0, 5, sel.base_num_windows - 1])
    )
    assert same.fingerprint == sel.fingerprint


def test_fingerprint_covers_the_selection(glob, base):
    table = _table(base.num_windows)
    a = IQDataset(glob, window=WINDOW, select=table)
    assert a.base_fingerprint == base.fingerprint == base.base_fingerprint
    assert a.fingerprint != base.fingerprint
    assert IQDataset(glob, window=WINDOW, select=table.copy()).fingerprint == a.fingerprint
    assert IQDataset(glob, window=WINDOW, select=table.tolist()).fingerprint == a.fingerprint
    # Another set, the same set in another order, or every window selected: all differ.
    for other in (table[:-1], table[::-1], np.arange(base.num_windows, dtype=np.uint64)):
        assert IQDataset(glob, window=WINDOW, select=other).fingerprint != a.fingerprint
    every = IQDataset(glob, window=WINDOW, select=np.arange(base.num_windows, dtype=np.uint64))
    assert every.fingerprint != base.fingerprint


def test_the_stream_over_a_selection(glob, base):
    table = _table(base.num_windows)
    sel = IQDataset(glob, window=WINDOW, select=table)
    n = sel.num_windows
    stream = TrainStream(sel, batch_size=5, seed=3)  # 5 does not divide 31: batches straddle
    ids = _ids(stream, (3 * n) // 5 + 1)
    for e in range(3):
        assert sorted(ids[e * n : (e + 1) * n].tolist()) == list(range(n)), f"epoch {e}"
    assert not np.array_equal(ids[:n], ids[n : 2 * n]), "epochs must be reshuffled"
    # Deterministic, and every row is the base window the selection names.
    again = TrainStream(sel, batch_size=5, seed=3, prefetch=0)
    for k in range(4):
        batch = next(again)
        np.testing.assert_array_equal(again.last_ids(), ids[k * 5 : (k + 1) * 5])
        np.testing.assert_array_equal(batch, base.windows(table[again.last_ids()]))


@pytest.mark.parametrize("saved_after", [0, 3, 7])
def test_exact_resume_over_a_selection(glob, base, saved_after):
    sel = IQDataset(glob, window=WINDOW, select=_table(base.num_windows))
    straight = TrainStream(sel, batch_size=4, seed=9)
    _ids(straight, saved_after)  # 7 * 4 = 28 of 31: the next batches straddle the epoch
    cursor = json.loads(json.dumps(straight.state_dict()))
    assert cursor["fingerprint"] == sel.fingerprint
    expected = [next(straight).copy() for _ in range(3)]
    resumed = TrainStream(
        IQDataset(glob, window=WINDOW, select=sel.selection), batch_size=4, seed=9
    )
    next(resumed)  # the restore must drop anything already prefetched
    resumed.load_state_dict(cursor)
    assert resumed.batches_consumed == saved_after
    for want in expected:
        np.testing.assert_array_equal(next(resumed), want)


def test_a_cursor_of_another_selection_is_refused(glob, base):
    table = _table(base.num_windows)
    sel = IQDataset(glob, window=WINDOW, select=table)
    plain = TrainStream(base, batch_size=4, seed=1)
    next(plain)
    with pytest.raises(CursorMismatchError, match="cursor.fingerprint"):
        TrainStream(sel, batch_size=4, seed=1).load_state_dict(plain.state_dict())
    selected = TrainStream(sel, batch_size=4, seed=1)
    next(selected)
    with pytest.raises(CursorMismatchError, match="cursor.fingerprint"):
        TrainStream(base, batch_size=4, seed=1).load_state_dict(selected.state_dict())
    other = IQDataset(glob, window=WINDOW, select=table[1:])
    with pytest.raises(CursorMismatchError, match="cursor.fingerprint"):
        TrainStream(other, batch_size=4, seed=1).load_state_dict(selected.state_dict())


def test_bad_selections_are_typed_errors(glob, base):
    n = base.num_windows
    for empty in (np.zeros(0, np.uint64), []):
        with misuse("select: selects no window"):
            IQDataset(glob, window=WINDOW, select=empty)
    with pytest.raises(IndexError, match=rf"selected window id {n} is out of range \[0, {n}\)"):
        IQDataset(glob, window=WINDOW, select=np.array([0, n], np.uint64))
    with pytest.raises(IndexError, match="selected window id -1 is out of range"):
        IQDataset(glob, window=WINDOW, select=np.array([0, -1]))
    with pytest.raises(IndexError, match="selected window id -2 is out of range"):
        IQDataset(glob, window=WINDOW, select=[3, -2])
    with pytest.raises(IndexError, match=f"selected window id {2**64} is out of range"):
        IQDataset(glob, window=WINDOW, select=[2**64])
    for bad, what in (
        (np.array([0.0, 1.0]), "dtype float64"),
        (np.array([True, False]), "dtype bool"),
        (np.array([0, 1], np.int32), "dtype int32"),
        (np.zeros((2, 2), np.uint64), r"shape \(2, 2\)"),
        ("01", "a str"),
        ([0.5], "a list"),
        (3, "an int|a int"),
    ):
        with misuse(f"select: must be a 1-D numpy uint64 array.*{what}"):
            IQDataset(glob, window=WINDOW, select=bad)
    with misuse("select: window ids, not flags", TypeError):
        IQDataset(glob, window=WINDOW, select=[True, False])

"""The windows a model reads outside training: every window of a grid, labelled where a
labelled annotation holds it whole (iqtrain embed / score --per window|recording), and the
windows inside labelled annotations (the probe, --per annotation)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import random_iq, write_annotated

from iqtrain.data.dataset import IQDataset
from iqtrain.data.windows import grid_windows, labelled_windows
from iqtrain.errors import DataError

W = 64


def test_grid_windows_are_the_datasets_windows_labelled_where_an_annotation_holds_them(tmp_path):
    rng = np.random.default_rng(0)
    a = random_iq(rng, 1000, "cf32_le")
    b = random_iq(rng, 300, "ci16_le")
    write_annotated(
        tmp_path,
        "a",
        a,
        "cf32_le",
        [
            (0, 128, "x"),  # holds windows 0 and 64
            (100, 200, "y"),  # holds 128 and 192; 64 starts before it
            (128, 64, "z"),  # overlaps "y": the first annotation in metadata order wins
            (700, 100, None),  # unlabelled
            (500, 64, "w"),  # the capture at 500 starts a new grid: holds 500
        ],
        captures=(0, 500),
    )
    write_annotated(tmp_path, "b", b, "ci16_le", [])
    grid = grid_windows(os.fspath(tmp_path / "*.sigmf-meta"), W)
    ds = IQDataset(os.fspath(tmp_path / "*.sigmf-meta"), window=W)
    assert len(grid) == ds.num_windows
    starts_a = [0, 64, 128, 192, 256, 320, 384, 500, 564, 628, 692, 756, 820, 884]
    assert grid.starts.tolist() == starts_a + [0, 64, 128, 192]
    assert grid.recordings.tolist() == [0] * 14 + [1] * 4
    assert grid.classes == ("w", "x", "y")  # "z" holds no window of its own
    names = [grid.classes[k] if k >= 0 else None for k in grid.labels]
    assert names[:8] == ["x", "x", "y", "y", None, None, None, "w"]
    assert names[8:] == [None] * 10
    got = np.concatenate(list(grid.batches(5)))
    for row, (r, s) in enumerate(zip(grid.recordings, grid.starts, strict=True)):
        want = (a.astype(np.float32), b)[r][s : s + W]
        np.testing.assert_array_equal(got[row], want)


def test_unlabelled_recordings_give_no_classes(tmp_path, make_recording):
    meta, _ = make_recording(640)
    grid = grid_windows(os.fspath(meta), W)
    assert grid.classes == () and (grid.labels == -1).all() and len(grid) == 10


# --------------------------------------------------------------------------- labelled windows


def test_windows_lie_inside_labelled_annotations_and_captures(tmp_path):
    rng = np.random.default_rng(0)
    a_iq = random_iq(rng, 1000, "cf32_le")
    b_iq = random_iq(rng, 400, "ci16_le")
    write_annotated(
        tmp_path,
        "a",
        a_iq,
        "cf32_le",
        [
            (10, 128, "x"),  # exactly two windows: the second ends on the annotation's end
            (200, 63, "y"),  # one sample short of a window: none
            (300, 330, "y"),  # crosses the capture at 500: the window over it is dropped
            (700, 100, None),  # unlabelled: ignored
            (800, None, "x"),  # no count: runs to the end of the data
        ],
        captures=(0, 500),
    )
    write_annotated(tmp_path, "b", b_iq, "ci16_le", [(0, 400, "z")], captures=(100,))
    ls = labelled_windows([os.fspath(tmp_path / "*.sigmf-meta")], W)
    assert ls.classes == ("x", "y", "z")
    assert ls.starts.tolist() == [10, 74, 300, 364, 428, 556, 800, 864, 928, 0, 128, 192, 256, 320]
    assert ls.recordings.tolist() == [0] * 9 + [1] * 5
    assert ls.labels.tolist() == [0, 0, 1, 1, 1, 1, 0, 0, 0, 2, 2, 2, 2, 2]
    # Grouped by annotation; the one that yields no window takes no number. In "b" the leading
    # segment [0, 100) and the capture at 100 cut the annotation; the grid stays anchored at
    # its start (0, 128, ...: the window at 64 crosses the capture) and it is still one group.
    assert ls.groups.tolist() == [0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3]
    assert len(ls) == 14 and ls.num_annotations == 4
    raw = {0: a_iq.astype(np.float32), 1: b_iq}
    got = np.concatenate(list(ls.batches(5)))
    assert got.shape == (14, W, 2)
    for row, (r, s) in enumerate(zip(ls.recordings, ls.starts, strict=True)):
        np.testing.assert_array_equal(got[row], raw[r][s : s + W])


def test_cu8_windows_are_offset_binary(tmp_path):
    iq = random_iq(np.random.default_rng(1), 256, "cu8")
    write_annotated(tmp_path, "u", iq, "cu8", [(0, 128, "p"), (128, 128, "q")])
    ls = labelled_windows(os.fspath(tmp_path / "u.sigmf-meta"), W)
    got = np.concatenate(list(ls.batches()))
    np.testing.assert_array_equal(got[0], iq[:W].astype(np.int16) - 128)


@pytest.mark.parametrize(
    ("annotations", "match"),
    [
        ([(0, 30, "x"), (30, 30, "y")], "no labelled window"),
        ([(0, 100, "x"), (100, 100, "x")], "at least 2 classes"),
        ([(0, 100, None), (100, 100, None)], "no labelled window"),
    ],
)
def test_too_little_labelled_data_is_a_data_error(tmp_path, annotations, match):
    meta = write_annotated(
        tmp_path, "r", random_iq(np.random.default_rng(2), 200, "ci8"), "ci8", annotations
    )
    with pytest.raises(DataError, match=match):
        labelled_windows(os.fspath(meta), W)


def test_annotation_beyond_the_data_names_the_file_and_field(tmp_path):
    meta = write_annotated(
        tmp_path, "r", random_iq(np.random.default_rng(3), 200, "ci8"), "ci8", [(0, 200, "x")]
    )
    doc = json.loads(meta.read_text())
    doc["annotations"][0]["core:sample_count"] = 201
    meta.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"r\.sigmf-meta: annotations\[0\]"):
        labelled_windows(os.fspath(meta), W)

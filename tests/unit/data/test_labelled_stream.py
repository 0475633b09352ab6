"""A fine-tune's labelled stream: windows cut on data.stride inside the annotations that carry
data.label_key, each with its class, sampled by the training stream like any dataset, and the
refusals of a set a classifier cannot train or validate on."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import write_bursts

from iqtrain.config.sections import DataConfig
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.data.sources import open_labelled
from iqtrain.data.windows import labelled_windows
from iqtrain.errors import DataError

W = 32


def test_windows_are_cut_on_the_stride_inside_each_annotation_with_its_class(tmp_path):
    meta = write_bursts(tmp_path, "a", ["y", "x", "y"], W, windows_per=2)
    ls = labelled_windows(os.fspath(meta), W, stride=16, select=True)
    # Each annotation of 64 samples holds windows at +0, +16, +32: three per annotation.
    assert ls.starts.tolist() == [0, 16, 32, 64, 80, 96, 128, 144, 160]
    assert ls.classes == ("x", "y") and ls.labels.tolist() == [1] * 3 + [0] * 3 + [1] * 3
    assert ls.dataset.num_windows == 9 and ls.ids.tolist() == list(range(9))
    base = IQDataset(os.fspath(meta), window=W, stride=1)
    np.testing.assert_array_equal(ls.dataset.windows(ls.ids), base.windows(ls.starts))
    # The stream samples exactly these windows, each once per epoch.
    stream = TrainStream(ls.dataset, batch_size=3, seed=1)
    seen = np.concatenate([(next(stream), stream.last_ids())[1] for _ in range(3)])
    assert sorted(seen.tolist()) == list(range(9))


def test_the_label_key_picks_the_field_and_integer_values_are_class_names(tmp_path):
    meta = write_bursts(
        tmp_path,
        "a",
        ["p", "q", "r", "s"],
        W,
        fields=[{"x:mod": 3}, {"x:mod": 10}, {}, {"x:mod": 3}],
    )
    ls = labelled_windows(os.fspath(meta), W, key="x:mod")
    # Integer classes sort as numbers.
    assert ls.classes == ("3", "10") and ls.labels.tolist() == [0, 0, 1, 1, 0, 0]
    doc = json.loads(meta.read_text())
    for bad, why in (([1], "not a class name"), (True, "not a class name"),
                     (1.5, "not a class name"), ("a\nb", "control character"),
                     ("a\x00", "control character")):  # fmt: skip
        doc["annotations"][0]["x:mod"] = bad
        meta.write_text(json.dumps(doc))
        with pytest.raises(DataError, match=rf"annotations\[0\] x:mod is .*{why}"):
            labelled_windows(os.fspath(meta), W, key="x:mod")
    # null and blank strings: unlabelled, and said so.
    for blank in (None, "", "  "):
        doc["annotations"][0]["x:mod"] = blank
        meta.write_text(json.dumps(doc))
        ls = labelled_windows(os.fspath(meta), W, key="x:mod")
        assert ls.num_annotations == 2
        assert (ls.blank is None) == (blank is None)
    # The integer 3 and the string "3" are one class written two ways: refused, both named.
    doc["annotations"][0]["x:mod"] = "3"
    meta.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"annotations\[3\] x:mod is 3, but .*annotations\[0\]"):
        labelled_windows(os.fspath(meta), W, key="x:mod")


def test_a_label_key_may_be_a_path_into_an_annotations_objects(tmp_path):
    signal = [{"signal:detail": {"mod_class": m, "type": "digital"}} for m in ("qam", "psk")]
    meta = write_bursts(tmp_path, "a", ["p", "q"], W, fields=signal)
    ls = labelled_windows(os.fspath(meta), W, key="signal:detail.mod_class")
    assert ls.classes == ("psk", "qam") and ls.labels.tolist() == [1, 1, 0, 0]
    # A path that does not resolve leaves the annotation unlabelled.
    with pytest.raises(DataError, match="no labelled window"):
        labelled_windows(os.fspath(meta), W, key="signal:detail.standard")
    # A field whose own name holds the dot is read first.
    fields = [{"x:a.b": "one"}, {"x:a.b": "two"}]
    meta = write_bursts(tmp_path, "b", ["p", "q"], W, fields=fields)
    assert labelled_windows(os.fspath(meta), W, key="x:a.b").classes == ("one", "two")


def _data(tmp_path, **kw) -> DataConfig:
    return DataConfig(
        train=[os.fspath(tmp_path / "train" / "*.sigmf-meta")],
        val=[os.fspath(tmp_path / "val" / "*.sigmf-meta")],
        patch_len=8,
        seq_patches=4,
        **kw,
    )


def test_validation_is_numbered_by_the_training_classes(tmp_path):
    write_bursts(tmp_path / "train", "t", ["b", "a", "c"], W)
    write_bursts(tmp_path / "val", "v", ["c", "a"], W)
    train, val = open_labelled(_data(tmp_path))
    assert train.classes == val.classes == ("a", "b", "c")
    assert val.labels.tolist() == [2, 2, 0, 0]
    assert train.dataset.fingerprint != val.dataset.fingerprint


@pytest.mark.parametrize(
    ("train", "val", "message"),
    [
        (["a", "a"], ["a"], r"data.train: .*every labelled window is a; at least 2 classes"),
        (["a", "b"], ["a", "z"], r"data.val: .*v.sigmf-meta: annotations\[1\]: class z is not"),
        ([None, None], ["a"], r"data.train: .*no labelled window"),
    ],
)
def test_a_set_a_classifier_cannot_learn_from_is_one_line(tmp_path, train, val, message):
    write_bursts(tmp_path / "train", "t", train, W)
    write_bursts(tmp_path / "val", "v", val, W)
    with pytest.raises(DataError, match=message):
        open_labelled(_data(tmp_path))


def test_another_label_key_finds_no_window(tmp_path):
    write_bursts(tmp_path / "train", "t", ["a", "b"], W)
    write_bursts(tmp_path / "val", "v", ["a"], W)
    with pytest.raises(DataError, match="no annotation with a x:class"):
        open_labelled(_data(tmp_path, label_key="x:class"))

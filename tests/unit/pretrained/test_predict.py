"""iqtrain predict's parts that need no trained model: aggregation, accuracy and the confusion
matrix, labels by ``data.label_key``, the rows of each ``--per``, and the printed text (a
stand-in model whose log-probabilities are a function of each window's samples)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from iqtrain.cli.infer import prediction_lines
from iqtrain.errors import ConfigError, DataError, ObjectiveError
from iqtrain.objectives import REGISTRY
from iqtrain.pretrained.recordings import (
    Prediction,
    PredictRow,
    accuracy_scores,
    mean_log_probs,
    predict_recordings,
    predicted,
)

WINDOW = 64
CLASSES = ("a", "b", "c")


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def _fake(objective="classify", key="core:label", nan_at=None, sample_rate=None):
    """A stand-in Pretrained: a window whose I components average v gets logits
    ``-(v - k)**2`` for class k (so a window filled with k predicts class k)."""

    def log_probs(batches):
        out = []
        for raw in batches:
            v = raw[..., 0].astype(np.float64).mean(axis=1)
            lp = _log_softmax(-((v[:, None] - np.arange(len(CLASSES))[None, :]) ** 2))
            if nan_at is not None:
                lp[(raw[:, 0, 1] == nan_at)] = np.nan
            out.append(lp)
        return np.concatenate(out) if out else np.zeros((0, len(CLASSES)))

    return SimpleNamespace(
        classes=None if objective != "classify" else CLASSES,
        objective=REGISTRY[objective],
        window=WINDOW,
        attempt=Path("/runs/x/attempts/0001"),
        config=SimpleNamespace(
            data=SimpleNamespace(label_key=key), model=SimpleNamespace(objective=objective)
        ),
        log_probs=log_probs,
        sample_rate=sample_rate,
    )


def _write(directory: Path, name: str, iq: np.ndarray, annotations) -> str:
    """A ci16_le SigMF recording with ``annotations``: ``(start, count, fields)``."""
    directory.mkdir(parents=True, exist_ok=True)
    np.ascontiguousarray(iq, dtype="<i2").tofile(directory / f"{name}.sigmf-data")
    meta = {
        "global": {"core:datatype": "ci16_le", "core:version": "1.0.0"},
        "captures": [{"core:sample_start": 0}],
        "annotations": [
            {"core:sample_start": s, "core:sample_count": n, **fields}
            for s, n, fields in annotations
        ],
    }
    (directory / f"{name}.sigmf-meta").write_text(json.dumps(meta))
    return str(directory / f"{name}.sigmf-meta")


def _recording(tmp_path: Path, key: str = "core:label") -> str:
    """1024 samples: a [0,256) (windows of 0), b [256,448) (windows of 1, 1, 2), an unknown
    label [448,576) (2), an unlabelled annotation [576,700) (2: one window), an "a" too short
    for a window [700,740); the rest zeros."""
    iq = np.zeros((1024, 2), dtype=np.int16)
    iq[256:384, 0] = 1
    iq[384:700, 0] = 2
    iq[:, 1] = np.arange(1024) // WINDOW  # marks the window (a stand-in's NaN picks one)
    return _write(
        tmp_path,
        "r",
        iq,
        [
            (0, 256, {key: "a"}),
            (256, 192, {key: "b"}),
            (448, 128, {key: "zzz"}),
            (576, 124, {}),
            (700, 40, {key: "a"}),
        ],
    )


def test_an_annotation_predicts_the_class_of_its_mean_log_probabilities():
    lp = _log_softmax(np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1, 1]]))
    mean = mean_log_probs(lp, np.array([0, 0, 1, 1]), 2)
    np.testing.assert_allclose(mean, [lp[:2].mean(0), lp[2:].mean(0)])
    k, p = predicted(mean)
    assert k.tolist() == [1, 2]  # the mean favours b in the first annotation, c in the second
    soft = np.exp(mean) / np.exp(mean).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(p, soft[np.arange(2), k], rtol=1e-12)
    k1, p1 = predicted(lp)  # a window: its own log-probabilities
    assert k1.tolist() == [0, 1, 2, 0]  # a tie: the first class
    np.testing.assert_allclose(p1, np.exp(lp.max(axis=1)), rtol=1e-12)
    assert predicted(np.zeros((0, 3)))[0].shape == (0,)


def test_accuracy_counts_only_known_labels_and_the_confusion_is_true_by_predicted():
    s = accuracy_scores([0, 0, 1, 1, 1, -1, 2], [0, 1, 1, 1, 0, 2, 2], CLASSES)
    assert s.labelled == 6
    assert s.confusion == [[1, 1, 0], [1, 2, 0], [0, 0, 1]]
    assert s.accuracy == pytest.approx(4 / 6)
    assert s.accuracy == np.trace(s.confusion) / np.sum(s.confusion)
    assert s.class_accuracy == {"a": 0.5, "b": pytest.approx(2 / 3), "c": 1.0}
    none = accuracy_scores([-1, 0], [0, 0], ("a", "b"))
    assert none.class_accuracy == {"a": 1.0, "b": None} and none.labelled == 1
    empty = accuracy_scores([-1], [1], CLASSES)
    assert empty.accuracy is None and empty.labelled == 0 and np.sum(empty.confusion) == 0


@pytest.mark.parametrize("key", ["core:label", "x:class"])
def test_per_annotation_rows_labels_unknown_labels_and_window_accuracy(tmp_path, key):
    data = _recording(tmp_path, key)
    pred = predict_recordings(_fake(key=key), [data], per="annotation")
    got = [(r.start, r.windows, r.predicted, r.label) for r in pred.rows]
    assert got == [(0, 4, "a", "a"), (256, 3, "b", "b"), (448, 2, "c", "zzz"), (576, 1, "c", None)]
    assert pred.rows[0].probability == pytest.approx(1 / (1 + np.exp(-1) + np.exp(-4)))
    assert pred.unknown == {"zzz": 1} and pred.label_key == key and pred.classes == CLASSES
    s = pred.scores
    assert s.labelled == 2 and s.accuracy == 1.0
    assert s.confusion == [[1, 0, 0], [0, 1, 0], [0, 0, 0]]
    assert s.class_accuracy == {"a": 1.0, "b": 1.0, "c": None}
    w = pred.window_scores  # each window of the two known annotations alone: b's third is c
    assert w.labelled == 7 and w.accuracy == pytest.approx(6 / 7)
    assert w.confusion == [[4, 0, 0], [0, 2, 1], [0, 0, 0]]
    doc = pred.to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["window_accuracy"] == w.accuracy and doc["unknown_labels"] == {"zzz": 1}
    assert doc["rows"][3] == {
        "recording": data,
        "start": 576,
        "windows": 1,
        "predicted": "c",
        "probability": pytest.approx(1 / (1 + np.exp(-1) + np.exp(-4))),
        "label": None,
    }


def test_per_window_rows_are_the_grid_labelled_by_the_annotation_holding_them(tmp_path):
    data = _recording(tmp_path, "x:class")
    pred = predict_recordings(_fake(key="x:class"), [data], per="window")
    assert [r.start for r in pred.rows] == list(range(0, 1024, WINDOW))
    labels = [r.label for r in pred.rows]
    assert labels == ["a"] * 4 + ["b"] * 3 + ["zzz"] * 2 + [None] * 7
    assert [r.predicted for r in pred.rows][:11] == ["a"] * 4 + ["b"] * 2 + ["c"] * 5
    assert pred.unknown == {"zzz": 2} and pred.window_scores is None
    assert pred.scores.labelled == 7 and pred.scores.accuracy == pytest.approx(6 / 7)
    assert all(r.windows == 1 for r in pred.rows)
    assert "window_accuracy" not in pred.to_dict()


def test_unlabelled_recordings_predict_per_window_and_refuse_per_annotation(tmp_path):
    data = _write(tmp_path, "plain", np.zeros((300, 2)), [])
    pred = predict_recordings(_fake(), [data], per="window")
    assert len(pred.rows) == 4 and pred.scores.accuracy is None and pred.unknown == {}
    assert all(r.label is None and r.predicted == "a" for r in pred.rows)
    with pytest.raises(DataError, match="no annotation holds a whole window of 64 .*--per window"):
        predict_recordings(_fake(), [data], per="annotation")
    lines = prediction_lines(pred, "src")
    assert lines[-1].startswith("accuracy n/a: no window carries a core:label")


def test_refusals_name_the_attempt_the_annotation_and_the_window(tmp_path):
    data = _recording(tmp_path)
    with pytest.raises(ObjectiveError, match="/runs/x/attempts/0001: model.objective is 'mse'"):
        predict_recordings(_fake("mse"), [data])
    with pytest.raises(ConfigError, match="--per"):
        predict_recordings(_fake(), [data], per="recording")
    with pytest.raises(DataError, match=r"r.sigmf-meta: the window at sample 320 gives non-fin"):
        predict_recordings(_fake(nan_at=5), [data], per="annotation")
    with pytest.raises(DataError, match=r"the window at sample 640 gives non-finite"):
        predict_recordings(_fake(nan_at=10), [data], per="window")
    bad = _write(tmp_path / "b", "bad", np.zeros((256, 2)), [(0, 128, {"core:label": "a"})])
    meta = json.loads(Path(bad).read_text())
    meta["annotations"][0]["x:class"] = 1.5
    Path(bad).write_text(json.dumps(meta))
    # A label value that is no class name is refused as every command refuses it.
    for per in ("annotation", "window"):
        with pytest.raises(DataError, match=r"bad.sigmf-meta: annotations\[0\] x:class is 1.5"):
            predict_recordings(_fake(key="x:class"), [bad], per=per)
    # A class the model does not know is predicted, not scored.
    meta["annotations"][0]["x:class"] = "zz"
    Path(bad).write_text(json.dumps(meta))
    for per in ("annotation", "window"):
        pred = predict_recordings(_fake(key="x:class"), [bad], per=per)
        assert pred.unknown == {"zz": 1 if per == "annotation" else 2}, pred.unknown
        assert pred.scores.labelled == 0 and {r.label for r in pred.rows} - {None} == {"zz"}


def test_the_text_is_a_header_the_table_accuracy_per_class_and_the_confusion_matrix():
    rows = [
        PredictRow(Path("/d/r0.sigmf-meta"), 0, 4, "a", 0.9, "a"),
        PredictRow(Path("/d/r0.sigmf-meta"), 512, 2, "b", 0.51234567, "a"),
        PredictRow(Path("/d/r1.sigmf-meta"), 64, 3, "b", 0.7, None),
    ]
    s = accuracy_scores([0, 0, -1], [0, 1, 1], CLASSES)
    w = accuracy_scores([0] * 6, [0, 0, 0, 0, 1, 0], CLASSES)
    pred = Prediction("annotation", CLASSES, rows, s, {}, window_scores=w)
    lines = prediction_lines(pred, "A at step_00000020 (step 20)")
    assert lines[0].startswith("predict of A at step_00000020 (step 20): 3 annotations (the ")
    assert "3 classes; labels from core:label (3 of 3 rows shown)" in lines[0]
    assert lines[1].split() == [
        "row",
        "start",
        "windows",
        "predicted",
        "probability",
        "label",
        "recording",
    ]
    assert lines[3].split() == ["2", "512", "2", "b", "0.51235", "a", "/d/r0.sigmf-meta"]
    assert lines[4].split()[-2:] == ["-", "/d/r1.sigmf-meta"]
    assert lines[5] == (
        "accuracy 0.50000 (1 correct of 2 annotations with a known label; each of their 6 windows "
        "alone 0.83333)"
    )
    assert lines[6] == "class accuracy: a 0.50000 (2), b n/a (0), c n/a (0)"
    assert lines[7] == "confusion (rows: true class, columns: predicted class):"
    assert lines[8].split() == list(CLASSES)
    assert [ln.split() for ln in lines[9:]] == [
        ["a", "1", "1", "0"],
        ["b", "0", "0", "0"],
        ["c", "0", "0", "0"],
    ]
    short = prediction_lines(pred, "A", rows=0)
    # No rows: no table header either; the summary follows the header line.
    assert "(0 of 3 rows shown)" in short[0] and short[1].startswith("accuracy 0.50000")
    assert len(short) == len(lines) - 4


def test_a_confusion_matrix_of_many_classes_is_left_to_the_json():
    classes = tuple(f"c{k:02d}" for k in range(41))
    truth = np.arange(41)
    scores = accuracy_scores(truth, truth, classes)
    rows = [PredictRow(Path("r"), 0, 1, c, 1.0, c) for c in classes]
    pred = Prediction("window", classes, rows, scores, {})
    text = prediction_lines(pred, "A", rows=0)
    assert text[1].startswith("accuracy 1.00000 (41 correct of 41 windows")
    assert text[-1] == "confusion: 41 classes, more than 40 to print (--json holds it)"
    assert len(text) == 4


def test_a_model_at_a_known_rate_refuses_recordings_at_another_unless_any_rate(tmp_path):
    data = _recording(tmp_path)  # no core:sample_rate
    with pytest.raises(DataError, match=r"--data: the model was trained at 2 MHz, but 1 rec"):
        predict_recordings(_fake(sample_rate=2e6), [data])
    with pytest.raises(DataError, match="have no core:sample_rate .*--any-rate"):
        predict_recordings(_fake(sample_rate=2e6), [data], per="window")
    assert len(predict_recordings(_fake(sample_rate=2e6), [data], any_rate=True).rows) == 4
    doc = json.loads(Path(data).read_text())
    doc["global"]["core:sample_rate"] = 2e6
    Path(data).write_text(json.dumps(doc))
    assert len(predict_recordings(_fake(sample_rate=2e6), [data]).rows) == 4


@pytest.mark.parametrize("key", ["x:class", "signal:detail.mod_class"])
def test_the_label_key_may_be_another_field_or_a_path(tmp_path, key):
    data = _recording(tmp_path, key)  # the model trained on core:label: labels elsewhere
    pred = predict_recordings(_fake(), [data], per="annotation", key=key)
    assert pred.label_key == key and [r.label for r in pred.rows] == ["a", "b", "zzz", None]
    assert pred.scores.labelled == 2
    plain = predict_recordings(_fake(), [data], per="window")  # the model's own key: none
    assert pred.unknown == {"zzz": 1} and plain.scores.labelled == 0
    with pytest.raises(ConfigError, match="--label-key"):
        predict_recordings(_fake(), [data], key="")


def test_every_recording_without_a_row_and_every_blank_label_is_noted(tmp_path, capsys):
    data = _recording(tmp_path / "r")
    _write(tmp_path / "r", "blank", np.zeros((128, 2)), [(0, 128, {"core:label": " "})])
    _write(tmp_path / "r", "bare", np.zeros((128, 2)), [])
    _write(tmp_path / "r", "short", np.zeros((40, 2)), [])
    both = [data, str(tmp_path / "r" / "*.sigmf-meta")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pred = predict_recordings(_fake(), both, per="annotation")
    err = capsys.readouterr().err
    assert "--data: 1 recording(s) yield no window of 64 samples (too short" in err
    assert "short.sigmf-meta" in err
    assert "1 recording(s) yield no window of 64 samples inside an annotation, skipped: " in err
    assert "bare.sigmf-meta" in err
    assert "--data: 1 annotation(s) with an empty core:label are read as unlabelled" in err
    assert [r.label for r in pred.rows if r.recording.name == "blank.sigmf-meta"] == [None]
    predict_recordings(_fake(), both, per="window")
    err = capsys.readouterr().err
    assert "short.sigmf-meta" in err and "empty core:label" in err and "bare" not in err


def test_class_names_print_as_show_class_prints_them():
    classes = (" a", "a", "b")
    rows = [
        PredictRow(Path("r"), 0, 1, " a", 0.9, "a"),
        PredictRow(Path("r"), 64, 1, "a", 0.8, " a"),
    ]
    pred = Prediction("window", classes, rows, accuracy_scores([1, 0], [0, 1], classes), {})
    lines = prediction_lines(pred, "A")
    assert lines[2].split()[3:6] == ["'", "a'", "0.90000"]  # "' a'": the name as written
    assert "' a'" in lines[3] and lines[3].split()[5] == "'"
    assert lines[-6] == "class accuracy: ' a' 0.00000 (1), a 0.00000 (1), b n/a (0)"
    assert lines[-4].split() == ["'", "a'", "a", "b"]
    assert lines[-3].split()[:2] == ["'", "a'"] and lines[-2].split()[0] == "a"

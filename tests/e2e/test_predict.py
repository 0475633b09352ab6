"""iqtrain predict as a user runs it: a tiny "classify" attempt fine-tuned on the synthetic
labelled set, its predictions over the validation recordings (the validation record's accuracy
reproduced), and every refusal one line, exit 2, no traceback."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from helpers import (
    cli_tables,
    refused_in_one_line,
    set_sample_rate,
    subprocess_env,
    write_annotated,
    write_sigmf,
)

from iqtrain import load_pretrained
from iqtrain.cli.main import main
from iqtrain.config.schema import dumps_toml
from iqtrain.errors import ObjectiveError
from iqtrain.evidence.metrics import read_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TIMEOUT = 300
WINDOW = 64  # seq_patches 8 x patch_len 8


def _iqtrain(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "iqtrain", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=TIMEOUT,
    )


@pytest.fixture(scope="module")
def attempts(tmp_path_factory):
    """A finished "classify" attempt (20 steps, validations at 10 and 20) on the synthetic
    labelled set, its validation recordings, and a finished pretraining attempt."""
    root = tmp_path_factory.mktemp("predict")
    tables = cli_tables(root / "cls", root / "cache-cls", max_steps=20, eval_every=10)
    tables["data"].update(batch_size=8)
    tables["data"]["synthetic"].update(samples=16384, train_recordings=2, val_recordings=1)
    tables["model"].update(dim=32, layers=1, heads=2, objective="classify")
    tables["training"]["checkpoint_every"] = 10
    (root / "cls.toml").write_text(dumps_toml(tables))
    proc = _iqtrain("run", root / "cls.toml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    pre = cli_tables(root / "pre", root / "cache-pre", max_steps=2)
    (root / "pre.toml").write_text(dumps_toml(pre))
    proc = _iqtrain("run", root / "pre.toml")
    assert proc.returncode == 0, proc.stderr[-4000:]
    val = glob.glob(os.fspath(root / "cache-cls" / "*" / "val" / "*.sigmf-meta"))
    assert val, list((root / "cache-cls").rglob("*"))
    return (
        root / "cls" / "attempts" / "0001",
        os.fspath(root / "cache-cls" / "*" / "val" / "*.sigmf-meta"),
        root / "pre" / "attempts" / "0001",
    )


def _json(proc: subprocess.CompletedProcess) -> tuple[list[str], dict]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    return lines[:-1], json.loads(lines[-1])


def _consistent(doc: dict) -> None:
    """Accuracy, per-class accuracy and rows agree with the confusion matrix."""
    c = np.array(doc["confusion"])
    k = len(doc["classes"])
    assert c.shape == (k, k) and doc["classes"] == sorted(doc["classes"])
    known = [r for r in doc["rows"] if r["label"] in doc["classes"]]
    assert c.sum() == doc["labelled"] == len(known) > 0
    assert doc["accuracy"] == pytest.approx(np.trace(c) / c.sum(), abs=0)
    assert sum(r["predicted"] == r["label"] for r in known) == np.trace(c)
    for i, name in enumerate(doc["classes"]):
        want = c[i, i] / c[i].sum() if c[i].sum() else None
        assert doc["class_accuracy"][name] == pytest.approx(want)
    for r in doc["rows"]:
        assert r["predicted"] in doc["classes"] and 0 < r["probability"] <= 1
        assert r["probability"] >= 1 / k - 1e-12  # the most probable class's probability


def test_per_annotation_reproduces_the_validation_accuracy_of_the_checkpoint(attempts):
    attempt, val, _ = attempts
    last = [r for r in read_metrics(attempt / "metrics.jsonl") if r["kind"] == "val"][-1]
    text, doc = _json(_iqtrain("predict", attempt, "--data", val, "--from", "latest", "--json"))
    assert doc["checkpoint"] == "step_00000020" and doc["step"] == 20 == last["step"]
    assert doc["per"] == "annotation" and doc["label_key"] == "core:label"
    assert doc["classes"] == sorted(last["class_accuracy"])
    # data.stride is the window: validation's windows are each annotation's, one window apart
    assert doc["windows"] == last["samples"] == sum(r["windows"] for r in doc["rows"])
    assert doc["window_accuracy"] == pytest.approx(last["accuracy"], abs=1e-12)
    assert doc["window_class_accuracy"] == pytest.approx(last["class_accuracy"], abs=1e-12)
    assert doc["unknown_labels"] == {} and all(r["label"] for r in doc["rows"])
    _consistent(doc)
    assert text[0].startswith(f"predict of {attempt.resolve()} at step_00000020 (step 20): ")
    assert text[1].split()[:4] == ["row", "start", "windows", "predicted"]
    n = len(doc["rows"])
    assert len(text) == 2 + n + 3 + 1 + len(doc["classes"])
    assert text[2 + n].startswith(f"accuracy {doc['accuracy']:.5f} (")
    assert text[3 + n].startswith("class accuracy: ")
    assert text[4 + n] == "confusion (rows: true class, columns: predicted class):"
    # --stride: each annotation's windows half a window apart (4 -> 7 windows per burst).
    _, half = _json(_iqtrain("predict", attempt, "--data", val, "--stride", "32", "--json"))
    assert [r["windows"] for r in half["rows"]] == [2 * r["windows"] - 1 for r in doc["rows"]]


def test_per_window_and_the_best_checkpoint_by_default(attempts):
    attempt, val, _ = attempts
    manifest = json.loads((attempt / "manifest.json").read_text())
    proc = _iqtrain("predict", attempt, "--data", val, "--per", "window", "--rows", "0", "--json")
    text, doc = _json(proc)
    assert (attempt / manifest["best"]["path"]).name == doc["checkpoint"]
    assert doc["per"] == "window" and "window_accuracy" not in doc
    assert all(r["windows"] == 1 and r["start"] % WINDOW == 0 for r in doc["rows"])
    assert any(r["label"] is None for r in doc["rows"])  # the gaps between bursts
    _consistent(doc)
    assert "(0 of " in text[0] and text[1].startswith("accuracy ")  # --rows 0: no table
    plain = _iqtrain("predict", attempt, "--data", val, "--per", "window")
    assert plain.returncode == 0 and "{" not in plain.stdout


def test_unlabelled_and_unknown_labels_are_predicted_not_scored(attempts, tmp_path, capsys):
    attempt, _, _ = attempts
    rng = np.random.default_rng(1)
    write_sigmf(tmp_path / "plain", "p", rng.integers(-99, 99, (300, 2)), "ci16_le")
    plain = os.fspath(tmp_path / "plain" / "*.sigmf-meta")
    assert main(["predict", os.fspath(attempt), "--data", plain, "--per", "window"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 2 + 4 + 1 and out[-1].startswith(
        "accuracy n/a: no window carries a core:label"
    )
    refused_in_one_line(
        capsys, ["predict", os.fspath(attempt), "--data", plain], "no annotation holds", "--per"
    )
    iq = rng.integers(-99, 99, (512, 2))
    anns = [(0, 128, "BPSK"), (128, 128, "Martian"), (256, 128, None)]
    set_sample_rate(write_annotated(tmp_path / "mixed", "m", iq, "ci16_le", anns))
    mixed = os.fspath(tmp_path / "mixed" / "*.sigmf-meta")
    assert main(["predict", os.fspath(attempt), "--data", mixed, "--json"]) == 0
    cap = capsys.readouterr()
    doc = json.loads(cap.out.strip().splitlines()[-1])
    assert [(r["start"], r["label"]) for r in doc["rows"]] == [
        (0, "BPSK"),
        (128, "Martian"),
        (256, None),
    ]
    assert doc["unknown_labels"] == {"Martian": 1} and doc["labelled"] == 1
    assert "1 annotation(s) carry a core:label the model does not know ('Martian': 1)" in cap.err


def test_bad_input_is_one_line_exit_2(attempts, tmp_path, capsys):
    attempt, val, pretraining = attempts
    a = os.fspath(attempt)
    proc = _iqtrain("predict", pretraining, "--data", val)  # a real process: no traceback
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr
    want = "predict needs a model trained with model.objective = 'classify'"
    assert os.fspath(pretraining) in lines[0] and want in lines[0], lines
    assert proc.stdout == ""
    refused_in_one_line(
        capsys, ["predict", os.fspath(tmp_path / "none"), "--data", val], "not an attempt"
    )
    refused_in_one_line(capsys, ["predict", a, "--data", val, "--from", "newest"], "--from")
    refused_in_one_line(
        capsys,
        ["predict", a, "--data", val, "--from", "step_3"],
        "step_00000003",
        "no such checkpoint",
    )
    missing = os.fspath(tmp_path / "nothing*.sigmf-meta")
    refused_in_one_line(capsys, ["predict", a, "--data", missing], "nothing*.sigmf-meta")
    rng = np.random.default_rng(2)
    write_annotated(
        tmp_path / "short", "s", rng.integers(-9, 9, (40, 2)), "ci16_le", [(0, 40, "BPSK")]
    )
    short = os.fspath(tmp_path / "short" / "*.sigmf-meta")
    refused_in_one_line(capsys, ["predict", a, "--data", short], "shorter than the window")
    refused_in_one_line(capsys, ["predict", a, "--data", val, "--per", "recording"], "--per")
    refused_in_one_line(capsys, ["predict", a, "--data", val, "--rows", "-1"], "--rows")
    for bad in (["--stride", "0"], ["--per", "window", "--stride", "8"]):
        refused_in_one_line(capsys, ["predict", a, "--data", val, *bad], "--stride")
    # A classifier scores no next patch: score refuses it, as predict refuses a pretraining one.
    refused_in_one_line(capsys, ["score", a, "--data", val], "which gives no score")
    with pytest.raises(ObjectiveError, match="'classify', which gives no score"):
        load_pretrained(attempt).score(np.zeros((1, 64), np.complex64))
    iq = rng.standard_normal((256, 2)).astype(np.float32)
    iq[140, 0] = np.nan
    set_sample_rate(write_annotated(tmp_path / "nan", "n", iq, "cf32_le", [(0, 256, "BPSK")]))
    nan = os.fspath(tmp_path / "nan" / "n.sigmf-meta")
    for per in ("annotation", "window"):
        refused_in_one_line(
            capsys, ["predict", a, "--data", nan, "--per", per], "n.sigmf-meta", "sample 128"
        )


def test_help_imports_no_torch():
    code = (
        "import sys\nfrom iqtrain.cli.main import main\n"
        "assert main(['predict', '--help']) == 0\n"
        "print('torch' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage: iqtrain predict" in proc.stdout and "--per {annotation,window}" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "False"

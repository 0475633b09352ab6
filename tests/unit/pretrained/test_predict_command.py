"""``iqtrain predict`` from the command line over recordings as people have them: the model's
sample rate (--any-rate), another label field or a path (--label-key), recordings that cannot
be read (--skip-invalid), one channel of several (--channel), and a note for every recording
that yields no row (a tiny "classify" attempt)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import (
    cli_tables,
    random_iq,
    refused_in_one_line,
    set_sample_rate,
    write_bursts,
    write_sigmf,
)

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config
from iqtrain.pretrained.load import load_pretrained
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

W = 64  # the tiny attempt's window: patch_len 8 x seq_patches 8


@pytest.fixture(scope="module")
def classify(tmp_path_factory):
    """A 2-step "classify" attempt on the synthetic labelled set (1 MHz), and its classes."""
    root = tmp_path_factory.mktemp("classify")
    tables = cli_tables(root / "run", root / "cache", max_steps=2)
    tables["model"].update(objective="classify")
    attempt = run_attempt(build_config(tables)).attempt
    pre = load_pretrained(attempt)
    assert pre.sample_rate == 1e6 and pre.config.data.label_key == "core:label"
    return os.fspath(attempt), list(pre.classes)


def _nested(meta):
    """Move every annotation's core:label of ``meta`` to ``signal:detail.mod_class``."""
    doc = json.loads(meta.read_text())
    for ann in doc["annotations"]:
        ann["signal:detail"] = {"mod_class": ann.pop("core:label")}
    meta.write_text(json.dumps(doc))
    return meta


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_predict_refuses_another_rate_unless_any_rate(classify, tmp_path, capsys):
    attempt, classes = classify
    fast = os.fspath(set_sample_rate(write_bursts(tmp_path, "f", classes[:2], W), 2e6))
    for per in ("annotation", "window"):
        refused_in_one_line(
            capsys,
            ["predict", attempt, "--data", fast, "--per", per],
            "--data",
            "1 MHz",
            "2 MHz",
            "--any-rate",
        )
    assert main(["predict", attempt, "--data", fast, "--any-rate", "--json"]) == 0
    assert _json(capsys)["labelled"] == 2


def test_predict_reads_labels_by_another_key_or_path(classify, tmp_path, capsys):
    attempt, classes = classify
    data = os.fspath(_nested(set_sample_rate(write_bursts(tmp_path, "n", classes[:3], W))))
    assert main(["predict", attempt, "--data", data, "--json"]) == 0
    doc = _json(capsys)  # the model's own key, core:label: no label
    assert doc["label_key"] == "core:label" and doc["labelled"] == 0
    argv = ["predict", attempt, "--data", data, "--label-key", "signal:detail.mod_class"]
    assert main([*argv, "--json"]) == 0
    doc = _json(capsys)
    assert doc["label_key"] == "signal:detail.mod_class" and doc["labelled"] == 3
    assert [r["label"] for r in doc["rows"]] == classes[:3]
    assert main([*argv, "--per", "window", "--json"]) == 0
    assert _json(capsys)["labelled"] == 6  # two windows per annotation
    refused_in_one_line(
        capsys, ["predict", attempt, "--data", data, "--label-key", ""], "--label-key"
    )


def test_predict_notes_what_yields_no_row_and_reads_past_with_skip_invalid(
    classify, tmp_path, capsys
):
    attempt, classes = classify
    d = tmp_path / "d"
    set_sample_rate(write_bursts(d, "good", [classes[0], " "], W))  # a blank label: said
    set_sample_rate(write_bursts(d, "short", [classes[0]], 20, windows_per=1))
    (d / "bad.sigmf-meta").write_text("[]")
    data = os.fspath(d / "*.sigmf-meta")
    line = refused_in_one_line(capsys, ["predict", attempt, "--data", data], "--data")
    assert "bad.sigmf-meta" in line and "--skip-invalid" in line
    assert main(["predict", attempt, "--data", data, "--skip-invalid", "--json"]) == 0
    cap = capsys.readouterr()
    assert "--data: 1 input(s) cannot be read and are skipped (--skip-invalid)" in cap.err
    assert "--data: 1 recording(s) yield no window of 64 samples (too short" in cap.err
    assert "short.sigmf-meta" in cap.err
    assert "--data: 1 annotation(s) with an empty core:label are read as unlabelled" in cap.err
    doc = json.loads(cap.out.strip().splitlines()[-1])
    assert [r["label"] for r in doc["rows"]] == [classes[0], None] and doc["labelled"] == 1


def test_predict_reads_one_channel_of_several(classify, tmp_path, capsys):
    attempt, _ = classify
    iq = random_iq(np.random.default_rng(0), 512, "ci16_le")
    two = set_sample_rate(write_sigmf(tmp_path, "two", iq, "ci16_le"))
    doc = json.loads(two.read_text())
    doc["global"]["core:num_channels"] = 2  # 256 samples of each of two channels
    two.write_text(json.dumps(doc))
    argv = ["predict", attempt, "--data", os.fspath(two), "--per", "window"]
    refused_in_one_line(capsys, argv, "--data", "core:num_channels")
    assert main([*argv, "--channel", "1", "--json"]) == 0
    assert len(_json(capsys)["rows"]) == 4
    refused_in_one_line(capsys, [*argv, "--channel", "-1"], "--channel")

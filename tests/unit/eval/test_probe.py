"""The linear probe: labelled windows, grouped folds, the classifier, baselines and the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import COMPONENT_DTYPES, cli_tables, random_iq

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config
from iqtrain.config.sections import DataConfig, ModelConfig
from iqtrain.data.synth import synthesize
from iqtrain.errors import ConfigError, DataError
from iqtrain.eval.probe import (
    assign_folds,
    cross_validate,
    labelled_windows,
    probe_features,
    probe_model,
    random_init_model,
)
from iqtrain.model.transformer import NextPatchModel
from iqtrain.train.attempt import run_pretraining_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

W = 64  # window of the tiny attempt below: patch_len 8 x seq_patches 8


def write_annotated(directory, name, iq, datatype, annotations, captures=(0,)) -> Path:
    """A SigMF recording with ``annotations``: ``(start, count or None, label or None)``."""
    from sigmf import SigMFFile

    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{name}.sigmf-data"
    np.ascontiguousarray(iq, dtype=COMPONENT_DTYPES[datatype]).tofile(data_path)
    meta = SigMFFile(data_file=data_path, global_info={"core:datatype": datatype})
    for start in captures:
        meta.add_capture(start)
    for start, count, label in annotations:
        meta.add_annotation(start, count, metadata={"core:label": label} if label else {})
    meta.tofile(directory / f"{name}.sigmf-meta")
    return directory / f"{name}.sigmf-meta"


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


# --------------------------------------------------------------------------- folds, classifier


def test_grouped_folds_never_split_an_annotation_and_are_deterministic():
    rng = np.random.default_rng(4)
    groups = np.repeat(np.arange(23), rng.integers(1, 9, size=23))
    labels = (groups % 3).astype(np.int64)
    folds = assign_folds(labels, groups, 5, seed=7)
    for g in np.unique(groups):
        assert np.unique(folds[groups == g]).size == 1
    per_fold = np.bincount([folds[groups == g][0] for g in np.unique(groups)])
    assert per_fold.tolist() == [5, 5, 5, 4, 4]  # dealt round-robin over annotations
    np.testing.assert_array_equal(folds, assign_folds(labels, groups, 5, seed=7))
    with pytest.raises(ConfigError, match="--folds: 24 folds need at least 24"):
        assign_folds(labels, groups, 24, seed=7, key="--folds")
    with pytest.raises(ConfigError, match="folds: must be an integer >= 2"):
        assign_folds(labels, groups, 1, seed=7)


def _blobs(n_per: int, classes: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    centres = 6.0 * torch.randn(classes, dim, generator=g)
    labels = np.repeat(np.arange(classes), n_per)
    x = centres[torch.from_numpy(labels)] + torch.randn(len(labels), dim, generator=g)
    groups = np.arange(len(labels)) // 5  # annotations of 5 windows, one class each
    return x.float(), labels, groups


def test_logistic_regression_separates_separable_data_and_not_shuffled_labels():
    x, labels, groups = _blobs(60, 3, 8, seed=0)
    sep = cross_validate(x, labels, groups, 5, seed=0, classes=["a", "b", "c"])
    assert sep.accuracy > 0.99
    assert set(sep.per_class) == {"a", "b", "c"}
    assert np.sum(sep.confusion) == len(labels)
    # Whole annotations shuffled, so labels stay constant within a group: nothing to learn.
    perm = np.random.default_rng(0).permutation(len(labels) // 5)
    shuffled = labels.reshape(-1, 5)[perm].reshape(-1)
    noise = cross_validate(x, shuffled, groups, 5, seed=0)
    assert noise.accuracy < 0.55  # chance is 1/3
    again = cross_validate(x, shuffled, groups, 5, seed=0)
    assert again == noise


# --------------------------------------------------------------------------- models


def test_hidden_states_feed_the_head():
    cfg = ModelConfig(patch_len=4, max_patches=8, dim=16, layers=1, heads=2)
    model = random_init_model(cfg, 0).eval()
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(model(x), model.head(model.hidden_states(x)), rtol=0, atol=0)
    assert model.hidden_states(x).shape == (3, 8, 16)


def test_random_init_is_trainings_step_0_and_leaves_the_global_rng_alone():
    cfg = ModelConfig(patch_len=4, max_patches=8, dim=16, layers=2, heads=2)
    torch.manual_seed(11)
    expected = NextPatchModel(cfg).state_dict()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    got = random_init_model(cfg, 11).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    assert got.keys() == expected.keys()
    for k in got:
        assert torch.equal(got[k], expected[k]), k


def test_features_and_scores_are_deterministic_and_rng_free(tmp_path):
    synthesize(tmp_path, recordings=2, samples=16384, datatype="ci8", seed=5)
    data = DataConfig(patch_len=8, seq_patches=8)
    ls = labelled_windows(os.fspath(tmp_path / "*.sigmf-meta"), data.window)
    model = random_init_model(ModelConfig(patch_len=8, max_patches=8, dim=16, layers=1), 0)
    model.train()
    before = torch.get_rng_state()
    feats = probe_features(model, ls, data, batch_size=7)
    assert model.training and feats.shape == (len(ls), 16) and feats.dtype == torch.float32
    torch.testing.assert_close(probe_features(model, ls, data, batch_size=7), feats, rtol=0, atol=0)
    one = probe_model(model, ls, data, 3, seed=1)
    assert one == probe_model(model, ls, data, 3, seed=1)
    assert torch.equal(torch.get_rng_state(), before)


def test_a_window_with_non_finite_features_is_a_data_error_naming_the_recording(tmp_path):
    synthesize(tmp_path, recordings=2, samples=16384, datatype="ci8", seed=5)
    data = DataConfig(patch_len=8, seq_patches=8)
    ls = labelled_windows(os.fspath(tmp_path / "*.sigmf-meta"), data.window)
    model = random_init_model(ModelConfig(patch_len=8, max_patches=8, dim=16, layers=1), 0)
    real = model.layer_states

    def one_nan_row(patches):  # as a NaN sample in the recording would make it
        states = real(patches)
        states[-1] = states[-1].clone()
        states[-1][0, 0, 0] = float("nan")
        return states

    model.layer_states = one_nan_row
    with pytest.raises(DataError, match=r"synth_0000.sigmf-data: the window at sample \d+"):
        probe_features(model, ls, data, batch_size=len(ls))


# --------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def attempt(tmp_path_factory):
    """A tiny trained attempt (3 steps) and labelled probe data from another synth seed."""
    root = tmp_path_factory.mktemp("probe")
    tables = cli_tables(root / "run", root / "cache")
    tables["run"]["seed"] = 3
    result = run_pretraining_attempt(build_config(tables))
    synthesize(root / "labelled", recordings=2, samples=16384, datatype="ci16_le", seed=9)
    return result.attempt, os.fspath(root / "labelled" / "*.sigmf-meta")


def test_probe_command_end_to_end_json(attempt, capsys):
    path, data = attempt
    assert main(["probe", os.fspath(path), "--data", data, "--folds", "3", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "pretrained" in out[2] and "random-init" in out[2]
    doc = json.loads(out[-1])
    assert doc["checkpoint"] == "step_00000003" and doc["step"] == 3 and doc["folds"] == 3
    assert doc["windows"] > 0 and doc["annotations"] >= 3 and len(doc["classes"]) >= 2
    for key in ("pretrained", "random_init"):
        assert 0.0 <= doc[key]["accuracy"] <= 1.0
        assert set(doc[key]["per_class"]) == set(doc["classes"])
        assert np.sum(doc[key]["confusion"]) == doc["windows"]
    assert 0.0 < doc["chance"] <= 1.0
    assert main(["probe", os.fspath(path), "--data", data, "--from", "step_2", "--folds", "2"]) == 0
    assert "step_00000002 (step 2)" in capsys.readouterr().out


def _refused(capsys, argv, *names):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iqtrain: error: "), err
    for name in names:
        assert name in err[0], err[0]


def test_probe_command_refusals_are_one_line_exit_2(attempt, tmp_path, capsys):
    path, data = attempt
    a = os.fspath(path)
    _refused(capsys, ["probe", a, "--data", os.fspath(tmp_path / "none*.sigmf-meta")], "none*")
    bad = tmp_path / "bad.sigmf-meta"
    bad.write_text("{not json")
    _refused(capsys, ["probe", a, "--data", os.fspath(bad)], os.fspath(bad))
    _refused(capsys, ["probe", a, "--data", data, "--from", "step_999"], "step_00000999")
    _refused(capsys, ["probe", a, "--data", data, "--from", "newest"], "--from")
    _refused(capsys, ["probe", a, "--data", data, "--folds", "500"], "--folds")
    _refused(capsys, ["probe", a, "--data", data, "--folds", "1"], "--folds")
    one = write_annotated(
        tmp_path, "one", random_iq(np.random.default_rng(0), 512, "ci8"), "ci8", [(0, 512, "x")]
    )
    _refused(capsys, ["probe", a, "--data", os.fspath(one)], "one.sigmf-meta", "2 classes")
    _refused(capsys, ["probe", os.fspath(tmp_path), "--data", data], os.fspath(tmp_path))


def test_probe_by_snr_per_layer_and_classical_in_table_and_json(attempt, capsys):
    path, data = attempt
    argv = ["probe", os.fspath(path), "--data", data, "--folds", "3", "--json"]
    assert main([*argv, "--by", "iqtrain:snr_db", "--bins", "10", "--layer", "all"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "classical" in out[2] and "pretrained" in out[2]
    assert any(line.startswith("accuracy by iqtrain:snr_db") for line in out)
    doc = json.loads(out[-1])
    assert set(doc["classical"]) >= {"accuracy", "per_class"}
    assert 0.0 <= doc["classical"]["accuracy"] <= 1.0
    assert set(doc["classical"]["per_class"]) == set(doc["classes"])
    by = doc["by"]
    assert by["key"] == "iqtrain:snr_db" and by["outside"] == 0
    assert sum(b["windows"] for b in by["bins"]) == doc["windows"]
    for lo_bin, hi_bin in zip(by["bins"], by["bins"][1:], strict=False):
        assert lo_bin["hi"] == hi_bin["lo"] and hi_bin["hi"] - hi_bin["lo"] == 10
    assert all(b["lo"] % 10 == 0 for b in by["bins"])
    # per-bin accuracies pool back to the overall accuracy, for every model
    for key in ("pretrained", "random_init", "classical"):
        pooled = sum(b[key] * b["windows"] for b in by["bins"]) / doc["windows"]
        assert pooled == pytest.approx(doc[key]["accuracy"], abs=1e-9)
    # every layer of the 1-block model: 0 (embeddings) and 1 (final, the default)
    assert [r["layer"] for r in doc["by_layer"]] == [0, 1] and doc["layer"] == 1
    assert doc["by_layer"][1]["pretrained"] == doc["pretrained"]["accuracy"]
    assert main([*argv, "--layer", "0"]) == 0
    doc0 = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc0["layer"] == 0 and doc0["pretrained"]["accuracy"] == doc["by_layer"][0]["pretrained"]
    assert "by" not in doc0 and "by_layer" not in doc0


def test_layer_states_number_embeddings_blocks_and_the_final_norm():
    torch.manual_seed(0)
    model = NextPatchModel(ModelConfig(dim=16, layers=3, heads=2, patch_len=4, max_patches=8))
    x = torch.randn(2, 5, 8)
    states = model.layer_states(x)
    assert len(states) == 4
    torch.testing.assert_close(states[0], model.patch_embed(x), rtol=0, atol=0)
    torch.testing.assert_close(states[-1], model.hidden_states(x), rtol=0, atol=0)
    cos, sin = model.rope_cos[:5], model.rope_sin[:5]
    torch.testing.assert_close(states[1], model.blocks[0](states[0], cos, sin), rtol=0, atol=0)


def test_bins_cover_the_values_and_refuse_empty_bins():
    from iqtrain.eval.probe import bin_edges, bin_index, check_bins, parse_bins

    values = np.array([-3.0, 0.0, 4.99, 5.0, 12.5])
    edges = bin_edges(values, 5.0)
    assert edges == [-5.0, 0.0, 5.0, 10.0, 15.0]
    assert bin_index(values, edges).tolist() == [0, 1, 1, 2, 3]
    assert bin_index(np.array([15.0, 15.1, -5.1]), edges).tolist() == [3, -1, -1]  # last closed
    assert parse_bins("-10, 0,10") == [-10.0, 0.0, 10.0] and parse_bins(None) == 5.0
    with pytest.raises(ConfigError, match=r"--bins: the bin \[5, 10\) of snr holds no window"):
        check_bins(np.array([0.0, 12.0]), [0.0, 5.0, 10.0, 15.0], "snr", "--bins")
    for bad, match in (("x", "width"), ("0", "> 0"), ("3,1", "increasing"), ("nan", "finite")):
        with pytest.raises(ConfigError, match=match):
            parse_bins(bad)
    # a width far too small is refused at once (it would never end), as is an overflowing one
    for width in (1e-300, 1e-7):
        with pytest.raises(ConfigError, match=r"--bins: a width of .* more than 1000 bins"):
            bin_edges(np.array([-20.0, 18.0]), width)
    with pytest.raises(ConfigError, match="more than 1000 bins"):
        bin_edges(np.array([-1e308, 1e308]), 1e-308)
    # a value on a multiple of a width that is not exact in binary opens its bin
    tenths = np.array([0.0, 0.3, 0.7])
    edges = bin_edges(tenths, 0.1)
    assert len(edges) == 9  # bins [0, 0.1) ... [0.7, 0.8)
    assert bin_index(tenths, edges, 0.1).tolist() == [0, 3, 7]


def test_by_key_refusals_are_one_line_exit_2(attempt, tmp_path, capsys):
    path, data = attempt
    a = [["probe", os.fspath(path), "--data", data, "--folds", "3"]][0]
    _refused(capsys, [*a, "--by", "torchsig:snr_db"], "--by torchsig:snr_db", "no labelled")
    _refused(capsys, [*a, "--by", "core:label"], "--by core:label", "not a finite number")
    _refused(capsys, [*a, "--by", "iqtrain:snr_db", "--bins", "100,200"], "--bins", "no window")
    _refused(capsys, [*a, "--bins", "5"], "--bins", "--by")
    _refused(capsys, [*a, "--layer", "2"], "--layer", "[0, 1]")
    _refused(capsys, [*a, "--layer", "last"], "--layer")
    for lenient in (" 1", "01", "+1", "-0", "1.0", "\u0661"):  # int() would take most of these
        _refused(capsys, [*a, "--layer", lenient], "--layer")
    # an annotation without the key, beside others with it: named
    rng = np.random.default_rng(0)
    rec = write_annotated(
        tmp_path, "mixed", random_iq(rng, 1024, "ci8"), "ci8", [(0, 256, "a"), (256, 256, "b")]
    )
    meta = json.loads(rec.read_text())
    meta["annotations"][0]["iqtrain:snr_db"] = 3.0
    meta["annotations"][1]["huge"] = 10**400  # a JSON integer no float holds
    meta["annotations"][0]["huge"] = 1.0
    rec.write_text(json.dumps(meta))
    _refused(
        capsys,
        ["probe", os.fspath(path), "--data", os.fspath(rec), "--folds", "2", "--by", "huge"],
        "mixed.sigmf-meta: annotations[1] is 1000",
    )
    _refused(
        capsys,
        [
            "probe",
            os.fspath(path),
            "--data",
            os.fspath(rec),
            "--folds",
            "2",
            "--by",
            "iqtrain:snr_db",
        ],
        "mixed.sigmf-meta: annotations[1] has none",
    )

"""The linear probe: labelled windows, grouped folds, the classifier, baselines and the CLI.

The CPU tests see that the random-init baseline reseeds no CUDA generator only by replacing
``torch.cuda.manual_seed_all``; that a real CUDA generator's state survives the baseline is the
``gpu_smoke`` test below.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import (
    cli_tables,
    random_iq,
    refused_in_one_line,
    set_sample_rate,
    write_annotated,
    write_bursts,
)

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config
from iqtrain.config.sections import DataConfig, ModelConfig
from iqtrain.data.synth import synthesize
from iqtrain.data.windows import labelled_windows
from iqtrain.errors import ConfigError, DataError
from iqtrain.eval.features import probe_features
from iqtrain.eval.folds import assign_folds, cross_validate
from iqtrain.eval.probe import probe_model, run_probe
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import random_init_model
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

W = 64  # window of the tiny attempt below: patch_len 8 x seq_patches 8


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
    expected = IQTransformer(cfg).state_dict()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    got = random_init_model(cfg, 11).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    assert got.keys() == expected.keys()
    for k in got:
        assert torch.equal(got[k], expected[k]), k


def test_random_init_reseeds_no_cuda_generator(monkeypatch):
    """The baseline is built lazily, at a process's first probe: a resumed process probes first
    at another step than the straight run did, so reseeding the CUDA generator (dropout's) there
    would part the two runs."""
    cfg = ModelConfig(patch_len=4, max_patches=8, dim=16, layers=2, heads=2)
    torch.manual_seed(11)
    expected = IQTransformer(cfg).state_dict()

    def reseed(*args):
        raise AssertionError("random_init_model reseeded the CUDA generators")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseed)
    monkeypatch.setattr(torch.cuda, "manual_seed", reseed)
    before = torch.get_rng_state()
    got = random_init_model(cfg, 11).state_dict()
    assert torch.equal(torch.get_rng_state(), before)
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


@pytest.mark.gpu
@pytest.mark.gpu_smoke
def test_random_init_leaves_the_cuda_generator_as_it_was():
    cfg = ModelConfig(patch_len=4, max_patches=8, dim=16, layers=2, heads=2)
    torch.cuda.manual_seed_all(1)
    before = torch.cuda.get_rng_state_all()
    random_init_model(cfg, 11)
    after = torch.cuda.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    torch.cuda.manual_seed_all(1)
    want = torch.rand(4, device="cuda")
    torch.cuda.manual_seed_all(1)
    random_init_model(cfg, 11)
    assert torch.equal(torch.rand(4, device="cuda"), want)  # the same draws follow


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
    result = run_attempt(build_config(tables))
    synthesize(root / "labelled", recordings=2, samples=16384, datatype="ci16_le", seed=9)
    return result.attempt, os.fspath(root / "labelled" / "*.sigmf-meta")


def test_probe_command_end_to_end_json(attempt, capsys):
    path, data = attempt
    assert main(["probe", os.fspath(path), "--data", data, "--folds", "3", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "pretrained" in out[3] and "random-init" in out[3]
    doc = json.loads(out[-1])
    assert doc["checkpoint"] == "step_00000003" and doc["step"] == 3 and doc["folds"] == 3
    assert doc["windows"] > 0 and doc["annotations"] >= 3 and len(doc["classes"]) >= 2
    for key in ("pretrained", "random_init", "classical", "combined"):
        assert 0.0 <= doc[key]["accuracy"] <= 1.0
        assert set(doc[key]["per_class"]) == set(doc["classes"])
        assert set(doc[key]["per_class_se"]) == set(doc["classes"])
        se = doc[key]["accuracy_se"]
        assert se >= 0.0 and (se > 0.0) == (0.0 < doc[key]["accuracy"] < 1.0)
        assert np.sum(doc[key]["confusion"]) == doc["windows"]
    assert 0.0 < doc["chance"] <= 1.0
    assert main(["probe", os.fspath(path), "--data", data, "--from", "step_2", "--folds", "2"]) == 0
    assert "step_00000002 (step 2)" in capsys.readouterr().out


def test_probe_command_refusals_are_one_line_exit_2(attempt, tmp_path, capsys):
    path, data = attempt
    a = os.fspath(path)
    refused_in_one_line(
        capsys, ["probe", a, "--data", os.fspath(tmp_path / "none*.sigmf-meta")], "none*"
    )
    bad = tmp_path / "bad.sigmf-meta"
    bad.write_text("{not json")
    refused_in_one_line(capsys, ["probe", a, "--data", os.fspath(bad)], os.fspath(bad))
    refused_in_one_line(capsys, ["probe", a, "--data", data, "--from", "step_999"], "step_00000999")
    refused_in_one_line(capsys, ["probe", a, "--data", data, "--from", "newest"], "--from")
    refused_in_one_line(capsys, ["probe", a, "--data", data, "--folds", "500"], "--folds")
    refused_in_one_line(capsys, ["probe", a, "--data", data, "--folds", "1"], "--folds")
    one = write_annotated(
        tmp_path, "one", random_iq(np.random.default_rng(0), 512, "ci8"), "ci8", [(0, 512, "x")]
    )
    refused_in_one_line(
        capsys, ["probe", a, "--data", os.fspath(one)], "one.sigmf-meta", "2 classes"
    )
    refused_in_one_line(capsys, ["probe", os.fspath(tmp_path), "--data", data], os.fspath(tmp_path))


def test_probe_by_snr_per_layer_and_classical_in_table_and_json(attempt, capsys):
    path, data = attempt
    argv = ["probe", os.fspath(path), "--data", data, "--folds", "3", "--json"]
    assert main([*argv, "--by", "iqtrain:snr_db", "--bins", "10", "--layer", "all"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "classical" in out[3] and "pretrained" in out[3]
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
    for key in ("pretrained", "random_init", "classical", "combined"):
        pooled = sum(b[key] * b["windows"] for b in by["bins"] if b["windows"]) / doc["windows"]
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
    model = IQTransformer(ModelConfig(dim=16, layers=3, heads=2, patch_len=4, max_patches=8))
    x = torch.randn(2, 5, 8)
    states = model.layer_states(x)
    assert len(states) == 4
    torch.testing.assert_close(states[0], model.patch_embed(x), rtol=0, atol=0)
    torch.testing.assert_close(states[-1], model.hidden_states(x), rtol=0, atol=0)
    cos, sin = model.rope_cos[:5], model.rope_sin[:5]
    torch.testing.assert_close(states[1], model.blocks[0](states[0], cos, sin), rtol=0, atol=0)


def test_bins_cover_the_values_and_keep_empty_bins():
    from iqtrain.cli.probe import parse_bins
    from iqtrain.eval.bins import bin_edges, bin_index, check_bins

    values = np.array([-3.0, 0.0, 4.99, 5.0, 12.5])
    edges = bin_edges(values, 5.0)
    assert edges == [-5.0, 0.0, 5.0, 10.0, 15.0]
    assert bin_index(values, edges).tolist() == [0, 1, 1, 2, 3]
    assert bin_index(np.array([15.0, 15.1, -5.1]), edges).tolist() == [3, -1, -1]  # last closed
    assert parse_bins("-10, 0,10") == [-10.0, 0.0, 10.0] and parse_bins(None) == 5.0
    # a bin without windows stays a bin; only bins holding no window at all are refused
    idx = check_bins(np.array([0.0, 12.0]), [0.0, 5.0, 10.0, 15.0], "snr", "--bins")
    assert idx.tolist() == [0, 2]
    with pytest.raises(ConfigError, match=r"--bins: no window's snr lies in the bins \[20, 30\]"):
        check_bins(np.array([0.0, 12.0]), [20.0, 25.0, 30.0], "snr", "--bins")
    for bad, match in (("x", "width"), ("0", "> 0"), ("3,1", "increasing"), ("nan", "finite")):
        with pytest.raises(ConfigError, match=match):
            parse_bins(bad)
    # a width far too small is refused at once (it would never end), as is an overflowing one
    for width in (1e-300, 1e-7):
        with pytest.raises(ConfigError, match=r"^--bins: a width of .* more than 1000 bins"):
            bin_edges(np.array([-20.0, 18.0]), width, "--bins")
    with pytest.raises(ConfigError, match="more than 1000 bins"):
        bin_edges(np.array([-1e308, 1e308]), 1e-308)
    # finer than the values' float resolution: the edges could not be told apart
    with pytest.raises(ConfigError, match="^bins: a width of 1 is finer than the float"):
        bin_edges(np.array([1e20, 1e20]), 1.0)  # the library names the option, not a flag
    # a value on a multiple of a width that is not exact in binary opens its bin
    tenths = np.array([0.0, 0.3, 0.7])
    edges = bin_edges(tenths, 0.1)
    assert len(edges) == 9 and edges[3] == 0.3 and edges[7] == 0.7  # [0, 0.1) ... [0.7, 0.8)
    assert bin_index(tenths, edges, 0.1).tolist() == [0, 3, 7]


@pytest.mark.parametrize("width", [1e300, 2e10, 7.3, 3.0, 0.7, 0.1, 5.0])
def test_every_value_lies_in_the_bin_printed_for_it(width):
    """Huge widths put negative values below 0 (they were binned into [0, w)); widths that are
    not powers of two print edges a value really lies between."""
    from iqtrain.eval.bins import bin_edges, bin_index, bin_span

    values = np.concatenate([np.arange(-20.0, 18.5, 0.5), [-1.4, 2.1, -0.3, 0.7, 1e-9, -1e-9]])
    edges = bin_edges(values, width)
    idx = bin_index(values, edges, width)
    assert (idx >= 0).all()
    for v, k in zip(values, idx, strict=True):
        printed = bin_span(edges[k], edges[k + 1], closed=False)  # as the table shows it
        lo, hi = (float(x) for x in printed[1:-1].split(", "))
        assert lo <= v < hi, (v, printed)
    if width == 1e300:  # the negative values below 0, the others above
        assert edges == [-1e300, 0.0, 1e300]
        assert idx.tolist() == (values >= 0).astype(int).tolist()


def test_by_key_refusals_are_one_line_exit_2(attempt, tmp_path, capsys):
    path, data = attempt
    a = [["probe", os.fspath(path), "--data", data, "--folds", "3"]][0]
    refused_in_one_line(
        capsys, [*a, "--by", "torchsig:snr_db"], "--by torchsig:snr_db", "no labelled"
    )
    refused_in_one_line(
        capsys, [*a, "--by", "core:label"], "--by core:label", "not a finite number"
    )
    refused_in_one_line(
        capsys, [*a, "--by", "iqtrain:snr_db", "--bins", "100,200"], "--bins", "no window"
    )
    refused_in_one_line(capsys, [*a, "--bins", "1e300"], "--bins", "--by")
    refused_in_one_line(capsys, [*a, "--bins", "5"], "--bins", "--by")
    refused_in_one_line(capsys, [*a, "--layer", "2"], "--layer", "[0, 1]")
    refused_in_one_line(capsys, [*a, "--layer", "last"], "--layer")
    for lenient in (" 1", "01", "+1", "-0", "1.0", "\u0661"):  # int() would take most of these
        refused_in_one_line(capsys, [*a, "--layer", lenient], "--layer")
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
    set_sample_rate(rec)  # the rate the attempt trained at
    refused_in_one_line(
        capsys,
        ["probe", os.fspath(path), "--data", os.fspath(rec), "--folds", "2", "--by", "huge"],
        "mixed.sigmf-meta: annotations[1] is 1000",
    )
    refused_in_one_line(
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


# --------------------------------------------------------------------------- standard errors


def test_cluster_se_is_over_annotations_not_windows():
    from iqtrain.eval.folds import cluster_se

    # by hand: n = [2, 3, 1], c = [1, 3, 0], acc = 2/3, residuals -1/3, 1, -2/3, G/(G-1) = 3/2
    groups = np.array([0, 0, 1, 1, 1, 2])
    correct = np.array([1, 0, 1, 1, 1, 0], dtype=bool)
    assert cluster_se(correct, groups) == pytest.approx(np.sqrt(1.5 * 14 / 9) / 6, rel=1e-12)
    # one window per annotation: the binomial standard error sqrt(acc (1 - acc) / (G - 1))
    rng = np.random.default_rng(0)
    single = rng.random(40) < 0.3
    acc = single.mean()
    assert cluster_se(single, np.arange(40)) == pytest.approx(np.sqrt(acc * (1 - acc) / 39))
    # copies of a window inside its annotation add no information: the same standard error
    copies = np.repeat(single, 7)
    assert cluster_se(copies, np.repeat(np.arange(40), 7)) == pytest.approx(
        cluster_se(single, np.arange(40)), rel=1e-12
    )
    # fewer than two annotations: no spread to measure
    assert cluster_se(np.array([True, False]), np.array([4, 4])) is None
    assert cluster_se(np.array([], dtype=bool), np.array([])) is None


def test_scores_carry_standard_errors_per_class():
    from iqtrain.eval.folds import cluster_se, score

    labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    groups = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    predicted = np.array([0, 1, 0, 0, 1, 1, 0, 0])
    sc = score(labels, predicted, ["a", "b"], groups)
    assert sc.accuracy == 5 / 8 and sc.accuracy_se == cluster_se(labels == predicted, groups)
    assert sc.per_class == {"a": 0.75, "b": 0.5}
    assert sc.per_class_se["a"] == cluster_se(np.array([1, 0, 1, 1], bool), np.array([0, 0, 1, 1]))
    assert set(sc.to_dict()) == {
        "accuracy",
        "accuracy_se",
        "per_class",
        "per_class_se",
        "confusion",
    }


# --------------------------------------------------------------------------- batched fits


def test_batched_fits_are_the_fits_one_at_a_time_and_converge():
    from iqtrain.eval.logistic import TOL_GRAD, fit_logistic, fit_logistic_many

    g = torch.Generator().manual_seed(3)
    latent = torch.randn(90, 6, generator=g, dtype=torch.float64)
    # 40 strongly correlated features (the conditioning of a model's hidden states)
    x = latent @ torch.randn(6, 40, generator=g, dtype=torch.float64)
    x = x + 1e-3 * torch.randn(90, 40, generator=g, dtype=torch.float64)
    labels = (latent[:, 0] > 0).long().numpy() + (latent[:, 1] > 0.5).long().numpy()
    rows = [np.arange(0, 60), np.arange(30, 90), np.arange(0, 90, 2)]
    many = fit_logistic_many(x, labels, rows, 3)
    for r, fit in zip(rows, many, strict=True):
        alone = fit_logistic(x[r], torch.from_numpy(labels[r]), 3)
        torch.testing.assert_close(fit.weight, alone.weight, rtol=0, atol=1e-6)
        assert torch.equal(fit.predict(x), alone.predict(x))
        # the gradient of the objective at the fit: at the optimum
        w = fit.weight.clone().requires_grad_(True)
        b = fit.bias.clone().requires_grad_(True)
        z = (x[r] - fit.mean) / fit.std
        y = torch.from_numpy(labels[r])
        loss = F.cross_entropy(z @ w + b, y) + 0.5e-3 * w.square().sum()
        loss.backward()
        assert max(w.grad.abs().max(), b.grad.abs().max()) <= 10 * TOL_GRAD
        # the bias stays in the softmax's invariant subspace: its classes sum to zero
        assert float(b.detach().sum()) == pytest.approx(0.0, abs=1e-9)


# --------------------------------------------------------------------------- few-shot draws


def _plan(per_class=7, classes=3, windows=3, folds=3, seed=5):
    from iqtrain.eval.folds import FoldPlan

    groups = np.repeat(np.arange(per_class * classes), windows)
    labels = groups % classes
    return FoldPlan.build(labels, groups, folds, seed, [f"c{i}" for i in range(classes)])


def test_few_shot_draws_come_from_the_training_folds_and_only_from_their_seed():
    plan = _plan()
    torch_state, np_state = torch.get_rng_state(), np.random.get_state()
    for k in (1, 3):
        for s in range(3):
            rows = plan.draw(k, s)
            assert len(rows) == plan.folds
            for f, r in enumerate(rows):
                drawn = np.unique(plan.groups[r])
                assert (plan.fold_of[r] != f).all()  # never the held-out fold
                assert np.bincount(plan.labels[r], minlength=3).tolist() == [3 * k] * 3
                # whole annotations: every window of a drawn annotation
                assert np.isin(plan.groups, drawn).sum() == len(r)
            again = plan.draw(k, s)
            assert all(np.array_equal(a, b) for a, b in zip(rows, again, strict=True))
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert all(np.array_equal(a, b) for a, b in zip(np.random.get_state(), np_state, strict=True))
    draws = [plan.draw(2, s) for s in range(4)]
    assert len({tuple(np.concatenate(d)) for d in draws}) > 1  # the seeds draw differently
    other = _plan(seed=6).draw(2, 0)  # another run.seed: its own folds and draws
    assert not all(np.array_equal(a, b) for a, b in zip(other, draws[0], strict=True))


def test_few_shot_scores_pool_the_folds_per_draw():
    plan = _plan(per_class=6, classes=2, windows=4, folds=2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(len(plan.labels), 5, generator=g) + 2.0 * torch.from_numpy(plan.labels)[:, None]
    shots = plan.shots({"pretrained": x}, [3, 1], seeds=3)
    assert [e["k"] for e in shots] == [1, 3] and all(e["seeds"] == 3 for e in shots)
    for e in shots:
        m = e["pretrained"]
        assert len(m["draws"]) == 3 and m["mean"] == pytest.approx(np.mean(m["draws"]))
        assert m["std"] == pytest.approx(np.std(m["draws"], ddof=1))
        assert 0 <= m["se"] < 0.5 and (m["se"] > 0) == (min(m["draws"]) < 1)
    assert shots[1]["pretrained"]["mean"] > 0.9  # separable classes, 3 examples each
    one = plan.shots({"pretrained": x}, [1], seeds=1)[0]["pretrained"]
    assert one["std"] is None and one["draws"] == shots[0]["pretrained"]["draws"][:1]
    with pytest.raises(ConfigError, match=r"^shots: K = 4 .* class c0 has only 3 training"):
        plan.check_shots([1, 4])  # the library names the option, the command its flag
    plan.check_shots([3])


@pytest.mark.parametrize(
    ("text", "seeds", "match"),
    [
        ("0", None, "--shots: expected"),
        ("1,x", None, "--shots: expected"),
        ("-1", None, "--shots: expected"),
        ("1.5", None, "--shots: expected"),
        ("01", None, "--shots: expected"),
        ("5,5", None, "--shots: each K once"),
        ("5", 0, "--seeds: must be an integer >= 1"),
        (None, 3, "--seeds: needs --shots"),
    ],
)
def test_bad_shots_and_seeds_arerefused_in_one_line(text, seeds, match):
    from iqtrain.cli.probe import parse_shots

    with pytest.raises(ConfigError, match=match):
        parse_shots(text, seeds)


# --------------------------------------------------------------------------- few-shot command


@pytest.fixture(scope="module")
def bursts(tmp_path_factory):
    """A labelled set with 6 annotations of 2 windows per class, and one on a sparse SNR grid
    (-20, -10, 0, 10, 18: RadioML's kind of grid), each SNR in both classes."""
    root = tmp_path_factory.mktemp("bursts")
    set_sample_rate(write_bursts(root / "six", "six", ["a", "b"] * 6, W))
    snrs = [{"snr": float(v)} for v in (-20, -20, -10, -10, 0, 0, 10, 10, 18, 18)]
    set_sample_rate(write_bursts(root / "grid", "grid", ["a", "b"] * 5, W, fields=snrs, seed=1))
    return os.fspath(root / "six" / "*.sigmf-meta"), os.fspath(root / "grid" / "*.sigmf-meta")


def test_probe_shots_table_and_json(attempt, bursts, capsys):
    path, _ = attempt
    argv = ["probe", os.fspath(path), "--data", bursts[0], "--folds", "3"]
    assert main([*argv, "--shots", "3,1", "--seeds", "2", "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out[-1])
    assert [e["k"] for e in doc["shots"]] == [1, 3]
    for e in doc["shots"]:
        assert e["seeds"] == 2
        assert set(e) == {"k", "seeds", "pretrained", "random_init", "classical", "combined"}
        for name in ("pretrained", "random_init", "classical", "combined"):
            m = e[name]
            assert set(m) == {"mean", "std", "se", "draws"} and len(m["draws"]) == 2
            assert m["mean"] == pytest.approx(sum(m["draws"]) / 2)
            assert m["std"] == pytest.approx(abs(m["draws"][0] - m["draws"][1]) / np.sqrt(2))
    table = out[: out.index(next(line for line in out if line.startswith("confusion")))]
    shot_rows = [line.split() for line in table if line.split()[:1] in (["1"], ["3"])]
    assert len(shot_rows) == 2 and all(row.count("±") == 4 for row in shot_rows)
    # every accuracy printed carries its standard error
    accuracy = next(line for line in out if line.startswith("accuracy  "))
    assert accuracy.count("±") == 4
    # the same draws again: the same numbers (local generators, deterministic fits)
    assert main([*argv, "--shots", "1,3", "--seeds", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shots"] == doc["shots"]
    assert main([*argv]) == 0
    assert "K labelled" not in capsys.readouterr().out


def test_too_many_shots_is_refused_before_any_feature(attempt, bursts, capsys, monkeypatch):
    import iqtrain.eval.probe as probe

    def never(*args, **kwargs):
        raise AssertionError("features were computed")

    monkeypatch.setattr(probe, "layer_features", never)
    monkeypatch.setattr(probe, "classical_matrix", never)
    path, _ = attempt
    argv = ["probe", os.fspath(path), "--data", bursts[0], "--folds", "3"]
    # 6 annotations per class in 3 folds: 4 of each class train when its fold is held out
    refused_in_one_line(capsys, [*argv, "--shots", "1,5"], "--shots", "class a has only 4 training")
    refused_in_one_line(capsys, [*argv, "--shots", "0"], "--shots")
    refused_in_one_line(capsys, [*argv, "--shots", "2,2"], "--shots", "each K once")
    refused_in_one_line(capsys, [*argv, "--seeds", "3"], "--seeds", "--shots")
    refused_in_one_line(capsys, [*argv, "--shots", "2", "--seeds", "0"], "--seeds")


def test_a_sparse_snr_grid_shows_its_empty_bins(attempt, bursts, capsys):
    path, _ = attempt
    argv = ["probe", os.fspath(path), "--data", bursts[1], "--folds", "2", "--json"]
    assert main([*argv, "--by", "snr"]) == 0  # default 5 dB bins: [-15, -10) holds no window
    out = capsys.readouterr().out.strip().splitlines()
    by = json.loads(out[-1])["by"]
    assert by["width"] == 5.0 and by["outside"] == 0
    assert [b["lo"] for b in by["bins"]] == [-20.0, -15.0, -10.0, -5.0, 0.0, 5.0, 10.0, 15.0]
    assert [b["windows"] for b in by["bins"]] == [4, 0, 4, 0, 4, 0, 4, 4]
    for b in by["bins"]:
        for name in ("pretrained", "random_init", "classical", "combined"):
            assert (b[name] is None) == (b["windows"] == 0)
            assert (b[f"{name}_se"] is None) == (b["windows"] == 0)
    row = next(line for line in out if line.strip().startswith("[-15, -10)"))
    assert row.split() == ["[-15,", "-10)", "0", "-", "-", "-", "-"]
    assert next(line for line in out if line.strip().startswith("[-20, -15)")).count("±") == 4
    # a huge width: the negative SNRs in [-1e300, 0), the others in [0, 1e300)
    assert main([*argv, "--by", "snr", "--bins", "1e300"]) == 0
    bins = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by"]["bins"]
    assert [(b["lo"], b["hi"], b["windows"]) for b in bins] == [(-1e300, 0.0, 8), (0.0, 1e300, 12)]
    # explicit edges none of the values reach: refused, one line
    refused_in_one_line(capsys, [*argv, "--by", "snr", "--bins", "30,40"], "--bins", "no window")


# --------------------------------------------------------------------------- real recordings in


def _nest_labels(meta, key="signal:detail"):
    """Move every annotation's core:label of ``meta`` under ``key`` as ``mod_class``."""
    doc = json.loads(meta.read_text())
    for ann in doc["annotations"]:
        ann[key] = {"mod_class": ann.pop("core:label")}
    meta.write_text(json.dumps(doc))
    return meta


def test_probe_reads_the_models_sample_rate_label_paths_and_names_its_flags(
    attempt, tmp_path, capsys
):
    path, _ = attempt
    a = ["probe", os.fspath(path), "--folds", "2"]
    fast = os.fspath(set_sample_rate(write_bursts(tmp_path / "f", "f", ["a", "b"] * 2, W), 2e6))
    refused_in_one_line(capsys, [*a, "--data", fast], "--data", "1 MHz", "2 MHz", "--any-rate")
    assert main([*a, "--data", fast, "--any-rate"]) == 0
    with pytest.raises(DataError, match="trained at 1 MHz, but .*any_rate reads them anyway"):
        run_probe(path, fast, folds=2)
    assert run_probe(path, fast, folds=2, any_rate=True).windows == 8
    nested = _nest_labels(set_sample_rate(write_bursts(tmp_path / "n", "n", ["a", "b"] * 2, W)))
    line = refused_in_one_line(capsys, [*a, "--data", os.fspath(nested)], "--data", "--label-key")
    assert "no labelled window" in line and "core:label" in line
    capsys.readouterr()
    assert main([*a, "--data", os.fspath(nested), "--label-key", "signal:detail.mod_class"]) == 0
    assert "4 annotations, 2 classes" in capsys.readouterr().out
    refused_in_one_line(capsys, [*a, "--data", fast, "--label-key", ""], "--label-key")
    refused_in_one_line(capsys, [*a, "--data", fast, "--channel", "-2"], "--channel")


def test_probe_notes_what_it_reads_past_and_prints_classes_apart(attempt, tmp_path, capsys):
    path, _ = attempt
    d = tmp_path / "d"
    labels = [" a", "a"] * 2 + [" ", "a"]  # " a" and "a" are two classes; " " is no label
    set_sample_rate(write_bursts(d, "labelled", labels, W))
    set_sample_rate(
        write_annotated(d, "plain", random_iq(np.random.default_rng(1), 256, "ci8"), "ci8", [])
    )
    set_sample_rate(
        write_annotated(d, "short", random_iq(np.random.default_rng(2), 40, "ci8"), "ci8", [])
    )
    (d / "broken.sigmf-meta").write_text("{")
    argv = ["probe", os.fspath(path), "--data", os.fspath(d / "*.sigmf-meta"), "--folds", "2"]
    refused_in_one_line(capsys, argv, "--data", "broken.sigmf-meta", "--skip-invalid")
    assert main([*argv, "--skip-invalid"]) == 0
    cap = capsys.readouterr()
    assert "--data: 1 input(s) cannot be read and are skipped (--skip-invalid)" in cap.err
    assert "--data: 1 recording(s) yield no window of 64 samples (too short" in cap.err
    assert "short.sigmf-meta" in cap.err and "plain.sigmf-meta" in cap.err
    assert "yield no window of 64 samples inside an annotation with a core:label" in cap.err
    assert "--data: 1 annotation(s) with an empty core:label are read as unlabelled" in cap.err
    rows = [line.split() for line in cap.out.splitlines()]
    assert next(r for r in rows if r[:1] == ["'"])[:2] == ["'", "a'"]  # " a", quoted
    header = next(i for i, r in enumerate(rows) if r[:1] == ["confusion"]) + 1
    assert rows[header] == ["'", "a'", "a"]

"""The next-patch objectives ("mse", "categorical"): quantisation, the categorical loss, the
predicted mean, the head they size."""

from __future__ import annotations

import math

import pytest
import torch

from iqtrain.config.sections import ModelConfig
from iqtrain.errors import ConfigError
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives.categorical import bin_centres, predicted_mean, quantise
from iqtrain.objectives.next_patch import next_patch_loss

TINY = {"dim": 16, "layers": 1, "heads": 2, "patch_len": 4, "max_patches": 8}


def objective_loss(out, patches, cfg: ModelConfig, squared_error: bool = True):
    """The config's objective's loss with the predicted mean's squared error."""
    return cfg.task.loss(out, patches, None, cfg, squared_error)


def categorical(bins: int = 8, bin_range: float = 2.0, **kw) -> ModelConfig:
    return ModelConfig(**{**TINY, **kw}, objective="categorical", bins=bins, bin_range=bin_range)


def test_quantise_is_floor_of_the_equal_grid_with_edge_bins_for_outliers():
    cfg = categorical(bins=8, bin_range=2.0)  # width 0.5: [-2,-1.5) -> 0 ... [1.5, 2] -> 7
    v = torch.tensor([-2.0, -1.99, -1.5, -0.01, 0.0, 0.49, 0.5, 1.99, 2.0, 7.0, -9.0])
    assert quantise(v, cfg).tolist() == [0, 0, 1, 3, 4, 4, 5, 7, 7, 7, 0]
    centres = bin_centres(cfg)
    assert centres.tolist() == [-1.75, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25, 1.75]
    assert quantise(centres, cfg).tolist() == list(range(8))  # each centre is in its own bin


def test_uniform_logits_cost_log_bins_per_value_and_predict_zero():
    cfg = categorical(bins=16)
    patches = torch.randn(3, 5, 8)
    out = torch.zeros(3, 5, 8 * 16)
    mean, total, count, se = objective_loss(out, patches, cfg)
    assert count == 3 * 4 * 4  # complex target samples, as for "mse"
    # nats per complex sample: two values, each ln(16)
    assert mean.item() == pytest.approx(2 * math.log(16), rel=1e-6)
    assert total.item() == pytest.approx(mean.item() * count, rel=1e-6)
    assert predicted_mean(out, cfg).abs().max().item() < 1e-6  # symmetric centres
    # the NMSE of a zero prediction: the targets' energy per complex sample
    assert se.item() == pytest.approx(patches[:, 1:].square().sum().item(), rel=1e-5)


def test_a_confident_correct_head_costs_nearly_nothing_and_predicts_the_bin_centre():
    cfg = categorical(bins=8, bin_range=2.0)
    centres = bin_centres(cfg)
    idx = torch.randint(0, 8, (2, 4, 8))
    patches = centres[idx]
    logits = torch.full((2, 4, 8, 8), -30.0)
    # output t predicts patch t+1: put patch t+1's bins at position t
    logits[:, :-1].scatter_(-1, idx[:, 1:, :, None], 30.0)
    out = logits.reshape(2, 4, 64)
    mean, _, _, se = objective_loss(out, patches, cfg)
    assert mean.item() < 1e-20
    assert se.item() < 1e-10
    torch.testing.assert_close(predicted_mean(out, cfg)[:, :-1], patches[:, 1:])


def test_squared_error_is_that_of_the_predicted_mean():
    cfg = categorical(bins=8)
    patches = torch.randn(2, 6, 8)
    out = torch.randn(2, 6, 64)
    _, _, _, se = objective_loss(out, patches, cfg)
    _, want, _ = next_patch_loss(predicted_mean(out, cfg), patches)
    assert se.item() == pytest.approx(want.item(), rel=1e-6)


def test_mse_objective_is_the_nmse_and_its_squared_error():
    cfg = ModelConfig(**TINY)
    patches, out = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    mean, total, count, se = objective_loss(out, patches, cfg)
    assert (mean, total, count) == next_patch_loss(out, patches)
    assert se is total


def test_the_loss_is_fp32_under_autocast():
    cfg = categorical(bins=8)
    patches = torch.randn(2, 6, 8).bfloat16()
    out = torch.randn(2, 6, 64).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mean, total, _, se = objective_loss(out, patches, cfg)
    assert mean.dtype == total.dtype == se.dtype == torch.float32


def test_wrong_output_width_is_named():
    cfg = categorical(bins=8)
    with pytest.raises(ValueError, match=r"2P x 8"):
        objective_loss(torch.zeros(2, 6, 8), torch.zeros(2, 6, 8), cfg)


def test_model_head_and_flops_follow_the_objective():
    mse = IQTransformer(ModelConfig(**TINY))
    cat = IQTransformer(categorical(bins=32))
    x = torch.randn(2, 6, 8)
    assert mse(x).shape == (2, 6, 8) and cat(x).shape == (2, 6, 8 * 32)
    w, d = 8, 16
    extra = 2 * w * d * (32 - 1)  # the head's extra 2 * d * w * (bins - 1)
    assert cat.forward_flops_per_patch(6) - mse.forward_flops_per_patch(6) == extra


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("objective", "gmm", "model.objective"),
        ("objective", 1, "model.objective"),
        ("bins", 1, "model.bins"),
        ("bins", 5000, "model.bins"),
        ("bins", True, "model.bins"),
        ("bin_range", 0.0, "model.bin_range"),
        ("bin_range", float("inf"), "model.bin_range"),
        ("bin_range", 1e39, "model.bin_range"),  # centres would be inf / nan in fp32
        ("bin_range", 1e-9, "model.bin_range: .* narrower than 1e-6"),
    ],
)
def test_bad_objective_keys_are_named(key, value, match):
    with pytest.raises(ConfigError, match=match):
        ModelConfig(**{**TINY, key: value})


def test_categorical_training_learns_a_constellation():
    # Next values drawn from 4 points: a categorical head learns all four; its loss falls
    # well below the uniform ln(bins) per value within a few hundred steps.
    torch.manual_seed(0)
    cfg = categorical(bins=16, bin_range=2.0)
    model = IQTransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(150):
        sym = torch.randint(0, 2, (16, 6, 8), generator=g).float() * 2 - 1  # BPSK-ish values
        x = sym * 0.75
        loss, *_ = objective_loss(model(x), x, cfg)
        opt.zero_grad()
        loss.backward()
        opt.step()
    # two equiprobable values per component: the optimum is 2 ln 2 per complex sample
    assert loss.item() < 2 * math.log(2) + 0.2 < 2 * math.log(16)


def test_a_non_finite_input_gives_a_non_finite_categorical_loss():
    # The clamp of a NaN target must not hide it: the logits see the NaN too.
    torch.manual_seed(0)
    cfg = categorical(bins=8)
    model = IQTransformer(cfg)
    x = torch.randn(2, 6, 8)
    x[1, 3, 2] = float("nan")
    mean, _, _, se = objective_loss(model(x), x, cfg)
    assert not math.isfinite(mean.item()) and not math.isfinite(se.item())


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_value_in_the_last_patch_alone_still_makes_the_loss_non_finite(bad):
    # The last patch is only a target (its own output predicts nothing): no logit sees it.
    cfg = categorical(bins=8)
    x = torch.randn(2, 6, 8)
    x[0, -1, 5] = bad
    mean, *_ = objective_loss(torch.zeros(2, 6, 64), x, cfg)
    assert not math.isfinite(mean.item())

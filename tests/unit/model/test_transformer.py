"""Tests of iqtrain.model.transformer: config validation, architecture invariants and the loss.

The ``gpu`` test repeats the residual stream's dtype check under CUDA's autocast, whose
policy (which ops run in bf16) is its own: a CPU cannot run it.
"""

from __future__ import annotations

import math

import pytest
import torch

from iqtrain.config.sections import ModelConfig, default_mlp_hidden
from iqtrain.errors import ConfigError, IQTrainError
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives.next_patch import next_patch_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TINY = {"dim": 32, "layers": 2, "heads": 2, "patch_len": 8, "max_patches": 16}


def unit_power_patches(b: int, n: int, p: int, seed: int = 0) -> torch.Tensor:
    """Complex Gaussian windows scaled to unit mean power per sample, as prepare_iq_input does."""
    g = torch.Generator().manual_seed(seed)
    iq = torch.randn(b, n * p, 2, generator=g, dtype=torch.float64)
    scale = iq.square().sum(-1).mean(-1).sqrt()
    return (iq / scale[:, None, None]).reshape(b, n, 2 * p).float()


# --------------------------------------------------------------------------- config


def test_defaults_resolve_mlp_hidden() -> None:
    cfg = ModelConfig()
    # round(8/3 * 128) = 341, up to a multiple of 64 -> 384; the resolved config shows it.
    assert cfg.mlp_hidden == 384
    assert default_mlp_hidden(512) == 1408
    assert default_mlp_hidden(96) == 256
    assert ModelConfig(mlp_hidden=100).mlp_hidden == 100
    assert isinstance(ModelConfig(rope_theta=500).rope_theta, float)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"heads": 3}, "model.heads: must divide model.dim (128), got 3"),
        ({"dim": 24, "heads": 8}, "model.heads"),  # head_dim 3 is odd: no rotary pairs
        ({"dim": 0}, "model.dim"),
        ({"dim": 128.0}, "model.dim"),
        ({"layers": True}, "model.layers"),
        ({"layers": 0}, "model.layers"),
        ({"mlp_hidden": 0}, "model.mlp_hidden"),
        ({"rope_theta": 1.0}, "model.rope_theta"),
        ({"dropout": 1.0}, "model.dropout"),
        ({"dropout": -0.1}, "model.dropout"),
        ({"dropout": "0.1"}, "model.dropout"),
        ({"init_std": 0.0}, "model.init_std"),
        ({"init_std": float("nan")}, "model.init_std"),
        ({"patch_len": 0}, "model.patch_len"),
        ({"max_patches": 1}, "model.max_patches"),
    ],
)
def test_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ModelConfig(**kwargs)
    assert str(info.value).startswith(key)
    assert isinstance(info.value, IQTrainError) and isinstance(info.value, ValueError)


# --------------------------------------------------------------------------- model


def test_shapes_param_counts_and_buffers() -> None:
    cfg = ModelConfig(**TINY)
    model = IQTransformer(cfg)
    out = model(torch.randn(3, 10, 16))
    assert out.shape == (3, 10, 16)
    total, trainable = model.param_counts()
    d, h, p2 = cfg.dim, cfg.mlp_hidden, 2 * cfg.patch_len
    per_block = 4 * d * d + 3 * d * h + 2 * d  # qkv + proj, gate_up + down, two norm gains
    expected = (p2 * d + d) + cfg.layers * per_block + d + (d * p2 + p2)
    assert total == trainable == expected
    model.head.bias.requires_grad_(False)
    assert model.param_counts() == (expected, expected - p2)
    # RoPE tables are derived from the config: buffers, but not in the state dict.
    assert {"rope_cos", "rope_sin"} <= {n for n, _ in model.named_buffers()}
    assert not any("rope" in k for k in model.state_dict())


def test_residual_projections_init_scaled_by_depth() -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(dim=256, layers=8, heads=4)
    model = IQTransformer(cfg)
    resid = torch.cat(
        [
            torch.cat([b.attn.proj.weight.flatten(), b.mlp.down.weight.flatten()])
            for b in model.blocks
        ]
    )
    other = torch.cat([b.attn.qkv.weight.flatten() for b in model.blocks])
    assert resid.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.02)
    assert other.std().item() == pytest.approx(0.02, rel=0.02)
    assert torch.count_nonzero(model.patch_embed.bias) == 0


def test_too_many_patches_names_max_patches() -> None:
    model = IQTransformer(ModelConfig(**TINY))
    model(torch.randn(1, 16, 16))  # exactly max_patches is fine
    with pytest.raises(ValueError, match="max_patches"):
        model(torch.randn(1, 17, 16))
    with pytest.raises(ValueError, match="patch_len"):
        model(torch.randn(1, 4, 15))


def test_causality() -> None:
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**TINY)).eval()
    x = torch.randn(2, 12, 16)
    t = 5
    y = x.clone()
    y[:, t + 1 :] = torch.randn(2, 12 - t - 1, 16) * 10
    with torch.no_grad():
        a, b = model(x), model(y)
    # Masked keys contribute exp(-inf) = 0 exactly; only kernel blocking could perturb the last
    # bits, hence a tolerance at fp32 resolution rather than equality.
    torch.testing.assert_close(a[:, : t + 1], b[:, : t + 1], rtol=0, atol=1e-6)
    assert (a[:, t + 1 :] - b[:, t + 1 :]).abs().max() > 1e-3  # the future does matter later


def test_dropout_inactive_in_eval() -> None:
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**TINY, dropout=0.5))
    x = torch.randn(2, 8, 16)
    with torch.no_grad():
        assert not torch.equal(model(x), model(x))  # train mode: fresh masks
        model.eval()
        assert torch.equal(model(x), model(x))


def _residual_dtypes(model: IQTransformer, x: torch.Tensor, device: str) -> list[torch.dtype]:
    with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16):
        return [s.dtype for s in model.layer_states(x)]


@pytest.mark.parametrize("kw", [{}, {"objective": "classify", "pool": "attention"}])
def test_the_residual_stream_stays_fp32_under_bf16_autocast(kw: dict) -> None:
    # Autocast runs the matmuls in bf16; the stream they add into stays fp32 (as nanoGPT's
    # does): a bf16 stream rounds every block's update to 8 mantissa bits.
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**{**TINY, **kw}), 3 if kw else 0).eval()
    x = unit_power_patches(2, 16, 8)
    # Patch embeddings, the stream after each block, the final hidden states.
    assert _residual_dtypes(model, x, "cpu") == [torch.float32] * 3
    assert _residual_dtypes(model, x.bfloat16(), "cpu") == [torch.float32] * 3
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(x).dtype == torch.bfloat16  # the head is a bf16 matmul: its output is bf16
    with torch.no_grad():  # fp32 without autocast, whatever the patches' dtype
        assert model(x.bfloat16()).dtype == torch.float32


@pytest.mark.gpu
def test_the_residual_stream_stays_fp32_under_cuda_autocast() -> None:
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**TINY)).cuda().eval()
    x = unit_power_patches(2, 16, 8).cuda()
    assert _residual_dtypes(model, x, "cuda") == [torch.float32] * 3


# --------------------------------------------------------------------------- FLOPs


@pytest.mark.parametrize(
    ("cfg", "batch", "n"),
    [
        # odd widths everywhere: dim, heads, patch_len, an explicit non-multiple-of-64 MLP
        ({"dim": 48, "layers": 3, "heads": 3, "patch_len": 5, "mlp_hidden": 70}, 3, 11),
        ({"dim": 20, "layers": 1, "heads": 5, "patch_len": 3}, 2, 7),
        ({"dim": 36, "layers": 2, "heads": 2, "patch_len": 1, "mlp_hidden": 100}, 1, 13),
    ],
    ids=["d48-L3-P5", "d20-L1-P3", "d36-L2-P1"],
)
def test_flops_formula_matches_torch_flop_counter(cfg: dict, batch: int, n: int) -> None:
    """The stated formula against an independent count: torch's FlopCounterMode on the real
    forward and backward, which counts every matmul by shape. Attention runs on SDPA's math
    backend here, whose matmuls every torch version counts (torch 2.11 has no FLOP formula for
    the CPU flash kernel and counts its attention as zero); its backward is the 4 matmuls the
    model-FLOPs convention counts (flash attention's recomputed scores would be a fifth)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**cfg, max_patches=16))
    x = torch.randn(batch, n, 2 * cfg["patch_len"])
    positions = batch * n
    forward = model.forward_flops_per_patch(n)
    assert model.train_flops_per_patch(n) == 3 * forward

    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x)
    assert counter.get_total_flops() == forward * positions
    by_op = {str(k): v for k, v in counter.get_flop_counts()["Global"].items()}
    # The full N x N score matrix, as the formula states: 2 matmuls x 2 N d per position.
    attention = cfg["layers"] * 4 * n * cfg["dim"] * positions
    assert by_op.get("aten.bmm", 0) == attention, by_op

    # Forward + backward. The input needs a gradient so the patch embedding's input-gradient
    # matmul runs too, as the 3x convention counts it.
    x.requires_grad_(True)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        next_patch_loss(model(x), x.detach())[0].backward()
    assert counter.get_total_flops() == model.train_flops_per_patch(n) * positions


def test_flops_hand_count_and_argument() -> None:
    model = IQTransformer(ModelConfig(dim=128, layers=4, heads=4, patch_len=16))
    d, h, w, n = 128, 384, 32, 64
    per_block = 6 * d * d + 4 * n * d + 2 * d * d + 4 * d * h + 2 * h * d
    assert model.forward_flops_per_patch(n) == 4 * w * d + 4 * per_block
    # With attention small, ~6 x parameters per patch (the 6N rule) within the bias/norm terms.
    params = model.param_counts()[0]
    ratio = model.train_flops_per_patch(n) / (6 * params)
    assert 1.0 < ratio < 1.1
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(ValueError, match="seq_patches"):
            model.forward_flops_per_patch(bad)


# --------------------------------------------------------------------------- loss


def test_zero_prediction_loss_is_about_one() -> None:
    x = unit_power_patches(8, 32, 16)
    mean, total, count = next_patch_loss(torch.zeros_like(x), x)
    assert count == 8 * 31 * 16  # complex target samples: patch 0 is never a target
    assert mean.dtype == torch.float32
    assert mean.item() == pytest.approx(1.0, abs=0.03)
    assert mean.item() == pytest.approx(total.item() / count, rel=1e-6)
    # Predicting the target exactly scores zero: position t is compared with patch t+1.
    shifted = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
    assert next_patch_loss(shifted, x)[0].item() == 0.0


def test_loss_definition_and_fp32() -> None:
    x = unit_power_patches(2, 4, 3, seed=1)
    pred = torch.randn_like(x)
    mean, total, count = next_patch_loss(pred.bfloat16(), x.bfloat16())
    assert mean.dtype == total.dtype == torch.float32
    p, t = pred.bfloat16().float(), x.bfloat16().float()
    expected = ((p[:, :-1] - t[:, 1:]) ** 2).sum()
    assert count == 2 * 3 * 3
    torch.testing.assert_close(total, expected)
    with pytest.raises(ValueError):
        next_patch_loss(x[:, :1], x[:, :1])  # a single patch has no target
    with pytest.raises(ValueError):
        next_patch_loss(pred[:, :3], x)

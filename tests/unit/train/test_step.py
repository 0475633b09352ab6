"""Tests of iqtrain.train.step: the optimizer step, evaluation, and their configuration.

All tests but one run eagerly: torch.compile costs tens of seconds per graph on a cold CPU cache,
so a single focused test checks that compiled and eager steps agree.

bf16 runs on CUDA only; the CPU tests reach its code path through CPU autocast. What they
cannot reach, CUDA's autocast, the Triton prepare kernel and the graph Inductor generates for
CUDA, is the ``gpu_smoke`` test: the compiled bf16 step the GPU stage must pass first.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.errors import ConfigError, NonFiniteError
from iqtrain.model.prepare import prepare_iq_input_reference
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives.next_patch import next_patch_loss
from iqtrain.train import step as step_module
from iqtrain.train.optim import split_parameters
from iqtrain.train.step import StepResult, TrainStep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


TINY = {"dim": 32, "layers": 2, "heads": 2, "patch_len": 8, "max_patches": 16}


def sinusoid_batch(b: int = 4, n: int = 16, p: int = 8, seed: int = 0) -> torch.Tensor:
    """Sums of three complex sinusoids per window, normalized to unit mean power, as patches."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n * p, dtype=torch.float64)
    sig = torch.zeros(b, n * p, dtype=torch.complex128)
    for _ in range(3):
        freq = torch.rand(b, 1, generator=g, dtype=torch.float64) * 0.4 - 0.2
        phase = torch.rand(b, 1, generator=g, dtype=torch.float64) * 2 * math.pi
        sig += torch.exp(1j * (2 * math.pi * freq * t + phase))
    sig /= sig.abs().square().mean(dim=1, keepdim=True).sqrt()
    return torch.view_as_real(sig).reshape(b, n, 2 * p).float()


def make_step(
    *, seed: int = 0, model_kw: dict | None = None, compile: bool = False, **opt_kw
) -> TrainStep:
    torch.manual_seed(seed)
    model = IQTransformer(ModelConfig(**{**TINY, **(model_kw or {})}))
    return TrainStep(
        model, OptimizerConfig(**opt_kw), device="cpu", precision="fp32", compile=compile
    )


def grads(ts: TrainStep) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in ts.model.named_parameters() if p.grad is not None}


def snapshot(ts: TrainStep) -> list[torch.Tensor]:
    """Every parameter and every optimizer tensor (moments, step counts, lr), cloned."""
    out = [p.detach().clone() for p in ts.model.parameters()]
    for state in ts.optimizer.state.values():
        out += [v.clone() for v in state.values() if isinstance(v, torch.Tensor)]
    out += [g["lr"].clone() for g in ts.optimizer.param_groups]
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    # Compare bit patterns, not values: -0.0 == 0.0 and NaN != NaN would blur "untouched".
    return t.view(torch.int64) if t.dtype == torch.float64 else t.view(torch.int32)


# --------------------------------------------------------------------------- learning


def test_one_batch_overfit() -> None:
    ts = make_step(lr=3e-3, weight_decay=0.0)
    x = sinusoid_batch()
    first = ts.train_step([x], 3e-3, step=0).loss
    assert first == pytest.approx(1.0, abs=0.2)  # zero-ish predictions at init score ~1
    losses = []
    for s in range(1, 300):  # stop as soon as the target is met: CPU time is shared here
        losses.append(ts.train_step([x], 3e-3, step=s).loss)
        if losses[-1] <= first / 10:
            break
    assert losses[-1] <= first / 10, (first, losses[-10:])
    assert all(math.isfinite(v) for v in losses)


def test_accumulation_matches_full_batch() -> None:
    a = make_step(grad_clip=0.0)
    b = copy.deepcopy(a)
    x = sinusoid_batch(b=4, seed=3)
    ra = a.train_step([x], 1e-3)
    rb = b.train_step([x[:2], x[2:]], 1e-3)
    # A=2 with halves is mathematically the same mean; in fp32 only the order of summation
    # differs (batch rows split into two partial sums), which moves results by a few ulps of
    # the accumulated magnitudes: relative 1e-5 with an absolute floor of 1e-7 (grad entries
    # are ~1e-2) leaves two orders of margin over the ~1e-7 relative differences observed.
    assert rb.loss == pytest.approx(ra.loss, rel=1e-5)
    assert rb.grad_norm == pytest.approx(ra.grad_norm, rel=1e-5)
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys() and len(ga) == len(list(a.model.parameters()))
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], rtol=1e-5, atol=1e-7, msg=name)


def test_accumulated_microbatches_are_clipped_once_as_the_full_batch() -> None:
    # The promise of TrainStep.train_step: clipping happens once, on the accumulated gradient.
    # Two microbatches must give exactly the step of their concatenation clipped once. eps=1
    # makes the first AdamW update ~ lr * g (|g| << eps) rather than ~ lr * sign(g), so the
    # parameters after the step depend on the clipped gradient's scale and direction, not
    # only on its signs; weight decay off so nothing else moves them.
    clip = 0.05
    full = make_step(seed=7, grad_clip=clip, eps=1.0, weight_decay=0.0)
    accum = copy.deepcopy(full)
    reference = copy.deepcopy(full.model)
    before = [p.detach().clone() for p in full.model.parameters()]
    x = sinusoid_batch(b=4, seed=7)

    rf = full.train_step([x], 1.0, step=0)
    ra = accum.train_step([x[:2], x[2:]], 1.0, step=0)

    assert rf.clipped and ra.clipped and rf.grad_norm > 10 * clip  # clipping really acts
    # Same mean loss and same pre-clip norm, to the summation-order tolerance of
    # test_accumulation_matches_full_batch.
    assert ra.loss == pytest.approx(rf.loss, rel=1e-5)
    assert ra.grad_norm == pytest.approx(rf.grad_norm, rel=1e-5)
    # The gradients left on the parameters are the clipped ones: identical, of norm clip.
    gf, ga = grads(full), grads(accum)
    assert gf.keys() == ga.keys() and len(gf) == len(before)
    for name in gf:
        torch.testing.assert_close(ga[name], gf[name], rtol=1e-5, atol=1e-8, msg=name)
    clipped_norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in gf.values()]))
    assert clipped_norm.item() == pytest.approx(clip, rel=1e-4)
    # Same parameters after the step, and the step moved them by ~lr * clip: far more than
    # the tolerance, so an update computed from a different gradient could not pass.
    moved = 0.0
    for pf, pa, p0 in zip(full.model.parameters(), accum.model.parameters(), before, strict=True):
        torch.testing.assert_close(pa, pf, rtol=1e-5, atol=1e-8)
        moved += (pf.detach() - p0).square().sum().item()
    assert math.sqrt(moved) > 0.5 * clip

    # Power of the check: clipping each microbatch's contribution separately (the mistake
    # this test guards against) would leave a gradient far outside the tolerance above.
    per_mb = [torch.zeros_like(p) for p in reference.parameters()]
    for mb in (x[:2], x[2:]):
        reference.zero_grad(set_to_none=True)
        (next_patch_loss(reference(mb), mb)[0] / 2).backward()
        g = [p.grad for p in reference.parameters()]
        norm = torch.linalg.vector_norm(torch.stack([t.norm() for t in g])).item()
        scale = min(1.0, clip / (norm + 1e-6))
        for acc, t in zip(per_mb, g, strict=True):
            acc += t * scale
    names = [n for n, _ in reference.named_parameters()]
    worst = max((per_mb[i] - gf[n]).abs().max().item() for i, n in enumerate(names))
    assert worst > 1e-4


def test_unequal_microbatches_rejected() -> None:
    ts = make_step()
    x = sinusoid_batch(b=4)
    with pytest.raises(ValueError, match="equal shapes"):
        ts.train_step([x[:3], x[3:]], 1e-3)
    with pytest.raises(ValueError):
        ts.train_step([], 1e-3)
    with pytest.raises(ValueError, match="lr"):
        ts.train_step([x], float("nan"))


def test_clipping_reports_pre_clip_norm() -> None:
    ts = make_step(grad_clip=1e-3)
    reference = copy.deepcopy(ts.model)
    x = sinusoid_batch()
    result = ts.train_step([x], 1e-3)

    next_patch_loss(reference(x), x)[0].backward()
    expected = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in reference.parameters()])
    ).item()
    assert result.grad_norm == pytest.approx(expected, rel=1e-5)
    assert result.clipped and result.grad_norm > 1e-3
    post = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ts.model.parameters()]))
    assert post.item() <= 1e-3

    unclipped = make_step(grad_clip=0.0).train_step([x], 1e-3)  # <= 0 turns clipping off
    assert not unclipped.clipped
    assert unclipped.grad_norm == pytest.approx(expected, rel=1e-5)
    assert not make_step(grad_clip=1e6).train_step([x], 1e-3).clipped


def test_non_finite_leaves_everything_bit_identical() -> None:
    ts = make_step(lr=1e-3)
    x = sinusoid_batch()
    for s in range(3):  # build optimizer state first: moments and step counts must survive too
        ts.train_step([x], 1e-3, step=s)
    before = snapshot(ts)
    assert len(before) > 3 * len(list(ts.model.parameters()))  # moments and steps included
    bad = x.clone()
    bad[1, 3, 5] = float("nan")
    with pytest.raises(NonFiniteError) as info:
        ts.train_step([x, bad], 5e-3, step=41, window_ids=torch.tensor([7, 8, 9, 10]))
    message = str(info.value)
    assert "step 41" in message and "nan" in message and "[7, 8, 9, 10]" in message
    assert isinstance(info.value, ArithmeticError)
    after = snapshot(ts)
    assert len(after) == len(before)
    for b, a in zip(before, after, strict=True):
        assert torch.equal(bits(b), bits(a))
    assert all(p.grad is None for p in ts.model.parameters())
    # The step is usable afterwards and picks the new lr up then.
    assert ts.train_step([x], 5e-3, step=41).lr == 5e-3

    with pytest.raises(NonFiniteError, match="non-finite"):
        ts.train_step([x * 1e30], 1e-3)  # squared error overflows fp32: an inf loss


def test_non_finite_message_without_step_and_with_list_ids() -> None:
    ts = make_step()
    bad = sinusoid_batch()
    bad[0, 0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^training step: .*window ids \[3, 1\]"):
        ts.train_step([bad], 1e-3, window_ids=[3, 1])


def test_bf16_autocast_path_keeps_fp32_params_and_state() -> None:
    # No GPU here: swap the CUDA autocast for CPU's to exercise the same dtype plumbing
    # (RMSNorm and RoPE in fp32, bf16 matmuls, fp32 loss) past the constructor's CUDA check.
    ts = make_step(seed=5)
    ref = copy.deepcopy(ts)
    ts.precision = "bf16"
    x = sinusoid_batch(seed=5)
    for s in range(2):
        got, want = ts.train_step([x], 1e-3, step=s), ref.train_step([x], 1e-3, step=s)
        assert got.loss == pytest.approx(want.loss, rel=1e-2)  # bf16 has 8 mantissa bits
    assert {p.dtype for p in ts.model.parameters()} == {torch.float32}
    state = [v for s in ts.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {v.dtype for v in state} == {torch.float32}
    total, count = ts.eval_step(x.bfloat16())  # prepare_iq_input may hand over bf16 patches
    assert math.isfinite(total) and count == 4 * 15 * 8


def _cpu_bf16_step(monkeypatch, model_kw: dict) -> TrainStep:
    """A step built with ``precision="bf16"`` on the CPU: the config's bf16-needs-CUDA rule is
    bypassed, so the step runs CPU bf16 autocast, the same code path as CUDA's."""
    monkeypatch.setattr(step_module, "TrainingConfig", lambda **kw: None)
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(**{**TINY, **model_kw}))
    return TrainStep(model, OptimizerConfig(), device="cpu", precision="bf16", compile=False)


def test_bf16_categorical_targets_are_binned_from_fp32_patches(monkeypatch) -> None:
    # prepare hands the model fp32 patches under bf16 too: autocast rounds the embedding's
    # input to bf16 as the kernel would, while the targets keep their fp32 values, so a value
    # is binned as prepare_iq_input_reference (and pretrained scoring) bins it. bf16's half-ulp
    # is 2**-8 in [1, 2): ~3% of a 1/8-wide bin (218 of these 15360 targets moved bins).
    from iqtrain.objectives.categorical import quantise

    kw = {"objective": "categorical", "bins": 64, "bin_range": 4.0}
    ts = _cpu_bf16_step(monkeypatch, kw)
    raw = raw_batch(64, seed=3)
    patches, _ = ts.prepare(raw, 8)
    want, _ = prepare_iq_input_reference(torch.from_numpy(raw), 8)
    assert patches.dtype == torch.float32
    cfg = ts.model.config
    assert torch.equal(quantise(patches[:, 1:], cfg), quantise(want[:, 1:], cfg))
    # The step's loss is that of the fp32 targets against the bf16-autocast output.
    total, count, _ = ts.eval_sums(patches)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = ts.model.eval()(want)
    assert count == 64 * 15 * 8 and torch.equal(total, cfg.task.loss(out, want, None, cfg)[1])


# --------------------------------------------------------------------------- optimizer


def test_parameter_groups() -> None:
    ts = make_step(weight_decay=0.1)
    names = {n for n, _ in ts.model.named_parameters()}
    decay, no_decay = set(ts.decay_param_names), set(ts.no_decay_param_names)
    assert decay | no_decay == names and not decay & no_decay
    # Matrices decay, except the patch embedding; norms, biases and the embedding do not.
    assert decay == {
        n for n, p in ts.model.named_parameters() if p.ndim >= 2 and not n.startswith("patch_embed")
    }
    assert "head.weight" in decay and "blocks.0.attn.qkv.weight" in decay
    assert {"patch_embed.weight", "patch_embed.bias", "head.bias", "norm.weight"} <= no_decay
    assert "blocks.1.mlp_norm.weight" in no_decay
    params = dict(ts.model.named_parameters())
    wd = {id(p): g["weight_decay"] for g in ts.optimizer.param_groups for p in g["params"]}
    assert all(wd[id(params[n])] == 0.1 for n in decay)
    assert all(wd[id(params[n])] == 0.0 for n in no_decay)
    assert split_parameters(ts.model)[0][0][0] in decay
    group = ts.optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.95) and group["eps"] == 1e-8


def test_lr_is_a_tensor_set_on_every_group() -> None:
    ts = make_step(lr=1e-3)
    x = sinusoid_batch()
    for lr in (2.5e-4, 7e-4):
        result = ts.train_step([x], lr)
        assert result == StepResult(
            loss=result.loss, grad_norm=result.grad_norm, clipped=result.clipped, lr=lr
        )
        for group in ts.optimizer.param_groups:
            assert isinstance(group["lr"], torch.Tensor) and group["lr"].item() == lr
    # A state dict loaded from a float-lr checkpoint gets its tensor back on the next step.
    state = ts.optimizer.state_dict()
    for group in state["param_groups"]:
        group["lr"] = 1.0
    ts.optimizer.load_state_dict(state)
    ts.train_step([x], 3e-4)
    assert all(isinstance(g["lr"], torch.Tensor) for g in ts.optimizer.param_groups)
    assert all(g["lr"].item() == 3e-4 for g in ts.optimizer.param_groups)
    assert all(s["exp_avg"].dtype == torch.float32 for s in ts.optimizer.state.values())


# --------------------------------------------------------------------------- evaluation


def test_eval_step_is_exact_sum_in_eval_mode() -> None:
    ts = make_step(model_kw={"dropout": 0.5})
    x = sinusoid_batch(b=3)
    total, count = ts.eval_step(x)
    assert ts.model.training  # train mode restored
    assert count == 3 * 15 * 8
    again, _ = ts.eval_step(x)
    assert total == again  # dropout off: deterministic
    ts.model.eval()
    with torch.no_grad():
        expected = next_patch_loss(ts.model(x), x)[1].item()
    assert total == pytest.approx(expected, rel=1e-6)
    ts.eval_step(x)
    assert not ts.model.training  # the previous mode, whichever it was, is restored


def test_eval_loss_sum_is_eval_step_without_the_sync() -> None:
    ts = make_step(model_kw={"dropout": 0.5})
    x = sinusoid_batch(b=3)
    total, count = ts.eval_loss_sum(x)
    assert isinstance(total, torch.Tensor) and total.ndim == 0 and total.dtype == torch.float32
    assert not total.requires_grad and ts.model.training
    assert (float(total), count) == ts.eval_step(x)


# --------------------------------------------------------------------------- prepare


def raw_batch(b: int, n: int = 16, p: int = 8, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.integers(-32768, 32768, size=(b, n * p, 2), dtype=np.int16)


def test_prepare_eager_is_the_reference_on_numpy_batches() -> None:
    ts = make_step()
    raw = raw_batch(4)
    patches, scale = ts.prepare(raw, 8, norm="prefix", prefix_patches=3)
    want = prepare_iq_input_reference(torch.from_numpy(raw), 8, norm="prefix", prefix_patches=3)
    assert patches.dtype == torch.float32 and patches.shape == (4, 16, 16)
    assert torch.equal(patches, want[0]) and torch.equal(scale, want[1])
    assert ts.train_step([patches], 1e-3).loss > 0  # the model takes what prepare gives
    with pytest.raises(ValueError, match="patch_len"):
        ts.prepare(raw, 7)


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize("device", ["cuda:0", "CPU", "gpu", " cpu", None])
def test_device_strings_rejected(device: object) -> None:
    model = IQTransformer(ModelConfig(**TINY))
    with pytest.raises(ConfigError, match=r"^training\.device"):
        TrainStep(model, OptimizerConfig(), device=device, precision="fp32", compile=False)


def test_precision_and_compile_rejected() -> None:
    model = IQTransformer(ModelConfig(**TINY))
    opt = OptimizerConfig()
    with pytest.raises(ConfigError, match=r"^training\.precision.*cuda"):
        TrainStep(model, opt, device="cpu", precision="bf16", compile=False)
    with pytest.raises(ConfigError, match=r"^training\.precision"):
        TrainStep(model, opt, device="cpu", precision="fp16", compile=False)
    with pytest.raises(ConfigError, match=r"^training\.compile"):
        TrainStep(model, opt, device="cpu", precision="fp32", compile="yes")


def test_cuda_without_cuda_rejected(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine too
    model = IQTransformer(ModelConfig(**TINY))
    with pytest.raises(ConfigError, match=r"^training\.device"):
        TrainStep(model, OptimizerConfig(), device="cuda", precision="bf16", compile=False)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"lr": 0.0}, "optimizer.lr"),
        ({"lr": "1e-3"}, "optimizer.lr"),
        ({"lr": 1e-4, "min_lr": 1e-3}, "optimizer.min_lr"),
        ({"min_lr": -1.0}, "optimizer.min_lr"),
        ({"betas": (0.9,)}, "optimizer.betas"),
        ({"betas": (0.9, 1.0)}, "optimizer.betas[1]"),
        ({"eps": 0.0}, "optimizer.eps"),
        ({"weight_decay": -0.1}, "optimizer.weight_decay"),
        ({"grad_clip": float("inf")}, "optimizer.grad_clip"),
    ],
)
def test_optimizer_config_errors_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        OptimizerConfig(**kwargs)
    assert str(info.value).startswith(key)


def test_optimizer_config_accepts_toml_shapes() -> None:
    cfg = OptimizerConfig(lr=1, min_lr=0, betas=[0.8, 0.9], grad_clip=0)
    assert cfg.betas == (0.8, 0.9) and isinstance(cfg.lr, float) and cfg.grad_clip == 0.0


def test_state_dict_round_trip_without_prefix() -> None:
    ts = make_step(seed=1)
    state = ts.model_state_dict()
    assert state and not any(k.startswith("_orig_mod.") for k in state)
    other = make_step(seed=2)
    other.load_model_state_dict({f"_orig_mod.{k}": v for k, v in state.items()})
    for k, v in other.model_state_dict().items():
        assert torch.equal(v, state[k])
    # A module compiled by the caller is unwrapped, so its keys carry no prefix either.
    wrapped = torch.compile(IQTransformer(ModelConfig(**TINY)))
    ts2 = TrainStep(wrapped, OptimizerConfig(), device="cpu", precision="fp32", compile=False)
    assert ts2.model_state_dict().keys() == state.keys()


# --------------------------------------------------------------------------- compile


def test_compiled_step_matches_eager() -> None:
    eager = make_step(seed=5, compile=False)
    compiled = make_step(seed=5, compile=True)
    x = sinusoid_batch(b=4, seed=5)
    # Two steps of one architecture share their graphs (parameters are graph inputs), so an
    # earlier test's graph would be reused here: start from an empty cache to see it compile.
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    lrs = (1e-3, 2e-3, 5e-4)  # a changing lr must not recompile: it lives in a tensor
    results = []
    for s, lr in enumerate(lrs):
        e = eager.train_step([x[:2], x[2:]], lr, step=s)
        c = compiled.train_step([x[:2], x[2:]], lr, step=s)
        results.append((e, c))
        if s == 0:
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            assert graphs >= 1  # it really compiled
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    for e, c in results:
        assert abs(e.loss - c.loss) <= 1e-5, (e, c)
        assert c.grad_norm == pytest.approx(e.grad_norm, rel=1e-4)
    assert not any(k.startswith("_orig_mod.") for k in compiled.model_state_dict())

    # Evaluation: at most one more graph (eval mode, no grad; none if an earlier test in this
    # process compiled it) with a dynamic batch dimension, shared by a validation batch size
    # and a partial last batch; training afterwards reuses its own.
    for i, b in enumerate((4, 3, 2)):
        got, count = compiled.eval_step(x[:b])
        want, _ = eager.eval_step(x[:b])
        assert got == pytest.approx(want, rel=1e-5) and count == b * 15 * 8
        if i == 0:
            with_eval = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            assert with_eval <= graphs + 1
    compiled.train_step([x[:2], x[2:]], 1e-3)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == with_eval


def test_compiled_prepare_is_bit_identical_without_recompiles() -> None:
    """CPU + compile: prepare runs inductor code, equal bit for bit to the eager reference,
    with one graph for the training batch, a validation batch and a partial last batch."""
    ts = make_step(compile=True)
    eager = make_step(compile=False)
    assert ts._prepare_fn is not prepare_iq_input_reference  # the compiled path is taken
    torch._dynamo.utils.counters.clear()
    for i, b in enumerate((8, 8, 24, 5, 8)):  # train, train, val, partial val, train
        raw = raw_batch(b, seed=i)
        got, want = ts.prepare(raw, 8), eager.prepare(raw, 8)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), b
        if i == 0:  # one graph (none if an earlier test in this process compiled it)
            first = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            assert first <= 1
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == first
    # int8 extremes and a NaN in float32 input: exact, and NaN is not hidden.
    raw8 = torch.tensor([[[-128, 127], [127, -128], [0, 1], [-1, 0]]] * 2, dtype=torch.int8)
    assert torch.equal(ts.prepare(raw8, 2)[0], eager.prepare(raw8, 2)[0])
    bad = torch.randn(3, 32, 2)
    bad[1, 5, 0] = float("nan")
    patches, scale = ts.prepare(bad, 8)
    assert scale[1].isnan() and patches[1].isnan().all() and not patches[0].isnan().any()
    with pytest.raises(ValueError, match="patch_len"):  # checks run before the compiled part
        ts.prepare(bad, 5)


def test_compiled_categorical_step_and_eval_match_eager() -> None:
    # The categorical objective's cross-entropy and predicted mean compile into the same
    # fullgraph as the model (one compile: ~30 s on a cold CPU cache).
    kw = {"objective": "categorical", "bins": 16, "bin_range": 3.0}
    eager = make_step(seed=7, model_kw=kw, compile=False)
    compiled = make_step(seed=7, model_kw=kw, compile=True)
    x = sinusoid_batch(b=4, seed=7)
    for s in range(2):
        e = eager.train_step([x], 1e-3, step=s)
        c = compiled.train_step([x], 1e-3, step=s)
        assert c.loss == pytest.approx(e.loss, rel=1e-5) and e.loss > 0
        assert c.grad_norm == pytest.approx(e.grad_norm, rel=1e-4)
    got = [float(v) if isinstance(v, torch.Tensor) else v for v in compiled.eval_sums(x)]
    want = [float(v) if isinstance(v, torch.Tensor) else v for v in eager.eval_sums(x)]
    assert got == pytest.approx(want, rel=1e-5)
    assert want[1] == 4 * 15 * 8 and want[0] != want[2]  # nats and squared error differ


def test_a_categorical_step_rejects_a_nan_target_before_the_update() -> None:
    ts = make_step(model_kw={"objective": "categorical", "bins": 8})
    before = snapshot(ts)
    x = sinusoid_batch(b=2)
    x[1, -1, 3] = float("nan")  # only a target: no output sees it
    with pytest.raises(NonFiniteError, match="training step 4: non-finite loss"):
        ts.train_step([x], 1e-3, step=4)
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(ts), strict=True))


@pytest.mark.gpu
@pytest.mark.gpu_smoke
def test_a_compiled_cuda_bf16_step_matches_eager_and_bins_fp32_targets() -> None:
    from iqtrain.objectives.categorical import quantise

    kw = {"objective": "categorical", "bins": 64, "bin_range": 4.0}
    cpu = make_step(seed=9, model_kw=kw)
    steps = {}
    for compiled in (False, True):
        ts = TrainStep(
            IQTransformer(cpu.model.config),
            OptimizerConfig(),
            device="cuda",
            precision="bf16",
            compile=compiled,
        )
        ts.load_model_state_dict(cpu.model_state_dict())
        steps[compiled] = ts
    raw = raw_batch(64, seed=9)
    patches, _ = steps[True].prepare(raw, 8)  # the Triton kernel
    want, _ = prepare_iq_input_reference(torch.from_numpy(raw), 8)
    assert patches.dtype == torch.float32 and patches.is_cuda
    cfg = cpu.model.config
    moved = quantise(patches[:, 1:].cpu(), cfg) != quantise(want[:, 1:], cfg)
    assert int(moved.sum()) <= 3  # fp32 both: only a value an ulp from an edge may move
    for s in range(2):
        c = cpu.train_step([want[:32], want[32:]], 1e-3, step=s)
        e = steps[False].train_step([patches[:32], patches[32:]], 1e-3, step=s)
        g = steps[True].train_step([patches[:32], patches[32:]], 1e-3, step=s)
        assert all(math.isfinite(r.loss) and math.isfinite(r.grad_norm) for r in (e, g))
        assert e.loss == pytest.approx(c.loss, rel=2e-2)
        assert g.loss == pytest.approx(e.loss, rel=1e-2)
        assert g.grad_norm == pytest.approx(e.grad_norm, rel=5e-2)
    for b in (64, 37):  # a validation batch and a partial last one
        et, en, ese = steps[False].eval_sums(patches[:b])
        gt, gn, gse = steps[True].eval_sums(patches[:b])
        assert en == gn == b * 15 * 8
        assert float(gt) == pytest.approx(float(et), rel=1e-2)
        assert float(gse) == pytest.approx(float(ese), rel=2e-2)
    assert {p.dtype for p in steps[True].model.parameters()} == {torch.float32}

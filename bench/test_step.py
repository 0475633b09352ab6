"""Throughput of the training step against its peers, all measured in the same run.

CPU (the quickstart model: dim 128, 4 layers, 4 heads, patch_len 16, 64 patches, batch 32):
- ``TrainStep`` eager and compiled (fp32);
- the peer: the same model written as a plain nanoGPT-style loop (eager modules, manual
  attention with a mask and softmax, manual RMSNorm, default AdamW, ``clip_grad_norm_``);
- the ceiling: a large fp32 matmul, so achieved model GFLOP/s can be read as a fraction of what
  this CPU's BLAS reaches.
CUDA (skipped without a GPU), against a large bf16 matmul measured in the same run:
- ``TrainStep`` at the GPU study's shape (examples/quickstart.toml's model with dropout 0.1,
  batch 256, 32 patches, bf16): compiled with ``training.deterministic`` on and off (the cost of
  determinism), and eager; the GPU stage's study plans its step count from the compiled,
  deterministic ms/step (``extra_info["variant"]``). Dropout 0.1 as the determinism and resume
  stages train it, so the compile cache those stages leave serves these compiles;
- eager ``TrainStep`` of a ~50M-parameter model (16 layers: compiling it in one graph costs
  more than the GPU stage's bench limit, so it is not compiled here).

Model FLOPs per step follow the PaLM convention: ``6 * params * tokens`` for the matmuls
(forward 2, backward 4) plus ``12 * layers * dim * N * tokens`` for attention scores and values,
counting the full N x N matrix (causal kernels skip about half of it, so this slightly flatters
attention-heavy shapes; here attention is a small part). A token is one patch.

Run ``pytest bench --benchmark-only``; a summary with the ratios is printed after the module.
"""

from __future__ import annotations

import math
import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from iqtrain.config.schema import load_config
from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.model.transformer import IQTransformer, rope_tables
from iqtrain.objectives.next_patch import next_patch_loss
from iqtrain.train.step import TrainStep

QUICKSTART = ModelConfig(dim=128, layers=4, heads=4, patch_len=16, max_patches=64)
CPU_BATCH, CPU_PATCHES = 32, 64
LR = 1e-3

# ~50M parameters: 16 blocks of 4*512^2 + 3*512*1408 = 3.2M each.
CUDA_MODEL = ModelConfig(dim=512, layers=16, heads=8, patch_len=16, max_patches=256)
CUDA_BATCH, CUDA_PATCHES = 64, 256
# The GPU study's step (scripts/ci/gpu_study.py): the quickstart's model, batch 256.
QUICKSTART_TOML = Path(__file__).resolve().parents[1] / "examples" / "quickstart.toml"
STUDY_SETS = ["model.dropout=0.1", "training.device=cuda", "training.precision=bf16"]
STUDY_BATCH = 256
# training.deterministic needs deterministic cuBLAS, which reads this once, at the process's
# first cuBLAS call (the matmul ceiling's here): set before any test runs, as configure() would.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

RESULTS: dict[str, dict[str, float]] = {}


# --------------------------------------------------------------------------- helpers


def unit_power_patches(b: int, n: int, p: int, device: str = "cpu") -> Tensor:
    g = torch.Generator().manual_seed(0)
    iq = torch.randn(b, n * p, 2, generator=g)
    iq /= iq.square().sum(-1).mean(-1).sqrt()[:, None, None]
    return iq.reshape(b, n, 2 * p).to(device)


def model_flops_per_step(cfg: ModelConfig, params: int, batch: int, patches: int) -> float:
    tokens = batch * patches
    return 6.0 * params * tokens + 12.0 * cfg.layers * cfg.dim * patches * tokens


def median_seconds(benchmark) -> float | None:
    # None when pytest-benchmark is disabled (--benchmark-disable runs each body once).
    return None if benchmark.stats is None else benchmark.stats.stats.median


def record(benchmark, name: str, *, samples: int, patches: int, flops: float) -> None:
    seconds = median_seconds(benchmark)
    if seconds is None:
        return
    info = {
        "ms_per_step": seconds * 1e3,
        "samples_per_s": samples / seconds,
        "patches_per_s": samples * patches / seconds,
        "model_gflop_per_step": flops / 1e9,
        "gflop_per_s": flops / seconds / 1e9,
        "threads": float(torch.get_num_threads()),
    }
    ceiling = RESULTS.get("cuda_matmul" if name.startswith("cuda") else "cpu_matmul")
    if ceiling:
        info["fraction_of_matmul"] = info["gflop_per_s"] / ceiling["gflop_per_s"]
    benchmark.extra_info.update(info)
    RESULTS[name] = info


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    yield
    if not RESULTS:
        return
    lines = ["", "step throughput (separate tests: medians; FLOPs per the module docstring):"]
    for name, info in RESULTS.items():
        if name == "cpu_interleaved":
            continue
        parts = [f"{k}={v:.4g}" for k, v in info.items()]
        lines.append(f"  {name}: " + ", ".join(parts))
    inter = RESULTS.get("cpu_interleaved")
    if inter:
        lines.append("  cpu interleaved (same conditions for all; min = uncontended estimate):")
        for stat in ("min", "median"):
            cells = [f"matmul {inter[f'{stat}_matmul_gflop_per_s']:.0f} GFLOP/s"]
            for v in ("plain_peer", "eager", "compiled"):
                cells.append(
                    f"{v} {inter[f'{stat}_{v}_samples_per_s']:.0f} samples/s "
                    f"({inter[f'{stat}_{v}_fraction_of_matmul']:.0%} of matmul)"
                )
            lines.append(f"    {stat}: " + "; ".join(cells))
            lines.append(
                f"    {stat}: compiled/eager {inter[f'{stat}_compiled_over_eager']:.2f}x, "
                f"compiled/plain_peer {inter[f'{stat}_compiled_over_plain_peer']:.2f}x, "
                f"eager/plain_peer {inter[f'{stat}_eager_over_plain_peer']:.2f}x"
            )
    pairs = [("cpu_compiled", "cpu_eager"), ("cpu_compiled", "cpu_plain_peer")]
    pairs += [("cuda_study_compiled_deterministic", "cuda_study_eager_deterministic")]
    pairs += [("cuda_study_compiled_deterministic", "cuda_study_compiled_nondeterministic")]
    for name, base in pairs:
        if name in RESULTS and base in RESULTS:
            ratio = RESULTS[name]["samples_per_s"] / RESULTS[base]["samples_per_s"]
            lines.append(f"  {name} / {base} = {ratio:.3f}x (throughput)")
    # Teardown output is captured; step outside the capture so the summary reaches the terminal.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n".join(lines), flush=True)


# --------------------------------------------------------------------------- the plain peer
# The same architecture and parameter count as IQTransformer, written the way a first
# PyTorch implementation (nanoGPT's non-flash path) would: every piece from elementary ops.


class PlainRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class PlainBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.mlp_hidden is not None
        self.heads, self.head_dim = cfg.heads, cfg.head_dim
        self.ln_1 = PlainRMSNorm(cfg.dim)
        self.c_attn = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.c_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.ln_2 = PlainRMSNorm(cfg.dim)
        self.w1 = nn.Linear(cfg.dim, cfg.mlp_hidden, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.mlp_hidden, bias=False)
        self.w2 = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=False)

    @staticmethod
    def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q = q.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, n, self.heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(mask[:n, :n] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, n, d)
        x = x + self.c_proj(y)
        h = self.ln_2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class PlainModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Linear(2 * cfg.patch_len, cfg.dim)
        self.blocks = nn.ModuleList(PlainBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = PlainRMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, 2 * cfg.patch_len)
        cos, sin = rope_tables(cfg.max_patches, cfg.head_dim, cfg.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        mask = torch.tril(torch.ones(cfg.max_patches, cfg.max_patches))
        self.register_buffer("mask", mask, persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=cfg.init_std)

    def forward(self, x: Tensor) -> Tensor:
        n = x.shape[1]
        h = self.embed(x)
        for block in self.blocks:
            h = block(h, self.cos[:n], self.sin[:n], self.mask)
        return self.head(self.ln_f(h))


def plain_loop(cfg: ModelConfig, x: Tensor):
    """One nanoGPT-style training iteration as a closure, with its parameter count."""
    torch.manual_seed(0)
    model = PlainModel(cfg).to(x.device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    # nanoGPT asks for fused AdamW only on CUDA; on CPU it gets torch's default implementation.
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=(0.9, 0.95),
    )

    def step() -> float:
        pred = model(x)
        # mse over 2P components x 2 = mean over complex samples of dI^2 + dQ^2.
        loss = F.mse_loss(pred[:, :-1], x[:, 1:]) * 2
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step, sum(p.numel() for p in model.parameters())


def quickstart_step(compile: bool, x: Tensor) -> tuple[TrainStep, int]:
    torch.manual_seed(0)
    model = IQTransformer(QUICKSTART)
    ts = TrainStep(model, OptimizerConfig(lr=LR), device="cpu", precision="fp32", compile=compile)
    return ts, model.param_counts()[0]


# --------------------------------------------------------------------------- CPU


def test_cpu_matmul_ceiling(benchmark) -> None:
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    benchmark.pedantic(torch.mm, args=(a, b), rounds=10, warmup_rounds=2)
    seconds = median_seconds(benchmark)
    if seconds is not None:
        RESULTS["cpu_matmul"] = {"gflop_per_s": 2 * n**3 / seconds / 1e9}
        benchmark.extra_info.update(RESULTS["cpu_matmul"])


def test_cpu_step_plain_peer(benchmark) -> None:
    x = unit_power_patches(CPU_BATCH, CPU_PATCHES, QUICKSTART.patch_len)
    step, params = plain_loop(QUICKSTART, x)
    ours = IQTransformer(QUICKSTART).param_counts()[0]
    assert params == ours  # the peer is the same model, not a smaller one
    benchmark.pedantic(step, rounds=20, warmup_rounds=3)
    flops = model_flops_per_step(QUICKSTART, params, CPU_BATCH, CPU_PATCHES)
    record(benchmark, "cpu_plain_peer", samples=CPU_BATCH, patches=CPU_PATCHES, flops=flops)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cpu_train_step(benchmark, compiled: bool) -> None:
    x = unit_power_patches(CPU_BATCH, CPU_PATCHES, QUICKSTART.patch_len)
    ts, params = quickstart_step(compiled, x)
    if compiled:
        start = time.perf_counter()
        ts.train_step([x], LR)  # pays the compile outside the timed rounds
        benchmark.extra_info["compile_s"] = time.perf_counter() - start
    benchmark.pedantic(ts.train_step, args=([x], LR), rounds=20, warmup_rounds=3)
    flops = model_flops_per_step(QUICKSTART, params, CPU_BATCH, CPU_PATCHES)
    name = "cpu_compiled" if compiled else "cpu_eager"
    record(benchmark, name, samples=CPU_BATCH, patches=CPU_PATCHES, flops=flops)


def test_cpu_interleaved(benchmark) -> None:
    """The three CPU steps and the matmul timed round-robin, for ratios robust to shared cores.

    The cores here are shared with other work whose load changes over seconds, so the separate
    tests above can each land in a different regime. Interleaving puts every variant under the
    same conditions; the per-variant minimum (contention only ever adds time) and median are
    both recorded, with ratios of each.
    """
    x = unit_power_patches(CPU_BATCH, CPU_PATCHES, QUICKSTART.patch_len)
    peer, params = plain_loop(QUICKSTART, x)
    eager, _ = quickstart_step(False, x)
    compiled, _ = quickstart_step(True, x)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    variants = {
        "matmul": lambda: torch.mm(a, b),
        "plain_peer": peer,
        "eager": lambda: eager.train_step([x], LR),
        "compiled": lambda: compiled.train_step([x], LR),
    }
    for fn in variants.values():  # compile and warm every variant before timing any
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    rounds = [0]

    def one_round() -> None:
        shift = rounds[0] % len(names)  # rotate the order so no variant always runs first
        rounds[0] += 1
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)

    benchmark.pedantic(one_round, rounds=15, warmup_rounds=0)
    if benchmark.stats is None:
        return
    flops = model_flops_per_step(QUICKSTART, params, CPU_BATCH, CPU_PATCHES)
    info: dict[str, float] = {}
    for stat, pick in (("min", min), ("median", lambda v: sorted(v)[len(v) // 2])):
        sec = {name: pick(v) for name, v in times.items()}
        ceiling = 2 * n**3 / sec["matmul"]
        info[f"{stat}_matmul_gflop_per_s"] = ceiling / 1e9
        for name in ("plain_peer", "eager", "compiled"):
            info[f"{stat}_{name}_samples_per_s"] = CPU_BATCH / sec[name]
            info[f"{stat}_{name}_fraction_of_matmul"] = flops / sec[name] / ceiling
        info[f"{stat}_compiled_over_eager"] = sec["eager"] / sec["compiled"]
        info[f"{stat}_compiled_over_plain_peer"] = sec["plain_peer"] / sec["compiled"]
        info[f"{stat}_eager_over_plain_peer"] = sec["plain_peer"] / sec["eager"]
    benchmark.extra_info.update(info)
    RESULTS["cpu_interleaved"] = info


# --------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
def test_cuda_matmul_ceiling(benchmark) -> None:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)

    def mm() -> None:
        torch.mm(a, b)
        torch.cuda.synchronize()

    benchmark.pedantic(mm, rounds=20, warmup_rounds=3)
    seconds = median_seconds(benchmark)
    if seconds is not None:
        RESULTS["cuda_matmul"] = {"gflop_per_s": 2 * n**3 / seconds / 1e9}
        benchmark.extra_info.update(RESULTS["cuda_matmul"])
        benchmark.extra_info["device"] = torch.cuda.get_device_name()


@contextmanager
def determinism(on: bool):
    """``training.deterministic`` on (what the trainer's preflight configures) or off, for one
    test; every process-wide setting it touches is restored after."""
    import torch._inductor.config as inductor

    cudnn = torch.backends.cudnn
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        inductor.deterministic,
        torch.utils.deterministic.fill_uninitialized_memory,
        cudnn.deterministic,
        cudnn.benchmark,
        torch.backends.cuda.cudnn_sdp_enabled(),
    )
    if on:
        from iqtrain.train.determinism import configure

        configure("cuda", True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        inductor.deterministic = saved[2]
        torch.utils.deterministic.fill_uninitialized_memory = saved[3]
        cudnn.deterministic, cudnn.benchmark = saved[4], saved[5]
        torch.backends.cuda.enable_cudnn_sdp(saved[6])


def _timed_step(benchmark, ts: TrainStep, x: Tensor, rounds: int) -> float:
    """Times ``ts``'s step on ``x`` after a first step (the compile, if any); the last loss."""

    def step() -> float:
        loss = ts.train_step([x], LR).loss
        torch.cuda.synchronize()  # the optimizer update is asynchronous after the finite check
        return loss

    start = time.perf_counter()
    step()
    benchmark.extra_info["first_step_s"] = time.perf_counter() - start
    return benchmark.pedantic(step, rounds=rounds, warmup_rounds=3)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("compiled", "deterministic"),
    [(True, True), (True, False), (False, True)],
    ids=["compiled-deterministic", "compiled-nondeterministic", "eager-deterministic"],
)
def test_cuda_study_step(benchmark, compiled: bool, deterministic: bool) -> None:
    cfg = load_config(QUICKSTART_TOML, STUDY_SETS)
    patches = cfg.data.seq_patches
    x = unit_power_patches(STUDY_BATCH, patches, cfg.model.patch_len, device="cuda")
    with determinism(deterministic):
        torch.manual_seed(0)
        model = IQTransformer(cfg.model, 0)
        params = model.param_counts()[0]
        ts = TrainStep(model, cfg.optimizer, device="cuda", precision="bf16", compile=compiled)
        loss = _timed_step(benchmark, ts, x, rounds=30)
    name = "cuda_study_" + ("compiled" if compiled else "eager")
    name += "_deterministic" if deterministic else "_nondeterministic"
    flops = model_flops_per_step(cfg.model, params, STUDY_BATCH, patches)
    record(benchmark, name, samples=STUDY_BATCH, patches=patches, flops=flops)
    benchmark.extra_info["variant"] = name
    assert math.isfinite(loss)


@pytest.mark.gpu
def test_cuda_bf16_train_step_50m(benchmark) -> None:
    x = unit_power_patches(CUDA_BATCH, CUDA_PATCHES, CUDA_MODEL.patch_len, device="cuda")
    torch.manual_seed(0)
    model = IQTransformer(CUDA_MODEL)
    params = model.param_counts()[0]
    ts = TrainStep(model, OptimizerConfig(lr=LR), device="cuda", precision="bf16", compile=False)
    benchmark.extra_info["params"] = params
    _timed_step(benchmark, ts, x, rounds=20)
    flops = model_flops_per_step(CUDA_MODEL, params, CUDA_BATCH, CUDA_PATCHES)
    record(benchmark, "cuda_eager_50m", samples=CUDA_BATCH, patches=CUDA_PATCHES, flops=flops)
    # Sanity: the loss of the measured model is finite and near its starting NMSE.
    with torch.no_grad():
        assert math.isfinite(next_patch_loss(ts.model(x[:2]), x[:2])[0].item())

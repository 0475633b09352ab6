"""The whole compiled training loop against its peers, in one run (CPU, fp32, one thread).

``run_attempt`` trains a small model (dim 128, 4 layers, 4 heads, patch_len 8, 64
patches, batch 16) on synthetic recordings with ``training.compile = true``, validating and
checkpointing only at the end. Two peers run in the same process, interleaved with the loop:

(a) a bare compiled ``TrainStep`` of the same model config, seed and optimizer (sharing the
    loop's compiled graphs) on a batch prepared before the run: the loop's overhead is
    everything else it does per step (loader, prepare, schedule, records, progress, checks).
    Target: <= 3%.
(b) a plain ``torch.compile``d PyTorch training loop written here the way nanoGPT's train.py
    is (numpy memmap batches at random offsets, a GPT with LayerNorm, learned positions, GELU
    MLP and ``is_causal`` SDPA, AdamW with decay groups, ``clip_grad_norm_``), of similar size.
    The architectures differ, so the comparison is per model FLOP: ours from
    ``IQTransformer.train_flops_per_patch``, the peer's counted independently with
    ``torch.utils.flop_counter`` on its forward (x3, the same convention). Target: >= 1.1x.

How the loop is timed. Every ``MetricWriter.write`` of a train record is wrapped: the time
between two consecutive train records is one full loop iteration (record, progress, checks,
loader, prepare, step), measured from the outside without touching the loop's code. After every
``BLOCK`` loop steps the wrapper runs ``BLOCK`` steps of peer (a), then ``BLOCK`` iterations of
peer (b), timed one by one; that time is excluded from the loop iteration it sits in. Each
variant is measured in its own steady state, as in training (a step follows a step of the same
model; the first of each run, which follows another model's work with cold caches, is
dropped), and the three run within seconds of each other. Ratios are the median over blocks of
per-block ratios of medians, robust to the 10x load swings of shared cores; ratios of the
minima (contention only ever adds time) are reported too. The loop's own ``train_step`` calls
are timed as well: the time the loop spends outside them, as a fraction of them, is its
overhead measured within one iteration, immune to load swings (though blind to the loop
slowing the step itself, which the ratio to peer (a) would show). The first ``WARMUP`` steps
(allocator, page cache) are not timed.

One thread (``torch.set_num_threads(1)``): at two threads on shared cores every parallel region
stalls whenever the other core is busy elsewhere, which measures the neighbours, not the code.

Measured on the shared 2-core AMD EPYC VM (torch 2.15), heavily loaded (load 4-7): with
inductor's C++ wrapper on CPU (step.py), 5 runs: per model FLOP against the nanoGPT-style loop
1.036-1.146x, median 1.111x (3 interleaved runs without it: median 1.033x); loop / bare
TrainStep 0.97-1.02x. By per-op minimum self time over 12-20 profiled steps (contention only
adds time): matmuls (``aten::mm``) 68% of our step and 63% of the peer's, SDPA 12% / 14%; the
rest is where we differ: fused AdamW + norm 1.6 ms against 5.5 ms, SwiGLU 7.4 ms against GELU
7.9 ms, rope 2.5 ms (the peer has none), the compiled graph's wrapper 3.6 ms (7.2 ms with the
Python wrapper). The run-to-run spread here is +-5-7%, so a 1.1x target sits inside the noise
around a true ~1.08-1.11x; state targets on the median of >= 3 runs.

    pytest bench/test_loop.py --benchmark-only
"""

from __future__ import annotations

import glob
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from bench_helpers import (
    BATCH,
    BLOCK,
    DIM,
    HEADS,
    LAYERS,
    LR,
    PATCH_LEN,
    SEQ_PATCHES,
    STEPS,
    WARMUP,
    WINDOW,
    loop_tables,
    median,
)
from torch import Tensor, nn

import iqtrain.evidence.metrics
from iqtrain.config.schema import build_config
from iqtrain.data.sources import ensure_synthetic
from iqtrain.model.transformer import IQTransformer
from iqtrain.train.attempt import run_attempt
from iqtrain.train.step import TrainStep

THREADS = 1


# --------------------------------------------------------------------------- the nanoGPT peer


class CausalSelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(DIM, 3 * DIM, bias=False)
        self.c_proj = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(x).split(DIM, dim=2)
        q = q.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        k = k.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        v = v.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM, bias=False)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(DIM, bias=False)
        self.c_fc = nn.Linear(DIM, 4 * DIM, bias=False)
        self.mlp_proj = nn.Linear(4 * DIM, DIM, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class PeerGPT(nn.Module):
    """nanoGPT's GPT with a patch embedding and an MSE head instead of tokens and softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Linear(2 * PATCH_LEN, DIM)
        self.wpe = nn.Embedding(SEQ_PATCHES, DIM)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM, bias=False)
        self.head = nn.Linear(DIM, 2 * PATCH_LEN)
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, raw: Tensor) -> Tensor:
        # Window power normalisation and patching, inside the compiled graph.
        x = raw.float()
        x = x * torch.rsqrt(x.square().sum(dim=(1, 2), keepdim=True) / x.shape[1] + 1e-12)
        x = x.view(x.shape[0], SEQ_PATCHES, 2 * PATCH_LEN)
        pos = torch.arange(SEQ_PATCHES, device=x.device)
        h = self.wte(x) + self.wpe(pos)
        for block in self.h:
            h = block(h)
        pred = self.head(self.ln_f(h))
        return F.mse_loss(pred[:, :-1], x[:, 1:]) * 2


class PeerLoop:
    """One nanoGPT-style iteration per call: get_batch, forward, backward, clip, step."""

    def __init__(self, data_path: str) -> None:
        torch.manual_seed(0)
        self.model = PeerGPT()
        self.data_path = data_path
        self.rng = np.random.default_rng(0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        # nanoGPT: fused AdamW only when CUDA is available; on CPU torch's default.
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
            lr=LR,
            betas=(0.9, 0.95),
        )
        self.compiled = torch.compile(self.model)
        self.iter = 0

    def get_batch(self) -> Tensor:
        # nanoGPT recreates the memmap every batch (to avoid a memory leak) and samples random
        # offsets; here in I/Q samples, ci16 interleaved.
        data = np.memmap(self.data_path, dtype=np.int16, mode="r")
        samples = len(data) // 2
        ix = self.rng.integers(0, samples - WINDOW, BATCH)
        x = np.stack([data[2 * i : 2 * (i + WINDOW)] for i in ix]).reshape(BATCH, WINDOW, 2)
        return torch.from_numpy(x)

    def __call__(self) -> None:
        x = self.get_batch()
        loss = self.compiled(x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.iter += 1
        if self.iter % 10 == 0:  # nanoGPT reads the loss back at its log interval
            assert math.isfinite(loss.item())

    def train_flops_per_step(self) -> int:
        """Independent count: torch's flop counter on the eager forward, x3 (fwd + bwd)."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter, torch.no_grad():
            self.model(self.get_batch())
        return 3 * counter.get_total_flops()


# --------------------------------------------------------------------------- the benchmark


def test_compiled_loop_vs_bare_step_and_nanogpt(benchmark, bench_summary, tmp_path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        _run(benchmark, bench_summary, tmp_path)
    finally:
        torch.set_num_threads(threads)


def _run(benchmark, bench_summary, tmp_path: Path) -> None:
    config = build_config(loop_tables(tmp_path / "run", tmp_path / "synth"))

    # Peer (a): a TrainStep of the same model config, seed and optimizer as the loop's, on one
    # batch prepared up front. Dynamo's cache is per function, not per instance, so the loop
    # reuses the graphs compiled here rather than compiling its own.
    torch.manual_seed(config.run.seed)
    bare = TrainStep(
        IQTransformer(config.model), config.optimizer, device="cpu", precision="fp32", compile=True
    )
    raw = np.random.default_rng(1).integers(-3000, 3000, (BATCH, WINDOW, 2), np.int16)
    bare_batch, _ = bare.prepare(raw, PATCH_LEN)
    # Peer (b): the nanoGPT-style loop on the first synthetic training recording.
    train_globs, _ = ensure_synthetic(config.data.synthetic)
    data_path = sorted(glob.glob(train_globs[0]))[0].removesuffix(".sigmf-meta") + ".sigmf-data"
    peer = PeerLoop(data_path)
    t = time.perf_counter()
    for _ in range(3):  # compile and warm both peers before anything is timed
        bare.train_step([bare_batch], LR)
        peer()
    peers_compile_s = time.perf_counter() - t

    entries: dict[int, float] = {}  # step -> perf_counter at its train record's write
    excluded: dict[int, float] = {}  # step -> seconds of peer work inside its write
    in_loop: dict[int, float] = {}  # step -> seconds of the loop's own train_step call
    bare_s: list[list[float]] = []  # per block, seconds per bare step
    peer_s: list[list[float]] = []  # per block, seconds per peer iteration
    orig_step = TrainStep.train_step
    orig_write = iqtrain.evidence.metrics.MetricWriter.write

    def train_step(self, microbatches, lr, **kwargs):
        t = time.perf_counter()
        result = orig_step(self, microbatches, lr, **kwargs)
        if self is not bare:
            in_loop[len(in_loop) + 1] = time.perf_counter() - t  # steps count from 1
        return result

    def timed(fn) -> list[float]:
        times = []
        for _ in range(BLOCK):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return times[1:]  # the first follows another model's work: cold caches

    def write(self, record: dict) -> None:
        entry = time.perf_counter()
        orig_write(self, record)
        if record.get("kind") != "train":
            return
        step = record["step"]
        written = time.perf_counter()
        if step > WARMUP and (step - WARMUP) % BLOCK == 0 and step < STEPS:
            bare_s.append(timed(lambda: bare.train_step([bare_batch], LR)))
            peer_s.append(timed(peer))
        entries[step] = entry
        excluded[step] = time.perf_counter() - written

    torch._dynamo.utils.counters.clear()
    TrainStep.train_step = train_step
    iqtrain.evidence.metrics.MetricWriter.write = write
    try:
        result = benchmark.pedantic(
            run_attempt, args=(config,), rounds=1, iterations=1, warmup_rounds=0
        )
    finally:
        TrainStep.train_step = orig_step
        iqtrain.evidence.metrics.MetricWriter.write = orig_write
    assert result.final_step == STEPS
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]

    # Loop iteration s + 1 runs from record s's write to record s + 1's, less the peer work
    # done inside record s's write; its train_step call is the (s + 1)-th. Block b: the loop
    # iterations between peer blocks b - 1 and b but the first (cold, after the peers), then
    # peer block b.
    loop: list[list[float]] = []
    outside: list[float] = []
    for b in range(len(bare_s)):
        first = WARMUP + b * BLOCK  # the record after which block b's loop steps run
        block = []
        for s in range(first + 1, first + BLOCK):
            block.append(entries[s + 1] - entries[s] - excluded[s])
            outside.append((block[-1] - in_loop[s + 1]) / in_loop[s + 1])
        loop.append(block)
    assert len(loop) == (STEPS - WARMUP - 1) // BLOCK

    ours_flops = bare.model.train_flops_per_patch(SEQ_PATCHES) * BATCH * SEQ_PATCHES
    peer_flops = peer.train_flops_per_step()

    med = statistics.median
    blocks = list(zip(loop, bare_s, peer_s, strict=True))
    overhead = med(med(lo) / med(b) for lo, b, _ in blocks)
    outside_frac = med(outside)
    per_flop = med((ours_flops / med(lo)) / (peer_flops / med(p)) for lo, _, p in blocks)
    series = {"loop": loop, "bare": bare_s, "peer": peer_s}
    mid = {k: med(x for blk in v for x in blk) for k, v in series.items()}
    low = {k: min(x for blk in v for x in blk) for k, v in series.items()}
    info = {
        "blocks": len(blocks),
        "graphs_compiled_by_loop": graphs,
        "peers_compile_and_warmup_s": peers_compile_s,
        "attempt_wall_s": median(benchmark),
        "loop_step_median_s": mid["loop"],
        "bare_step_median_s": mid["bare"],
        "peer_step_median_s": mid["peer"],
        "loop_over_bare_median_of_block_ratios": overhead,
        "loop_over_bare_ratio_of_minima": low["loop"] / low["bare"],
        "loop_outside_step_over_step_median": outside_frac,
        "ours_gflop_per_step": ours_flops / 1e9,
        "peer_gflop_per_step": peer_flops / 1e9,
        "ours_loop_gflop_per_s": ours_flops / mid["loop"] / 1e9,
        "ours_bare_gflop_per_s": ours_flops / mid["bare"] / 1e9,
        "peer_gflop_per_s": peer_flops / mid["peer"] / 1e9,
        "per_flop_vs_peer_median_of_block_ratios": per_flop,
        "per_flop_vs_peer_ratio_of_minima": (ours_flops / low["loop"]) / (peer_flops / low["peer"]),
    }
    benchmark.extra_info.update(info)
    bench_summary(
        f"loop (compiled, cpu fp32, {THREADS} thread, {len(blocks)} blocks of {BLOCK}): "
        f"loop / bare TrainStep = {overhead:.3f}x (target <= 1.03x; minima "
        f"{info['loop_over_bare_ratio_of_minima']:.3f}x); time outside train_step = "
        f"{100 * outside_frac:.2f}% of it; "
        f"loop {mid['loop'] * 1e3:.1f} ms, bare {mid['bare'] * 1e3:.1f} ms per step"
    )
    bench_summary(
        f"loop vs nanoGPT-style compiled loop, per model FLOP: {per_flop:.3f}x "
        f"(target >= 1.1x; minima {info['per_flop_vs_peer_ratio_of_minima']:.3f}x); "
        f"ours {info['ours_loop_gflop_per_s']:.1f} GFLOP/s ({ours_flops / 1e9:.2f} GFLOP/step), "
        f"peer {info['peer_gflop_per_s']:.1f} GFLOP/s ({peer_flops / 1e9:.2f} GFLOP/step, "
        f"{mid['peer'] * 1e3:.1f} ms); {graphs} graphs compiled by the loop"
    )

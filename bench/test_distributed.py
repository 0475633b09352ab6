"""Data-parallel throughput on this machine: 2 ranks of 1 thread against 1 process of 2 threads.

Both train the same compiled model (dim 128, 4 layers, 4 heads, patch_len 8, 64 patches,
global batch 16) on the same synthetic recordings for ``STEPS`` steps, as subprocesses exactly as
a user launches them (``torchrun --standalone --nproc-per-node 2 -m iqtrain run`` with
``OMP_NUM_THREADS=1``; ``python -m iqtrain run`` with ``OMP_NUM_THREADS=2``). Throughput is read
from the attempt's own train records (``samples_per_s`` x patches per window, the loop's
wall-clock per step including the loader and the gradient all-reduce), as the median over the
steps after ``WARMUP``. The two variants alternate for ``ROUNDS`` rounds so that load swings on
the shared cores hit both; the ratio is reported per round and as the ratio of the medians of
all rounds. A ratio below 1 is what the two ranks pay for communication (gloo all-reduce of every
gradient through the loopback, once per step) and for running two Python loops on two cores;
above 1, what one process loses to intra-op threading of small kernels.

Measured on the shared 2-core AMD EPYC VM (torch 2.15), 2026-11-30, two runs of 2 rounds:
0.823x and 0.786x (rounds 0.861, 0.791; 0.711, 0.867); about 10.7k against 13.0k patches/s.
FSDP2 against DDP, both 2 ranks (``test_fsdp_vs_ddp_on_two_ranks``): 0.578x (rounds 0.592,
0.565) with the last block kept gathered for the backward; 0.526x before that change, in a run
that shared the cores with other work.

    pytest bench/test_distributed.py --benchmark-only -s
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench_helpers import SEQ_PATCHES, loop_tables

from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics

STEPS = 40
WARMUP = 8
ROUNDS = 2


def _tables(run_dir: Path, cache: Path) -> dict:
    """bench/test_loop.py's compiled model and data, for ``STEPS`` steps."""
    tables = loop_tables(run_dir, cache)
    tables["training"].update(
        max_steps=STEPS, eval_every=10 * STEPS, checkpoint_every=10 * STEPS, log_every=10 * STEPS
    )
    return tables


def _env(threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _patches_per_s(run_dir: Path, cmd: list[str], threads: int) -> float:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(threads), timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    attempt = sorted((run_dir / "attempts").iterdir())[-1]
    train = [r for r in read_metrics(attempt / "metrics.jsonl") if r["kind"] == "train"]
    rates = [r["samples_per_s"] * (SEQ_PATCHES - 1) for r in train[WARMUP:]]
    return statistics.median(rates)


def _command(tmp_path: Path, name: str, nproc: int, **training) -> tuple[Path, list[str]]:
    """(run dir, command) of variant ``name``: one process, or ``nproc`` ranks under torchrun."""
    run_dir = tmp_path / name
    tables = _tables(run_dir, tmp_path / "cache")
    tables["training"].update(training)
    cfg = tmp_path / f"{name}.toml"
    cfg.write_text(dumps_toml(tables))
    cmd = [sys.executable, "-m"]
    if nproc > 1:
        cmd += ["torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), "-m"]
    return run_dir, [*cmd, "iqtrain", "run", os.fspath(cfg)]


def test_two_ranks_vs_one_process_of_two_threads(benchmark, bench_summary, tmp_path) -> None:
    runs, cmds = {}, {}
    runs["one"], cmds["one"] = _command(tmp_path, "one", 1)
    runs["two"], cmds["two"] = _command(tmp_path, "two", 2)
    one, two = cmds["one"], cmds["two"]
    rates: dict[str, list[float]] = {"one": [], "two": []}

    def round_trip() -> None:
        rates["one"].append(_patches_per_s(runs["one"], one, threads=2))
        rates["two"].append(_patches_per_s(runs["two"], two, threads=1))

    benchmark.pedantic(round_trip, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    per_round = [b / a for a, b in zip(rates["one"], rates["two"], strict=True)]
    ratio = statistics.median(rates["two"]) / statistics.median(rates["one"])
    benchmark.extra_info.update(
        {
            "patches_per_s_one_process_2_threads": rates["one"],
            "patches_per_s_two_ranks_1_thread": rates["two"],
            "two_ranks_over_one_process": ratio,
            "per_round": per_round,
        }
    )
    bench_summary(
        f"data parallel: 2 ranks x 1 thread / 1 process x 2 threads = {ratio:.3f}x patches/s "
        f"(per round {', '.join(f'{r:.3f}' for r in per_round)}; "
        f"one {statistics.median(rates['one']):.0f}, two {statistics.median(rates['two']):.0f} "
        f"patches/s)"
    )


def test_fsdp_vs_ddp_on_two_ranks(benchmark, bench_summary, tmp_path) -> None:
    """training.parallel = "fsdp" against "ddp", both 2 ranks of 1 thread, alternating rounds:
    what sharding costs here (an all-gather of every block's parameters in the forward and
    again in the backward, a reduce-scatter instead of an all-reduce, and per-block compiled
    graphs with eager hooks between them instead of one graph)."""
    runs, cmds = {}, {}
    for name in ("ddp", "fsdp"):
        runs[name], cmds[name] = _command(tmp_path, name, 2, parallel=name)
    rates: dict[str, list[float]] = {"ddp": [], "fsdp": []}

    def round_trip() -> None:
        for name in ("ddp", "fsdp"):
            rates[name].append(_patches_per_s(runs[name], cmds[name], threads=1))

    benchmark.pedantic(round_trip, rounds=ROUNDS, iterations=1, warmup_rounds=0)
    per_round = [b / a for a, b in zip(rates["ddp"], rates["fsdp"], strict=True)]
    ratio = statistics.median(rates["fsdp"]) / statistics.median(rates["ddp"])
    benchmark.extra_info.update(
        {"patches_per_s": rates, "fsdp_over_ddp": ratio, "per_round": per_round}
    )
    bench_summary(
        f"sharding: FSDP2 / DDP on 2 ranks x 1 thread = {ratio:.3f}x patches/s "
        f"(per round {', '.join(f'{r:.3f}' for r in per_round)})"
    )

"""What the benchmarks share: the median of a finished benchmark, and the loop benchmark's model
and config (the data-parallel bench runs the same one on two ranks)."""

from __future__ import annotations

import os
from pathlib import Path

STEPS = 69
WARMUP = 8
BLOCK = 5  # loop steps, then as many bare steps, then as many peer iterations
PATCH_LEN, SEQ_PATCHES, BATCH = 8, 64, 16
DIM, LAYERS, HEADS = 128, 4, 4
WINDOW = PATCH_LEN * SEQ_PATCHES
LR = 1e-3


def median(benchmark) -> float | None:
    """Median seconds per round of a finished benchmark (None under --benchmark-disable)."""
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else stats.stats.median


def loop_tables(run_dir: Path, cache: Path) -> dict:
    return {
        "run": {"dir": os.fspath(run_dir), "seed": 0},
        "data": {
            "patch_len": PATCH_LEN,
            "seq_patches": SEQ_PATCHES,
            "batch_size": BATCH,
            "val_batch_size": 64,
            "synthetic": {
                "train_recordings": 2,
                "val_recordings": 1,
                "samples": 1 << 16,  # 128 windows per recording
                "cache_dir": os.fspath(cache),
            },
        },
        "model": {"dim": DIM, "layers": LAYERS, "heads": HEADS},
        "optimizer": {"lr": LR, "min_lr": LR / 10},
        "schedule": {"kind": "wsd", "warmup_steps": 4, "decay_steps": 8},
        "training": {
            "device": "cpu",
            "precision": "fp32",
            "compile": True,
            "max_steps": STEPS,
            "eval_every": 10 * STEPS,  # only the final step validates and checkpoints
            "checkpoint_every": 10 * STEPS,
            "keep_last": 1,
            "log_every": 10 * STEPS,
        },
    }

"""Fault injection: kill -9 at varied points of a tiny run, then verify and resume exactly.

Bounded: a fixed number of kills at seeded random delays (about a minute on 2 cores). With
checkpoint_every=1 and keep_last=1 every step writes one checkpoint and prunes another, so the
kills land in writes, renames and prunes alike.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_attempt import tiny_tables

from iqtrain.checkpoint import list_checkpoints
from iqtrain.config import dumps_toml
from iqtrain.lineage import attempt_status, check_attempt, checkpoint_problems
from iqtrain.metrics import read_metrics, strip_timing

KILLS = 6
MAX_STEPS = 60


def _env() -> dict[str, str]:
    # One thread everywhere: the killed chain and the reference must run the same kernels.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "iqtrain.cli", *map(str, args)]


def _attempts(attempts: Path) -> list[Path]:
    """Claimed attempts (a kill during a claim may leave a ``.tmp-`` directory: not one)."""
    return sorted(p for p in attempts.iterdir() if p.name.isdigit()) if attempts.is_dir() else []


def _newest_resumable(attempts: Path) -> Path | None:
    for attempt in reversed(_attempts(attempts)):
        if any(not checkpoint_problems(c) for c in list_checkpoints(attempt / "checkpoints")):
            return attempt
    return None


def _final_weights(attempt: Path) -> dict[str, torch.Tensor]:
    return load_file(attempt / "checkpoints" / f"step_{MAX_STEPS:08d}" / "model.safetensors")


def test_repeated_kill_9_leaves_verifiable_attempts_that_resume_exactly(tmp_path):
    training = {"max_steps": MAX_STEPS, "checkpoint_every": 1, "keep_last": 1, "eval_every": 7}
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(dumps_toml(tiny_tables(tmp_path / "run", tmp_path / "cache", **training)))
    ref = subprocess.run(
        _cli("run", cfg, "--set", f"run.dir='{tmp_path / 'ref'}'"),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert ref.returncode == 0, ref.stderr
    reference = tmp_path / "ref" / "attempts" / "0001"

    rng = random.Random(8)
    attempts = tmp_path / "run" / "attempts"
    killed, finished = [], None
    for _ in range(KILLS):
        parent = _newest_resumable(attempts)
        args = ("run", cfg) if parent is None else ("resume", "--attempt", parent)
        before = set(_attempts(attempts))
        proc = subprocess.Popen(
            _cli(*args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env()
        )
        # Wait for the new attempt's first record, then kill at a random point after it.
        deadline = time.monotonic() + 120
        new = None
        while proc.poll() is None and time.monotonic() < deadline:
            fresh = set(_attempts(attempts)) - before
            if fresh:
                new = fresh.pop()
                metrics = new / "metrics.jsonl"
                if metrics.exists() and metrics.stat().st_size > 0:
                    break
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.25))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            killed.append(new)
        _, err = proc.communicate(timeout=60)
        if proc.returncode == 0:
            finished = new
            break
        assert proc.returncode == -signal.SIGKILL, err.decode()
        # After every kill, every attempt verifies (leftovers are notes) and reads as crashed.
        for attempt in _attempts(attempts):
            check = check_attempt(attempt)
            assert check.problems == [], (attempt, check.problems)
        if new is not None:
            assert attempt_status(new) == "crashed"

    assert len(killed) >= 3, "the kills must land while the runs are running"
    if finished is None:
        parent = _newest_resumable(attempts)
        assert parent is not None
        done = subprocess.run(
            _cli("resume", "--attempt", parent), capture_output=True, text=True, env=_env()
        )
        assert done.returncode == 0, done.stderr
        finished = _attempts(attempts)[-1]
    assert check_attempt(finished).problems == []
    assert attempt_status(finished) == "completed"
    assert strip_timing(read_metrics(finished / "metrics.jsonl")) == strip_timing(
        read_metrics(reference / "metrics.jsonl")
    )
    want, got = _final_weights(reference), _final_weights(finished)
    assert want.keys() == got.keys()
    for k in want:
        assert torch.equal(want[k], got[k]), k


pytestmark = pytest.mark.usefixtures("one_torch_thread")

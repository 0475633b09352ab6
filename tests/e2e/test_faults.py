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
from helpers import tiny_tables
from safetensors.torch import load_file

from iqtrain.checkpoint.files import list_checkpoints
from iqtrain.config.schema import dumps_toml
from iqtrain.data.synth import synthesize
from iqtrain.evidence.lock import attempt_status
from iqtrain.evidence.manifest import checkpoint_problems
from iqtrain.evidence.metrics import read_metrics, strip_timing
from iqtrain.evidence.verify import check_attempt

pytestmark = pytest.mark.slow

KILLS = 6
MAX_STEPS = 60


def _env() -> dict[str, str]:
    # One thread everywhere: the killed chain and the reference must run the same kernels.
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "iqtrain.cli.main", *map(str, args)]


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


@pytest.mark.parametrize("change", ["truncate", "grow"])
def test_data_changing_length_mid_run_is_exit_1_naming_the_file_and_resumes_once_restored(
    tmp_path, change
):
    data = tmp_path / "data"
    synthesize(data / "train", recordings=2, samples=65536, seed=1)
    synthesize(data / "val", recordings=1, samples=4096, seed=2)
    training = {"max_steps": 400, "checkpoint_every": 5, "keep_last": 1, "eval_every": 200}
    tables = tiny_tables(tmp_path / "run", tmp_path / "unused", **training)
    tables["data"]["train"] = [os.fspath(data / "train" / "*.sigmf-meta")]
    tables["data"]["val"] = [os.fspath(data / "val" / "*.sigmf-meta")]
    tables["data"]["prefetch"] = 2
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(dumps_toml(tables))
    victim = sorted((data / "train").glob("*.sigmf-data"))[0]
    original = victim.read_bytes()

    proc = subprocess.Popen(
        _cli("run", cfg), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env()
    )
    attempt = tmp_path / "run" / "attempts" / "0001"
    ckpts = attempt / "checkpoints"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if list_checkpoints(ckpts):
            break
        time.sleep(0.005)
    with open(victim, "r+b") as f:  # in place, as a failing copy or an appending writer would
        if change == "truncate":
            f.truncate(len(original) // 4)
        else:
            f.seek(0, 2)
            f.write(b"\0" * 4096)
    _, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("iqtrain: error:")]
    assert len(lines) == 1 and victim.name in lines[0], err
    assert attempt_status(attempt) == "failed"
    assert check_attempt(attempt).problems == []

    victim.write_bytes(original)
    resumed = subprocess.run(
        _cli("resume", "--attempt", attempt),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    child = tmp_path / "run" / "attempts" / "0002"
    assert check_attempt(child).problems == [] and attempt_status(child) == "completed"

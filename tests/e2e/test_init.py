"""[init] from as a user runs it: an attempt started from another's weights is killed with
SIGKILL and resumed exactly as any attempt; under torchrun every rank starts from the same
verified weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import kill_after_checkpoints, tiny_tables
from safetensors.torch import load_file

from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing
from iqtrain.evidence.verify import check_attempt

MAX_STEPS = 40
TIMEOUT = 300


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "iqtrain", *map(str, args)]


def _run(*args) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cli(*args), capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _final(attempt, step=MAX_STEPS) -> dict[str, torch.Tensor]:
    return load_file(attempt / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A trained source attempt and the config of attempts initialised from it."""
    root = tmp_path_factory.mktemp("init")
    src = root / "src.toml"
    src.write_text(dumps_toml(tiny_tables(root / "src", root / "cache", max_steps=6)))
    _run("run", src)
    tables = tiny_tables(
        root / "ft", root / "cache", max_steps=MAX_STEPS, checkpoint_every=1, eval_every=10
    )
    tables["init"] = {"from": os.fspath(root / "src" / "attempts" / "0001"), "which": "latest"}
    cfg = root / "ft.toml"
    cfg.write_text(dumps_toml(tables))
    return root, cfg


@pytest.mark.slow
def test_an_initialised_attempt_killed_with_sigkill_resumes_exactly(source):
    root, cfg = source
    _run("run", cfg, "--set", f"run.dir='{root / 'ref'}'")
    reference = root / "ref" / "attempts" / "0001"
    attempts = root / "ft" / "attempts"
    kill_after_checkpoints(_cli("run", cfg), _env(), attempts / "0001" / "checkpoints", 1)
    killed = attempts / "0001"
    assert check_attempt(killed).problems == []
    _run("resume", "--attempt", killed)
    child = attempts / "0002"
    assert check_attempt(child).problems == []
    info = json.loads((child / "attempt.json").read_text())
    assert info["init"] == json.loads((reference / "attempt.json").read_text())["init"]
    assert info["parent"]["attempt"] == os.fspath(killed.resolve())
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(reference / "metrics.jsonl")
    )
    want, got = _final(reference), _final(child)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.distributed
def test_every_rank_starts_from_the_same_verified_weights(source):
    root, cfg = source
    steps = ["--set", "training.max_steps=6", "--set", "training.eval_every=3"]
    _run("run", cfg, "--set", f"run.dir='{root / 'one'}'", *steps)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "iqtrain", "run", os.fspath(cfg), "--set", f"run.dir='{root / 'two'}'", *steps]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    one, two = root / "one" / "attempts" / "0001", root / "two" / "attempts" / "0001"
    assert check_attempt(two).problems == []
    info = json.loads((two / "attempt.json").read_text())
    assert info["world"]["size"] == 2
    assert info["init"] == json.loads((one / "attempt.json").read_text())["init"]
    # The same start and the same global batches: the same losses up to summation order.
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in a] == [(r["kind"], r["step"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4), (ra, rb)


@pytest.mark.distributed
@pytest.mark.exit_path
def test_a_source_that_fails_verification_is_exit_2_on_every_rank_printed_once(source, tmp_path):
    root, cfg = source
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "iqtrain", "run", os.fspath(cfg), "--set", f"run.dir='{tmp_path / 'run'}'"]
    cmd += ["--set", f"init.from='{tmp_path / 'nothing'}'"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode != 0 and proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-4000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and lines[0].startswith("iqtrain: error: init.from: "), lines
    assert not (tmp_path / "run").exists()

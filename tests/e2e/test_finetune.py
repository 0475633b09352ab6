"""Fine-tuning as a user runs it: a classifier started from a pretrained attempt's trunk,
killed with SIGKILL and resumed exactly, verified, reported and run on two ranks; and the
inputs it refuses in one line before anything exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from helpers import kill_after_checkpoints, tensorboard_scalars, tiny_tables, write_bursts
from safetensors.torch import load_file

from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing
from iqtrain.evidence.verify import check_attempt

MAX_STEPS = 24
TIMEOUT = 300


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _cli(*args) -> list[str]:
    return [sys.executable, "-m", "iqtrain", *map(str, args)]


def _run(*args, code: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cli(*args), capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode == code, proc.stderr[-4000:]
    return proc


def _weights(attempt, step) -> dict[str, torch.Tensor]:
    return load_file(attempt / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


def _classify_tables(root, name, **training) -> dict:
    tables = tiny_tables(root / name, root / "cache", **training)
    tables["model"]["objective"] = "classify"
    return tables


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pretrained attempt and the config of a fine-tune from it."""
    root = tmp_path_factory.mktemp("finetune")
    src = root / "src.toml"
    src.write_text(dumps_toml(tiny_tables(root / "src", root / "cache", max_steps=6)))
    _run("run", src)
    tables = _classify_tables(
        root, "ft", max_steps=MAX_STEPS, checkpoint_every=1, eval_every=8, keep_last=0
    )
    tables["init"] = {"from": os.fspath(root / "src" / "attempts" / "0001"), "which": "latest"}
    cfg = root / "ft.toml"
    cfg.write_text(dumps_toml(tables))
    return root, cfg


@pytest.mark.slow
def test_a_fine_tune_from_a_pretrained_trunk_is_verified_evidence(pretrained):
    root, cfg = pretrained
    out = _run(
        "run",
        cfg,
        "--set",
        f"run.dir='{root / 'frozen'}'",
        "--set",
        "model.freeze_trunk=true",
        "--set",
        "training.max_steps=8",
        "--set",
        "logging.tensorboard=true",
    )

    assert "final val accuracy" in out.stdout, out.stdout
    attempt = root / "frozen" / "attempts" / "0001"
    assert check_attempt(attempt).problems == []
    info = json.loads((attempt / "attempt.json").read_text())
    source = root / "src" / "attempts" / "0001"
    assert info["init"]["attempt"] == os.fspath(source.resolve())
    assert info["classes"] == ["16QAM", "64QAM", "8PSK", "BPSK", "CPFSK", "GMSK", "QPSK"]
    # A frozen trunk is the source's, weight for weight; the head is new.
    src, got = _weights(source, 6), _weights(attempt, 8)
    trunk = [k for k in src if not k.startswith("head.")]
    assert trunk and all(torch.equal(src[k], got[k]) for k in trunk)
    assert got["head.weight"].shape == (7, 32)
    vals = [r for r in read_metrics(attempt / "metrics.jsonl") if r["kind"] == "val"]
    assert [r["step"] for r in vals] == [8]
    assert 0.0 <= vals[0]["accuracy"] <= 1.0 and set(vals[0]["class_accuracy"]) == set(
        info["classes"]
    )
    manifest = json.loads((attempt / "manifest.json").read_text())
    assert manifest["best"]["val_accuracy"] == vals[0]["accuracy"]
    report = _run("report", attempt, "--plot", root / "frozen.png").stdout
    assert "best val accuracy" in report and (root / "frozen.png").stat().st_size > 0, report
    live = tensorboard_scalars(attempt / "tensorboard")
    assert live["val/accuracy"] == [(8, pytest.approx(vals[0]["accuracy"]))]
    assert {f"val/class_accuracy/{c}" for c in info["classes"]} <= set(live)


@pytest.mark.slow
def test_a_fine_tune_killed_with_sigkill_resumes_exactly(pretrained):
    root, cfg = pretrained
    _run("run", cfg, "--set", f"run.dir='{root / 'ref'}'")
    reference = root / "ref" / "attempts" / "0001"
    attempts = root / "ft" / "attempts"
    kill_after_checkpoints(_cli("run", cfg), _env(), attempts / "0001" / "checkpoints", 3)
    killed = attempts / "0001"
    assert check_attempt(killed).problems == []
    _run("resume", "--attempt", killed)
    child = attempts / "0002"
    assert check_attempt(child).problems == []
    info = json.loads((child / "attempt.json").read_text())
    want_info = json.loads((reference / "attempt.json").read_text())
    assert info["classes"] == want_info["classes"] and info["init"] == want_info["init"]
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(reference / "metrics.jsonl")
    )
    want, got = _weights(reference, MAX_STEPS), _weights(child, MAX_STEPS)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "sets", [[], ["training.parallel='fsdp'", "model.freeze_trunk=true"]], ids=["ddp", "fsdp"]
)
def test_a_fine_tune_on_two_ranks_sees_the_same_batches(pretrained, sets):
    root, cfg = pretrained
    name = "fsdp" if sets else "ddp"
    steps = ["--set", "training.max_steps=6", "--set", "training.eval_every=3"]
    steps += [a for s in sets for a in ("--set", s)]
    _run("run", cfg, "--set", f"run.dir='{root / name / 'one'}'", *steps)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "iqtrain", "run", os.fspath(cfg), "--set", f"run.dir='{root / name / 'two'}'"]
    proc = subprocess.run(cmd + steps, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    one, two = root / name / "one" / "attempts" / "0001", root / name / "two" / "attempts" / "0001"
    assert check_attempt(two).problems == []
    a, b = read_metrics(one / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in a] == [(r["kind"], r["step"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra["loss"] == pytest.approx(rb["loss"], rel=1e-4), (ra, rb)
        if ra["kind"] == "val":  # every window counted once, whole batches per rank
            assert ra["accuracy"] == rb["accuracy"] and ra["samples"] == rb["samples"]


def _labelled_tables(tmp_path, train, val) -> dict:
    write_bursts(tmp_path / "train", "t", train, 128)
    write_bursts(tmp_path / "val", "v", val, 128)
    tables = _classify_tables(tmp_path, "run")
    tables["data"]["train"] = [os.fspath(tmp_path / "train" / "*.sigmf-meta")]
    tables["data"]["val"] = [os.fspath(tmp_path / "val" / "*.sigmf-meta")]
    return tables


@pytest.mark.parametrize(
    ("train", "val", "sets", "want"),
    [
        (["a", "a"], ["a"], [], "every labelled window is a;"),
        (["a", "b"], ["a", "z"], [], "class z is not one of the training set's 2 classes"),
        (["a", "b"], ["a"], ["data.label_key='x:class'"], "no annotation with a x:class"),
        (["a", "b"], ["a"], ["probe.every=1"], "probe.every: only model.objective = 'mse' or "),
        (
            ["a", "b"],
            ["a"],
            ["model.dim=48", "model.heads=2", "init.from='{src}'"],
            "model.dim: 48 here, but the init.from checkpoint",
        ),
    ],
)
def test_inputs_a_fine_tune_cannot_use_are_one_line_and_create_nothing(
    pretrained, tmp_path, train, val, sets, want
):
    root, _ = pretrained
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(_labelled_tables(tmp_path, train, val)))
    src = root / "src" / "attempts" / "0001"
    args = [a for s in sets for a in ("--set", s.format(src=src))]
    proc = _run("run", cfg, *args, code=2)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and want in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.distributed
@pytest.mark.exit_path
def test_an_unknown_validation_class_is_exit_2_on_every_rank_printed_once(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(_labelled_tables(tmp_path, ["a", "b"], ["a", "z"])))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "iqtrain", "run", os.fspath(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode != 0 and proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-4000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "class z is not one of the training set's" in lines[0], lines
    assert not (tmp_path / "run").exists()

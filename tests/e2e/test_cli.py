"""The iqtrain command: exit codes, one-line errors, verify/inspect/report/synth."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import (
    assert_same_tensors,
    cli_tables,
    manifest_weights,
    tiny_tables,
    write_sigmf,
)

from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing


def iqtrain(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def _real_config(tmp_path, train_iq, val_iq, *, data=None, **training) -> Path:
    """cf32 SigMF train/val recordings under ``tmp_path/d`` and a config that trains on them."""
    write_sigmf(tmp_path / "d", "train", train_iq, "cf32_le")
    write_sigmf(tmp_path / "d", "val", val_iq, "cf32_le")
    tables = cli_tables(tmp_path / "run", tmp_path / "cache", **training)
    tables["data"]["train"] = [os.fspath(tmp_path / "d" / "train.sigmf-meta")]
    tables["data"]["val"] = [os.fspath(tmp_path / "d" / "val.sigmf-meta")]
    tables["data"].update(data or {})
    path = tmp_path / "real.toml"
    path.write_text(dumps_toml(tables))
    return path


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "cfg.toml"
    path.write_text(dumps_toml(cli_tables(tmp_path / "run", tmp_path / "cache")))
    return path


def _one_clean_line(proc, key):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("iqtrain: error: ") and key in lines[0], lines[0]


def test_run_verify_report_and_tamper(cfg, tmp_path):
    proc = iqtrain("run", cfg)
    assert proc.returncode == 0, proc.stderr
    attempt = tmp_path / "run" / "attempts" / "0001"
    assert f"iqtrain verify {attempt}" in proc.stdout
    ok = iqtrain("verify", attempt)
    assert ok.returncode == 0 and "verified" in ok.stdout
    rep = iqtrain("report", attempt)
    assert rep.returncode == 0 and "baselines: zero-prediction" in rep.stdout
    ckpt = attempt / "checkpoints" / "step_00000003" / "model.safetensors"
    data = bytearray(ckpt.read_bytes())
    data[-5] ^= 1
    ckpt.write_bytes(bytes(data))
    bad = iqtrain("verify", attempt)
    assert bad.returncode == 1 and "MISMATCH" in bad.stdout and "model.safetensors" in bad.stdout
    refused = iqtrain("resume", "--attempt", attempt)
    assert refused.returncode == 2 and "model.safetensors" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert sorted(p.name for p in (tmp_path / "run" / "attempts").iterdir()) == ["0001"]


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        (["--set", "training.max_step=5"], "training.max_step"),
        (["--set", "training.device=gpu"], "training.device"),
        (
            [
                "--set",
                "data.train=['/nonexistent/*.sigmf-meta']",
                "--set",
                "data.val=['/nonexistent/*.sigmf-meta']",
            ],
            "/nonexistent/*.sigmf-meta",
        ),
        (["--set", "schedule.decay_steps=10"], "schedule.decay_steps"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_no_attempt(cfg, tmp_path, extra, key):
    _one_clean_line(iqtrain("run", cfg, *extra), key)
    assert not (tmp_path / "run").exists()


def test_missing_config_and_bad_arguments(tmp_path):
    _one_clean_line(iqtrain("run", tmp_path / "nope.toml"), "nope.toml")
    _one_clean_line(iqtrain("synth", tmp_path / "s", "--datatype", "rf32"), "--datatype")
    _one_clean_line(iqtrain("resume", "--attempt", tmp_path), "not an attempt directory")


def test_non_finite_data_fails_with_exit_1_and_a_verifiable_attempt(tmp_path):
    rng = np.random.default_rng(0)
    iq = rng.standard_normal((2048, 2)).astype("f4")
    iq[5, 0] = np.nan  # in window 0
    val = rng.standard_normal((512, 2)).astype("f4")
    # batch 32: every batch of this 32-window file holds window 0
    path = _real_config(tmp_path, iq, val, data={"batch_size": 32}, max_steps=40)
    proc = iqtrain("run", path)
    assert proc.returncode == 1, proc.stderr
    assert "non-finite" in proc.stderr and "window ids" in proc.stderr
    attempt = tmp_path / "run" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "failed" and "NonFiniteError" in info["error"]
    assert not (attempt / "manifest.json").exists()
    assert iqtrain("verify", attempt).returncode == 0


def test_non_finite_validation_fails_with_exit_1_naming_step_and_windows(tmp_path):
    rng = np.random.default_rng(0)
    train = rng.standard_normal((2048, 2)).astype("f4")
    val = rng.standard_normal((512, 2)).astype("f4")
    val[200, 1] = np.inf  # window 3 of 8 (64-sample windows)
    path = _real_config(tmp_path, train, val, data={"val_batch_size": 2}, max_steps=4, eval_every=2)
    proc = iqtrain("run", path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("iqtrain: error:")]
    assert len(error) == 1, proc.stderr
    assert "step 2" in error[0] and "validation" in error[0] and "[2, 3]" in error[0], error
    attempt = tmp_path / "run" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "failed" and "NonFiniteError" in info["error"]
    records = [json.loads(line) for line in (attempt / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in records] == ["train", "train"]  # no val record was written
    assert iqtrain("verify", attempt).returncode == 0


def test_verify_data_rereads_every_recording(tmp_path):
    rng = np.random.default_rng(1)
    iq = rng.standard_normal((2048, 2)).astype("f4")
    path = _real_config(tmp_path, iq, rng.standard_normal((512, 2)).astype("f4"))
    assert iqtrain("run", path).returncode == 0
    attempt = tmp_path / "run" / "attempts" / "0001"
    ok = iqtrain("verify", attempt, "--data")
    assert ok.returncode == 0 and "verified and its data" in ok.stdout, ok.stdout + ok.stderr
    data = tmp_path / "d" / "train.sigmf-data"
    raw = bytearray(data.read_bytes())
    raw[5000] ^= 0x10
    data.write_bytes(bytes(raw))
    assert iqtrain("verify", attempt).returncode == 0  # the attempt's own files are intact
    bad = iqtrain("verify", attempt, "--data")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "train.sigmf-data" in bad.stdout and "MISMATCH" in bad.stdout, bad.stdout


def test_synth_and_inspect(cfg, tmp_path):
    out = tmp_path / "synth"
    proc = iqtrain("synth", out, "--recordings", "2", "--samples", "4096", "--datatype", "ci8")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "synth_0000.sigmf-data",
        "synth_0000.sigmf-meta",
        "synth_0001.sigmf-data",
        "synth_0001.sigmf-meta",
    ]
    ins = iqtrain("inspect", cfg)
    assert ins.returncode == 0, ins.stderr
    for needle in (
        "1 loader batch (numpy): shape (4, 64, 2) dtype int16",
        "3 prepare_iq_input patches: shape (4, 8, 16) dtype float32",
        "require gradients",
        "per optimizer step: 4 windows",
    ):
        assert needle in ins.stdout, ins.stdout
    assert not (tmp_path / "run").exists()  # inspect writes no attempt


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "bin.toml"
    path.write_bytes(b"\xff\xfe[run]\n")
    _one_clean_line(iqtrain("run", path), "not UTF-8")


def test_a_fifo_in_place_of_a_data_file_is_one_line_not_a_hang(tmp_path):
    rng = np.random.default_rng(3)
    path = _real_config(
        tmp_path,
        rng.standard_normal((2048, 2)).astype("f4"),
        rng.standard_normal((512, 2)).astype("f4"),
    )
    data = tmp_path / "d" / "train.sigmf-data"
    data.unlink()
    os.mkfifo(data)
    _one_clean_line(iqtrain("run", path), "not a regular file")


def test_refused_runs_generate_no_synthetic_data(cfg, tmp_path):
    _one_clean_line(iqtrain("run", cfg, "--set", "data.seq_patches=100000"), "data.seq_patches")
    (tmp_path / "a-file").write_text("")
    bad_dir = f"run.dir='{tmp_path / 'a-file' / 'run'}'"  # under a regular file: never creatable
    _one_clean_line(iqtrain("run", cfg, "--set", bad_dir), "run.dir")
    assert not (tmp_path / "cache").exists()


def test_changed_metadata_is_named_on_resume_and_by_verify_data(tmp_path):
    rng = np.random.default_rng(4)
    path = _real_config(
        tmp_path,
        rng.standard_normal((2048, 2)).astype("f4"),
        rng.standard_normal((512, 2)).astype("f4"),
        max_steps=6,
    )
    assert iqtrain("run", path).returncode == 0
    attempt = tmp_path / "run" / "attempts" / "0001"
    meta_path = tmp_path / "d" / "train.sigmf-meta"
    meta = json.loads(meta_path.read_text())
    meta["captures"].append({"core:sample_start": 1000, "core:frequency": 2.4e9})
    meta_path.write_text(json.dumps(meta))
    bad = iqtrain("verify", attempt, "--data")
    assert bad.returncode == 1 and "train.sigmf-meta" in bad.stdout, bad.stdout
    proc = iqtrain("resume", "--attempt", attempt, "--from", "step_2")
    assert proc.returncode == 2 and "train.sigmf-meta" in proc.stderr, proc.stderr
    assert sorted(p.name for p in attempt.parent.iterdir()) == ["0001"]


def test_cli_resume_in_a_fresh_process_after_sigterm(tmp_path):
    cache = tmp_path / "cache"
    import tomllib  # noqa: F401  (the config below is written as TOML)

    from iqtrain.config.schema import dumps_toml

    cfg_path = tmp_path / "cfg.toml"
    cfg_path.write_text(dumps_toml(tiny_tables(tmp_path / "run", cache, max_steps=40, keep_last=0)))
    straight = subprocess.run(
        [
            sys.executable,
            "-m",
            "iqtrain.cli.main",
            "run",
            os.fspath(cfg_path),
            "--set",
            f"run.dir='{tmp_path / 'straight'}'",
        ],
        capture_output=True,
        text=True,
    )
    assert straight.returncode == 0, straight.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "iqtrain.cli.main", "run", os.fspath(cfg_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = tmp_path / "run" / "attempts" / "0001" / "metrics.jsonl"
    deadline = time.time() + 120
    while not (metrics.exists() and metrics.stat().st_size > 0) and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode in (143, 0), err  # 0 only if it finished before the signal landed
    if proc.returncode == 143:
        assert "iqtrain resume --attempt" in err
        resumed = subprocess.run(
            [
                sys.executable,
                "-m",
                "iqtrain.cli.main",
                "resume",
                "--attempt",
                os.fspath(tmp_path / "run" / "attempts" / "0001"),
            ],
            capture_output=True,
            text=True,
        )
        assert resumed.returncode == 0, resumed.stderr
        child = tmp_path / "run" / "attempts" / "0002"
    else:
        child = tmp_path / "run" / "attempts" / "0001"
    ref = tmp_path / "straight" / "attempts" / "0001"
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(ref / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(ref)[0], manifest_weights(child)[0])

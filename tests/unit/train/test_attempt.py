"""End-to-end attempts: evidence, schedule, best/last checkpoints, exact resume, refusals."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import torch
from helpers import assert_same_tensors, manifest_weights, rated_recordings, tiny_tables

from iqtrain.config.schema import build_config
from iqtrain.data.synth import synthesize
from iqtrain.errors import CheckpointError, ConfigError, CursorMismatchError, DataError
from iqtrain.evidence.lineage import ParentRef
from iqtrain.evidence.metrics import read_metrics, strip_timing
from iqtrain.evidence.verify import verify_attempt
from iqtrain.pretrained.load import load_pretrained
from iqtrain.report.summary import report
from iqtrain.train import attempt as attempt_module
from iqtrain.train import determinism
from iqtrain.train.attempt import run_attempt
from iqtrain.train.loop import spike_update
from iqtrain.train.schedule import Plan, lr_at
from iqtrain.train.step import TrainStep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("synth-cache")


def _run(tmp_path, cache, name="run", parent=None, **training):
    cfg = build_config(tiny_tables(tmp_path / name, cache, **training))
    return run_attempt(cfg, parent)


def test_end_to_end_evidence(tmp_path, cache):
    result = _run(tmp_path, cache)
    att = result.attempt
    assert att == tmp_path / "run" / "attempts" / "0001"
    for name in ("attempt.json", "config.toml", "metrics.jsonl", "manifest.json"):
        assert (att / name).is_file(), name
    assert verify_attempt(att) == []
    info = json.loads((att / "attempt.json").read_text())
    assert info["status"] == "completed" and info["parent"] is None
    assert set(info["versions"]) >= {"python", "torch", "numpy"}

    records = read_metrics(att / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert [r["step"] for r in val] == [4, 8, 12]
    assert set(train[0]) >= {
        "step",
        "loss",
        "lr",
        "grad_norm",
        "clipped",
        "samples",
        "patches",
        "step_time_s",
        "samples_per_s",
        "spike",
    }
    assert train[0]["samples"] == 8 and train[0]["patches"] == 8 * 15
    # peak memory so far: never less than a torch process holds, never falling
    rss = [r["peak_rss_bytes"] for r in train]
    assert rss[0] > 50 * 2**20 and rss == sorted(rss) and "cuda_peak_bytes" not in train[0]
    plan = Plan(
        kind="wsd",
        max_steps=12,
        warmup_steps=2,
        decay_steps=4,
        decay_shape="linear",
        lr=3e-3,
        min_lr=3e-4,
    )
    assert [r["lr"] for r in train] == [lr_at(s, plan) for s in range(12)]
    assert "baseline_zero_loss" in val[0] and "baseline_copy_last_loss" in val[0]
    assert 0.5 < val[0]["baseline_zero_loss"] < 1.5  # window-normalised: ~1
    assert all("baseline_zero_loss" not in r for r in val[1:])
    for r in val:
        assert r["pred_snr_db"] == pytest.approx(-10 * __import__("math").log10(r["loss"]))
        assert r["samples"] == 32 and r["patches"] == 32 * 15  # one 4096-sample recording

    # best is the argmin of validation, and flags mark each improvement
    best = min(val, key=lambda r: r["loss"])
    running = float("inf")
    for r in val:
        assert r["best"] == (r["loss"] < running)
        running = min(running, r["loss"])
    manifest = json.loads((att / "manifest.json").read_text())
    assert manifest["best"]["step"] == best["step"]
    assert manifest["best"]["val_loss"] == best["loss"]
    assert manifest["latest"]["step"] == 12
    assert result.best_val_loss == best["loss"]

    # keep_last=1: only the latest and the best survive pruning
    left = sorted(p.name for p in (att / "checkpoints").iterdir())
    assert left == sorted({f"step_{12:08d}", f"step_{best['step']:08d}"})
    assert not list(att.glob("checkpoints/.tmp-*"))
    # evidence is frozen
    assert not os.access(att / "metrics.jsonl", os.W_OK) or os.geteuid() == 0
    assert (att / "metrics.jsonl").stat().st_mode & 0o222 == 0

    # a second run never reuses or touches the first attempt
    again = _run(tmp_path, cache)
    assert again.attempt.name == "0002"
    assert verify_attempt(att) == []


@pytest.mark.parametrize("k", [5, 7], ids=["on_checkpoint_boundary", "before_val_boundary"])
def test_exact_resume_from_step_k(tmp_path, cache, k):
    straight = _run(tmp_path, cache, checkpoint_every=1, keep_last=0).attempt
    child = run_attempt(
        build_config(tiny_tables(tmp_path / "run", cache, checkpoint_every=1, keep_last=0)),
        ParentRef(straight, f"step_{k}"),
    ).attempt
    assert child.name == "0002"
    info = json.loads((child / "attempt.json").read_text())
    assert info["parent"]["checkpoint"] == f"step_{k:08d}" and info["parent"]["step"] == k
    a = strip_timing(read_metrics(straight / "metrics.jsonl"))
    b = strip_timing(read_metrics(child / "metrics.jsonl"))
    assert a == b
    wa, oa = manifest_weights(straight)
    wb, ob = manifest_weights(child)
    assert_same_tensors(wa, wb)
    assert_same_tensors(oa, ob)
    manifest = json.loads((child / "manifest.json").read_text())
    assert manifest["inherited_metrics"]["records"] == sum(1 for r in a if r["step"] <= k)
    assert verify_attempt(child) == []


def test_resume_of_a_crashed_parent_uses_its_latest_verified_checkpoint(tmp_path, cache):
    straight = _run(tmp_path, cache, keep_last=0).attempt
    # Simulate a crash after step 10's checkpoint: no manifest, a torn newer checkpoint.
    crashed_dir = tmp_path / "crash"
    import shutil

    shutil.copytree(straight.parent.parent, crashed_dir)
    crashed = crashed_dir / "attempts" / "0001"
    for p in (crashed / "manifest.json", crashed / "metrics.jsonl", crashed / "config.toml"):
        p.chmod(0o644)
    (crashed / "manifest.json").unlink()
    info = json.loads((crashed / "attempt.json").read_text())
    info["status"] = "running"  # killed: it never recorded how it ended
    (crashed / "attempt.json").write_text(json.dumps(info))
    shutil.rmtree(crashed / "checkpoints" / "step_00000012")
    torn = crashed / "checkpoints" / "step_00000011"
    shutil.copytree(crashed / "checkpoints" / "step_00000010", torn)
    (torn / "checkpoint.json").unlink()  # written last: its absence marks a torn checkpoint
    cfg = build_config(tiny_tables(crashed_dir, cache, keep_last=0))
    child = run_attempt(cfg, ParentRef(crashed)).attempt
    info = json.loads((child / "attempt.json").read_text())
    assert info["parent"]["checkpoint"] == "step_00000010"
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(straight / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(straight)[0], manifest_weights(child)[0])


def test_interrupt_then_resume_matches_the_straight_run(tmp_path, cache):
    straight = _run(tmp_path, cache, max_steps=60, keep_last=0).attempt
    cfg = build_config(tiny_tables(tmp_path / "int", cache, max_steps=60, keep_last=0))
    metrics = tmp_path / "int" / "attempts" / "0001" / "metrics.jsonl"

    def interrupt_soon():
        while not (metrics.exists() and metrics.stat().st_size > 0):
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGINT)

    from iqtrain.console import Interrupted

    threading.Thread(target=interrupt_soon, daemon=True).start()
    with pytest.raises(Interrupted) as exc:
        run_attempt(cfg)
    assert exc.value.exit_code == 130
    parent = exc.value.attempt
    info = json.loads((parent / "attempt.json").read_text())
    assert info["status"] == "interrupted" and info["final_step"] < 60
    assert not (parent / "manifest.json").exists()
    assert verify_attempt(parent) == []
    child = run_attempt(cfg, ParentRef(parent)).attempt
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(straight / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(straight)[0], manifest_weights(child)[0])
    assert_same_tensors(manifest_weights(straight)[1], manifest_weights(child)[1])


def test_plan_change_allowed_only_before_the_decay_start(tmp_path, cache):
    parent = _run(tmp_path, cache, checkpoint_every=1, keep_last=0).attempt  # decay starts at 8
    longer = build_config(
        tiny_tables(tmp_path / "run", cache, max_steps=16, checkpoint_every=1, keep_last=0)
    )
    child = run_attempt(longer, ParentRef(parent, "step_5")).attempt
    info = json.loads((child / "attempt.json").read_text())
    assert info["config_changes"]["training.max_steps"] == {"from": 12, "to": 16}
    assert info["plan"]["max_steps"] == 16
    train = [r for r in read_metrics(child / "metrics.jsonl") if r["kind"] == "train"]
    assert train[-1]["step"] == 16 and train[-1]["lr"] == 3e-4
    n_before = len(list((tmp_path / "run" / "attempts").iterdir()))
    with pytest.raises(ConfigError, match="training.max_steps"):
        run_attempt(longer, ParentRef(parent, "step_9"))
    other = build_config(
        tiny_tables(tmp_path / "run", cache, checkpoint_every=1, keep_last=0, grad_accum=2)
    )
    with pytest.raises(ConfigError, match="training.grad_accum: cannot change on resume"):
        run_attempt(other, ParentRef(parent))
    assert len(list((tmp_path / "run" / "attempts").iterdir())) == n_before


@pytest.mark.parametrize(
    "target", ["model.safetensors", "optimizer.safetensors", "state.json", "metrics", "config"]
)
def test_resume_refuses_a_tampered_parent(tmp_path, cache, target):
    parent = _run(tmp_path, cache).attempt
    ckpt = parent / "checkpoints" / "step_00000012"
    path = {"metrics": parent / "metrics.jsonl", "config": parent / "config.toml"}.get(
        target, ckpt / target
    )
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert verify_attempt(parent) != []
    cfg = build_config(tiny_tables(tmp_path / "run", cache))
    with pytest.raises(CheckpointError):
        run_attempt(cfg, ParentRef(parent))
    assert sorted(p.name for p in (tmp_path / "run" / "attempts").iterdir()) == ["0001"]


def test_resume_refuses_a_changed_dataset(tmp_path):
    data = tmp_path / "data"
    synthesize(data / "train", recordings=2, samples=4096, seed=1)
    synthesize(data / "val", recordings=1, samples=4096, seed=2)
    tables = tiny_tables(tmp_path / "run", tmp_path / "unused")
    tables["data"]["train"] = [os.fspath(data / "train" / "*.sigmf-meta")]
    tables["data"]["val"] = [os.fspath(data / "val" / "*.sigmf-meta")]
    parent = run_attempt(build_config(tables)).attempt
    synthesize(data / "train", recordings=2, samples=4096, seed=7)  # same names, new content
    with pytest.raises(CursorMismatchError, match="data.train"):
        run_attempt(build_config(tables), ParentRef(parent))
    assert sorted(p.name for p in (tmp_path / "run" / "attempts").iterdir()) == ["0001"]


def test_window_longer_than_every_recording_is_a_config_error(tmp_path, cache):
    tables = tiny_tables(tmp_path / "run", cache)
    tables["data"]["seq_patches"] = 1024  # 8192-sample windows, 4096-sample recordings
    tables["model"]["max_patches"] = 1024
    with pytest.raises(ConfigError, match="data.seq_patches"):
        run_attempt(build_config(tables))
    assert not (tmp_path / "run").exists()


def test_compiled_resume_is_exact(tmp_path, cache):
    # The one compiled attempt test: compile is ~30 s per graph on this machine.
    straight = _run(
        tmp_path, cache, compile=True, max_steps=6, eval_every=3, checkpoint_every=1, keep_last=0
    ).attempt
    cfg = build_config(
        tiny_tables(
            tmp_path / "run",
            cache,
            compile=True,
            max_steps=6,
            eval_every=3,
            checkpoint_every=1,
            keep_last=0,
        )
    )
    child = run_attempt(cfg, ParentRef(straight, "step_4")).attempt
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(straight / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(straight)[0], manifest_weights(child)[0])


def test_spike_flag_against_a_made_up_loss_sequence():
    # The running average starts at the first loss and moves 10% towards each new one; a loss
    # above 3x the average *before* it is a spike. Averages worked by hand:
    # 1.0 -> 1.0 -> 1.0 -> (3.5: 3.5 > 3.0, spike) 1.25 -> (3.7: 3.7 < 3.75) 1.495
    # -> (4.6: 4.6 > 4.485, spike) 1.8055 -> (0.1) 1.63495
    losses = [1.0, 1.0, 3.5, 3.7, 4.6, 0.1]
    want_spikes = [False, False, True, False, True, False]
    want_ema = [1.0, 1.0, 1.25, 1.495, 1.8055, 1.63495]
    ema = None
    for loss, spike_expected, ema_expected in zip(losses, want_spikes, want_ema, strict=True):
        spike, ema = spike_update(ema, loss)
        assert spike == spike_expected, loss
        assert ema == pytest.approx(ema_expected, rel=1e-12)


def test_validation_leaves_training_untouched(tmp_path, cache):
    every = _run(tmp_path, cache, name="every", eval_every=1, keep_last=0).attempt
    once = _run(tmp_path, cache, name="once", eval_every=12, keep_last=0).attempt
    train_every = [r for r in read_metrics(every / "metrics.jsonl") if r["kind"] == "train"]
    train_once = [r for r in read_metrics(once / "metrics.jsonl") if r["kind"] == "train"]
    assert len(train_every) == 12
    assert strip_timing(train_every) == strip_timing(train_once)
    assert_same_tensors(manifest_weights(every)[0], manifest_weights(once)[0])
    assert_same_tensors(manifest_weights(every)[1], manifest_weights(once)[1])


def test_resume_from_a_mid_run_best(tmp_path, cache):
    # On this tiny validation set the loss is lowest early (the premise, checked below).
    tables = tiny_tables(tmp_path / "run", cache, eval_every=2, keep_last=1)
    straight = run_attempt(build_config(tables)).attempt
    manifest = json.loads((straight / "manifest.json").read_text())
    best_step = manifest["best"]["step"]
    assert best_step < manifest["latest"]["step"], "premise: best must be mid-run"
    child = run_attempt(build_config(tables), ParentRef(straight, "best")).attempt
    info = json.loads((child / "attempt.json").read_text())
    assert info["parent"]["checkpoint"] == f"step_{best_step:08d}"
    assert info["parent"]["step"] == best_step
    # Continuing from best is continuing from that step: the same records, the same weights.
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(straight / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(straight)[0], manifest_weights(child)[0])
    assert verify_attempt(child) == []


def test_a_refused_run_writes_no_synthetic_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine too
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache")
    tables["training"]["device"] = "cuda"
    with pytest.raises(ConfigError, match="training.device"):
        run_attempt(build_config(tables))
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_training_deterministic_is_configured_before_anything_touches_the_device(
    tmp_path, monkeypatch
):
    # The deterministic cuBLAS workspace must be chosen before the process's first cuBLAS call:
    # the preflight configures it first, so a workspace that is not deterministic is the
    # refusal, not the missing GPU the step finds later; the attempt is never created.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a GPU machine too
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache")
    tables["training"]["device"] = "cuda"
    with pytest.raises(ConfigError, match=r"^training.deterministic: .*=':0:0', but"):
        run_attempt(build_config(tables))
    assert not (tmp_path / "cache").exists() and not (tmp_path / "run").exists()


def test_a_resume_may_change_training_deterministic_and_each_attempt_records_it(
    tmp_path, cache, monkeypatch
):
    calls = []
    configure, seed = determinism.configure, torch.manual_seed

    def recorded(name, fn):
        return lambda *args, **kwargs: calls.append((name, *args)) or fn(*args, **kwargs)

    monkeypatch.setattr(determinism, "configure", recorded("configure", configure))
    monkeypatch.setattr(torch, "manual_seed", recorded("seed", seed))
    monkeypatch.setattr(attempt_module, "TrainStep", recorded("step", TrainStep))
    steps = {"max_steps": 6, "eval_every": 3, "checkpoint_every": 1, "keep_last": 0}
    parent = _run(tmp_path, cache, deterministic=False, **steps).attempt
    # first of all: before the seed and the step (the first to touch a device)
    assert calls[0] == ("configure", "cpu", False)
    assert {c[0] for c in calls} == {"configure", "seed", "step"}
    calls.clear()
    cfg = build_config(tiny_tables(tmp_path / "run", cache, **steps))  # true, the default
    child = run_attempt(cfg, ParentRef(parent, "step_4")).attempt
    assert calls[0] == ("configure", "cpu", True)
    parent_info = json.loads((parent / "attempt.json").read_text())
    child_info = json.loads((child / "attempt.json").read_text())
    assert parent_info["device"]["deterministic"] is False
    assert child_info["device"]["deterministic"] is True
    assert child_info["config_changes"] == {"training.deterministic": {"from": False, "to": True}}
    # No effect on the CPU: the child repeats its parent's steps bit for bit.
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(
        read_metrics(parent / "metrics.jsonl")
    )
    assert_same_tensors(manifest_weights(parent)[0], manifest_weights(child)[0])
    assert verify_attempt(child) == []


def test_data_changed_anywhere_refuses_resume_naming_the_recording(tmp_path):
    data = tmp_path / "data"
    synthesize(data / "train", recordings=2, samples=65536, seed=1)
    synthesize(data / "val", recordings=1, samples=4096, seed=2)
    tables = tiny_tables(tmp_path / "run", tmp_path / "unused", max_steps=6, keep_last=0)
    tables["data"]["train"] = [os.fspath(data / "train" / "*.sigmf-meta")]
    tables["data"]["val"] = [os.fspath(data / "val" / "*.sigmf-meta")]
    parent = run_attempt(build_config(tables)).attempt
    victim = sorted((data / "train").glob("*.sigmf-data"))[1]
    raw = bytearray(victim.read_bytes())
    # One byte between the sampled fingerprint's blocks: only a full-content digest sees it.
    sampled = {i * (len(raw) - 4096) // 15 // 4096 for i in range(16)}
    block = next(b for b in range(len(raw) // 4096) if b not in sampled and b - 1 not in sampled)
    raw[block * 4096 + 100] ^= 0x01
    victim.write_bytes(bytes(raw))
    with pytest.raises(CursorMismatchError, match=victim.name):
        run_attempt(build_config(tables), ParentRef(parent))
    assert sorted(p.name for p in (tmp_path / "run" / "attempts").iterdir()) == ["0001"]


def test_a_categorical_attempt_records_both_losses_and_resumes_exactly(tmp_path, cache):
    def cfg(name):
        tables = tiny_tables(tmp_path / name, cache, checkpoint_every=1, keep_last=0)
        tables["model"].update(objective="categorical", bins=16, bin_range=3.0)
        return build_config(tables)

    straight = run_attempt(cfg("run"))
    val = [r for r in read_metrics(straight.attempt / "metrics.jsonl") if r["kind"] == "val"]
    for r in val:
        # the objective's loss (nats per complex sample) and the NMSE of the predicted mean
        assert 0 < r["loss"] < 2 * __import__("math").log(16) + 0.5
        assert r["nmse"] != r["loss"] and 0 < r["nmse"] < 2.0
        assert r["pred_snr_db"] == pytest.approx(-10 * __import__("math").log10(r["nmse"]))
    assert straight.final_val_nmse == val[-1]["nmse"] and straight.objective == "categorical"
    # best and early stopping follow the objective's own loss
    manifest = json.loads((straight.attempt / "manifest.json").read_text())
    assert manifest["best"]["val_loss"] == min(r["loss"] for r in val)
    child = run_attempt(cfg("run"), ParentRef(straight.attempt, "step_5")).attempt
    a = strip_timing(read_metrics(straight.attempt / "metrics.jsonl"))
    assert a == strip_timing(read_metrics(child / "metrics.jsonl"))
    assert_same_tensors(manifest_weights(straight.attempt)[0], manifest_weights(child)[0])
    assert verify_attempt(child) == []
    # the objective is part of the model: changing it on resume is refused
    tables = tiny_tables(tmp_path / "run", cache, checkpoint_every=1, keep_last=0)
    tables["model"].update(bins=16, bin_range=3.0)  # the default "mse", the parent's grid
    with pytest.raises(ConfigError, match=r"model\.objective: cannot change on resume"):
        run_attempt(build_config(tables), ParentRef(straight.attempt, "step_5"))


def test_spikes_of_a_negative_log_likelihood_are_judged_in_nats():
    # An NLL near 4 nats rising to 5.2 is a divergence (ln 3 = 1.0986 above the average)
    # that a 3x ratio would never flag; 4.9 is not one.
    ema = None
    for loss in (4.0, 4.0):
        spike, ema = spike_update(ema, loss, nats=True)
        assert not spike
    assert spike_update(ema, 4.0 + 1.0986, nats=True)[0] is False
    assert spike_update(ema, 5.2, nats=True)[0] is True
    assert spike_update(ema, 5.2, nats=False)[0] is False  # what the ratio rule would say
    assert spike_update(ema, 12.1)[0] is True


def _rated(tmp_path, train, val, *, name="run", **data):
    """tiny_tables over real recordings: ``train`` and ``val`` map names to sample rates."""
    tables = tiny_tables(tmp_path / name, tmp_path / "unused", keep_last=0)
    tables["data"]["train"] = [rated_recordings(tmp_path / "train", train)]
    tables["data"]["val"] = [rated_recordings(tmp_path / "val", val, seed=1)]
    tables["data"].update(data)
    return tables


def _states(attempt):
    return [
        json.loads(p.read_text()) for p in sorted(attempt.glob("checkpoints/step_*/state.json"))
    ]


def test_the_sample_rate_is_recorded_everywhere_and_a_resume_keeps_it(tmp_path):
    tables = _rated(tmp_path, {"a": 2.4e6, "b": 2.4e6}, {"c": 2.4e6})
    attempt = run_attempt(build_config(tables)).attempt
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["data"] == {"sample_rate": 2.4e6, "refused": {"data.train": [], "data.val": []}}
    states = _states(attempt)
    assert len(states) > 1 and all(s["sample_rate"] == 2.4e6 for s in states)
    manifest = json.loads((attempt / "manifest.json").read_text())
    assert manifest["data"]["sample_rate"] == 2.4e6
    assert manifest["data"]["refused"] == {"data.train": 0, "data.val": 0}
    assert load_pretrained(attempt).sample_rate == 2.4e6
    assert "  data: 2.4 MHz" in report(attempt).splitlines()
    assert verify_attempt(attempt) == []
    child = run_attempt(build_config(tables), ParentRef(attempt, "step_5")).attempt
    assert json.loads((child / "attempt.json").read_text())["data"] == info["data"]
    assert [s["sample_rate"] for s in _states(child)] == [2.4e6] * len(_states(child))
    assert verify_attempt(child) == []


def test_a_mix_of_rates_is_refused_before_anything_exists_and_any_trains_on_it(tmp_path):
    tables = _rated(tmp_path, {"a": 1e6, "b": 2e6}, {"c": 1e6})
    with pytest.raises(DataError, match="2 sample rates") as err:
        run_attempt(build_config(tables))
    assert err.value.exit_code == 2 and "1 MHz" in str(err.value) and "2 MHz" in str(err.value)
    assert not (tmp_path / "run").exists()
    tables["data"]["sample_rate"] = "any"
    attempt = run_attempt(build_config(tables)).attempt
    assert json.loads((attempt / "attempt.json").read_text())["data"]["sample_rate"] is None
    assert all("sample_rate" in s and s["sample_rate"] is None for s in _states(attempt))
    assert json.loads((attempt / "manifest.json").read_text())["data"]["sample_rate"] is None
    assert load_pretrained(attempt).sample_rate is None
    assert "  data: no one sample rate" in report(attempt)
    assert verify_attempt(attempt) == []


def test_a_fixed_rate_rule_refuses_another_rate_and_records_its_own(tmp_path):
    tables = _rated(tmp_path, {"a": 1e6}, {"c": 1e6}, sample_rate=2e6)
    with pytest.raises(DataError, match="data.sample_rate = 2e.06 but 2 recording"):
        run_attempt(build_config(tables))
    assert not (tmp_path / "run").exists()
    tables["data"]["sample_rate"] = 1e6
    attempt = run_attempt(build_config(tables)).attempt
    assert json.loads((attempt / "attempt.json").read_text())["data"]["sample_rate"] == 1e6
    assert {s["sample_rate"] for s in _states(attempt)} == {1e6}


def test_recordings_read_past_are_recorded_bound_and_reported(tmp_path):
    tables = _rated(tmp_path, {"a": 1e6, "b": 1e6}, {"c": 1e6}, skip_invalid=True)
    broken = tmp_path / "train" / "b.sigmf-meta"
    broken.write_text("{not json")
    attempt = run_attempt(build_config(tables)).attempt
    info = json.loads((attempt / "attempt.json").read_text())
    (entry,) = info["data"]["refused"]["data.train"]
    assert entry["path"] == os.fspath(broken) and "not valid JSON" in entry["reason"]
    assert info["data"]["refused"]["data.val"] == []
    manifest = json.loads((attempt / "manifest.json").read_text())
    assert manifest["data"]["refused"] == {"data.train": 1, "data.val": 0}
    lines = report(attempt).splitlines()
    at = lines.index("  data: 1 MHz; 1 input(s) skipped as unreadable (data.skip_invalid):")
    assert lines[at + 1].startswith("    data.train: ") and "b.sigmf-meta" in lines[at + 1]
    assert verify_attempt(attempt) == []
    # A resume reopens the data: its own list, the same file.
    child = run_attempt(build_config(tables), ParentRef(attempt, "step_5")).attempt
    assert json.loads((child / "attempt.json").read_text())["data"] == info["data"]
    # The list is bound by the manifest: an entry dropped afterwards fails verify.
    info["data"]["refused"]["data.train"] = []
    (attempt / "attempt.json").write_text(json.dumps(info))
    assert any("manifest.json data" in p for p in verify_attempt(attempt))


def test_a_model_from_another_rate_is_a_note_naming_both(tmp_path, capfd):
    source = run_attempt(build_config(_rated(tmp_path / "s", {"a": 1e6}, {"c": 1e6})))
    source = source.attempt
    tables = _rated(tmp_path / "t", {"a": 2e6}, {"c": 2e6})
    tables["init"] = {"from": os.fspath(source), "which": "latest"}
    capfd.readouterr()
    attempt = run_attempt(build_config(tables)).attempt
    notes = [ln for ln in capfd.readouterr().err.splitlines() if "init.from" in ln]
    assert len(notes) == 1 and "1 MHz" in notes[0] and "2 MHz" in notes[0], notes
    assert json.loads((attempt / "attempt.json").read_text())["data"]["sample_rate"] == 2e6

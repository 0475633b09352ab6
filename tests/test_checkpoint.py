"""Checkpoints: atomic write, hashes, exact round trip, refusal of non-finite state."""

from __future__ import annotations

import json

import pytest
import torch

from iqtrain.checkpoint import (
    list_checkpoints,
    load_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    verify_checkpoint,
)
from iqtrain.errors import CheckpointError, NonFiniteError
from iqtrain.model import ModelConfig, NextPatchModel
from iqtrain.step import OptimizerConfig, TrainStep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _stepper(steps=2):
    torch.manual_seed(0)
    model = NextPatchModel(ModelConfig(dim=32, layers=1, heads=2, patch_len=4, max_patches=8))
    s = TrainStep(model, OptimizerConfig(lr=1e-3), device="cpu", precision="fp32", compile=False)
    for _ in range(steps):
        s.train_step([torch.randn(2, 8, 8)], 1e-3)
    return s


def test_round_trip_is_exact(tmp_path):
    s = _stepper()
    path = save_checkpoint(
        tmp_path, 7, s.model_state_dict(), s.optimizer.state_dict(), {"step": 7, "note": "x"}
    )
    assert path.name == "step_00000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "checkpoint.json",
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
    ]
    assert verify_checkpoint(path) == []
    model, optim, state = load_checkpoint(path)
    assert state == {"step": 7, "note": "x"}
    for k, v in s.model_state_dict().items():
        assert torch.equal(model[k], v)
    fresh = _stepper(steps=0)
    fresh.load_model_state_dict(model)
    fresh.optimizer.load_state_dict(optim)
    want, got = s.optimizer.state_dict(), fresh.optimizer.state_dict()
    for idx, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][idx][key], value), (idx, key)
    assert [g["weight_decay"] for g in got["param_groups"]] == [
        g["weight_decay"] for g in want["param_groups"]
    ]
    assert all(isinstance(g["lr"], torch.Tensor) for g in got["param_groups"])
    # both continue identically
    batch = torch.randn(2, 8, 8)
    a = s.train_step([batch], 5e-4)
    b = fresh.train_step([batch], 5e-4)
    assert a == b


def test_tampering_is_detected(tmp_path):
    s = _stepper(1)
    path = save_checkpoint(tmp_path, 1, s.model_state_dict(), s.optimizer.state_dict(), {})
    f = path / "optimizer.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    problems = verify_checkpoint(path)
    assert len(problems) == 1 and "optimizer.safetensors" in problems[0]
    with pytest.raises(CheckpointError, match="optimizer.safetensors"):
        load_checkpoint(path)


def test_non_finite_state_is_refused_before_writing(tmp_path):
    s = _stepper(1)
    model = s.model_state_dict()
    name = next(iter(model))
    model[name] = model[name].clone()
    model[name].view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=name):
        save_checkpoint(tmp_path, 1, model, s.optimizer.state_dict(), {})
    assert list(tmp_path.iterdir()) == []


def test_never_overwrites_and_torn_checkpoints_are_not_listed(tmp_path):
    s = _stepper(1)
    save_checkpoint(tmp_path, 1, s.model_state_dict(), s.optimizer.state_dict(), {})
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(tmp_path, 1, s.model_state_dict(), s.optimizer.state_dict(), {})
    (tmp_path / ".tmp-step_00000002-123").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    torn = tmp_path / "step_00000003"
    torn.mkdir()
    assert "missing" in verify_checkpoint(torn)[0]


def test_rng_state_round_trip():
    state = json.loads(json.dumps(rng_state()))
    a = torch.rand(5)
    restore_rng_state(state)
    assert torch.equal(torch.rand(5), a)

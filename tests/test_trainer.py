"""The loop's components: LoopState, the step's state, the checkpoint policy."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from iqtrain.checkpoint import CheckpointManager, list_checkpoints
from iqtrain.config import ModelConfig, OptimizerConfig
from iqtrain.model import NextPatchModel
from iqtrain.step import TrainStep
from iqtrain.trainer import LoopState

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_loop_state_tracks_the_first_strict_minimum_and_round_trips():
    loop = LoopState()
    attempt = Path("/runs/x/attempts/0003")
    for step, loss, improved in [
        (4, 0.9, True),
        (8, 0.9, False),
        (12, 0.8, True),
        (16, 0.85, False),
    ]:
        loop.step = step
        assert loop.record_validation(loss, attempt) is improved
    assert (loop.best_val_loss, loop.best_step, loop.validations) == (0.8, 12, 4)
    assert loop.best_checkpoint == "attempts/0003/checkpoints/step_00000012"
    assert loop.record_loss(1.0) is False and loop.record_loss(3.5) is True
    state = loop.state_dict()
    assert "step" not in state  # stored beside the components, as state.json "step"
    other = LoopState()
    other.load_state_dict(state)
    other.step = loop.step
    assert other == loop


def _step(seed: int) -> TrainStep:
    torch.manual_seed(seed)
    model = NextPatchModel(ModelConfig(patch_len=4, max_patches=8, dim=16, layers=1, heads=2))
    return TrainStep(model, OptimizerConfig(lr=1e-2), device="cpu", precision="fp32", compile=False)


def test_the_step_owns_model_and_optimizer_state():
    a = _step(0)
    a.train_step([torch.randn(2, 8, 8)], 1e-2)
    b = _step(1)
    # state_dict() holds live references, as torch's do: a copy is what a checkpoint makes.
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for k, v in a.model_state_dict().items():
        assert torch.equal(v, b.model_state_dict()[k]), k
    x = torch.randn(2, 8, 8)
    ra, rb = a.train_step([x], 1e-2), b.train_step([x], 1e-2)
    assert (ra.loss, ra.grad_norm) == (rb.loss, rb.grad_norm)
    for k, v in a.model_state_dict().items():
        assert torch.equal(v, b.model_state_dict()[k]), k


def test_checkpoint_policy_saves_when_due_and_never_prunes_latest_or_best(tmp_path):
    run = tmp_path / "run"
    root = run / "attempts" / "0001" / "checkpoints"
    manager = CheckpointManager(root, run, every=5, keep_last=1)
    assert manager.due(5, final=False, improved=False)
    assert not manager.due(6, final=False, improved=False)
    assert manager.due(6, final=True, improved=False) and manager.due(7, final=False, improved=True)
    model = {"w": torch.zeros(2)}
    best = "attempts/0001/checkpoints/step_00000002"
    for step in (2, 5, 10, 15):
        manager.save(step, model, {"state": {}, "param_groups": []}, {"step": step}, protect=best)
        assert manager.saved_at(step) and manager.latest == root / f"step_{step:08d}"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002", "step_00000015"]
    assert not list(root.glob(".pruned-*"))  # pruned atomically and completely

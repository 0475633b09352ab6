"""The checkpoint policy of an attempt: when to save, what to keep (one process)."""

from __future__ import annotations

import torch
from helpers import checkpoint_state

from iqtrain.checkpoint.files import list_checkpoints
from iqtrain.checkpoint.manager import CheckpointManager


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
        state = checkpoint_state(step)
        optim = {"state": {}, "param_groups": []}
        manager.save(model, optim, state, step=step, protect=best)
        assert manager.saved_at(step) and manager.latest == root / f"step_{step:08d}"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002", "step_00000015"]
    assert not list(root.glob(".pruned-*"))  # pruned atomically and completely

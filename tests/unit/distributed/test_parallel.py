"""training.parallel = "fsdp" in one process: the step trains unsharded and checkpoints its state
with torch.distributed.checkpoint. Several ranks (sharding, resharding on load) are tested with
real processes in test_distributed.py."""

from __future__ import annotations

import pytest
import torch
from helpers import Forged, fsdp_step

from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.errors import CheckpointError, ConfigError, NonFiniteError
from iqtrain.model.transformer import IQTransformer
from iqtrain.train.step import TrainStep

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BATCHES = [torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(i)) for i in range(4)]


def _stepper(steps: int, *, dim: int = 32) -> TrainStep:
    s = fsdp_step(dim=dim, layers=2)
    for batch in BATCHES[:steps]:
        s.train_step([batch], 1e-3)
    return s


def test_one_process_saves_and_loads_the_sharded_state_exactly(tmp_path):
    trained = _stepper(2)
    assert trained.sharded and not trained.forward_is_collective
    assert trained.state_dict()["optimizer"] is None  # it lives in the sharded files
    trained.save_sharded(tmp_path / "dcp")
    assert sorted(p.name for p in (tmp_path / "dcp").iterdir()) == [".metadata", "__0_0.distcp"]
    fresh = _stepper(0)
    fresh.load_sharded(tmp_path / "dcp")
    for k, v in trained.model_state_dict().items():
        assert torch.equal(fresh.model_state_dict()[k], v), k
    want, got = trained.optimizer.state_dict(), fresh.optimizer.state_dict()
    for idx, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][idx][key], value), (idx, key)
    # ... and both continue as one.
    a = trained.train_step([BATCHES[2]], 5e-4)
    b = fresh.train_step([BATCHES[2]], 5e-4)
    assert a == b
    assert all(torch.equal(x, y) for x, y in zip(trained._params, fresh._params, strict=True))


def test_a_sharded_state_of_another_model_is_a_checkpoint_error(tmp_path):
    _stepper(1).save_sharded(tmp_path / "dcp")
    with pytest.raises(CheckpointError, match="cannot load the sharded state"):
        _stepper(0, dim=16).load_sharded(tmp_path / "dcp")


def test_a_non_finite_tensor_is_refused_before_anything_is_written(tmp_path):
    s = _stepper(1)
    with torch.no_grad():
        s.model.head.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match="head.weight"):
        s.save_sharded(tmp_path / "dcp")
    assert not (tmp_path / "dcp").exists()


def test_parallel_is_checked():
    model = IQTransformer(ModelConfig(dim=32, layers=1, heads=2, patch_len=4, max_patches=8))
    with pytest.raises(ConfigError, match="training.parallel"):
        TrainStep(
            model,
            OptimizerConfig(),
            device="cpu",
            precision="fp32",
            compile=False,
            parallel="zero3",
        )


def test_a_forged_metadata_file_is_refused_before_it_runs_anything(tmp_path):
    import pickle

    _stepper(1).save_sharded(tmp_path / "dcp")
    marker = tmp_path / "ran"
    (tmp_path / "dcp" / ".metadata").write_bytes(pickle.dumps(Forged(open, str(marker), "w")))
    with pytest.raises(
        CheckpointError, match=r"\.metadata: refused: .* _?io\.open, not checkpoint metadata"
    ):
        _stepper(0).load_sharded(tmp_path / "dcp")
    assert not marker.exists()

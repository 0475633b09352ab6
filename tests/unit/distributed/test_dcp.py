"""The sharded state (iqtrain.distributed.dcp): its metadata read by the restricted unpickler
(what DCP writes loads, anything else is one CheckpointError naming the file), and the ranks'
agreement that every tensor is finite before anything is written.

The CPU tests reach the agreement on an NCCL world only through fakes of torch.distributed's
collectives (which refuse a CPU tensor as NCCL does); that a real NCCL group gathers the
verdict, and that DCP writes and reads back a sharded FSDP2 step over it, is the ``gpu`` test
at the end (one rank, in a subprocess of its own).
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys

import pytest
import torch
from helpers import Forged, fsdp_step

from iqtrain.distributed.dcp import (
    _check_metadata,
    _MetadataUnpickler,
    _plain_data_planner,
    save_sharded,
)
from iqtrain.distributed.world import World
from iqtrain.errors import CheckpointError, NonFiniteError
from iqtrain.train.step import TrainStep


def test_dcp_metadata_unpickles_and_other_globals_are_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    _check_metadata(tmp_path)  # DCP's own classes: admitted
    with pytest.raises(pickle.UnpicklingError, match=r"it names os\.system, not checkpoint"):
        _MetadataUnpickler(io.BytesIO()).find_class("os", "system")


@pytest.mark.parametrize(
    "data, reason",
    [(b"\x80\x04\xff.", "invalid load key"), (b"", "EOFError"), (b"\x80\x04(", "")],
    ids=["unknown opcode", "empty", "truncated"],
)
def test_damaged_metadata_is_one_checkpoint_error(tmp_path, data, reason):
    (tmp_path / ".metadata").write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        _check_metadata(tmp_path)
    text = str(info.value)
    assert text.startswith(f"{tmp_path / '.metadata'}: refused: ") and reason in text
    assert "\n" not in text


def test_a_forged_plain_data_item_is_refused_before_it_runs_anything(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError):
        _plain_data_planner().load_bytes(
            None, io.BytesIO(pickle.dumps(Forged(open, str(marker), "w"), protocol=2))
        )
    assert not marker.exists()


# ------------------------------------------------------------- agreeing that every tensor is finite


class FakeNccl:
    """torch.distributed's collectives on an NCCL group of ``world_size`` ranks, this process
    rank 0: a tensor collective refuses a CPU tensor as NCCL's group does (it registers no CPU
    backend); the object collectives return ``gathered`` (the other ranks' objects) or ``None``
    for every other rank."""

    def __init__(self, world_size: int, gathered: list | None = None) -> None:
        self.world_size, self.gathered, self.calls = world_size, gathered, []

    def _on_cuda(self, tensor: torch.Tensor) -> None:
        self.calls.append("tensor")
        if tensor.device.type != "cuda":
            raise RuntimeError("No backend type associated with device type cpu")

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        self._on_cuda(tensor)

    def barrier(self, group=None, async_op=False, device_ids=None):
        self.calls.append("barrier")

    def all_gather_object(self, out, obj, group=None):
        self.calls.append(("all_gather_object", obj))
        out[:] = self.gathered or [obj] + [None] * (self.world_size - 1)

    def broadcast_object_list(self, objs, src=0, group=None, device=None, group_src=None):
        self.calls.append("broadcast_object_list")

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNccl:
        import torch.distributed as dist

        for name in ("all_reduce", "barrier", "all_gather_object", "broadcast_object_list"):
            monkeypatch.setattr(dist, name, getattr(self, name))
        return self


def _fsdp_step(nan: bool = False) -> TrainStep:
    """A one-process ``parallel = "fsdp"`` step that has stepped once."""
    s = fsdp_step(dim=16, layers=1)
    s.train_step([torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1))], 1e-3)
    if nan:
        with torch.no_grad():
            s.model.head.weight[0, 0] = float("nan")
    return s


NCCL = World(rank=0, world_size=2, local_rank=0, backend="nccl")


def test_an_nccl_world_agrees_on_finiteness_with_no_cpu_tensor_collective(tmp_path, monkeypatch):
    fake = FakeNccl(2).install(monkeypatch)
    s = _fsdp_step()
    save_sharded(s.model, s.optimizer, tmp_path / "dcp", NCCL)
    assert (tmp_path / "dcp" / ".metadata").is_file()
    assert fake.calls == [("all_gather_object", None)]  # this rank: every tensor finite


@pytest.mark.parametrize("nan", [False, True], ids=["finite here", "non-finite here too"])
def test_a_non_finite_tensor_on_another_rank_is_refused_naming_rank_and_tensor(
    tmp_path, monkeypatch, nan
):
    name = "model.head.weight"
    fake = FakeNccl(2, gathered=[name if nan else None, name]).install(monkeypatch)
    s = _fsdp_step(nan)
    with pytest.raises(NonFiniteError) as info:
        save_sharded(s.model, s.optimizer, tmp_path / "dcp", NCCL)
    assert fake.calls == [("all_gather_object", name if nan else None)]
    where = f"tensor {name!r} of this rank" if nan else f"rank 1's tensor {name!r}"
    assert str(info.value) == f"checkpoint refused: {where} is not finite"
    assert not (tmp_path / "dcp").exists()


ONE_RANK_NCCL = """
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.distributed.world import World
from iqtrain.errors import NonFiniteError
from iqtrain.model.transformer import IQTransformer
from iqtrain.train.step import TrainStep


class OneRank(World):  # a group of one that still goes through every collective
    @property
    def distributed(self):
        return True


torch.cuda.set_device(0)
out = Path(sys.argv[1])
store = dist.FileStore(str(out / "store"), 1)
dist.init_process_group(
    "nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0)
)
world = OneRank(0, 1, 0, "nccl")


def step():
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(dim=32, layers=2, heads=2, patch_len=4, max_patches=8))
    s = TrainStep(model, OptimizerConfig(lr=1e-3), device="cuda", precision="fp32",
                  compile=False, world=world, parallel="fsdp")
    s.data_parallel()
    assert s.forward_is_collective
    return s


a = step()
a.train_step([torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1))], 1e-3)
a.save_sharded(out / "dcp")
b = step()
b.load_sharded(out / "dcp")
want, got = a.model_state_dict(), b.model_state_dict()
assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
with torch.no_grad():
    next(a.model.parameters()).fill_(float("nan"))  # a sharded DTensor: every shard
try:
    a.save_sharded(out / "nan")
except NonFiniteError as exc:
    print("refused:", exc)
dist.destroy_process_group()
print("ok")
"""


@pytest.mark.gpu
@pytest.mark.gpu_smoke
def test_one_nccl_rank_saves_loads_and_refuses_a_sharded_checkpoint(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", ONE_RANK_NCCL, os.fspath(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]  # before the fix: a PeerError, exit 1
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "ok", done.stdout
    assert lines[-2].startswith("refused: checkpoint refused: tensor '") and (
        lines[-2].endswith("' of this rank is not finite")
    ), lines
    assert (tmp_path / "dcp" / ".metadata").is_file()
    assert not (tmp_path / "nan").exists()

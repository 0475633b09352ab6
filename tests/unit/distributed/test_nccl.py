"""One rank on NCCL: every collective the trainer uses, and a collective that times out.

Two ranks cannot share one GPU under NCCL, so what the peers of a failed rank do (they follow
it: one line, every rank's own exit code) is tested on gloo, with real processes
(tests/e2e/test_distributed.py) and with thread ranks (test_world.py). What only NCCL can show
runs here on a group of one rank: a :class:`OneRank` world goes through every collective
though it is alone (a World of one process skips them).

- The sweep: the join's path (the rendezvous store, the agreement before any group, the group
  made on that store), then every collective the trainer uses: ``all_reduce_sum`` (and its
  refusal of a host tensor on NCCL), ``all_gather_object``, ``broadcast_object``,
  ``wait_for_main``, ``agree`` (passing and failing), ``hosts``, ``RNGState.state_dict``, a DDP
  step, an FSDP2 step, ``model_state_dict`` of the sharded model, ``save_sharded`` /
  ``load_sharded`` and ``validate`` on both; the same numbers as one process. Its CPU variant
  runs the same code on gloo, so the sweep is known to be right before a GPU runs it.
- Not reachable on the CPU: an NCCL collective that times out. NCCL reports it from its
  watchdog thread, which kills the process (SIGABRT: no line of ours, exit -6 under torchrun)
  unless blocking wait is on (``World.connect`` sets ``TORCH_NCCL_BLOCKING_WAIT=1``): then the
  collective raises in the rank, and the rank ends with one ``iqtrain: error:`` line and exit 1.
  The GPU test queues a collective behind a 20 s kernel on a group whose timeout is 3 s.

Each runs in a subprocess (this file is its script): a hang costs the test its timeout, not
the GPU stage, and no process group outlives its test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from iqtrain.distributed.world import World

TIMEOUT = 180  # a subprocess that hangs fails its test


class OneRank(World):
    """A world of one rank that still goes through every collective."""

    @property
    def distributed(self) -> bool:
        return True


class _Windows:
    """What validation reads of a dataset: ``num_windows`` and ``windows(ids)``."""

    def __init__(self, raw: np.ndarray) -> None:
        self.raw = raw

    @property
    def num_windows(self) -> int:
        return len(self.raw)

    def windows(self, ids: Any) -> np.ndarray:
        return self.raw[np.asarray(ids, dtype=np.int64)]


def _step(world: World, device: str, parallel: str) -> Any:
    import torch

    from iqtrain.config.sections import ModelConfig, OptimizerConfig
    from iqtrain.model.transformer import IQTransformer
    from iqtrain.train.step import TrainStep

    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(dim=32, layers=2, heads=2, patch_len=4, max_patches=8))
    s = TrainStep(
        model,
        OptimizerConfig(lr=1e-3),
        device=device,
        precision="fp32",
        compile=False,
        world=world,
        parallel=parallel,
    )
    s.data_parallel()
    return s


def _joined(device: str) -> World:
    """A one-rank world joined as :func:`~iqtrain.distributed.world.join` joins (``env://``
    from MASTER_ADDR/MASTER_PORT, the agreement, the group on the same store)."""
    from torch.distributed import PrefixStore

    from iqtrain.distributed import world as w

    world = OneRank(0, 1, 0)
    store = w._rendezvous(world, 60)
    w._agree_to_start(world, None, {"training.device": device}, store, 60)
    world = world.connect(device, 60, PrefixStore("default_pg", store))
    assert type(world) is OneRank
    assert world.backend == ("nccl" if device == "cuda" else "gloo"), world
    return world


def _world_collectives(world: World, device: str) -> None:
    import socket

    import torch

    from iqtrain.distributed.world import agree
    from iqtrain.errors import DataError
    from iqtrain.train.rng import RNGState

    x = torch.arange(3.0, device=device)
    assert world.all_reduce_sum(x) is x and x.tolist() == [0.0, 1.0, 2.0]
    if device == "cuda":
        try:
            world.all_reduce_sum(torch.zeros(1))
        except ValueError as exc:
            assert "NCCL" in str(exc), exc
        else:
            raise AssertionError("an NCCL group all-reduced a host tensor")
    assert world.all_gather_object({"rank": 0}) == [{"rank": 0}]
    assert world.broadcast_object("rank 0's") == "rank 0's"
    world.wait_for_main()
    assert agree(world, None, same={"k": 1}, payload="share") == ["share"]
    try:
        agree(world, DataError("bad file"))
    except DataError as exc:
        assert str(exc) == "bad file"
    else:
        raise AssertionError("agree() passed a failed rank")
    assert world.hosts() == [socket.gethostname()]
    rng = RNGState(world).state_dict()
    assert rng["world_size"] == 1 and ("cuda" in rng["ranks"][0]) == (device == "cuda"), rng


def _steps(world: World, device: str, out: Path) -> None:
    """A DDP and an FSDP2 step, validation and a sharded checkpoint on the one-rank group:
    the numbers of one process without a group."""
    import torch

    from iqtrain.config.sections import DataConfig
    from iqtrain.train.validation import validate

    batch = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(1))
    raw = np.random.default_rng(0).integers(-2000, 2000, (7, 32, 2), dtype=np.int16)
    d = DataConfig(patch_len=4, seq_patches=8, batch_size=2, val_batch_size=3)
    plain = _step(World(), device, "ddp")
    want = plain.train_step([batch], 1e-3)
    want_val = validate(plain, _Windows(raw), d, 1, True)
    want_state = plain.model_state_dict()
    steps = {parallel: _step(world, device, parallel) for parallel in ("ddp", "fsdp")}
    assert steps["ddp"]._ddp is not None and steps["fsdp"].forward_is_collective
    for parallel, s in steps.items():
        got = s.train_step([batch], 1e-3)
        assert abs(got.loss - want.loss) <= 1e-6 * abs(want.loss), (parallel, got, want)
        state = s.model_state_dict()  # sharded: gathered whole onto this rank's CPU
        assert state.keys() == want_state.keys()
        for k, v in want_state.items():
            torch.testing.assert_close(state[k].cpu(), v.cpu(), rtol=1e-5, atol=1e-6)
        val = validate(s, _Windows(raw), d, 1, True)
        assert val.keys() == want_val.keys()
        assert abs(val["loss"] - want_val["loss"]) <= 1e-5 * abs(want_val["loss"]), val
    steps["fsdp"].save_sharded(out / "dcp")
    again = _step(world, device, "fsdp")
    again.load_sharded(out / "dcp")
    loaded, saved = again.model_state_dict(), steps["fsdp"].model_state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)


def _sweep(device: str, out: Path) -> None:
    world = _joined(device)
    _world_collectives(world, device)
    _steps(world, device, out)
    world.close()
    print("swept", flush=True)


def _time_out() -> None:
    """An all-reduce queued behind 20 s of GPU work on a group whose timeout is 3 s: as the
    CLI does under torchrun, the error's one line, then ``os._exit`` with its code."""
    import torch
    import torch.distributed as dist

    from iqtrain.console import error
    from iqtrain.errors import IQTrainError, exit_code

    world = OneRank(0, 1, 0).connect("cuda", 3, dist.HashStore())
    x = torch.ones(1, device="cuda")
    world.all_reduce_sum(x)  # the communicator is up, and this one completes
    torch.cuda.synchronize()
    torch.cuda._sleep(int(20 * 1.98e9))  # ~20 s of clock cycles at the H200's 1.98 GHz
    code, start = 0, time.monotonic()
    try:
        world.all_reduce_sum(x)
    except IQTrainError as exc:
        print(f"waited {time.monotonic() - start:.1f} s", flush=True)
        error(str(exc))
        code = exit_code(exc)
    sys.stderr.flush()
    os._exit(code)


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    # Blocking wait is World.connect's to set: the environment does not.
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_USE_AGENT_STORE"):
        base.pop(key, None)
    base.pop("TORCH_NCCL_BLOCKING_WAIT", None)
    return subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize(
    "device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.gpu_smoke])]
)
def test_one_rank_runs_every_collective_the_trainer_uses(tmp_path, device):
    proc = _run("sweep", device, os.fspath(tmp_path), env={"MASTER_ADDR": "127.0.0.1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert proc.stdout.strip().splitlines()[-1] == "swept", proc.stdout[-2000:]
    assert (tmp_path / "dcp" / ".metadata").is_file()


@pytest.mark.gpu
@pytest.mark.gpu_smoke
def test_an_nccl_collective_that_times_out_ends_the_rank_in_one_line():
    # As torchrun's workers: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (the watchdog tears down).
    start = time.monotonic()
    proc = _run("time-out", env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})
    took = time.monotonic() - start
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-6000:])
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1, proc.stderr[-6000:]
    assert lines[0].startswith(
        "iqtrain: error: rank 0: a collective with the other ranks failed"
    ), lines
    # The timeout ended the wait (3 s), not the kernel in front of the collective (20 s).
    waited = float(proc.stdout.split("waited ")[1].split(" s")[0])
    assert 2.5 <= waited < 15, proc.stdout
    assert took < 90, took


if __name__ == "__main__":
    os.environ.setdefault("MASTER_PORT", "0")  # one rank serves its own store on a free port
    if sys.argv[1] == "sweep":
        _sweep(sys.argv[2], Path(sys.argv[3]))
    elif sys.argv[1] == "time-out":
        _time_out()

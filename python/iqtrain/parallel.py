"""How several ranks hold a step's model (``training.parallel``, DESIGN.md section 9): replicated
by DistributedDataParallel, or sharded by FSDP2 with its state in torch.distributed.checkpoint.

Replication. As PyTorch documents for DDP, the module is compiled first (``module.compile``)
and then wrapped, so dynamo never traces DDP itself; the backward is one compiled graph, so the
gradient all-reduce runs when it ends (no overlap with the backward: the models here are small
per rank).

Sharding. Every block of ``model.blocks`` is one FSDP unit (``fully_shard``), then the root
(embedding, final norm, head): a block's parameters are gathered just before it runs and freed
after. Compiled, each block is compiled (``Module.compile``, in place, so parameter names stay
plain) *before* it is sharded, as torchtitan does: dynamo cannot trace FSDP2's hooks with
``fullgraph`` (``torch._dynamo.disable ... skipping FSDP hooks`` in torch 2.15), so the hooks
run eagerly between compiled blocks. FSDP2 averages gradients over the ranks exactly as DDP
does: measured on 2 gloo ranks, eager FSDP2 and DDP parameters are bit-identical after three
AdamW steps. The gradient norm is summed shard by shard, so it (and through clipping, the run)
agrees with DDP's to rounding only (1e-4 relative over 12 steps in tests/test_distributed.py).

State. :func:`save_sharded` writes ``{"model", "optimizer"}`` as each rank holds them
(parameter and moment shards, keyed by parameter name) with ``torch.distributed.checkpoint``:
one file per rank plus ``.metadata``. :func:`load_sharded` reads into whatever layout the
loading step has, sharded over any number of ranks or whole in one process: DCP reshards on
load. Both go through ``get_state_dict``/``set_state_dict``, which handle sharded and plain
modules alike.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import pickle
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from iqtrain.distributed import RankExit, World
from iqtrain.errors import CheckpointError, NonFiniteError, StorageError

__all__ = [
    "full_model_state",
    "full_optimizer_state",
    "global_norm",
    "load_full_optimizer_state",
    "load_sharded",
    "replicate",
    "save_sharded",
    "shard",
]


def replicate(module: nn.Module, world: World, *, cuda: bool) -> nn.Module:
    """``module`` (already compiled, if it is to be) in DistributedDataParallel: a collective
    that broadcasts rank 0's parameters and buffers."""
    from torch.nn.parallel import DistributedDataParallel

    # The only buffers are the rotary tables, constants: nothing to synchronise per step.
    # (torch 2.15 renamed the switch; older releases know only broadcast_buffers.)
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in params else "broadcast_buffers"
    return DistributedDataParallel(
        module, device_ids=[world.local_rank] if cuda else None, **{no_sync: False}
    )


def shard(model: nn.Module, *, compile_options: dict[str, Any] | None, compile: bool) -> None:
    """Shard ``model`` in place over the default process group (every rank, a collective
    set-up): each of ``model.blocks`` (compiled first when ``compile``), then the root."""
    from torch.distributed.fsdp import fully_shard

    blocks = list(getattr(model, "blocks", ()))
    for i, block in enumerate(blocks):
        if compile:
            block.compile(fullgraph=True, options=compile_options)
        # The backward starts with the last block: keeping it gathered after the forward saves
        # an all-gather per step for one block's memory (FSDP2 does the same for the root).
        fully_shard(block, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model)


def global_norm(norm: torch.Tensor) -> torch.Tensor:
    """``get_total_norm`` of DTensor gradients is a DTensor: its value over every shard."""
    from torch.distributed.tensor import DTensor

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model on rank 0, on the CPU (a collective: every rank gathers, rank 0 keeps it;
    the other ranks get ``{}``). Keys are plain parameter names."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict | None:
    """An unsharded optimizer's state keyed by parameter name (what survives sharding, which
    replaces the parameters), or None when it has none yet."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state:  # get_optimizer_state_dict would initialise it (step 1)
        return None
    return get_optimizer_state_dict(model, optimizer)


def load_full_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load :func:`full_optimizer_state`'s result into the optimizer of the sharded ``model``:
    every rank holds the whole state and keeps its own shard of each moment."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)


def _local(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _non_finite(state: dict[str, Any], prefix: str = "") -> str | None:
    """The first non-finite floating tensor of this rank's part of ``state``, by name."""
    for key, value in state.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found = _non_finite(value, name + ".")
            if found is not None:
                return found
        elif isinstance(value, torch.Tensor):
            local = _local(value)
            if local.is_floating_point() and not bool(torch.isfinite(local).all()):
                return name
    return None


class _DCPLogs(logging.Filter):
    """DCP logs its internal failures, tracebacks included, on the root logger; they reach the
    user as the one error line its exception becomes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torch/distributed/checkpoint/" not in record.pathname.replace(os.sep, "/")


@contextlib.contextmanager
def _dcp_quietly() -> Iterator[None]:
    """One process has no group: DCP warns that it assumes a single-process save or load."""
    quiet, root = _DCPLogs(), logging.getLogger()
    root.addFilter(quiet)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load)")
            yield
    finally:
        root.removeFilter(quiet)


# ------------------------------------------------------------- reading what others wrote, safely
# DCP unpickles ``.metadata`` and every non-tensor item (the optimizer's hyperparameters) with
# full powers: a forged checkpoint would run code on load. checkpoint.json's hashes prove only
# that the files are the ones it lists, so both are read first by unpicklers that build only
# what a checkpoint holds.


def _metadata_global(module: str, name: str) -> bool:
    """What a DCP ``.metadata`` may name (torch 2.15 writes exactly these): DCP's metadata
    classes and file records, torch sizes, dtypes and layouts, and the path it was saved to."""
    from torch.distributed.checkpoint import metadata

    if module == metadata.__name__:
        obj = getattr(metadata, name, None)
        return isinstance(obj, type) and obj.__module__ == module
    if module == "torch":
        return name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)
    return (module, name) in _METADATA_GLOBALS


_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if not _metadata_global(module, name):
            raise pickle.UnpicklingError(f"it names {module}.{name}, not checkpoint metadata")
        return super().find_class(module, name)


def _check_metadata(directory: Path) -> None:
    """CheckpointError naming ``directory/.metadata`` unless it unpickles as metadata only."""
    path = directory / ".metadata"
    try:
        with open(path, "rb") as f:
            _MetadataUnpickler(f).load()
    except Exception as exc:  # untrusted bytes: any failure is a refusal
        raise CheckpointError(f"{path}: refused: {type(exc).__name__}: {exc}") from None


def _plain_data_planner() -> Any:
    """DCP's default load planner, except that a non-tensor item must unpickle with
    ``weights_only`` (plain data and tensors) before DCP unpickles it."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class PlainDataPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            data = value.read()
            torch.load(io.BytesIO(data), weights_only=True)  # raises on anything else
            super().load_bytes(read_item, io.BytesIO(data))

    return PlainDataPlanner()


def _train_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optimizer_state}


def save_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, world: World
) -> None:
    """Write this rank's shards of the model and optimizer into ``directory`` (every rank, the
    same directory; a collective). Refuses a non-finite tensor on any rank before anything is
    written. A write that fails on any rank fails on every rank: rank 0 raises
    :class:`StorageError` naming the directory and the ranks, the others exit quietly with 1."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    if not optimizer.state:
        # get_state_dict would initialise the moments and bump the step of a live optimizer.
        raise RuntimeError("a sharded checkpoint needs an optimizer that has stepped")
    state = _train_state(model, optimizer)
    bad = _non_finite(state)
    flags = world.all_reduce_sum(torch.tensor([0.0 if bad is None else 1.0]))
    if float(flags[0]) > 0:
        where = f"tensor {bad!r} of this rank" if bad is not None else "another rank's shard"
        raise NonFiniteError(f"checkpoint refused: {where} is not finite")
    try:
        # CheckpointException derives from BaseException: ``except Exception`` misses it.
        with _dcp_quietly():
            dcp.save(state, storage_writer=dcp.FileSystemWriter(directory, sync_files=True))
    except CheckpointException as exc:
        failures = getattr(exc, "failures", {}) or {}
        first = next(iter(failures.values()), (exc,))[0]
        message = (
            f"{directory}: cannot write the sharded state on rank(s) {sorted(failures)}: {first}"
        )
        if not world.is_main:
            raise RankExit(1, message) from None
        raise StorageError(message) from None


def load_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, world: World
) -> None:
    """Load a sharded checkpoint's model and optimizer state into ``model``/``optimizer``,
    resharding to this world (every rank together; one process reads every shard alone).
    Raises :class:`CheckpointError` naming ``directory`` when the state does not fit."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_state_dict

    _check_metadata(directory)
    state = _train_state(model, optimizer)
    try:
        with _dcp_quietly():
            reader, planner = dcp.FileSystemReader(directory), _plain_data_planner()
            dcp.load(state, storage_reader=reader, planner=planner)
    except CheckpointException as exc:  # a missing or misshapen key, on any rank
        failures = getattr(exc, "failures", {}) or {}
        first = next(iter(failures.values()), (exc,))[0]
        raise CheckpointError(f"{directory}: cannot load the sharded state: {first}") from None
    # (A backend failure while loading is not caught here: it is the peers', not the file's.)
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )
    except (RuntimeError, ValueError, KeyError) as exc:
        text = str(exc).strip().splitlines()
        raise CheckpointError(
            f"{directory}: cannot load the sharded state: {text[0] if text else exc!r}"
        ) from None

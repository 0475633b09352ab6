"""The sharded state of a checkpoint (``training.parallel = "fsdp"``; docs/design.md "DCP and
restricted unpicklers").

:func:`save_sharded` writes ``{"model", "optimizer"}`` as each rank holds them
(parameter and moment shards, keyed by parameter name) with ``torch.distributed.checkpoint``:
one file per rank plus ``.metadata``. :func:`load_sharded` reads into whatever layout the
loading step has, sharded over any number of ranks or whole in one process: DCP reshards on
load. Both go through ``get_state_dict``/``set_state_dict``, which handle sharded and plain
modules alike.
"""

from __future__ import annotations

import contextlib
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

from iqtrain.distributed.world import RankExit, World
from iqtrain.errors import CheckpointError, NonFiniteError, StorageError
from iqtrain.storage import RestrictedUnpickler


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
# what a checkpoint holds (``.metadata``: iqtrain.storage's RestrictedUnpickler, admitting only
# DCP's metadata globals; the items: torch.load(weights_only=True), torch's own).


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


class _MetadataUnpickler(RestrictedUnpickler):
    def admit(self, module: str, name: str) -> Any | None:
        return self.import_global(module, name) if _metadata_global(module, name) else None

    def refused(self, module: str, name: str) -> Exception:
        return pickle.UnpicklingError(f"it names {module}.{name}, not checkpoint metadata")


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


def _refuse_non_finite(state: dict[str, Any], world: World) -> None:
    """NonFiniteError on every rank when any rank holds a non-finite tensor, naming this rank's
    first one, or else the first rank's. The ranks agree through an object collective: a CPU
    flag tensor would not do, since an NCCL group (training.device = "cuda") has no CPU
    backend, and the step's device is not known here."""
    bad = _non_finite(state)
    found = [(r, n) for r, n in enumerate(world.all_gather_object(bad)) if n is not None]
    if found:
        rank, name = found[0]
        where = f"tensor {bad!r} of this rank" if bad else f"rank {rank}'s tensor {name!r}"
        raise NonFiniteError(f"checkpoint refused: {where} is not finite")


def save_sharded(
    model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path, world: World
) -> None:
    """Write this rank's shards of the model and optimizer into ``directory`` (every rank, the
    same directory; a collective). Refuses a non-finite tensor on any rank before anything is
    written (:func:`_refuse_non_finite`). A write that fails on any rank fails on every rank:
    rank 0 raises :class:`StorageError` naming the directory and the ranks, the others exit
    quietly with 1."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    if not optimizer.state:
        # get_state_dict would initialise the moments and bump the step of a live optimizer.
        raise RuntimeError("a sharded checkpoint needs an optimizer that has stepped")
    state = _train_state(model, optimizer)
    _refuse_non_finite(state, world)
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

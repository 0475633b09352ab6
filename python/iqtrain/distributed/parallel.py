"""How several ranks hold a step's model (``training.parallel``, docs/design.md "DDP and
FSDP2"):
replicated by DistributedDataParallel, or sharded by FSDP2 (its checkpoint state:
:mod:`iqtrain.distributed.dcp`).

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
agrees with DDP's to rounding only (1e-4 relative over 12 steps in tests/e2e/test_distributed.py).

"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from torch import nn

from iqtrain.distributed.world import World

__all__ = [
    "full_model_state",
    "full_optimizer_state",
    "global_norm",
    "load_full_optimizer_state",
    "replicate",
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
    switch: dict[str, Any] = {no_sync: False}
    return DistributedDataParallel(
        module, device_ids=[world.local_rank] if cuda else None, **switch
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
    # Typed for any state dict (ValueType covers optimizer state too); a model's is all tensors.
    return cast(dict[str, torch.Tensor], get_model_state_dict(model, options=options))


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

"""The optimizer's state as a checkpoint stores it: every tensor for optimizer.safetensors (as
``state.<param index>.<name>``), the rest as JSON in state.json's ``optimizer`` table (a tensor
hyperparameter such as the lr as ``{"tensor": value, "dtype": name}``, a tuple as
``{"tuple": [...]}``). torch is imported by the functions: the checkpoint package imports none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["join_optimizer_state", "split_optimizer_state"]


def split_optimizer_state(
    optim_sd: dict[str, Any],
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state dict -> (tensors for safetensors, JSON-able remainder)."""
    import torch

    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in optim_sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = []
    for group in optim_sd["param_groups"]:
        g: dict[str, Any] = {}
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                # A tensor hyperparameter (the lr) stays a tensor on restore, with its dtype.
                g[key] = {"tensor": value.item(), "dtype": str(value.dtype).removeprefix("torch.")}
            elif isinstance(value, tuple):
                g[key] = {"tuple": list(value)}
            else:
                g[key] = value
        groups.append(g)
    return tensors, {"scalars": scalars, "param_groups": groups}


def join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """The optimizer state dict :func:`split_optimizer_state` split."""
    import torch

    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, entry in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(entry)
    groups = []
    for g in meta["param_groups"]:
        group: dict[str, Any] = {}
        for key, value in g.items():
            if isinstance(value, dict) and "tensor" in value:
                group[key] = torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"]))
            elif isinstance(value, dict) and "tuple" in value:
                group[key] = tuple(value["tuple"])
            else:
                group[key] = value
        groups.append(group)
    return {"state": state, "param_groups": groups}

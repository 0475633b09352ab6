"""The optimizer of a step: which parameters get weight decay, and fused AdamW with a tensor lr
per group (docs/design.md "AdamW"). How a checkpoint stores its state:
:mod:`iqtrain.checkpoint.optim_codec`."""

from __future__ import annotations

import torch
from torch import nn

from iqtrain.config.sections import OptimizerConfig

__all__ = [
    "build_adamw",
    "split_parameters",
]


def split_parameters(
    model: nn.Module,
) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(decay, no_decay) lists of ``(name, parameter)`` over trainable parameters.

    Weight decay goes on matrices (ndim >= 2): it limits their scale, which is what capacity
    control means for a linear map. Norm gains and biases are 1-d offsets and scales whose decay
    only fights the normalization; embeddings (``nn.Embedding`` and the modules a model names in
    ``embedding_modules``, the patch embedding here) map inputs rather than mix features, and
    decaying them shrinks the input signal.
    """
    embedding_names = set(getattr(model, "embedding_modules", ()))
    embedding_params: set[int] = set()
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) or name in embedding_names:
            embedding_params.update(id(p) for p in module.parameters())
    decay: list[tuple[str, nn.Parameter]] = []
    no_decay: list[tuple[str, nn.Parameter]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.ndim >= 2 and id(p) not in embedding_params:
            decay.append((name, p))
        else:
            no_decay.append((name, p))
    return decay, no_decay


def build_adamw(
    decay: list[nn.Parameter],
    no_decay: list[nn.Parameter],
    opt_cfg: OptimizerConfig,
    head: set[int] | None = None,
) -> torch.optim.AdamW:
    """Fused AdamW over the weight-decay group and the one without (each only when it has
    parameters), with a tensor lr per group.

    ``head`` (a fine-tuned model: the ids of its head's parameters): four groups instead, the
    trunk's decay and no-decay groups with ``lr_scale = optimizer.trunk_lr_scale`` and the
    head's with ``lr_scale = 1.0`` (empty ones dropped), in that order; the step sets each
    group's lr to the schedule's times its ``lr_scale``."""
    if head is None:
        groups = [
            {"params": g, "weight_decay": wd}
            for g, wd in ((decay, opt_cfg.weight_decay), (no_decay, 0.0))
            if g
        ]
    else:
        scale = opt_cfg.trunk_lr_scale
        groups = [
            {
                "params": [p for p in g if (id(p) in head) == is_head],
                "weight_decay": wd,
                "lr_scale": 1.0 if is_head else scale,
            }
            for is_head in (False, True)
            for g, wd in ((decay, opt_cfg.weight_decay), (no_decay, 0.0))
        ]
        groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(
        groups,
        lr=torch.tensor(opt_cfg.lr, dtype=torch.float64),
        betas=opt_cfg.betas,
        eps=opt_cfg.eps,
        fused=True,
    )
    # The default lr tensor is shared by every group; give each its own so a group's value
    # can be read or changed independently, as with float lrs.
    for group in optimizer.param_groups:
        group["lr"] = torch.tensor(opt_cfg.lr, dtype=torch.float64)
    return optimizer

"""``[init] from``: a new attempt whose model starts from a verified checkpoint's weights
(docs/design.md section 6.11).

The source is resolved and verified as a resume verifies its parent (its optimizer tensors are
not read: optimizer, schedule, stream and step start fresh). Every architecture key of
``[model]`` must match the source's (:data:`ARCHITECTURE_KEYS`): the first that differs is one
ConfigError line naming it, before anything is created. The record an attempt keeps of its
source (:class:`InitSource.record`) is what ``attempt.json`` and the manifest hold as ``init``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from iqtrain.checkpoint.files import listed_sha256
from iqtrain.config.sections import InitConfig, ModelConfig
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.lineage import load_parent
from iqtrain.model.transformer import NextPatchModel
from iqtrain.pretrained.load import load_weights, source_config, source_ref

__all__ = ["ARCHITECTURE_KEYS", "InitSource", "first_difference", "load_init"]

#: ``[model]`` keys that shape the weights or what they compute: a checkpoint's tensors mean
#: what they meant in training only with every one of these equal. (``dropout`` and
#: ``init_std`` only act in training and at initialisation: they may differ.)
ARCHITECTURE_KEYS = (
    "dim",
    "layers",
    "heads",
    "mlp_hidden",
    "patch_len",
    "max_patches",
    "rope_theta",
    "objective",
    "bins",
    "bin_range",
)


@dataclass(frozen=True)
class InitSource:
    """The verified source of a new attempt's weights."""

    record: dict[str, Any]  # {attempt, checkpoint, step, model_sha256}
    model_state: dict[str, torch.Tensor]

    def load_into(self, model: NextPatchModel) -> None:
        """Every weight of ``model`` from the source (strict: the architectures matched)."""
        path = Path(self.record["attempt"], "checkpoints", self.record["checkpoint"])
        load_weights(model, self.model_state, path / "model.safetensors")


def first_difference(mine: ModelConfig, source: ModelConfig) -> str | None:
    """The first architecture key (in :data:`ARCHITECTURE_KEYS` order) whose value differs."""
    for key in ARCHITECTURE_KEYS:
        if getattr(mine, key) != getattr(source, key):
            return key
    return None


def load_init(init: InitConfig, model: ModelConfig) -> InitSource | None:
    """The source ``[init]`` names, verified, or None when ``init.from`` is empty.

    CheckpointError names a source that fails verification; ConfigError names the first
    architecture key of ``model`` that differs from the source's."""
    if not init.from_:
        return None
    ref = source_ref(init.from_, init.which, name="init.which")
    try:
        parent = load_parent(ref, optimizer=False)
    except CheckpointError as exc:
        raise CheckpointError(f"init.from: {exc}") from None
    source = source_config(parent, name="init.from: ").model
    key = first_difference(model, source)
    if key is not None:
        raise ConfigError(
            f"model.{key}: {getattr(model, key)!r} here, but the init.from checkpoint "
            f"({parent.checkpoint}) was trained with {getattr(source, key)!r}; every "
            f"architecture key must match its source's"
        )
    record = {
        "attempt": os.fspath(parent.attempt.resolve()),
        "checkpoint": parent.checkpoint.name,
        "step": parent.state.step,
        "model_sha256": listed_sha256(parent.checkpoint),
    }
    return InitSource(record, parent.model_state)

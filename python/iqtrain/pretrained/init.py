"""``[init] from``: a new attempt whose model starts from a verified checkpoint's weights
(docs/design.md "A new attempt from existing weights").

The source is resolved and verified as a resume verifies its parent (its optimizer tensors are
not read: optimizer, schedule, stream and step start fresh). Every architecture key of
``[model]`` must match the source's (:data:`ARCHITECTURE_KEYS`): the first that differs is one
ConfigError line naming it, before anything is created. A labelled objective's attempt (a
fine-tune) takes the trunk (:data:`TRUNK_KEYS` must match) and a new head, unless its source
has the same objective, classes and ``model.pool``: then every weight. The record an
attempt keeps of its source (:class:`InitSource.record`) is what ``attempt.json`` and the
manifest hold as ``init``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from iqtrain.checkpoint.files import listed_sha256
from iqtrain.config.sections import ARCHITECTURE_KEYS, TRUNK_KEYS, InitConfig, ModelConfig
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.lineage import load_parent
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import load_weights, source_config, source_ref

__all__ = ["InitSource", "first_difference", "load_init"]


@dataclass(frozen=True)
class InitSource:
    """The verified source of a new attempt's weights."""

    record: dict[str, Any]  # {attempt, checkpoint, step, model_sha256} or {package, ...}
    model_state: dict[str, torch.Tensor]
    #: A fine-tune from another head: only the trunk's weights are loaded.
    trunk_only: bool = False
    #: The sample rate the source was trained at (its state.json ``sample_rate``); None when
    #: its recordings had none or several, or its state predates the record.
    sample_rate: float | None = None

    @property
    def checkpoint(self) -> Path:
        """The source checkpoint's directory (a package's own)."""
        if "package" in self.record:
            return Path(self.record["package"])
        return Path(self.record["attempt"], "checkpoints", self.record["checkpoint"])

    def load_into(self, model: IQTransformer) -> None:
        """Every weight of ``model`` from the source (strict: the architectures matched), or
        with ``trunk_only`` every weight but the head's (the head keeps its initialisation)."""
        path = self.checkpoint
        if not self.trunk_only:
            load_weights(model, self.model_state, path / "model.safetensors")
            return
        head = {k: v for k, v in model.state_dict().items() if model.is_head(k)}
        load_weights(
            model, {**model.trunk_state(self.model_state), **head}, path / "model.safetensors"
        )


def first_difference(
    mine: ModelConfig, source: ModelConfig, keys: tuple[str, ...] = ARCHITECTURE_KEYS
) -> str | None:
    """The first of ``keys`` (architecture keys, in order) whose value differs."""
    for key in keys:
        if getattr(mine, key) != getattr(source, key):
            return key
    return None


def load_init(
    init: InitConfig, model: ModelConfig, classes: tuple[str, ...] | None = None
) -> InitSource | None:
    """The source ``[init]`` names, verified, or None when ``init.from`` is empty (``classes``:
    a fine-tune's training classes).

    CheckpointError names a source that fails verification; ConfigError names the first
    architecture key of ``model`` that differs from the source's."""
    if not init.from_:
        return None
    found = _source(init)
    source = found.config
    fine_tune = model.task.labelled
    keys = TRUNK_KEYS if fine_tune else ARCHITECTURE_KEYS
    key = first_difference(model, source, keys)
    if key is not None:
        what = "trunk" if fine_tune else "architecture"
        raise ConfigError(
            f"model.{key}: {getattr(model, key)!r} here, but the init.from checkpoint "
            f"({found.where}) was trained with {getattr(source, key)!r}; every "
            f"{what} key must match its source's"
        )
    # A classifier continues its own head only over the same classes, pooled the same way.
    trunk_only = fine_tune and not (
        source.objective == model.objective
        and source.pool == model.pool
        and found.classes == list(classes or ())
    )
    return InitSource(found.record, found.state, trunk_only, found.sample_rate)


@dataclass(frozen=True)
class _Found:
    """A verified ``[init] from``: where it is, its model config and classes, its tensors, its
    rate and the record attempt.json keeps of it."""

    where: Path
    config: ModelConfig
    classes: list[str] | None
    state: dict[str, torch.Tensor]
    sample_rate: float | None
    record: dict[str, Any]


def _source(init: InitConfig) -> _Found:
    """The checkpoint ``[init] from`` names (an attempt, a checkpoint or a package), verified."""
    from iqtrain.evidence.package import is_package
    from iqtrain.pretrained.package import load_package_state

    path = Path(init.from_)
    if is_package(path):
        if init.which is not None:
            raise ConfigError(f"init.which: {init.which!r}, but {path} is a package")
        try:
            package, config, state = load_package_state(path)
        except CheckpointError as exc:
            raise CheckpointError(f"init.from: {exc}") from None
        doc = package.config
        record = {
            "package": os.fspath(package.path.resolve()),
            "step": doc["step"],
            "model_sha256": doc["model_sha256"],
        }
        return _Found(package.path, config.model, doc["classes"], state, doc["sample_rate"], record)
    ref = source_ref(init.from_, init.which, name="init.which", error=ConfigError)
    try:
        parent = load_parent(ref, optimizer=False)
    except CheckpointError as exc:
        raise CheckpointError(f"init.from: {exc}") from None
    record = {
        "attempt": os.fspath(parent.attempt.resolve()),
        "checkpoint": parent.checkpoint.name,
        "step": parent.state.step,
        "model_sha256": listed_sha256(parent.checkpoint),
    }
    return _Found(
        parent.checkpoint,
        source_config(parent, name="init.from: ").model,
        parent.state.classes,
        parent.model_state,
        parent.state.known_rate,
        record,
    )

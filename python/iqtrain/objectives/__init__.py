"""What a model is trained to do, as one type: :class:`Objective` (docs/design.md "Objectives").

``model.objective`` names one of :data:`REGISTRY`: "mse" and "categorical" pretrain by
next-patch prediction (:mod:`~iqtrain.objectives.next_patch`), "classify" fine-tunes to the
class of a labelled window (:mod:`~iqtrain.objectives.classify`). ``ModelConfig.task`` is the
config's objective; the trainer, the verifier, :mod:`iqtrain.pretrained`, :mod:`iqtrain.report`
and :mod:`iqtrain.eval` ask it what differs. A new objective is one module with an
:class:`Objective` subclass and one line in :data:`REGISTRY` (docs/development.md "A new
objective"). Nothing here imports torch on import.
"""

from __future__ import annotations

from typing import Any

from iqtrain.errors import ConfigError
from iqtrain.objectives.base import USES, Objective, Use
from iqtrain.objectives.categorical import Categorical
from iqtrain.objectives.classify import Classify
from iqtrain.objectives.mse import MSE

__all__ = ["REGISTRY", "USES", "Objective", "Use", "check_keys", "get", "names"]

#: Every objective by its ``model.objective`` name, in the order messages list them: the
#: registration a new objective adds itself to.
REGISTRY: dict[str, Objective] = {o.name: o for o in (MSE(), Categorical(), Classify())}


def names() -> tuple[str, ...]:
    """The ``model.objective`` values a config may name."""
    return tuple(REGISTRY)


def get(name: str) -> Objective:
    """The objective named ``name`` (ValueError naming the known ones otherwise)."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"model.objective: must be one of {', '.join(map(repr, names()))}, got {name!r}"
        ) from None


def check_keys(objective: Objective, section: str, values: Any) -> None:
    """ConfigError naming the key when a key of config section ``section`` (``values``: the
    section's dataclass) that only other objectives read is set to anything but its "off"
    value under ``objective``."""
    optional = {k: v for o in REGISTRY.values() for k, v in o.reads.items()}
    for key, off in optional.items():
        owner, _, field = key.partition(".")
        if owner != section or key in objective.reads:
            continue
        value = getattr(values, field)
        if value != off or type(value) is not type(off):
            readers = " or ".join(repr(o.name) for o in REGISTRY.values() if key in o.reads)
            raise ConfigError(
                f"{key}: only model.objective = {readers} reads it; a {objective.name!r} run "
                f"does not (leave it at {off!r}), got {value!r}"
            )

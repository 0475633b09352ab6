"""Learning-rate schedules over optimizer steps ``s = 0 … S-1`` (docs/design.md
"Learning-rate schedule").

WSD (warmup-stable-decay) with warmup ``W``, decay ``D``, peak ``lr`` and floor ``min_lr``:

- ``s < W``: ``lr * (s + 1) / W``
- ``W <= s < S - D``: ``lr``
- ``s >= S - D``: ``p = (s - (S - D) + 1) / D``; ``min_lr + (lr - min_lr) * f(p)`` with
  ``f = 1 - p`` (linear), ``(1 + cos(pi p)) / 2`` (cosine) or ``1 - sqrt(p)`` (sqrt), so the
  last step runs at exactly ``min_lr``.

``cosine``: warmup, then ``p = (s - W + 1) / (S - W)``; ``min_lr + (lr - min_lr) * (1 + cos(pi
p)) / 2``, from ``lr`` to exactly ``min_lr`` at the last step. ``constant``: warmup, then ``lr``.
Warmup is the same for every kind. The decay start is ``S - D`` (wsd), ``W`` (cosine), ``S``
(constant).

The plan (S, W, D, kind, shape, lr, min_lr) is stored in every checkpoint; a resume keeps it, and
changing S is an explicit decision allowed only before the new decay start (:meth:`Plan.extend`).

:class:`ScheduleConfig` (the ``[schedule]`` table) and its kinds and shapes (:data:`KINDS`,
:data:`SHAPES`) live in :mod:`iqtrain.config.sections`. Offers :class:`Plan` and :func:`lr_at`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from iqtrain.config.sections import KINDS, SHAPES, DecayShape, ScheduleConfig, ScheduleKind
from iqtrain.errors import ConfigError

__all__ = [
    "Plan",
    "lr_at",
]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything that determines the learning rate of every step."""

    kind: ScheduleKind
    max_steps: int
    warmup_steps: int
    decay_steps: int
    decay_shape: DecayShape
    lr: float
    min_lr: float

    @classmethod
    def from_config(cls, schedule: ScheduleConfig, max_steps: int, lr: float, min_lr: float):
        return cls(
            kind=schedule.kind,
            max_steps=max_steps,
            warmup_steps=schedule.warmup_steps,
            decay_steps=schedule.decay_steps if schedule.kind == "wsd" else 0,
            decay_shape=schedule.decay_shape,
            lr=lr,
            min_lr=min_lr,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        """A plan read back from a checkpoint; ValueError/TypeError if it is not a valid one."""
        plan = cls(**d)
        if plan.kind not in KINDS or (plan.kind == "wsd" and plan.decay_shape not in SHAPES):
            raise ValueError(f"unknown schedule {plan.kind!r} / {plan.decay_shape!r}")
        for name in ("max_steps", "warmup_steps", "decay_steps"):
            value = getattr(plan, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise TypeError(f"{name} is {value!r}")
        for name in ("lr", "min_lr"):
            value = getattr(plan, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} is {value!r}")
        return plan

    @property
    def decay_start(self) -> int:
        """First step of the decay phase (``max_steps`` when there is none)."""
        if self.kind == "wsd":
            return self.max_steps - self.decay_steps
        if self.kind == "cosine":
            return self.warmup_steps
        return self.max_steps

    def extend(self, max_steps: int, completed_steps: int) -> Plan:
        """The same plan with another total, allowed only while no step of the *new* plan's
        decay (and none of the old one's) has run: steps already taken keep their lr."""
        new = Plan(**{**asdict(self), "max_steps": max_steps})
        if max_steps < self.warmup_steps + self.decay_steps or max_steps < 1:
            raise ConfigError(
                f"training.max_steps: {max_steps} is shorter than warmup + decay "
                f"({self.warmup_steps} + {self.decay_steps})"
            )
        if completed_steps > min(new.decay_start, self.decay_start):
            raise ConfigError(
                f"training.max_steps: cannot change the plan after step "
                f"{min(new.decay_start, self.decay_start)} (the decay start); "
                f"this checkpoint is at step {completed_steps}"
            )
        return new


def lr_at(s: int, plan: Plan) -> float:
    """Learning rate of optimizer step ``s`` (0-based) under ``plan``."""
    S, W, lr, lo = plan.max_steps, plan.warmup_steps, plan.lr, plan.min_lr
    if not 0 <= s < S:
        raise ValueError(f"step {s} outside the plan [0, {S})")
    if s < W:
        return lr * (s + 1) / W
    if plan.kind == "constant":
        return lr
    if plan.kind == "cosine":
        p = (s - W + 1) / (S - W)
        return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * p))
    D = plan.decay_steps
    if s < S - D:
        return lr
    p = (s - (S - D) + 1) / D
    if plan.decay_shape == "linear":
        f = 1.0 - p
    elif plan.decay_shape == "cosine":
        f = 0.5 * (1.0 + math.cos(math.pi * p))
    else:
        f = 1.0 - math.sqrt(p)
    return lo + (lr - lo) * f

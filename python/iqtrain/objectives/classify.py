"""``model.objective = "classify"``: fine-tuning to the class of a labelled window
(docs/design.md "Objectives", "Fine-tuning").

The trunk is a pretraining model's; the head pools the patches' final hidden states into one
vector per window (``model.pool``: their mean, or one learned attention query) and maps it to
one logit per class of the training set (``data.label_key`` annotations; the classes sorted,
their order recorded in attempt.json and every state.json). Loss: the cross-entropy of each
window in nats, averaged over the windows. Validation records the loss, the accuracy, each
class's accuracy and the majority-class baseline; the best checkpoint and early stopping
follow the accuracy, higher is better (the first of equal accuracies stays best). A trained
model embeds and predicts (each window's log-probability of each class); it scores no next
patch. Only this objective reads ``model.pool``, ``model.freeze_trunk``,
``optimizer.trunk_lr_scale`` and ``data.label_key``; the probe does not run (its validation
measures the classes itself).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from iqtrain.objectives.base import Objective, Use, fp32

if TYPE_CHECKING:
    from torch import Tensor

    from iqtrain.config.sections import ModelConfig

__all__ = ["Classify", "classify_loss"]


def classify_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, int, Tensor]:
    """``(mean, sum, count, predictions)`` of the logits ``[B, classes]`` against ``labels [B]``
    (int64 class indices): the cross-entropy of each window in nats, summed over the
    ``count = B`` windows, and each window's arg-max class (int64). fp32 even under autocast. A
    non-finite logit makes the loss NaN (the step's finite check rejects it)."""
    import torch.nn.functional as F

    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [B, classes] and labels [B], got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    with fp32(logits.device.type):
        lf = logits.float()
        total = F.cross_entropy(lf, labels, reduction="sum")
        # cross_entropy of a row with +inf and finite logits is finite; the sum is not.
        total = total + 0.0 * lf.sum()
        count = logits.shape[0]
        return total / count, total, count, lf.argmax(dim=1)


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


class Classify(Objective):
    name: ClassVar[str] = "classify"
    labelled: ClassVar[bool] = True
    monitor: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True
    nll: ClassVar[bool] = True
    loss_unit: ClassVar[str] = "nats per window"
    uses: ClassVar[frozenset[Use]] = frozenset({"embed", "predict"})
    reads: ClassVar[dict[str, object]] = {
        "model.pool": "mean",
        "model.freeze_trunk": False,
        "optimizer.trunk_lr_scale": 1.0,
        "data.label_key": "core:label",
    }

    def head_width(self, config: ModelConfig, classes: int) -> int:
        return classes

    def loss(
        self,
        out: Tensor,
        patches: Tensor,
        labels: Tensor | None,
        config: ModelConfig,
        squared_error: bool = False,
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        if labels is None:
            raise ValueError(f"model.objective {self.name!r} needs each window's label")
        return classify_loss(out, labels)

    def validation_note(self, record: Any) -> str:
        return f"loss {record['loss']:.5f}, accuracy {record['accuracy']:.4f}"

    def summary_lines(self, result: Any) -> list[str]:
        final = _fmt(result.final_val_accuracy, ".4f")
        best = _fmt(result.best_val_accuracy, ".4f")
        loss = _fmt(result.final_val_loss, ".5f")
        return [f"  final val accuracy {final} (loss {loss} {self.loss_unit}), best {best}"]

    def untrained_line(
        self,
        loss_sum: float,
        squared: float,
        count: int,
        zero: float,
        config: ModelConfig,
        classes: int,
    ) -> str:
        return (
            f"5 untrained loss {loss_sum / count:.4f} {self.loss_unit} (uniform ln {classes} = "
            f"{math.log(classes):.4f}; windows per batch: {count})"
        )

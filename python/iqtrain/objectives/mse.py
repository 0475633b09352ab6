"""``model.objective = "mse"``: the head predicts each value of the next patch itself
(docs/design.md "Objectives").

Loss: the squared error summed over I and Q, averaged over the complex target samples (NMSE on
window-normalised data: predicting zeros scores about 1.0, ``-10 log10`` of it is the prediction
SNR in dB). The predicted mean is the output, so validation's ``nmse`` is its ``loss``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from iqtrain.objectives.base import fp32
from iqtrain.objectives.next_patch import NextPatch, _fmt_db, check_shapes, next_patch_loss

if TYPE_CHECKING:
    from torch import Tensor

    from iqtrain.config.sections import ModelConfig

__all__ = ["MSE"]


class MSE(NextPatch):
    name: ClassVar[str] = "mse"
    nll: ClassVar[bool] = False
    loss_unit: ClassVar[str] = "NMSE"

    def loss(
        self,
        out: Tensor,
        patches: Tensor,
        labels: Tensor | None,
        config: ModelConfig,
        squared_error: bool = False,
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        mean, total, count = next_patch_loss(out, patches)
        return mean, total, count, total

    def window_losses(self, out: Tensor, patches: Tensor, config: ModelConfig) -> Tensor:
        """Each window's squared error over its ``(N - 1) * P`` complex targets: with every
        window of one length their mean is :meth:`loss`'s ``mean`` (up to the order of the
        float sums). A non-finite target makes its window's loss non-finite."""

        with fp32(out.device.type):
            _, n, width = check_shapes(out, patches, 1)
            err = out[:, :-1].float() - patches[:, 1:].float()
            return err.square().sum(dim=(1, 2)) / ((n - 1) * (width // 2))

    def summary_lines(self, result: Any) -> list[str]:
        return [
            f"  final val loss {_fmt_db(result.final_val_loss)}, "
            f"best {_fmt_db(result.best_val_loss)}"
        ]

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
            f"5 untrained loss {loss_sum / count:.4f} vs zero-prediction {zero:.4f} "
            f"(targets per batch: {count:,} complex samples)"
        )

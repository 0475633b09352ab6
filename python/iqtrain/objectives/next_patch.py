"""What the next-patch objectives share (docs/design.md "Objectives").

The task is next-patch prediction: the output at position t is about patch t+1, whose ``2P``
real values are the window-normalised ``I0, Q0, I1, Q1, ...`` of P complex samples; the last
position's output predicts nothing. Each objective says what its head says about each of those
values (:mod:`iqtrain.objectives.mse`, :mod:`iqtrain.objectives.categorical`) and yields a
predicted mean, whose squared error is the NMSE validation records for every one of them, so
the zero and copy baselines and the prediction SNR compare across objectives.

Their loss is averaged over the complex target samples, ``count = B * (N - 1) * P``: one count
normalises every objective. The best checkpoint and early stopping follow the validation loss,
lower is better. A trained model embeds windows and scores them (each window's mean loss: a
likelihood-based novelty score); it predicts no class. The probe (``probe.every``) judges its
features.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from iqtrain.objectives.base import Objective, Use, fp32

if TYPE_CHECKING:
    from torch import Tensor

    from iqtrain.config.sections import ModelConfig

__all__ = ["NextPatch", "check_shapes", "next_patch_loss"]


def check_shapes(out: Tensor, patches: Tensor, per_value: int) -> tuple[int, int, int]:
    """``(B, N, 2P)`` of ``patches [B, N >= 2, 2P]``, with ``out`` ``[B, N, 2P x per_value]``
    (ValueError otherwise)."""
    if patches.ndim != 3 or patches.shape[-1] % 2 or patches.shape[1] < 2:
        raise ValueError(
            f"patches must be [B, N >= 2, 2P] (a patch needs a successor to be a target), "
            f"got {tuple(patches.shape)}"
        )
    b, n, width = patches.shape
    if out.shape != (b, n, width * per_value):
        raise ValueError(
            f"the model's output must be [B, N, 2P x {per_value}] = {[b, n, width * per_value]} "
            f"for patches {tuple(patches.shape)}, got {tuple(out.shape)}"
        )
    return b, n, width


def next_patch_loss(pred: Tensor, patches: Tensor) -> tuple[Tensor, Tensor, int]:
    """Next-patch NMSE: ``(mean, sum, count)`` with ``mean = sum / count``.

    Position t predicts patch t+1, so the targets are patches 1..N-1 and the last prediction is
    unused. ``sum`` is the squared error summed over both components, ``sum (dI^2 + dQ^2)``;
    ``count = B * (N - 1) * P`` is the number of complex target samples. On window-normalized
    data (unit mean power per complex sample) predicting zeros scores about 1.0, so
    ``-10 log10(mean)`` is the prediction SNR in dB. Computed in fp32 even under autocast.
    """

    if pred.shape != patches.shape:
        raise ValueError(
            f"pred and patches must have one shape, got {tuple(pred.shape)} "
            f"and {tuple(patches.shape)}"
        )
    b, n, width = check_shapes(pred, patches, 1)
    with fp32(pred.device.type):
        err = pred[:, :-1].float() - patches[:, 1:].float()
        total = err.square().sum()
    count = b * (n - 1) * (width // 2)
    return total / count, total, count


def _fmt_db(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.5f} ({-10 * math.log10(x):.2f} dB)"


class NextPatch(Objective):
    """The next-patch objectives' common part (abstract: each names its own head and loss)."""

    labelled: ClassVar[bool] = False
    monitor: ClassVar[str] = "loss"
    higher_is_better: ClassVar[bool] = False
    uses: ClassVar[frozenset[Use]] = frozenset({"embed", "score"})
    reads: ClassVar[dict[str, object]] = {"probe.every": 0}

    def head_width(self, config: ModelConfig, classes: int) -> int:
        return 2 * config.patch_len * self.outputs_per_value(config)

    def validation_note(self, record: Any) -> str:
        nmse = "" if record["nmse"] == record["loss"] else f", nmse {record['nmse']:.5f}"
        return f"loss {record['loss']:.5f}{nmse} ({record['pred_snr_db']:.2f} dB)"

    def summary_lines(self, result: Any) -> list[str]:
        # A negative log-likelihood in nats: its dB means nothing; the predicted mean's NMSE's
        # does.
        loss, best = (
            "n/a" if x is None else f"{x:.5f}"
            for x in (result.final_val_loss, result.best_val_loss)
        )
        return [
            f"  final val loss {loss} {self.loss_unit} ({self.name}), best {best}; "
            f"predicted-mean NMSE {_fmt_db(result.final_val_nmse)}"
        ]

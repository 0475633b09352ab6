"""``model.objective = "categorical"``: the head gives, for each value of the next patch, a
distribution over ``model.bins`` equal bins spanning ``[-model.bin_range, model.bin_range]``
(docs/design.md "Objectives").

The target of each value is the bin it falls in (:func:`quantise`: values outside the range go
to the edge bins). Loss: cross-entropy in nats summed over I and Q, averaged over the complex
target samples. A squared error predicts the conditional mean, which averages a constellation
away; a distribution over the next value has to model it. Its predicted mean (the
probability-weighted bin centres, :func:`predicted_mean`) gives the NMSE validation records
beside the loss.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

from iqtrain.objectives.base import fp32
from iqtrain.objectives.next_patch import NextPatch, check_shapes

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from iqtrain.config.sections import ModelConfig

__all__ = ["Categorical", "bin_centres", "predicted_mean", "quantise"]


def bin_centres(config: ModelConfig, device: torch.device | str | None = None) -> Tensor:
    """``[bins]`` fp32: the centre of each bin, ``-r + (k + 1/2) * 2r / bins``."""
    import torch

    r, k = config.bin_range, config.bins
    return (torch.arange(k, dtype=torch.float32, device=device) + 0.5) * (2.0 * r / k) - r


def quantise(values: Tensor, config: ModelConfig) -> Tensor:
    """The bin of each value (int64): ``floor((v + r) * bins / 2r)`` clamped to
    ``[0, bins - 1]``, in fp32. ``v = r`` and above go to the top bin, ``v < -r`` to bin 0; a
    NaN to bin 0 (it would index out of range; the loss makes its window's loss NaN)."""
    import torch

    r, k = config.bin_range, config.bins
    scaled = torch.floor((values.float() + r) * (k / (2.0 * r)))
    return torch.nan_to_num(scaled, nan=0.0).clamp(0, k - 1).long()


def predicted_mean(out: Tensor, config: ModelConfig) -> Tensor:
    """The head's output ``[B, N, 2P x bins]`` -> its predicted mean ``[B, N, 2P]`` in fp32:
    ``sum_k softmax(logits)_k * centre_k``."""
    b, n, wide = out.shape
    logits = out.float().reshape(b, n, wide // config.bins, config.bins)
    return logits.softmax(dim=-1) @ bin_centres(config, out.device)


class Categorical(NextPatch):
    name: ClassVar[str] = "categorical"
    nll: ClassVar[bool] = True
    loss_unit: ClassVar[str] = "nats per complex sample"

    def outputs_per_value(self, config: ModelConfig) -> int:
        return config.bins

    def _nll(self, out: Tensor, patches: Tensor, config: ModelConfig) -> tuple[Tensor, Tensor]:
        """Per-value cross-entropies ``[B * (N - 1) * 2P]`` and the fp32 targets: the negative
        log-softmax at each target's bin (what ``cross_entropy(reduction="none")`` computes,
        written out so that a graph exported with a symbolic batch keeps its shape)."""
        logits = out[:, :-1].float().reshape(-1, config.bins)
        target = patches[:, 1:].float()
        bins = quantise(target, config).reshape(-1, 1)
        return -logits.log_softmax(dim=-1).gather(1, bins).squeeze(1), target

    def loss(
        self,
        out: Tensor,
        patches: Tensor,
        labels: Tensor | None,
        config: ModelConfig,
        squared_error: bool = False,
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        """``squared_error=False`` (a training step: only ``mean`` is used) skips the predicted
        mean and returns a zero in its place."""
        import torch
        import torch.nn.functional as F

        with fp32(out.device.type):
            b, n, width = check_shapes(out, patches, config.bins)
            logits = out[:, :-1].float().reshape(-1, config.bins)
            target = patches[:, 1:].float()
            nll = F.cross_entropy(logits, quantise(target, config).reshape(-1), reduction="sum")
            # A non-finite target (quantised into a bin) must not leave a finite loss: 0 * NaN
            # and 0 * inf are NaN, so the step's finite check rejects it as it does for "mse"
            # (a NaN in the last patch reaches no logit: it is only a target).
            nll = nll + 0.0 * target.sum()
            count = b * (n - 1) * (width // 2)
            if not squared_error:
                return nll / count, nll, count, torch.zeros_like(nll)
            se = (predicted_mean(out[:, :-1], config) - target).square().sum()
            return nll / count, nll, count, se

    def window_losses(self, out: Tensor, patches: Tensor, config: ModelConfig) -> Tensor:
        """Each window's summed cross-entropy over its ``(N - 1) * P`` complex targets (nats per
        complex sample); a non-finite target makes its window's loss NaN."""

        with fp32(out.device.type):
            b, n, width = check_shapes(out, patches, config.bins)
            nll, target = self._nll(out, patches, config)
            count = (n - 1) * (width // 2)
            # Each window's (N - 1) x 2P values (an explicit width: the batch may be symbolic).
            per_window = nll.reshape(b, (n - 1) * width).sum(dim=1)
            return (per_window + 0.0 * target.sum(dim=(1, 2))) / count

    def untrained_line(
        self,
        loss_sum: float,
        squared: float,
        count: int,
        zero: float,
        config: ModelConfig,
        classes: int,
    ) -> str:
        # The uniform distribution over the bins scores ln(bins) per value, two values per
        # complex sample.
        return (
            f"5 untrained loss {loss_sum / count:.4f} nats per sample ({self.name}; uniform "
            f"{2 * math.log(config.bins):.4f}), predicted-mean NMSE {squared / count:.4f} "
            f"vs zero-prediction {zero:.4f} (targets per batch: {count:,} complex samples)"
        )

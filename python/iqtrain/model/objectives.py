"""What the head predicts for the next patch and how it is scored (docs/design.md "Objectives").

The task is always next-patch prediction: the output at position t is about patch t+1, whose
``2P`` real values are the window-normalised ``I0, Q0, I1, Q1, ...`` of P complex samples.
``model.objective`` chooses what the head says about each of those values:

- ``"mse"``: the value itself. Loss: squared error summed over I and Q, averaged over the
  complex target samples (NMSE on window-normalised data; :func:`next_patch_loss`).
- ``"categorical"``: a distribution over ``model.bins`` equal bins spanning
  ``[-model.bin_range, model.bin_range]``. The target of each value is the bin it falls in
  (:func:`quantise`: values outside the range go to the edge bins). Loss: cross-entropy in nats
  summed over I and Q, averaged over the complex target samples (so one count normalises
  every objective). A squared error predicts the conditional mean, which averages a
  constellation away; a distribution over the next value has to model it.

Every objective also yields its predicted mean (the categorical: the probability-weighted bin
centres), whose squared error is the NMSE validation records for every objective, so the zero
and copy baselines and the prediction SNR compare across objectives.

:func:`objective_loss` returns ``(mean, sum, count, squared_error_sum)`` in fp32 whatever the
autocast state: ``mean = sum / count`` is what training minimises, ``sum`` and
``squared_error_sum`` let validation form exact means over a partial last batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from iqtrain.config.sections import ModelConfig

__all__ = [
    "bin_centres",
    "classify_loss",
    "next_patch_loss",
    "objective_loss",
    "predicted_mean",
    "quantise",
    "window_losses",
]


def _check_shapes(out: Tensor, patches: Tensor, per_value: int) -> tuple[int, int, int]:
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
    b, n, width = _check_shapes(pred, patches, 1)
    with torch.autocast(device_type=pred.device.type, enabled=False):
        err = pred[:, :-1].float() - patches[:, 1:].float()
        total = err.square().sum()
    count = b * (n - 1) * (width // 2)
    return total / count, total, count


def bin_centres(config: ModelConfig, device: torch.device | str | None = None) -> Tensor:
    """``[bins]`` fp32: the centre of each bin, ``-r + (k + 1/2) * 2r / bins``."""
    r, k = config.bin_range, config.bins
    return (torch.arange(k, dtype=torch.float32, device=device) + 0.5) * (2.0 * r / k) - r


def quantise(values: Tensor, config: ModelConfig) -> Tensor:
    """The bin of each value (int64): ``floor((v + r) * bins / 2r)`` clamped to
    ``[0, bins - 1]``, in fp32. ``v = r`` and above go to the top bin, ``v < -r`` to bin 0; a
    NaN to bin 0 (it would index out of range; :func:`objective_loss` makes its loss NaN)."""
    r, k = config.bin_range, config.bins
    scaled = torch.floor((values.float() + r) * (k / (2.0 * r)))
    return torch.nan_to_num(scaled, nan=0.0).clamp(0, k - 1).long()


def predicted_mean(out: Tensor, config: ModelConfig) -> Tensor:
    """The head's output ``[B, N, 2P x outputs_per_value]`` -> its predicted mean ``[B, N, 2P]``
    in fp32: the output itself for "mse", ``sum_k softmax(logits)_k * centre_k`` otherwise."""
    if config.objective == "mse":
        return out.float()
    b, n, wide = out.shape
    logits = out.float().reshape(b, n, wide // config.bins, config.bins)
    return logits.softmax(dim=-1) @ bin_centres(config, out.device)


def objective_loss(
    out: Tensor, patches: Tensor, config: ModelConfig, squared_error: bool = True
) -> tuple[Tensor, Tensor, int, Tensor]:
    """``(mean, sum, count, squared_error_sum)`` of the model output ``out`` against the next
    patches (see the module docstring); fp32 even under autocast. ``squared_error=False``
    (a training step: only ``mean`` is used) skips the categorical's predicted mean and returns
    a zero in its place; for "mse" it is the loss's own sum either way."""
    with torch.autocast(device_type=out.device.type, enabled=False):
        if config.objective == "mse":
            mean, total, count = next_patch_loss(out, patches)
            return mean, total, count, total
        b, n, width = _check_shapes(out, patches, config.bins)
        logits = out[:, :-1].float().reshape(-1, config.bins)
        target = patches[:, 1:].float()
        nll = F.cross_entropy(logits, quantise(target, config).reshape(-1), reduction="sum")
        # A non-finite target (quantised into a bin) must not leave a finite loss: 0 * NaN and
        # 0 * inf are NaN, so the step's finite check rejects it as it does for "mse" (a NaN in
        # the last patch reaches no logit: it is only a target).
        nll = nll + 0.0 * target.sum()
        count = b * (n - 1) * (width // 2)
        if not squared_error:
            return nll / count, nll, count, torch.zeros_like(nll)
        mean_pred = predicted_mean(out[:, :-1], config)
        se = (mean_pred - target).square().sum()
        return nll / count, nll, count, se


def classify_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, int, Tensor]:
    """``model.objective = "classify"``: ``(mean, sum, count, predictions)`` of the logits
    ``[B, classes]`` against ``labels [B]`` (int64 class indices): the cross-entropy of each
    window in nats, summed over the ``count = B`` windows, and each window's arg-max class
    (int64). fp32 even under autocast. A non-finite logit makes the loss NaN (the step's finite
    check rejects it)."""
    if logits.ndim != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [B, classes] and labels [B], got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    with torch.autocast(device_type=logits.device.type, enabled=False):
        lf = logits.float()
        total = F.cross_entropy(lf, labels, reduction="sum")
        # cross_entropy of a row with +inf and finite logits is finite; the sum is not.
        total = total + 0.0 * lf.sum()
        count = logits.shape[0]
        return total / count, total, count, lf.argmax(dim=1)


def window_losses(out: Tensor, patches: Tensor, config: ModelConfig) -> Tensor:
    """``[B]`` fp32: each window's own mean loss under the objective, in the units validation
    records (NMSE for "mse", nats per complex sample for "categorical"): the window's summed
    loss over its ``(N - 1) * P`` complex target samples, so with every window of one length
    their mean is :func:`objective_loss`'s ``mean`` (up to the order of the float sums). A
    non-finite target makes its window's loss NaN, as it makes the batch's."""
    with torch.autocast(device_type=out.device.type, enabled=False):
        b, n, width = _check_shapes(out, patches, config.outputs_per_value)
        target = patches[:, 1:].float()
        count = (n - 1) * (width // 2)
        if config.objective == "mse":
            return (out[:, :-1].float() - target).square().sum(dim=(1, 2)) / count
        logits = out[:, :-1].float().reshape(-1, config.bins)
        nll = F.cross_entropy(logits, quantise(target, config).reshape(-1), reduction="none")
        return (nll.reshape(b, -1).sum(dim=1) + 0.0 * target.sum(dim=(1, 2))) / count

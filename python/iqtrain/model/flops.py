"""Achieved model FLOP/s and model FLOPs utilisation (MFU) for the train records.

The model states its FLOPs (``IQTransformer.train_flops_per_patch``: every matmul, forward plus
backward = 3x forward, full attention matrix); this module turns them into TFLOP/s and a
fraction of the device's dense peak. Pure functions plus one table; torch is imported only
inside :func:`device_peak_tflops`, so the module imports without it.

MFU = achieved model FLOP/s / peak FLOP/s of the precision the matmuls run in: bf16 tensor cores
under ``precision = "bf16"``; under ``"fp32"``, TF32 tensor cores if torch lets fp32 matmuls use
them, else the plain FP32 (CUDA core) peak. That setting is read through torch's fp32_precision
API (torch 2.9+): TF32 when ``torch.backends.cuda.matmul.fp32_precision`` is ``"tf32"``, or is
``"none"`` (inherit) while ``torch.backends.fp32_precision`` is ``"tf32"``
(``torch.set_float32_matmul_precision("high")`` or ``"medium"`` sets it too). Never through the
legacy ``matmul.allow_tf32``: torch deprecates it, and its getter raises once the new API has
set a state the legacy one cannot represent.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from iqtrain.config.sections import Device, Precision

__all__ = ["PEAK_TFLOPS", "achieved_tflops", "device_peak_tflops", "lookup_peak_tflops", "mfu"]

# Dense (no 2:4 sparsity) peak TFLOP/s per precision, from NVIDIA's datasheets, which quote
# tensor-core figures "with sparsity": the dense figure is half of that.
# - A100 (SXM4 and PCIe, 40 and 80 GB alike), A100 datasheet: BF16 312, TF32 156, FP32 19.5.
# - H100 SXM5, NVIDIA H100 Tensor Core GPU architecture whitepaper (peak at boost clock):
#   BF16 989.4, TF32 494.7, FP32 66.9.
#   GH200's GPU is the same part at the same clocks.
# - H100 PCIe, same table: BF16 756.5, TF32 378.0, FP32 51.2.
# - H100 NVL, H100 datasheet (1671 / 835 with sparsity): BF16 835.5, TF32 417.5, FP32 60.
# - H200 SXM, H200 datasheet (1979 / 989 with sparsity): same compute as H100 SXM5; H200 NVL
#   (1671 / 835 with sparsity, FP32 60) as H100 NVL.
# Peaks are at the boost clock; a power- or thermally-capped GPU runs below them, so MFU is a
# conservative figure. Unknown GPUs (and CPUs) have no entry: MFU is then left out unless
# training.peak_tflops names the peak.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "H100 SXM": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200 SXM": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
}


def _family(device_name: str) -> str | None:
    """Table key for a ``torch.cuda.get_device_name()`` string, or None when not in the table.

    Names seen in practice: "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB
    HBM3" (SXM5), "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA GH200 480GB", "NVIDIA H200",
    "NVIDIA H200 NVL".
    """
    name = device_name.lower()
    if "gh200" in name:  # before "h200": Grace Hopper carries an H100 SXM-class GPU
        return "H100 SXM"
    if "h200" in name:
        return "H200 NVL" if "nvl" in name else "H200 SXM"
    if "h100" in name:
        if "pcie" in name:
            return "H100 PCIe"
        return "H100 NVL" if "nvl" in name else "H100 SXM"
    if "a100" in name:
        return "A100"
    return None


def lookup_peak_tflops(
    device_name: str, precision: Precision, *, tf32: bool = False
) -> float | None:
    """Dense peak TFLOP/s of GPU ``device_name`` for ``precision`` ("bf16" or "fp32").

    ``tf32``: whether fp32 matmuls may use TF32 tensor cores. None for a GPU not in the table.
    """
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision: expected 'bf16' or 'fp32', got {precision!r}")
    family = _family(device_name)
    if family is None:
        return None
    key = "bf16" if precision == "bf16" else ("tf32" if tf32 else "fp32")
    return PEAK_TFLOPS[family][key]


def device_peak_tflops(
    device: Device, precision: Precision, override: float | None = None
) -> float | None:
    """Peak TFLOP/s of this process's ``device`` ("cpu" or "cuda") at ``precision``.

    ``override`` (``training.peak_tflops``) wins when set; otherwise the table entry of the
    current CUDA device, with TF32 read from torch's current matmul setting. None on CPU (no
    meaningful tensor peak) and for GPUs the table does not know.
    """
    if override is not None:
        if (
            isinstance(override, bool)
            or not isinstance(override, int | float)
            or not math.isfinite(override)
            or override <= 0
        ):
            raise ValueError(f"peak_tflops: expected a finite number > 0, got {override!r}")
        return float(override)
    if device != "cuda":
        return None
    import torch  # here, not at module level: the table and the arithmetic need no torch

    if not torch.cuda.is_available():
        return None
    return lookup_peak_tflops(torch.cuda.get_device_name(), precision, tf32=_matmul_tf32(torch))


def _matmul_tf32(torch: Any) -> bool:
    """Whether torch lets fp32 CUDA matmuls use TF32, through the fp32_precision API alone."""
    precision = torch.backends.cuda.matmul.fp32_precision
    if precision == "none":  # not set at this level: the generic level's applies
        precision = torch.backends.fp32_precision
    return bool(precision == "tf32")


def achieved_tflops(flops_per_patch: float, patches: int, seconds: float) -> float:
    """Model TFLOP/s of a step that ran ``patches`` patch positions in ``seconds``.

    ``patches`` counts every position the model computed: windows x ``seq_patches``, not the
    train record's ``patches`` field (windows x (seq_patches - 1) targets). 0.0 when
    ``seconds <= 0``, as the records do for ``samples_per_s``, so a record is never non-finite.
    """
    if seconds <= 0:
        return 0.0
    return flops_per_patch * patches / seconds / 1e12


def mfu(achieved: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation: ``achieved`` TFLOP/s over ``peak`` TFLOP/s; None without a peak."""
    if peak is None:
        return None
    if not peak > 0:
        raise ValueError(f"peak: expected TFLOP/s > 0, got {peak!r}")
    return achieved / peak

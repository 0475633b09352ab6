"""Raw I/Q batch -> model input: dtype conversion, per-window power normalisation and patching.

docs/design.md "prepare_iq_input". :func:`prepare_iq_input_reference` is the specification, written
in plain PyTorch; :func:`prepare_iq_input` dispatches to the fused Triton kernel
(``iqtrain.kernels.normalize_patch``) for CUDA tensors and to the reference everywhere else.
:func:`compiled_reference` is the reference under ``torch.compile``, bit-identical to it, for CPU
runs with ``training.compile = true`` (``TrainStep.prepare`` picks the path for the loop).

triton is imported only on the Triton path, so this module imports on machines without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, get_args

import torch

from iqtrain.config.sections import NORMS, Norm

__all__ = [
    "BACKENDS",
    "Backend",
    "compiled_reference",
    "prepare_iq_input",
    "prepare_iq_input_reference",
]

_IN_DTYPES = (torch.int8, torch.int16, torch.float32)
_OUT_DTYPES = (torch.float32, torch.bfloat16)
#: ``prepare_iq_input(backend=...)``: the Triton kernel for CUDA tensors and the reference
#: otherwise ("auto"), the kernel alone ("triton"), the reference alone ("torch").
Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
# eps is added in fp32; anything below the smallest normal fp32 would flush towards zero and an
# all-zero window would give 0/0 = NaN instead of zeros.
_MIN_EPS = torch.finfo(torch.float32).tiny


def _check_args(
    raw: torch.Tensor,
    patch_len: int,
    norm: str,
    prefix_patches: int,
    eps: float,
    out_dtype: torch.dtype,
) -> int:
    """Raise ``ValueError`` naming the first bad argument; return the samples the scale spans.

    Checks only types, shapes and Python values, never tensor contents, so it traces cleanly
    under ``torch.compile``.
    """
    if not isinstance(raw, torch.Tensor):
        raise ValueError(f"raw: expected a torch.Tensor, got {type(raw).__name__}")
    if raw.dim() != 3 or raw.shape[-1] != 2:
        raise ValueError(f"raw: expected shape [B, L, 2] (interleaved I, Q), got {list(raw.shape)}")
    if raw.dtype not in _IN_DTYPES:
        raise ValueError(f"raw: dtype {raw.dtype} is not one of int8, int16, float32")
    length = raw.shape[1]
    if length < 1:
        raise ValueError("raw: a window needs at least one sample (L >= 1)")
    if isinstance(patch_len, bool) or not isinstance(patch_len, int) or patch_len < 1:
        raise ValueError(f"patch_len: expected an integer >= 1, got {patch_len!r}")
    if length % patch_len != 0:
        raise ValueError(f"patch_len: {patch_len} does not divide the window length L={length}")
    if norm not in NORMS:
        raise ValueError(f"norm: expected 'window' or 'prefix', got {norm!r}")
    n_patches = length // patch_len
    if norm == "prefix" and (
        isinstance(prefix_patches, bool)
        or not isinstance(prefix_patches, int)
        or not 1 <= prefix_patches <= n_patches
    ):
        raise ValueError(
            f"prefix_patches: expected an integer in [1, {n_patches}] (the window has "
            f"{n_patches} patches of {patch_len} samples), got {prefix_patches!r}"
        )
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not math.isfinite(eps)
        or eps < _MIN_EPS
    ):
        raise ValueError(f"eps: expected a finite number >= {_MIN_EPS:.3g}, got {eps!r}")
    if out_dtype not in _OUT_DTYPES:
        raise ValueError(f"out_dtype: expected torch.float32 or torch.bfloat16, got {out_dtype!r}")
    return length if norm == "window" else prefix_patches * patch_len


def prepare_iq_input_reference(
    raw: torch.Tensor,
    patch_len: int,
    *,
    norm: Norm = "window",
    prefix_patches: int = 4,
    eps: float = 1e-12,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The specification of :func:`prepare_iq_input`, in plain PyTorch (any device).

    ``raw [B, L, 2]`` -> ``(patches [B, L // patch_len, 2 * patch_len] out_dtype, scale [B] fp32)``
    with ``scale_b = sqrt(mean_t(I_t^2 + Q_t^2) + eps)`` over the whole window or its first
    ``prefix_patches`` patches, and ``patches_b = raw_b / scale_b``.
    """
    norm_samples = _check_args(raw, patch_len, norm, prefix_patches, eps, out_dtype)
    return _reference_body(raw, patch_len, norm_samples, eps, out_dtype)


def _reference_body(
    raw: torch.Tensor, patch_len: int, norm_samples: int, eps: float, out_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference after its checks: what :func:`compiled_reference` compiles."""
    batch, length, _ = raw.shape
    # The power is summed in float64 from exact squares (an int16 square needs 30 bits, an
    # fp32 square 48): for int8/int16 input every partial sum is an integer below 2^53, so the
    # sum is exact and independent of the summation order; the scale is then rounded to fp32
    # once. That is what makes the compiled reference (inductor's loop order) bit-identical to
    # this eager one (torch's pairwise reduction). For float32 input the fp64 sums can differ
    # in the last bits, which survive the rounding to fp32 only when they straddle a rounding
    # boundary (about 2^-29 of windows).
    x64 = raw[:, :norm_samples, :].to(torch.float64)
    power = x64.square().sum(dim=(1, 2))
    scale = torch.sqrt(power / norm_samples + eps).to(torch.float32)

    # Divide by scale as a multiplication by its correctly rounded reciprocal: that is what the
    # kernel does per element, so both round identically whenever their scales agree.
    normalized = raw.to(torch.float32) * torch.reciprocal(scale)[:, None, None]
    # [B, L, 2] contiguous is already patch j = samples [jP, (j+1)P) interleaved I0, Q0, I1, ...
    patches = normalized.reshape(batch, length // patch_len, 2 * patch_len)
    return patches.to(out_dtype), scale


def compiled_reference() -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """:func:`prepare_iq_input_reference` compiled with inductor, for CPU training runs.

    Same signature and checks (run eagerly, before the compiled part, so a bad argument raises
    the same ``ValueError``); output bit-identical to the eager reference for int8/int16 input
    (see :func:`_reference_body`; float32 input agrees but for rare last-bit scale roundings).
    The batch dimension is marked dynamic, so one graph serves the training batch, the
    validation batch and a partial last validation batch (batch 1 gets its own: dynamo
    specialises sizes 0 and 1). Each distinct (window length, patch_len, norm span, eps,
    out_dtype) compiles once. CPU only: CUDA runs use the Triton kernel.
    """
    body = torch.compile(_reference_body, fullgraph=True)

    def prepare(
        raw: torch.Tensor,
        patch_len: int,
        *,
        norm: Norm = "window",
        prefix_patches: int = 4,
        eps: float = 1e-12,
        out_dtype: torch.dtype = torch.float32,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm_samples = _check_args(raw, patch_len, norm, prefix_patches, eps, out_dtype)
        if raw.shape[0] == 0:  # nothing to compile for; the eager body handles it exactly
            return _reference_body(raw, patch_len, norm_samples, eps, out_dtype)
        torch._dynamo.maybe_mark_dynamic(raw, 0)
        return body(raw, patch_len, norm_samples, eps, out_dtype)

    return prepare


def _triton_launcher(
    raw: torch.Tensor, backend: Backend
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """Import the kernel; check it runs on ``raw``'s device (else ``ValueError`` naming backend)."""
    try:
        from iqtrain.kernels import normalize_patch as kernel
    except ImportError as exc:
        raise ValueError(
            f"backend: {backend!r} selects the Triton kernel, which cannot be imported ({exc}); "
            "use backend='torch'"
        ) from exc
    if not raw.is_cuda and not (raw.device.type == "cpu" and kernel.interpreted()):
        raise ValueError(
            f"backend: 'triton' needs a CUDA tensor (raw is on {raw.device}); CPU tensors run "
            "only in the Triton interpreter (TRITON_INTERPRET=1 set before triton is imported). "
            "Use backend='auto' or 'torch'"
        )
    return kernel.normalize_patch


def prepare_iq_input(
    raw: torch.Tensor,
    patch_len: int,
    *,
    norm: Norm = "window",
    prefix_patches: int = 4,
    eps: float = 1e-12,
    out_dtype: torch.dtype = torch.float32,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a raw I/Q batch into normalised patches: ``(patches, scale)``.

    Args:
        raw: ``[B, L, 2]`` int8, int16 or float32, interleaved I, Q (what the loader yields).
        patch_len: samples per patch P; must divide L.
        norm: ``"window"`` (scale over all L samples) or ``"prefix"`` (over the first
            ``prefix_patches`` patches only, so the scale is causal).
        prefix_patches: patches the ``"prefix"`` scale spans, in ``[1, L // P]``; ignored for
            ``"window"``.
        eps: added to the mean power before the square root, so an all-zero window gives zeros.
        out_dtype: ``torch.float32`` or ``torch.bfloat16``.
        backend: ``"auto"`` (Triton for CUDA tensors, the reference otherwise), ``"triton"``
            (CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``) or ``"torch"``.

    Returns:
        ``patches [B, L // P, 2P]`` in ``out_dtype`` (patch j holds samples ``[jP, (j+1)P)`` as
        ``I0, Q0, I1, Q1, ...`` divided by the window's scale) and ``scale [B]`` float32,
        ``sqrt(mean(I^2 + Q^2) + eps)``. NaN in the scaled span gives NaN out; nothing is hidden.

    Raises:
        ValueError: naming the argument (raw, patch_len, norm, prefix_patches, eps, out_dtype,
            backend) that is wrong.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected 'auto', 'triton' or 'torch', got {backend!r}")
    _check_args(raw, patch_len, norm, prefix_patches, eps, out_dtype)
    if backend == "torch" or (backend == "auto" and not raw.is_cuda):
        return prepare_iq_input_reference(
            raw,
            patch_len,
            norm=norm,
            prefix_patches=prefix_patches,
            eps=eps,
            out_dtype=out_dtype,
        )
    launch = _triton_launcher(raw, backend)
    return launch(
        raw,
        patch_len,
        norm=norm,
        prefix_patches=prefix_patches,
        eps=eps,
        out_dtype=out_dtype,
    )

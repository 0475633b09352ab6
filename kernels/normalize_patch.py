"""Fused normalize-and-patch: raw I/Q batch -> model input patches plus per-window scale.

docs/design.md "prepare_iq_input". For every window b of a raw batch ``[B, L, 2]`` (int8, int16 or
float32)::

    scale[b]   = sqrt(sum_{t < n} (I_t^2 + Q_t^2) / n + eps)      n = L, or prefix_patches * P
    patches[b] = raw[b] * (1 / scale[b])  viewed as [L / P, 2P]

Layout fact the kernel exploits: a contiguous ``[B, L, 2]`` tensor with interleaved I, Q is,
byte for byte, the patch layout ``[B, L / P, 2P]`` (patch j is samples [jP, (j+1)P), interleaved).
Patching is therefore a free view, and the whole step is a per-window reduction followed by a flat
elementwise scale of 2L contiguous values. No gather, no transpose, and P never reaches the kernel.

One program per window, two passes over the window's memory:
  pass 1 loops over BLOCK-sized chunks of the (prefix) window, accumulating x^2 in fp32 per lane;
  pass 2 loops over the whole window again, writing x * (1 / scale) in the output dtype.
Pass 2 re-reads the window right after pass 1 has pulled it in, so the re-read is meant to hit
L2 (an int16 window of 4096 samples is 16 KiB) and DRAM sees each raw byte once; not yet verified
with a profiler. A window of up to 65,536 samples does not fit in one block, which is why both
passes loop instead of holding the window in registers.

This file is the real source; python/iqtrain/kernels/normalize_patch.py is a file symlink to it,
so the installed wheel imports it as ``iqtrain.kernels.normalize_patch``.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl

__all__ = ["normalize_patch", "interpreted", "SUPPORTED_IN_DTYPES", "SUPPORTED_OUT_DTYPES"]

SUPPORTED_IN_DTYPES = (torch.int8, torch.int16, torch.float32)
SUPPORTED_OUT_DTYPES = (torch.float32, torch.bfloat16)

# Largest chunk one loop iteration touches, and elements per thread. At the cap, 8192 elements
# over 16 warps is 16 values per thread. Compiled offline for sm_90 (triton 3.9): 32-40 registers
# per thread (cuobjdump -res-usage) and, with 16-divisible lengths, 16-byte vector loads and
# stores (ld/st.global.v4 in the PTX). 8192 covers a whole L=4096 window in one iteration, so a
# program has its entire 16 KiB int16 window in flight at once. Not tuned on hardware: no GPU was
# available when this was written; bench/test_prepare.py measures it.
_MAX_BLOCK = 8192
_ELEMS_PER_THREAD = 16


@triton.jit
def _normalize_patch_kernel(
    raw_ptr,  # *int8 | *int16 | *fp32, [B, n_elem] contiguous (interleaved I, Q)
    out_ptr,  # *fp32 | *bf16,           [B, n_elem] contiguous (== [B, L/P, 2P])
    scale_ptr,  # *fp32, [B]
    n_elem,  # 2 * L: values per window
    n_norm,  # 2 * (samples in the normalisation window): L, or prefix_patches * P
    n_norm_samples,  # n_norm / 2 as fp32, the divisor of the mean
    eps,  # fp32
    BLOCK: tl.constexpr,
):
    # int64 before multiplying: B * 2L passes 2^31 for e.g. B = 16385 windows of 65,536 samples.
    window = tl.program_id(0).to(tl.int64)
    base = window * n_elem
    offs = tl.arange(0, BLOCK)

    # Pass 1: power. Values are squared after conversion to fp32, so int16 extremes cannot overflow
    # (I^2 + Q^2 reaches 2^31 for (-32768, -32768), outside int32).
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_norm, BLOCK):
        idx = start + offs
        mask = idx < n_norm
        x = tl.load(raw_ptr + base + idx, mask=mask, other=0).to(tl.float32)
        acc += x * x
    total = tl.sum(acc, axis=0)

    # IEEE-rounded divide and sqrt (the defaults on NVIDIA are approximate) so that the scale, and
    # hence every output value, rounds exactly as the PyTorch reference does when the sums agree.
    # They run once per window, not per element.
    scale = tl.sqrt_rn(tl.math.div_rn(total, n_norm_samples) + eps)
    tl.store(scale_ptr + window, scale)
    inv_scale = tl.math.div_rn(1.0, scale)

    # Pass 2: flat elementwise scale of the whole window in the output dtype. A NaN anywhere in the
    # normalisation window makes scale NaN and so every output of the window NaN: not hidden.
    for start in range(0, n_elem, BLOCK):
        idx = start + offs
        mask = idx < n_elem
        x = tl.load(raw_ptr + base + idx, mask=mask, other=0).to(tl.float32)
        y = x * inv_scale
        tl.store(out_ptr + base + idx, y.to(out_ptr.dtype.element_ty), mask=mask)


def interpreted() -> bool:
    """True when the kernel was decorated under TRITON_INTERPRET=1 and so runs on CPU tensors.

    Triton decides this once, when ``@triton.jit`` runs at import, so the environment variable
    read later is not authoritative; the kernel object is.
    """
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_normalize_patch_kernel, InterpretedFunction)


def _block_and_warps(n_elem: int) -> tuple[int, int]:
    block = min(triton.next_power_of_2(n_elem), _MAX_BLOCK)
    # 1 warp for small windows, up to 16 (512 threads) at the cap.
    num_warps = max(1, min(16, block // (32 * _ELEMS_PER_THREAD)))
    return block, num_warps


def normalize_patch(
    raw: torch.Tensor,
    patch_len: int,
    *,
    norm: str,
    prefix_patches: int,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused kernel: ``raw [B, L, 2]`` -> ``(patches [B, L/P, 2P], scale [B] fp32)``.

    Validates shapes and dtypes (``ValueError`` naming the argument), makes ``raw`` contiguous,
    picks the block size and warp count, and launches one program per window. Runs on CUDA
    tensors, or on CPU tensors when the kernel runs in the Triton interpreter.
    """
    if not isinstance(raw, torch.Tensor):
        raise ValueError(f"raw: expected a torch.Tensor, got {type(raw).__name__}")
    if raw.dim() != 3 or raw.shape[-1] != 2:
        raise ValueError(f"raw: expected shape [B, L, 2], got {list(raw.shape)}")
    if raw.dtype not in SUPPORTED_IN_DTYPES:
        raise ValueError(f"raw: dtype {raw.dtype} is not one of int8, int16, float32")
    batch, length, _ = raw.shape
    if length < 1:
        raise ValueError("raw: a window needs at least one sample (L >= 1)")
    if isinstance(patch_len, bool) or not isinstance(patch_len, int) or patch_len < 1:
        raise ValueError(f"patch_len: expected an integer >= 1, got {patch_len!r}")
    if length % patch_len != 0:
        raise ValueError(f"patch_len: {patch_len} does not divide the window length L={length}")
    n_patches = length // patch_len
    if norm == "window":
        norm_samples = length
    elif norm == "prefix":
        if (
            isinstance(prefix_patches, bool)
            or not isinstance(prefix_patches, int)
            or not 1 <= prefix_patches <= n_patches
        ):
            raise ValueError(
                f"prefix_patches: expected an integer in [1, {n_patches}] (the window has "
                f"{n_patches} patches), got {prefix_patches!r}"
            )
        norm_samples = prefix_patches * patch_len
    else:
        raise ValueError(f"norm: expected 'window' or 'prefix', got {norm!r}")
    if out_dtype not in SUPPORTED_OUT_DTYPES:
        raise ValueError(f"out_dtype: expected torch.float32 or torch.bfloat16, got {out_dtype}")

    raw = raw.contiguous()
    patches = torch.empty((batch, n_patches, 2 * patch_len), dtype=out_dtype, device=raw.device)
    scale = torch.empty((batch,), dtype=torch.float32, device=raw.device)
    if batch == 0:
        return patches, scale  # a grid of zero programs is not launchable

    n_elem = 2 * length
    block, num_warps = _block_and_warps(n_elem)
    # Launch on raw's device, not whichever device happens to be current.
    with torch.cuda.device(raw.device) if raw.is_cuda else contextlib.nullcontext():
        _normalize_patch_kernel[(batch,)](
            raw,
            patches,
            scale,
            n_elem,
            2 * norm_samples,
            float(norm_samples),
            float(eps),
            BLOCK=block,
            num_warps=num_warps,
        )
    return patches, scale

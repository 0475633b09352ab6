"""The next-patch-prediction transformer and its loss (DESIGN.md section 4).

A window of complex baseband samples arrives as patches ``[B, N, 2P]`` (``prepare_iq_input``:
patch j holds samples ``[jP, (j+1)P)`` interleaved ``I0, Q0, I1, Q1, ...``, divided by one real
scale per window). The model embeds each patch with ``Linear(2P, dim)``, runs pre-norm causal
transformer blocks (RMSNorm, rotary attention through ``scaled_dot_product_attention``, SwiGLU MLP)
and maps back with ``Linear(dim, 2P)``: the output at position t is the prediction of patch t+1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from iqtrain.errors import ConfigError

__all__ = ["ModelConfig", "NextPatchModel", "default_mlp_hidden", "next_patch_loss"]


# --------------------------------------------------------------------------- config validation
# Shared with step.py's OptimizerConfig: every message starts with the dotted key so a user can
# find the offending line of the TOML file without reading a traceback.


def _require_int(key: str, value: object, *, minimum: int) -> int:
    # bool is an int subclass; `layers = true` in a config file is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key}: must be >= {minimum}, got {value}")
    return value


def _require_float(
    key: str,
    value: object,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> float:
    # TOML writes `rope_theta = 10000` as an integer; accept it and store the float so the
    # resolved config has one type per field.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{key}: must be finite, got {value!r}")
    if gt is not None and not v > gt:
        raise ConfigError(f"{key}: must be > {gt}, got {value!r}")
    if ge is not None and not v >= ge:
        raise ConfigError(f"{key}: must be >= {ge}, got {value!r}")
    if lt is not None and not v < lt:
        raise ConfigError(f"{key}: must be < {lt}, got {value!r}")
    if le is not None and not v <= le:
        raise ConfigError(f"{key}: must be <= {le}, got {value!r}")
    return v


def default_mlp_hidden(dim: int) -> int:
    """SwiGLU hidden width for ``dim``: round(8/3 * dim), rounded up to a multiple of 64.

    8/3 keeps the three SwiGLU matrices at the parameter count of a 4x two-matrix MLP; the
    multiple of 64 keeps matmul shapes aligned to vector units and tensor-core tiles.
    """
    return -(-round(8 * dim / 3) // 64) * 64


@dataclass(kw_only=True)
class ModelConfig:
    """The ``[model]`` table. Validated on construction; ``mlp_hidden=None`` is resolved."""

    dim: int = 128
    layers: int = 4
    heads: int = 4
    mlp_hidden: int | None = None
    rope_theta: float = 10000.0
    dropout: float = 0.0
    init_std: float = 0.02
    patch_len: int = 16
    max_patches: int = 256

    def __post_init__(self) -> None:
        _require_int("model.dim", self.dim, minimum=1)
        _require_int("model.layers", self.layers, minimum=1)
        _require_int("model.heads", self.heads, minimum=1)
        if self.dim % self.heads:
            raise ConfigError(f"model.heads: must divide model.dim ({self.dim}), got {self.heads}")
        # RoPE rotates pairs of channels, so every head needs an even width.
        if (self.dim // self.heads) % 2:
            raise ConfigError(
                f"model.heads: model.dim / model.heads must be even for rotary embeddings, "
                f"got {self.dim} / {self.heads} = {self.dim // self.heads}"
            )
        if self.mlp_hidden is None:
            # Resolved here, not at build time, so the resolved config records the width used.
            self.mlp_hidden = default_mlp_hidden(self.dim)
        else:
            _require_int("model.mlp_hidden", self.mlp_hidden, minimum=1)
        self.rope_theta = _require_float("model.rope_theta", self.rope_theta, gt=1.0)
        self.dropout = _require_float("model.dropout", self.dropout, ge=0.0, lt=1.0)
        self.init_std = _require_float("model.init_std", self.init_std, gt=0.0)
        _require_int("model.patch_len", self.patch_len, minimum=1)
        # One patch has no successor to predict, so a usable window has at least two.
        _require_int("model.max_patches", self.max_patches, minimum=2)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain, computed in fp32 whatever the activation dtype.

    Under bf16 autocast the residual stream is bf16; the mean of squares is the
    precision-sensitive part, so it is taken in fp32 and the result cast back.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # .float() and .to() are no-ops in fp32, so the eager fp32 path is one fused aten kernel.
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight, self.eps).to(x.dtype)


def rope_tables(max_patches: int, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, ``[max_patches, head_dim / 2]`` fp32."""
    # float64 for the angles: position * frequency loses digits in fp32 at long contexts.
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_patches, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs ``(i, i + hd/2)`` of ``x [B, H, N, hd]`` by position (NeoX layout)."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.head_dim = cfg.head_dim
        self.dropout = cfg.dropout
        # One matmul for q, k and v: fewer, larger GEMMs.
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(b, n, d)
        return self.resid_dropout(self.proj(y))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        assert cfg.mlp_hidden is not None  # resolved by ModelConfig.__post_init__
        # Gate and up projections share one matmul; split afterwards.
        self.gate_up = nn.Linear(cfg.dim, 2 * cfg.mlp_hidden, bias=False)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.dim, bias=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * up))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim)
        self.attn = CausalSelfAttention(cfg)
        self.mlp_norm = RMSNorm(cfg.dim)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


# --------------------------------------------------------------------------- the model


class NextPatchModel(nn.Module):
    """``forward(patches [B, N, 2P]) -> predictions [B, N, 2P]``; output t predicts patch t+1."""

    # Modules whose weights are embeddings: AdamW does not decay them (see step.py). The patch
    # embedding is a matrix, but decaying it shrinks the input representation, not capacity.
    embedding_modules: tuple[str, ...] = ("patch_embed",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"NextPatchModel needs a ModelConfig, got {type(config).__name__}")
        self.config = config
        width = 2 * config.patch_len
        # Biases on the input and output maps only: they absorb a DC offset in I/Q; inside the
        # blocks the norms make biases redundant.
        self.patch_embed = nn.Linear(width, config.dim)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim)
        self.head = nn.Linear(config.dim, width)
        cos, sin = rope_tables(config.max_patches, config.head_dim, config.rope_theta)
        # Non-persistent: derived from the config, so checkpoints neither store nor need them.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = self.config.init_std
        # Each block adds two residual branches; scaling their output projections by
        # 1/sqrt(2 * layers) keeps the residual stream's variance independent of depth (GPT-2).
        resid_std = std / math.sqrt(2 * self.config.layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_resid = name.endswith(".attn.proj") or name.endswith(".mlp.down")
                nn.init.normal_(module.weight, mean=0.0, std=resid_std if is_resid else std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(self, patches: Tensor) -> Tensor:
        width = 2 * self.config.patch_len
        if patches.ndim != 3 or patches.shape[-1] != width:
            raise ValueError(
                f"patches must be [B, N, 2*model.patch_len = {width}], got {tuple(patches.shape)}"
            )
        n = patches.shape[1]
        if n > self.config.max_patches:
            raise ValueError(
                f"{n} patches per window exceed model.max_patches ({self.config.max_patches})"
            )
        # bf16 patches from prepare_iq_input meet fp32 weights in fp32 runs; under autocast the
        # Linear casts back down, so this costs nothing there.
        x = self.embed_dropout(self.patch_embed(patches.to(self.patch_embed.weight.dtype)))
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.head(self.norm(x))

    def param_counts(self) -> tuple[int, int]:
        """(total parameters, parameters that require gradients)."""
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return total, trainable


def next_patch_loss(pred: Tensor, patches: Tensor) -> tuple[Tensor, Tensor, int]:
    """Next-patch NMSE: ``(mean, sum, count)`` with ``mean = sum / count``.

    Position t predicts patch t+1, so the targets are patches 1..N-1 and the last prediction is
    unused. ``sum`` is the squared error summed over both components, ``sum (dI^2 + dQ^2)``;
    ``count = B * (N - 1) * P`` is the number of complex target samples. On window-normalized
    data (unit mean power per complex sample) predicting zeros scores about 1.0, so
    ``-10 log10(mean)`` is the prediction SNR in dB. ``sum`` and ``count`` let validation form an
    exact mean over a partial last batch. Computed in fp32 even under autocast.
    """
    if pred.shape != patches.shape:
        raise ValueError(
            f"pred and patches must have one shape, got {tuple(pred.shape)} "
            f"and {tuple(patches.shape)}"
        )
    if patches.ndim != 3 or patches.shape[-1] % 2 or patches.shape[1] < 2:
        raise ValueError(
            f"patches must be [B, N >= 2, 2P] (a patch needs a successor to be a target), "
            f"got {tuple(patches.shape)}"
        )
    b, n, width = patches.shape
    with torch.autocast(device_type=pred.device.type, enabled=False):
        err = pred[:, :-1].float() - patches[:, 1:].float()
        total = err.square().sum()
    count = b * (n - 1) * (width // 2)
    return total / count, total, count

"""The transformer every objective trains (docs/design.md "Architecture"): a causal trunk and the
head its objective (:mod:`iqtrain.objectives`) sizes.

A window of complex baseband samples arrives as patches ``[B, N, 2P]`` (``prepare_iq_input``:
patch j holds samples ``[jP, (j+1)P)`` interleaved ``I0, Q0, I1, Q1, ...``, divided by one real
scale per window). The model embeds each patch with ``Linear(2P, dim)``, runs pre-norm causal
transformer blocks (RMSNorm, rotary attention through ``scaled_dot_product_attention``, SwiGLU MLP)
and maps back with ``Linear(dim, 2P x outputs_per_value)``: the output at position t is the
prediction of patch t+1, either its values (``model.objective = "mse"``) or ``model.bins`` logits
per value ("categorical"). A labelled objective (a classifier) keeps the same trunk (the
embedding, the blocks, the final norm) and replaces the head: the final states are pooled over
patches (their mean, or ``model.pool = "attention"``: softmax weights from one learned query)
and ``Linear(dim, classes)`` gives one logit per class and window.

Precision. Parameters are fp32. Under bf16 autocast (``training.precision = "bf16"``) the
Linear layers and attention run in bf16, while the residual stream (the patch embeddings and
every block's sum), the norms, RoPE and the attention pool stay fp32: every state
:meth:`IQTransformer.layer_states` returns is fp32, and only the head's output is bf16.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The [model] table lives in the torch-free config module.
from iqtrain.config.sections import ModelConfig

__all__ = ["IQTransformer"]


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain, computed in fp32 whatever the activation dtype, and
    returned in the input's dtype.

    The model's residual stream is fp32 under bf16 autocast too (see ``_trunk``), so there the
    casts are no-ops and the norm's output meets the next Linear, which autocast rounds to
    bf16. A bf16 input (a caller's own bf16 activations) is normalised in fp32 all the same:
    the mean of squares is the precision-sensitive part.
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


class AttentionPool(nn.Module):
    """``[B, N, dim] -> [B, dim]``: the states weighted by the softmax, over patches, of their
    dot product with one learned query (scaled by ``1/sqrt(dim)``), in fp32."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        weights = (xf @ self.query.float() / math.sqrt(x.shape[-1])).softmax(dim=1)
        return (weights.unsqueeze(-1) * xf).sum(dim=1).to(x.dtype)


#: Parameter name prefixes of a labelled objective's head: what is not the trunk.
HEAD_PREFIXES = ("head.", "pool.")


class IQTransformer(nn.Module):
    """``forward(patches [B, N, 2P]) -> [B, N, 2P x outputs_per_value]``; output t predicts
    patch t+1 (its values, or per value ``model.bins`` logits). With a labelled objective
    (``classes`` >= 2 required): ``forward(patches) -> [B, classes]`` logits."""

    # Modules whose weights are embeddings: AdamW does not decay them (see step.py). The patch
    # embedding is a matrix, but decaying it shrinks the input representation, not capacity.
    embedding_modules: tuple[str, ...] = ("patch_embed",)
    # Buffers registered in __init__; declared so type checkers see Tensors, not Module.
    rope_cos: Tensor
    rope_sin: Tensor

    def __init__(self, config: ModelConfig, classes: int = 0) -> None:
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise TypeError(f"IQTransformer needs a ModelConfig, got {type(config).__name__}")
        #: What the model is trained to do: its head's width and its loss (iqtrain.objectives).
        self.objective = config.task
        self.classes = self.objective.check_classes(classes)
        self.config = config
        width = 2 * config.patch_len
        # Biases on the input and output maps only: they absorb a DC offset in I/Q; inside the
        # blocks the norms make biases redundant.
        self.patch_embed = nn.Linear(width, config.dim)
        self.embed_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.dim)
        # A labelled objective's head pools the window (its outputs are the window's classes).
        pooled = self.objective.labelled and config.pool == "attention"
        self.pool = AttentionPool(config.dim) if pooled else None
        self.head = nn.Linear(config.dim, self.objective.head_width(config, self.classes))
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
            elif isinstance(module, AttentionPool):
                nn.init.zeros_(module.query)  # uniform weights: the mean, to start

    def forward(self, patches: Tensor) -> Tensor:
        states = self.hidden_states(patches)
        if self.objective.labelled:
            pooled = states.mean(dim=1) if self.pool is None else self.pool(states)
            return self.head(pooled)
        return self.head(states)

    def is_head(self, name: str) -> bool:
        """Whether parameter ``name`` belongs to a labelled objective's head (pool and linear):
        what ``model.freeze_trunk`` leaves trainable and ``optimizer.trunk_lr_scale`` does not
        scale. For the next-patch objectives there is no such split: False."""
        return self.objective.labelled and name.startswith(HEAD_PREFIXES)

    def trunk_state(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """``state`` without the head's tensors (its pool's and its linear map's): the
        weights a fine-tuned model takes from a pretrained one."""
        return {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}

    def hidden_states(self, patches: Tensor) -> Tensor:
        """The final hidden states ``[B, N, dim]``: after the final norm, before the head.

        What :meth:`forward` feeds its output head; the linear probe reads these features.
        """
        return self._trunk(patches, collect=None)

    def layer_states(self, patches: Tensor) -> list[Tensor]:
        """Every layer's hidden states, ``layers + 1`` tensors ``[B, N, dim]``: index 0 the
        patch embeddings, index i < layers the residual stream after the first i blocks
        (before any norm), and index ``layers`` the final hidden states (after all blocks and
        the final norm: :meth:`hidden_states`); in the weights' dtype (fp32) under autocast
        too. What ``iqtrain probe --layer`` reads; one forward for all of them."""
        states: list[Tensor] = []
        states.append(self._trunk(patches, collect=states))
        return states

    def _trunk(self, patches: Tensor, collect: list[Tensor] | None) -> Tensor:
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
        # Patches of any dtype meet the weights' (fp32); under bf16 autocast the Linear rounds
        # them to bf16 as it multiplies. Its output is bf16 there: casting it back to the
        # weights' dtype keeps the residual stream fp32, so every block adds its (bf16) update
        # to an fp32 stream instead of rounding the sum to 8 mantissa bits at each of the
        # 2 * layers adds (nanoGPT's stream stays fp32 the same way). Without autocast both
        # casts are no-ops: fp32 runs are unchanged bit for bit.
        w = self.patch_embed.weight
        x = self.embed_dropout(self.patch_embed(patches.to(w.dtype)).to(w.dtype))
        cos, sin = self.rope_cos[:n], self.rope_sin[:n]
        for block in self.blocks:
            if collect is not None:
                collect.append(x)
            x = block(x, cos, sin)
        return self.norm(x)

    def param_counts(self) -> tuple[int, int]:
        """(total parameters, parameters that require gradients)."""
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return total, trainable

    def forward_flops_per_patch(self, seq_patches: int) -> int:
        """Model FLOPs of one forward pass per patch position, in windows of ``seq_patches``.

        Every matmul counts ``2 * m * k * n`` (one multiply and one add per term). Per patch,
        with d = ``dim``, h = ``mlp_hidden``, w = ``2 * patch_len``, N = ``seq_patches``:

        - patch embedding ``Linear(w, d)``: ``2wd``; output head ``Linear(d, w * o)`` with
          o = ``outputs_per_value`` (1 for "mse", ``bins`` for "categorical"): ``2wdo``;
        - per block: QKV ``2 * d * 3d``; attention scores ``q k^T`` and the weighted sum
          ``p v``: ``2Nd`` each, over all N keys; output projection ``2d^2``; SwiGLU gate and
          up ``2 * d * 2h`` and down ``2hd``.

        Attention counts the full N x N score matrix although the mask is causal: the PaLM
        (appendix B) and nanoGPT convention, and what ``torch.utils.flop_counter`` counts, so
        MFU figures compare across code bases. A causal kernel does about half the attention
        work, so for attention-heavy shapes (N comparable to 6d) achieved figures flatter.
        Excluded: norms, RoPE, softmax, SiLU and the gating product, residual adds, biases,
        dropout and the loss (the categorical's softmax and predicted mean are O(w * bins), not
        O(d * w * bins)): elementwise work, O(d) per patch against O(d^2) for the matmuls.
        """
        if isinstance(seq_patches, bool) or not isinstance(seq_patches, int) or seq_patches < 1:
            raise ValueError(f"seq_patches: expected an integer >= 1, got {seq_patches!r}")
        cfg = self.config
        d, w, n = cfg.dim, 2 * cfg.patch_len, seq_patches
        assert cfg.mlp_hidden is not None  # resolved by ModelConfig.__post_init__
        h = cfg.mlp_hidden
        if self.objective.labelled:  # the window's head, spread over its patches
            return self._trunk_flops(n) + self._window_head_flops(n) // n
        embed_and_head = 2 * w * d * (1 + cfg.outputs_per_value)
        attention = 2 * d * 3 * d + 2 * (2 * n * d) + 2 * d * d
        mlp = 2 * d * 2 * h + 2 * h * d
        return embed_and_head + cfg.layers * (attention + mlp)

    def _trunk_flops(self, n: int) -> int:
        """Forward FLOPs per patch of the embedding and the blocks (as above)."""
        cfg = self.config
        d, w = cfg.dim, 2 * cfg.patch_len
        assert cfg.mlp_hidden is not None
        h = cfg.mlp_hidden
        attention = 2 * d * 3 * d + 2 * (2 * n * d) + 2 * d * d
        return 2 * w * d + cfg.layers * (attention + 2 * d * 2 * h + 2 * h * d)

    def _window_head_flops(self, n: int) -> int:
        """Forward FLOPs per window of a labelled objective's head: the attention pool's scores and
        weighted sum (``2nd`` each; the mean pool's sum is elementwise work, not counted) and
        ``Linear(dim, classes)``: ``2 * dim * classes``."""
        d = self.config.dim
        pool = 4 * n * d if self.pool is not None else 0
        return pool + 2 * d * self.classes

    def train_flops_per_window(self, seq_patches: int) -> int:
        """Model FLOPs of one training step per window of ``seq_patches`` patches: 3x the forward
        (:meth:`train_flops_per_patch` x ``seq_patches``), except for a labelled objective's model
        with ``model.freeze_trunk``: the trunk runs forward only (nothing in it needs a gradient, so
        autograd stops at the head), the head forward and backward."""
        if isinstance(seq_patches, bool) or not isinstance(seq_patches, int) or seq_patches < 1:
            raise ValueError(f"seq_patches: expected an integer >= 1, got {seq_patches!r}")
        n = seq_patches
        if self.objective.labelled:
            trunk = self._trunk_flops(n) * n
            head = self._window_head_flops(n)
            if self.config.freeze_trunk:
                return trunk + 3 * head
            return 3 * (trunk + head)
        return self.train_flops_per_patch(n) * n

    def train_flops_per_patch(self, seq_patches: int) -> int:
        """Model FLOPs of one training step per patch position: 3x the forward.

        Backward costs two matmuls per forward matmul (the input gradient and the weight
        gradient), the PaLM / nanoGPT ``6 * params + 12 * layers * d * N`` convention. Model
        FLOPs, not hardware FLOPs: the recomputation a flash-attention backward does (the
        scores again, ``2Nd`` per block) is not counted, nor the patch embedding's input
        gradient, which autograd skips because patches need none. A step over ``windows``
        windows runs ``windows * seq_patches`` patch positions (all N are computed, though only
        N - 1 have a target), so its FLOPs are ``train_flops_per_patch(N) * windows * N``.
        """
        return 3 * self.forward_flops_per_patch(seq_patches)

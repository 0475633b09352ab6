"""A side study of docs/design.md section 10.5: does a contrastive next-patch term beside the
categorical objective give the trunk features the probe can use? A prototype, not an iqtrain
objective: it trains outside the trainer (no checkpoints, no evidence) with the quickstart's
model, data shape, optimizer and warmup-stable-decay shape, so its rows compare with the study's
categorical rows at the same number of steps.

The contrastive term is InfoNCE (CPC, van den Oord et al. 2018) on the next patch: from the
final hidden state at position t, a linear map predicts an embedding of patch t + k; a small MLP
embeds every target patch; both are L2-normalised and scored by their dot product over a
temperature against the target patches of the whole batch, and the loss is the cross-entropy of
the true one. ``--negatives other`` drops the candidates from the window's own other positions,
so only other windows (other bursts, modulations, SNRs, offsets) compete with the true patch.
The loss is ``categorical + weight x InfoNCE``. ``--shift F`` also moves every training window
by a random carrier offset within ``[-F, F]`` cycles/sample and a random phase (augmentation).

Held-out discipline: the probe runs on the study's *select* set only (TorchSig seed 1)::

    python scripts/study/contrastive.py 'train/*.sigmf-meta' 'select/*.sigmf-meta' out.json \\
        --steps 1000 [--mode categorical|both] [--negatives all|other] [--ahead 1] [--shift 0]

``train`` is the quickstart's synthetic set (``iqtrain synth train --recordings 32 --samples
262144 --datatype ci16_le --seed 0``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from iqtrain.config.sections import DataConfig, ModelConfig
from iqtrain.data.dataset import IQDataset
from iqtrain.eval.probe import (
    classical_score,
    cross_validate,
    labelled_windows,
    layer_features,
    random_init_model,
)
from iqtrain.model.objectives import objective_loss
from iqtrain.model.prepare import prepare_iq_input_reference
from iqtrain.model.transformer import NextPatchModel

FOLDS, SEED = 5, 0  # the probe's defaults
LR, MIN_LR, WARMUP, DECAY = 2e-3, 2e-4, 0.05, 0.30  # the quickstart's, as fractions of the steps


class NextPatchContrast(nn.Module):
    """InfoNCE between the prediction from position t and the embedding of patch t + ahead."""

    def __init__(self, dim: int, width: int, embed: int, temperature: float) -> None:
        super().__init__()
        self.predict = nn.Linear(dim, embed)
        self.encode = nn.Sequential(
            nn.Linear(width, 2 * dim),
            nn.GELU(),
            nn.Linear(2 * dim, 2 * dim),
            nn.GELU(),
            nn.Linear(2 * dim, embed),
        )
        self.temperature = temperature

    def forward(self, hidden: Tensor, patches: Tensor, ahead: int, others_only: bool) -> Tensor:
        b, n, _ = hidden.shape
        q = F.normalize(self.predict(hidden[:, : n - ahead]), dim=-1).flatten(0, 1)
        z = F.normalize(self.encode(patches[:, ahead:]), dim=-1).flatten(0, 1)
        logits = q @ z.T / self.temperature
        if others_only:
            window = torch.arange(b).repeat_interleave(n - ahead)
            same = (window[:, None] == window[None, :]) & ~torch.eye(len(q), dtype=torch.bool)
            logits = logits.masked_fill(same, float("-inf"))
        return F.cross_entropy(logits, torch.arange(len(q)))


def shifted(raw: np.ndarray, shift: float, rng: np.random.Generator) -> np.ndarray:
    """Each window ``[B, L, 2]`` moved by its own carrier offset, uniform in ``[-shift, shift]``
    cycles/sample, and rotated by a uniform phase: fp32 ``[B, L, 2]``."""
    b, n, _ = raw.shape
    f = rng.uniform(-shift, shift, (b, 1))
    phase = rng.uniform(0.0, 2.0 * np.pi, (b, 1))
    x = (raw[..., 0].astype(np.float64) + 1j * raw[..., 1]) * np.exp(
        1j * (2.0 * np.pi * f * np.arange(n) + phase)
    )
    return np.stack([x.real, x.imag], axis=-1).astype(np.float32)


def lr_at(step: int, steps: int) -> float:
    warm, decay = max(1, int(WARMUP * steps)), int(DECAY * steps)
    if step < warm:
        return LR * (step + 1) / warm
    if step < steps - decay:
        return LR
    return LR + (MIN_LR - LR) * (step - (steps - decay)) / decay


def train(
    args: argparse.Namespace, cfg: ModelConfig, data: DataConfig
) -> tuple[NextPatchModel, dict]:
    torch.manual_seed(SEED)
    model = NextPatchModel(cfg)
    contrast = NextPatchContrast(cfg.dim, 2 * cfg.patch_len, args.embed, args.temperature)
    named = list(model.named_parameters()) + list(contrast.named_parameters())
    # AdamW groups as the trainer's (train/optim.py): no decay on vectors or the patch embedding.
    decay = [p for n, p in named if p.ndim >= 2 and not n.startswith("patch_embed")]
    rest = [p for n, p in named if not (p.ndim >= 2 and not n.startswith("patch_embed"))]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=LR,
        betas=(0.9, 0.95),
    )
    ds = IQDataset(args.train, window=data.patch_len * data.seq_patches)
    rng = np.random.default_rng(SEED)
    log: dict = {"categorical": [], "contrastive": []}
    start = time.perf_counter()
    for step in range(args.steps):
        raw = ds.windows(rng.integers(0, ds.num_windows, data.batch_size))
        if args.shift > 0:
            raw = shifted(raw, args.shift, rng)
        patches, _ = prepare_iq_input_reference(torch.from_numpy(raw), data.patch_len)
        hidden = model.hidden_states(patches)
        loss, *_ = objective_loss(model.head(hidden), patches, cfg, squared_error=False)
        log["categorical"].append(loss.item())
        if args.mode == "both":
            nce = contrast(hidden, patches, args.ahead, args.negatives == "other")
            log["contrastive"].append(nce.item())
            loss = loss + args.weight * nce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps)
        opt.step()
    seconds = time.perf_counter() - start
    tail = {k: float(np.mean(v[-100:])) for k, v in log.items() if v}
    return model, {"train_s": seconds, "loss_last_100": tail}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("train")
    p.add_argument("select")
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--mode", choices=["categorical", "both"], default="both")
    p.add_argument("--negatives", choices=["all", "other"], default="all")
    p.add_argument("--ahead", type=int, default=1)
    p.add_argument("--weight", type=float, default=1.0)
    p.add_argument("--temperature", type=float, default=0.1)
    p.add_argument("--embed", type=int, default=128)
    # Augmentation: a random carrier offset up to this many cycles/sample and a random phase
    # per training window (synth bursts carry up to 0.1; TorchSig's up to 0.25).
    p.add_argument("--shift", type=float, default=0.0)
    args = p.parse_args()
    torch.set_num_threads(2)
    # The quickstart's model and data shape (examples/quickstart.toml).
    cfg = ModelConfig(dim=192, layers=4, heads=6, objective="categorical", bins=64, patch_len=16)
    data = DataConfig(patch_len=16, seq_patches=32, batch_size=32, norm="window")
    model, info = train(args, cfg, data)
    labelled = labelled_windows(args.select, data.patch_len * data.seq_patches)

    def accuracy(features: Tensor) -> float:
        return cross_validate(
            features, labelled.labels, labelled.groups, FOLDS, SEED, classes=labelled.classes
        ).accuracy

    layers = list(range(1, cfg.layers + 1))
    feats = layer_features(model, labelled, data, layers)
    random = layer_features(random_init_model(cfg, SEED), labelled, data, [cfg.layers])
    result = {
        "args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()},
        **info,
        "pretrained_by_layer": {k: accuracy(f) for k, f in feats.items()},
        "random_init": accuracy(random[cfg.layers]),
        "classical": classical_score(labelled, FOLDS, SEED).accuracy,
        "chance": float(np.bincount(labelled.labels).max() / len(labelled.labels)),
    }
    print(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

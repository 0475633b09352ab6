"""A side study of docs/design.md section 10.5: does a contrastive next-patch term beside the
categorical objective give the trunk features the probe can use? A prototype, not an iqtrain
objective: it trains outside the trainer (no checkpoints, no evidence) with the quickstart's
model, data shape, optimizer and warmup-stable-decay schedule (``examples/quickstart.toml``;
warmup 5% and decay 30% of the steps, as ``recipe.py`` scales them), so its rows compare with
the study's categorical rows at the same number of steps.

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

from iqtrain.config.schema import Config, load_config
from iqtrain.data.dataset import IQDataset
from iqtrain.data.windows import labelled_windows
from iqtrain.eval.probe import classical_score, cross_validate, layer_features
from iqtrain.model.objectives import objective_loss
from iqtrain.model.prepare import prepare_iq_input_reference
from iqtrain.model.transformer import NextPatchModel
from iqtrain.pretrained.load import random_init_model
from iqtrain.train.optim import split_parameters
from iqtrain.train.schedule import Plan, lr_at

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml"
FOLDS, SEED = 5, 0  # the probe's defaults


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


def quickstart(steps: int) -> Config:
    """The quickstart's config, its schedule scaled to ``steps`` as ``recipe.py`` scales it."""
    return load_config(
        QUICKSTART,
        [
            f"training.max_steps={steps}",
            f"schedule.warmup_steps={max(1, steps // 20)}",
            f"schedule.decay_steps={max(1, (3 * steps) // 10)}",
        ],
    )


def train(args: argparse.Namespace, config: Config) -> tuple[NextPatchModel, dict]:
    cfg, data, oc = config.model, config.data, config.optimizer
    plan = Plan.from_config(config.schedule, args.steps, oc.lr, oc.min_lr)
    torch.manual_seed(SEED)
    model = NextPatchModel(cfg)
    contrast = NextPatchContrast(cfg.dim, 2 * cfg.patch_len, args.embed, args.temperature)
    # AdamW groups as the trainer's: no decay on vectors or the patch embedding.
    (decay, rest), (c_decay, c_rest) = split_parameters(model), split_parameters(contrast)
    opt = torch.optim.AdamW(
        [
            {"params": [p for _, p in decay + c_decay], "weight_decay": oc.weight_decay},
            {"params": [p for _, p in rest + c_rest], "weight_decay": 0.0},
        ],
        lr=oc.lr,
        betas=oc.betas,
        eps=oc.eps,
    )
    ds = IQDataset(args.train, window=data.patch_len * data.seq_patches)
    rng = np.random.default_rng(SEED)
    log: dict = {"categorical": [], "contrastive": []}
    start = time.perf_counter()
    for step in range(args.steps):
        raw = ds.windows(rng.integers(0, ds.num_windows, data.batch_size))
        if args.shift > 0:
            raw = shifted(raw, args.shift, rng)
        patches, _ = prepare_iq_input_reference(
            torch.from_numpy(raw),
            data.patch_len,
            norm=data.norm,
            prefix_patches=data.prefix_patches,
        )
        hidden = model.hidden_states(patches)
        loss, *_ = objective_loss(model.head(hidden), patches, cfg, squared_error=False)
        log["categorical"].append(loss.item())
        if args.mode == "both":
            nce = contrast(hidden, patches, args.ahead, args.negatives == "other")
            log["contrastive"].append(nce.item())
            loss = loss + args.weight * nce
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, plan)
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
    config = quickstart(args.steps)
    cfg, data = config.model, config.data
    model, info = train(args, config)
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

"""The pooling side study of the recipe study (studies/README.md): does the probe's mean over
patches hide what the trunk learned?

For one pretrained attempt and its random init, every layer's hidden states are pooled over
patches four ways (mean, as the probe does; mean + std; mean + std + skewness; mean + std + max
absolute value) and each is scored by the probe's grouped cross-validation on the labelled set
(the study's *select* set: never the report set). Prints one line per (model, layer, pooling)
and writes them as JSON::

    python studies/recipe/pooling.py ATTEMPT 'TORCHSIG_SEED1/*.sigmf-meta' out.json

Venv: the project's. Data: a pretrained attempt of the recipe study (studies/recipe/recipe.py)
and the study's select set (studies/torchsig_data/torchsig_data.py, seed 1). Results:
studies/recipe/RESULTS.md.

Every layer's per-patch states come from the public ``Pretrained.features`` (``pool=None``: one
forward per batch for all layers, the path ``iqtrain probe`` and ``Pretrained.embed`` take);
only the pooling is the study's own. The labelled windows and the grouped cross-validation are
the probe's own: :func:`iqtrain.data.windows.labelled_windows` and
:func:`iqtrain.eval.folds.cross_validate`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from iqtrain import Pretrained, load_pretrained
from iqtrain.data.windows import LabelledSet, labelled_windows
from iqtrain.eval.folds import cross_validate

POOLINGS = ("mean", "meanstd", "meanstdskew", "meanstdmax")
FOLDS, SEED = 5, 0  # the probe's defaults


def _pooled(h: torch.Tensor) -> dict[str, torch.Tensor]:
    """``h`` [batch, patches, dim] pooled over patches, each way."""
    mu, sd = h.mean(1), h.std(1)
    skew = ((h - mu[:, None]) ** 3).mean(1) / (sd**3 + 1e-6)
    return {
        "mean": mu,
        "meanstd": torch.cat([mu, sd], 1),
        "meanstdskew": torch.cat([mu, sd, skew], 1),
        "meanstdmax": torch.cat([mu, sd, h.abs().amax(1)], 1),
    }


def pooled_features(pre: Pretrained, labelled: LabelledSet) -> dict[int, dict[str, torch.Tensor]]:
    """``{layer: {pooling: [windows, features]}}``: every patch's state of every layer, pooled
    each way."""
    layers = range(pre.config.model.layers + 1)
    states = pre.features(labelled.batches(64), layers, pool=None)
    return {k: _pooled(h) for k, h in states.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attempt")
    parser.add_argument("data", help="labelled .sigmf-meta glob (the select set)")
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    pre = load_pretrained(args.attempt, which="latest")
    labelled = labelled_windows(args.data, pre.window)
    results: dict[str, float] = {}
    for name, m in {"pretrained": pre, "random": pre.random_init()}.items():
        for layer, pooled in pooled_features(m, labelled).items():
            for pooling in POOLINGS:
                score = cross_validate(
                    pooled[pooling],
                    labelled.labels,
                    labelled.groups,
                    FOLDS,
                    SEED,
                    classes=labelled.classes,
                )
                results[f"{name} layer {layer} {pooling}"] = round(score.accuracy, 3)
                print(name, layer, pooling, round(score.accuracy, 3), flush=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

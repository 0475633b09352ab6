"""``iqtrain report DIR``: a plain-text summary of an attempt's metric stream."""

from __future__ import annotations

import json
import math
from pathlib import Path

from iqtrain.errors import CheckpointError
from iqtrain.metrics import read_metrics

__all__ = ["report"]


def report(attempt: Path) -> str:
    metrics = attempt / "metrics.jsonl"
    if not metrics.is_file():
        raise CheckpointError(f"{attempt}: no metrics.jsonl (not an attempt directory?)")
    info = json.loads((attempt / "attempt.json").read_text())
    records = read_metrics(metrics)
    train = [r for r in records if r["kind"] == "train"]
    val = [r for r in records if r["kind"] == "val"]
    lines = [f"attempt {attempt} ({info.get('status')}), device {info['device']['name']}"]
    if info.get("parent"):
        lines.append(f"  resumed from {info['parent']['attempt']} at step {info['parent']['step']}")
    if train:
        last = train[-1]
        sps = [r["samples_per_s"] for r in train[len(train) // 10 :]]
        lines.append(
            f"  {len(train)} train steps, last loss {last['loss']:.5f}, "
            f"clipped {sum(r['clipped'] for r in train)}, spikes {sum(r['spike'] for r in train)}, "
            f"median samples/s {sorted(sps)[len(sps) // 2]:.0f}"
        )
    base = next((r for r in val if "baseline_zero_loss" in r), None)
    if base:
        lines.append(
            f"  baselines: zero-prediction {base['baseline_zero_loss']:.5f}, "
            f"copy-last-patch {base['baseline_copy_last_loss']:.5f}"
        )
    for r in val:
        lines.append(
            f"  val step {r['step']:>7}: loss {r['loss']:.5f} ({r['pred_snr_db']:.2f} dB)"
            + ("  best" if r["best"] else "")
        )
    if val:
        best = min(val, key=lambda r: r["loss"])
        lines.append(
            f"  best val loss {best['loss']:.5f} at step {best['step']} "
            f"({-10 * math.log10(best['loss']):.2f} dB)"
        )
    return "\n".join(lines)

"""``iqtrain verify DIR --data``: re-read every recording an attempt trained on.

Compares the full-content digests (data files) and metadata digests that the attempt's newest
verified checkpoint records with the files as they are now, and checks each recording's SigMF
``core:sha512`` where its metadata carries one. Reads every byte. Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from iqtrain.evidence import checkpoint_problems

__all__ = ["verify_data"]


def verify_data(attempt: Path) -> list[str]:
    """Re-read every recording the attempt trained on and compare it with what it recorded.

    The full-content digests recorded in the attempt's newest verified checkpoint, and each
    recording's SigMF ``core:sha512`` where its metadata carries one. Reads every byte.
    """
    from iqtrain.checkpoint import list_checkpoints
    from iqtrain.data import IQDataset
    from iqtrain.errors import DataError

    attempt = Path(attempt)
    ckpt = next(
        (
            c
            for c in reversed(list_checkpoints(attempt / "checkpoints"))
            if not checkpoint_problems(c)
        ),
        None,
    )
    if ckpt is None:
        return [f"{attempt}: no verified checkpoint records the data's digests"]
    try:
        recorded = json.loads((ckpt / "state.json").read_text())["data"]
        groups = [(k, dict(recorded[k])) for k in ("train", "val")]
        metas_recorded = [
            (k.removesuffix("_meta"), dict(recorded[k]))
            for k in ("train_meta", "val_meta")
            if k in recorded
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{ckpt / 'state.json'}: no data digests: {exc}"]
    problems = []
    for key, digests in groups:
        metas = [str(Path(p).with_suffix(".sigmf-meta")) for p in sorted(digests)]
        try:
            dataset = IQDataset(metas, window=1)  # every recording, whatever its length
            now = dataset.content_digests()
            problems += dataset.verify_content()
        except DataError as exc:
            problems.append(f"data.{key}: {exc}")
            continue
        problems += [
            f"data.{key}: {p}: content differs from what {ckpt.name} recorded"
            for p in sorted(digests)
            if now.get(p) != digests[p]
        ]
    for key, digests in metas_recorded:
        for meta, want in sorted(digests.items()):
            try:
                got = hashlib.sha256(Path(meta).read_bytes()).hexdigest()
            except OSError as exc:
                problems.append(f"data.{key}: {meta}: cannot read: {exc.strerror}")
                continue
            if got != want:
                problems.append(
                    f"data.{key}: {meta}: metadata differs from what {ckpt.name} recorded"
                )
    return problems

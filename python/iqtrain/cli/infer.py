"""``iqtrain embed`` and ``iqtrain score``: a trained model over SigMF recordings
(docs/design.md section 10.6).

The model is loaded through :func:`iqtrain.pretrained.load.load_pretrained` (verified as a
resume verifies its parent); the work is :mod:`iqtrain.pretrained.recordings`. Both import torch
only when they run. Every refusal (a bad flag, a glob matching nothing, an unlabelled set with
``--per annotation``, an output that exists) is one line, exit 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["add_embed_parser", "add_score_parser", "cmd_embed", "cmd_score"]

_FROM_HELP = "latest, best or step_N (default best; a checkpoint directory names its own)"


def _load(args: argparse.Namespace) -> Any:
    from iqtrain.pretrained.load import load_pretrained, source_ref

    source_ref(args.attempt, args.from_, name="--from")  # a bad --from is named as such
    return load_pretrained(
        args.attempt, which=args.from_, device=args.device, precision=args.precision
    )


def cmd_embed(args: argparse.Namespace) -> int:
    from iqtrain.pretrained.recordings import check_output, embed_recordings, write_embeddings

    out = Path(args.out)
    check_output(out, args.force)  # before the model or the data is read
    pre = _load(args)
    emb = embed_recordings(pre, args.data, per=args.per, layer=args.layer)
    check_output(out, args.force)  # again: the work may have taken long
    write_embeddings(out, emb)
    labels = "" if emb.label is None else f", labels of {len(emb.classes)} classes"
    print(
        f"wrote {len(emb.embeddings)} {args.per} embeddings of dim {emb.embeddings.shape[1]} "
        f"(layer {emb.meta['layer']}, {pre.checkpoint.name}){labels} to {out}"
    )
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from iqtrain.pretrained.recordings import score_recordings, unit_of

    if args.top is not None and args.top < 1:
        raise _usage(f"--top: must be >= 1, got {args.top}")
    pre = _load(args)
    rows = score_recordings(pre, args.data, per=args.per)
    shown = rows if args.top is None else rows[: args.top]
    unit = unit_of(pre)
    print(
        f"score of {pre.attempt} at {pre.checkpoint.name} (step {pre.step}): mean next-patch "
        f"loss per {args.per}, {unit}, highest first ({len(shown)} of {len(rows)})"
    )
    print(f"{'rank':>5}  {'score':>10}  {'windows':>7}  {'start':>10}  recording  label")
    for i, r in enumerate(shown, start=1):
        label = "" if r.label is None else f"  {r.label}"
        print(
            f"{i:>5}  {r.score:>10.5f}  {r.windows:>7}  {r.start:>10}  "
            f"{os.fspath(r.recording)}{label}"
        )
    if args.json:
        print(
            json.dumps(
                {
                    "attempt": os.fspath(pre.attempt),
                    "checkpoint": pre.checkpoint.name,
                    "step": pre.step,
                    "per": args.per,
                    "unit": unit,
                    "rows": [r.to_dict() for r in shown],
                }
            )
        )
    return 0


def _usage(message: str) -> Exception:
    from iqtrain.errors import ConfigError

    return ConfigError(message)


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("attempt", help="an attempt directory, or a checkpoint directory in one")
    sp.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="GLOB",
        help=".sigmf-meta files or glob patterns",
    )
    sp.add_argument("--from", dest="from_", default=None, help=_FROM_HELP)
    sp.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    sp.add_argument(
        "--precision",
        choices=("fp32", "bf16", "auto"),
        default="fp32",
        help="fp32 (default: exactly the probe's numbers), bf16 (CUDA), or auto (bf16 on CUDA "
        "where the model trained in bf16)",
    )


def add_embed_parser(sub: Any) -> None:
    """Add ``embed`` to ``sub`` (the subparsers of ``iqtrain``)."""
    sp = sub.add_parser(
        "embed",
        help="write a checkpoint's embeddings of SigMF recordings to a safetensors file",
        description="Embeddings (hidden states mean-pooled over patches) of every window, or of "
        "every labelled annotation, as float32 [N, dim] with recording, start, windows and (for "
        "labelled data) label per row; the class and recording names are in the file's "
        "metadata.",
    )
    _common(sp)
    sp.add_argument("--out", required=True, metavar="FILE.safetensors", help="the file to write")
    sp.add_argument(
        "--layer",
        metavar="N",
        help="block N's states (0 the patch embeddings; default: the final hidden states)",
    )
    sp.add_argument(
        "--per",
        choices=("window", "annotation"),
        default="window",
        help="a row per window (default), or per labelled annotation (its windows mean-pooled)",
    )
    sp.add_argument("--force", action="store_true", help="replace FILE if it exists")
    sp.set_defaults(func=cmd_embed)


def add_score_parser(sub: Any) -> None:
    """Add ``score`` to ``sub`` (the subparsers of ``iqtrain``)."""
    sp = sub.add_parser(
        "score",
        help="rank recordings, annotations or windows by how surprising they are to a checkpoint",
        description="The mean next-patch loss under the model's own objective (nats per complex "
        "sample for categorical, NMSE for mse) of each recording, labelled annotation or "
        "window, highest first: a likelihood-based novelty score.",
    )
    _common(sp)
    sp.add_argument(
        "--per",
        choices=("recording", "annotation", "window"),
        default="recording",
        help="what one row scores (default recording: the mean over its windows)",
    )
    sp.add_argument("--top", type=int, metavar="N", help="only the N highest")
    sp.add_argument("--json", action="store_true", help="also print one JSON object last")
    sp.set_defaults(func=cmd_score)

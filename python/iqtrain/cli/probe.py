"""``iqtrain probe ATTEMPT``: the linear probe of a checkpoint (docs/design.md section 10.2).

The probe itself is :mod:`iqtrain.eval.probe`, imported when the command runs (it imports
torch; ``iqtrain --help`` must not).
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_probe_parser", "cmd_probe"]


def cmd_probe(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    # Lazily: probe imports torch, and `iqtrain --help` must not.
    from iqtrain.eval.probe import Shots, format_table, run_probe

    shots = Shots.parse(args.shots, args.seeds)  # refused before anything is loaded
    result = run_probe(
        Path(args.attempt),
        args.data,
        args.from_,
        args.folds,
        by=args.by,
        bins=args.bins,
        layer=args.layer,
        shots=shots,
    )
    print(format_table(result))
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def add_probe_parser(sub: Any) -> None:
    """Add ``probe`` to ``sub`` (the subparsers of ``iqtrain``)."""
    sp = sub.add_parser(
        "probe", help="linear-probe accuracy of a checkpoint on labelled SigMF annotations"
    )
    sp.add_argument("attempt", help="the attempt directory")
    sp.add_argument(
        "--data",
        nargs="+",
        default=None,
        metavar="GLOB",
        help="labelled .sigmf-meta files (default: the attempt's probe set: probe.data, the "
        "synthetic probe set or its validation recordings)",
    )
    sp.add_argument("--from", dest="from_", default="latest", help="latest, best or step_N")
    sp.add_argument("--folds", type=int, default=5, help="cross-validation folds (default 5)")
    sp.add_argument(
        "--by",
        metavar="KEY",
        help="also accuracy per bin of a numeric annotation field, e.g. iqtrain:snr_db",
    )
    sp.add_argument(
        "--bins",
        metavar="W|E1,E2,...",
        help="--by's bins: a width (default 5) or comma-separated edges",
    )
    sp.add_argument(
        "--layer",
        metavar="N|all",
        help="features of block N (0 the patch embeddings; default: the final hidden states, "
        "model.layers) or of every layer",
    )
    sp.add_argument(
        "--shots",
        metavar="K[,K...]",
        help="also the few-shot accuracies: K labelled annotations per class drawn from each "
        "training fold (the field's label-efficiency curve)",
    )
    sp.add_argument(
        "--seeds",
        type=int,
        metavar="S",
        help="--shots' draws per K (default 5): the accuracy is their mean, with their std",
    )
    sp.add_argument("--json", action="store_true", help="also print one JSON object last")
    sp.set_defaults(func=cmd_probe)

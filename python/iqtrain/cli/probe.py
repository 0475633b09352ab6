"""``iqtrain probe ATTEMPT``: the linear probe of a checkpoint (docs/design.md "Linear probe").

The command's flags, their parsing and their names live here: :func:`parse_shots` and
:func:`parse_bins` turn ``--shots``/``--seeds`` and ``--bins`` text into what the probe takes,
and :data:`FLAGS` tells the probe which flag each of its errors is about. The probe itself is
:mod:`iqtrain.eval.probe`, imported when the command runs (it imports torch; ``iqtrain --help``
must not).
"""

from __future__ import annotations

import argparse
import math
import re
from typing import TYPE_CHECKING, Any

from iqtrain.errors import ConfigError

if TYPE_CHECKING:
    from iqtrain.eval.folds import Shots
    from iqtrain.eval.probe import ProbeNames

__all__ = ["add_probe_parser", "cmd_probe", "flag_names", "parse_bins", "parse_shots"]


def flag_names() -> ProbeNames:
    """The flag of each option of :func:`iqtrain.eval.probe.run_probe`, for its errors."""
    from iqtrain.eval.probe import ProbeNames

    return ProbeNames(
        from_="--from",
        folds="--folds",
        layer="--layer",
        by="--by",
        bins="--bins",
        shots="--shots",
        data="--data",
        label_key="--label-key",
        any_rate="--any-rate",
        skip_invalid="--skip-invalid",
    )


def parse_shots(text: str | None, seeds: int | None) -> Shots | None:
    """``--shots K[,K...]`` (plain ASCII digits) and ``--seeds S`` (default 5); None without
    shots. ConfigError naming the flag for a bad K or seed count, a K given twice, or seeds
    without shots."""
    from iqtrain.eval.folds import DEFAULT_SEEDS, Shots

    if seeds is not None and (isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1):
        raise ConfigError(f"--seeds: must be an integer >= 1, got {seeds!r}")
    if text is None:
        if seeds is not None:
            raise ConfigError("--seeds: needs --shots K[,K...] (the draws to repeat)")
        return None
    values = []
    for item in text.split(","):
        if not re.fullmatch(r"[1-9][0-9]*", item.strip()):
            raise ConfigError(
                f"--shots: expected annotations per class, positive integers (1,5,10), got {text!r}"
            )
        values.append(int(item.strip()))
    if len(set(values)) != len(values):
        raise ConfigError(f"--shots: each K once, got {text!r}")
    return Shots.of(values, DEFAULT_SEEDS if seeds is None else seeds)


def parse_bins(text: str | None) -> float | list[float]:
    """``--bins``: one number (a bin width, the edges on its multiples; none: the default
    width) or comma-separated edges, strictly increasing, at least two; ConfigError naming
    ``--bins`` otherwise."""
    if text is None:
        from iqtrain.eval.bins import DEFAULT_BIN_WIDTH

        return DEFAULT_BIN_WIDTH
    try:
        values = [float(v) for v in str(text).split(",")]
    except ValueError:
        raise ConfigError(
            f"--bins: expected a width (5) or comma-separated edges (-20,-10,0,10,20), got {text!r}"
        ) from None
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(f"--bins: edges and widths must be finite, got {text!r}")
    if len(values) == 1:
        if not values[0] > 0:
            raise ConfigError(f"--bins: a bin width must be > 0, got {text!r}")
        return values[0]
    if any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ConfigError(f"--bins: edges must be strictly increasing, got {text!r}")
    return values


def cmd_probe(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    # Lazily: probe imports torch, and `iqtrain --help` must not.
    from iqtrain.cli.infer import check_channel
    from iqtrain.data.dataset import ReadOptions
    from iqtrain.eval.probe import ProbeOptions, probe_attempt
    from iqtrain.eval.table import format_table

    check_channel(args.channel)
    options = ProbeOptions(  # shots and bins refused before anything is loaded
        from_=args.from_,
        folds=args.folds,
        by=args.by,
        bins=None if args.bins is None else parse_bins(args.bins),
        layer=args.layer,
        shots=parse_shots(args.shots, args.seeds),
        names=flag_names(),
        label_key=args.label_key,
        read=ReadOptions(args.channel, args.skip_invalid),  # channel None: data.channel's
        any_rate=args.any_rate,
    )
    result = probe_attempt(Path(args.attempt), args.data, options)
    print(format_table(result))
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def add_probe_parser(sub: Any) -> None:
    """Add ``probe`` to ``sub`` (the subparsers of ``iqtrain``)."""
    from iqtrain.cli.infer import add_read_flags

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
    sp.add_argument(
        "--label-key",
        metavar="KEY",
        default=None,
        help="the annotation field that names a class, or a path into one "
        "(signal:detail.mod_class); default: the attempt's probe.label_key (core:label)",
    )
    add_read_flags(sp)
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

"""``iqtrain describe RAW --datatype T --sample-rate R``: SigMF metadata for a raw SDR capture
(:mod:`iqtrain.data.describe`; the flags and their names are here). Imports no torch."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["add_describe_parser"]


def cmd_describe(args: argparse.Namespace) -> int:
    from iqtrain.data.describe import RawCapture, describe_raw
    from iqtrain.data.sources import format_rate

    capture = RawCapture(
        datatype=args.datatype,
        sample_rate=args.sample_rate,
        frequency=args.frequency,
        header_bytes=args.header_bytes,
        trailing_bytes=args.trailing_bytes,
        label=args.label,
    )
    meta, samples = describe_raw(
        args.raw, capture, out=args.out, force=args.force, checksum=not args.no_checksum
    )
    print(
        f"wrote {meta}: {samples} samples of {args.raw} at {format_rate(args.sample_rate)} "
        f'(train on it with data.train = ["{meta}"])'
    )
    return 0


def add_describe_parser(sub: Any) -> None:
    """Add ``describe`` to ``sub`` (the subparsers of ``iqtrain``)."""
    from iqtrain.data.describe import DATATYPE_ALIASES

    sp = sub.add_parser(
        "describe",
        help="write the SigMF metadata (.sigmf-meta) of a raw SDR capture",
        description="Write RAW's SigMF metadata beside it, a non-conforming dataset naming RAW "
        "(checked by sigmf-python and by iqtrain's reader first; written atomically), so "
        "that iqtrain (and any SigMF tool) reads the capture.",
    )
    sp.add_argument("raw", metavar="RAW", help="the raw capture (e.g. capture.cu8)")
    sp.add_argument(
        "--datatype",
        required=True,
        help="its sample format: a complex SigMF datatype (cu8 for rtl_sdr, ci8, ci16_le, "
        f"cf32_le, ...) or an SDR tool's name ({', '.join(DATATYPE_ALIASES)})",
    )
    sp.add_argument(
        "--sample-rate", required=True, type=float, metavar="HZ", help="samples per second"
    )
    sp.add_argument("--frequency", type=float, metavar="HZ", help="the centre frequency")
    sp.add_argument(
        "--header-bytes", type=int, default=0, metavar="N", help="bytes before the samples"
    )
    sp.add_argument(
        "--trailing-bytes", type=int, default=0, metavar="N", help="bytes after the samples"
    )
    sp.add_argument("--label", help="one annotation over every sample with this core:label")
    sp.add_argument(
        "--out", metavar="META", help="the metadata file (default: RAW's name, .sigmf-meta)"
    )
    sp.add_argument("--force", action="store_true", help="replace an existing metadata file")
    sp.add_argument(
        "--no-checksum",
        action="store_true",
        help="do not read the capture for core:sha512 (verify then cannot check its content)",
    )
    sp.set_defaults(func=cmd_describe)

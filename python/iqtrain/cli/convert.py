"""``iqtrain convert radioml2016|radioml2018 SOURCE OUT_DIR``: public datasets as labelled SigMF.

The conversion itself is :mod:`iqtrain.data.convert` (imported when the command runs, so
``iqtrain --help`` loads neither it nor h5py); the flags and their names are here, the library
names its parameters. Imports no torch.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from iqtrain.errors import DataError

__all__ = ["add_convert_parser"]


def _summary(result: Any, out_dir: str) -> int:
    print(
        f"wrote {result.examples} examples of {len(result.classes)} classes "
        f"in {result.recordings} recordings to {out_dir}"
    )
    return 0


def cmd_convert_radioml2016(args: argparse.Namespace) -> int:
    from iqtrain.data.convert import convert_radioml2016

    return _summary(convert_radioml2016(args.source, args.out_dir), args.out_dir)


def cmd_convert_radioml2018(args: argparse.Namespace) -> int:
    from iqtrain.data.convert import ClassCountError, convert_radioml2018

    # convert.json and the error name the flag that gives the class list: --classes.
    order = None if args.classes is None else f"--classes {os.path.abspath(args.classes)}"
    try:
        result = convert_radioml2018(
            args.source, args.out_dir, classes_file=args.classes, class_order=order
        )
    except ClassCountError as exc:
        raise DataError(
            f"{exc.mismatch}; pass --classes FILE with {exc.width} names, one per line"
        ) from None
    return _summary(result, args.out_dir)


def add_convert_parser(sub: Any, parser_class: type[argparse.ArgumentParser]) -> None:
    """Add ``convert`` and its datasets to ``sub`` (the subparsers of ``iqtrain``); nested
    parsers are ``parser_class`` (the CLI's, whose usage errors are one line, exit 2)."""
    sp = sub.add_parser(
        "convert",
        help="write a public dataset (RadioML 2016.10A, 2018.01A) as labelled SigMF recordings",
        description="Convert a dataset into labelled cf32_le SigMF recordings in a new OUT_DIR "
        "(one capture and one core:label / iqtrain:snr_db annotation per example, "
        "OUT_DIR/convert.json naming the source); a failure leaves no OUT_DIR.",
    )
    kinds = sp.add_subparsers(
        dest="dataset", required=True, metavar="DATASET", parser_class=parser_class
    )
    p = kinds.add_parser("radioml2016", help="RML2016.10a_dict.pkl (a Python 2 pickle)")
    p.add_argument("source", metavar="SOURCE", help="the .pkl file")
    p.add_argument("out_dir", metavar="OUT_DIR", help="absent or empty; created")
    p.set_defaults(func=cmd_convert_radioml2016)

    p = kinds.add_parser(
        "radioml2018", help="GOLD_XYZ_OSC.0001_1024.hdf5 (needs h5py: iqtrain[radioml])"
    )
    p.add_argument("source", metavar="SOURCE", help="the .hdf5 file")
    p.add_argument("out_dir", metavar="OUT_DIR", help="absent or empty; created")
    p.add_argument(
        "--classes",
        metavar="FILE",
        default=None,
        help="class names by Y column, one per line (default: the order of the dataset's "
        "paper; the classes.txt shipped with the dataset does not match Y)",
    )
    p.set_defaults(func=cmd_convert_radioml2018)

"""``iqtrain export``: a trained model out of iqtrain, as a package folder (``--out DIR``) or an
ONNX file (``--onnx FILE``) (docs/design.md "Model package", "ONNX export").

The checkpoint is verified as ``load_pretrained`` verifies it; every refusal (a bad flag, an
output that exists or is inside an attempt, a head the objective does not give, a checkpoint
that fails verification) is one line, exit 2, with nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["add_export_parser", "cmd_export"]


def cmd_export(args: argparse.Namespace) -> int:
    from iqtrain.errors import ConfigError
    from iqtrain.evidence.package import is_package

    if (args.out is None) == (args.onnx is None):
        raise ConfigError("export: name exactly one of --out DIR (a package) and --onnx FILE")
    if args.out is not None:
        for flag, value in (("--head", args.head), ("--layer", args.layer)):
            if value is not None:
                raise ConfigError(f"{flag}: only for --onnx")
        return _package(args)
    if is_package(Path(args.attempt)) and args.which is not None:
        raise ConfigError(f"--which: {args.attempt} is a package of one checkpoint")
    return _onnx(args)


def _package(args: argparse.Namespace) -> int:
    from iqtrain.errors import ConfigError
    from iqtrain.pretrained.load import source_ref
    from iqtrain.pretrained.package import check_package_target, export_package

    out = Path(args.out)
    check_package_target(out, args.force)  # before the checkpoint is read
    ref = source_ref(args.attempt, args.which, "--which", ConfigError)
    export_package(ref, out, force=args.force)
    print(f"wrote package {out} (model.safetensors, config.json, README.md, lineage.json)")
    print(f"  load: iqtrain.load_pretrained({str(out)!r}); check: iqtrain verify {out}")
    return 0


def _onnx(args: argparse.Namespace) -> int:
    from iqtrain.errors import ConfigError
    from iqtrain.pretrained.load import load_pretrained, parse_layer, source_ref
    from iqtrain.pretrained.onnx_export import check_onnx_target, export_onnx

    out = Path(args.onnx)
    check_onnx_target(out, args.force)
    if not Path(args.attempt).is_dir() or not (Path(args.attempt) / "lineage.json").is_file():
        source_ref(args.attempt, args.which, "--which", ConfigError)
    pre = load_pretrained(args.attempt, which=args.which)
    layer = parse_layer(args.layer, pre.config.model.layers, "--layer", ConfigError)
    if layer == "all":
        raise ConfigError("--layer: an export takes one layer (an integer), not 'all'")
    if args.head is not None:
        pre.objective.require(args.head, pre.attempt)
    done = export_onnx(
        pre,
        out,
        head=args.head,
        layer=int(layer),
        pool=None if args.pool == "none" else "mean",
        input_dtype=args.input_dtype,
        check=args.check,
        force=args.force,
    )
    checked = (
        "not checked"
        if done.max_rel_diff is None
        else f"ONNX Runtime matches within {done.max_rel_diff:.2g} relative"
    )
    print(f"wrote {out}: head {done.head}, opset {done.opset}, input {args.input_dtype}; {checked}")
    return 0


def add_export_parser(sub: Any) -> None:
    """Add ``export`` to ``sub`` (the subparsers of ``iqtrain``)."""
    sp = sub.add_parser(
        "export",
        help="write a checkpoint as a model package folder or an ONNX file",
        description="A verified checkpoint as a package (--out DIR: model.safetensors, "
        "config.json, README.md model card, lineage.json; the Hugging Face Hub's layout) or as an "
        "ONNX graph that takes raw [N, window, 2] I/Q windows (--onnx FILE).",
    )
    sp.add_argument("attempt", help="an attempt directory, a checkpoint directory or a package")
    sp.add_argument(
        "--which", default=None, help="latest, best or step_N (default best; not for a package)"
    )
    sp.add_argument("--out", metavar="DIR", help="write a package folder")
    sp.add_argument("--onnx", metavar="FILE", help="write an ONNX file")
    sp.add_argument(
        "--head",
        choices=("embed", "score", "predict"),
        help="--onnx: what the graph outputs (default predict for a classifier, else embed)",
    )
    sp.add_argument("--layer", metavar="N", help="--onnx --head embed: block N's states")
    sp.add_argument(
        "--pool",
        choices=("mean", "none"),
        default="mean",
        help="--onnx --head embed: mean over patches (default) or every patch",
    )
    sp.add_argument(
        "--input-dtype",
        choices=("float32", "int16", "int8"),
        default="float32",
        help="--onnx: the dtype of the I/Q the graph takes (default float32)",
    )
    sp.add_argument(
        "--no-check",
        dest="check",
        action="store_false",
        help="--onnx: skip the ONNX Runtime comparison with the model",
    )
    sp.add_argument("--force", action="store_true", help="replace an existing package or file")
    sp.set_defaults(func=cmd_export)

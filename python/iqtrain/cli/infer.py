"""``iqtrain embed``, ``iqtrain score`` and ``iqtrain predict``: a trained model over SigMF
recordings (docs/design.md "A trained model as a product").

The model is loaded through :func:`iqtrain.pretrained.load.load_pretrained` (verified as a
resume verifies its parent); the work is :mod:`iqtrain.pretrained.recordings`. Each imports
torch only when it runs. Every refusal (a bad flag, a glob matching nothing, an unlabelled set
with ``--per annotation``, an output that exists, a pretraining attempt given to ``predict``) is
one line, exit 2, before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

__all__ = [
    "add_embed_parser",
    "add_read_flags",
    "add_predict_parser",
    "add_score_parser",
    "cmd_embed",
    "cmd_predict",
    "cmd_score",
    "check_channel",
    "prediction_lines",
    "read_options",
]

_FROM_HELP = "latest, best or step_N (default best; a checkpoint directory names its own)"
#: The annotation field embed and score read labels from without --label-key.
DEFAULT_LABEL_KEY = "core:label"


def _load(args: argparse.Namespace) -> Any:
    from iqtrain.errors import ConfigError
    from iqtrain.pretrained.load import (
        check_precision,
        load_pretrained,
        resolve_device,
        source_ref,
    )
    from iqtrain.pretrained.recordings import check_label_key

    # Flags first, each refused as the flag (one line, exit 2): nothing is loaded for a bad one.
    check_channel(args.channel)
    check_label_key(args.label_key)
    source_ref(args.attempt, args.from_, "--from", ConfigError)
    device = resolve_device(args.device, "--device", ConfigError)
    check_precision(args.precision, device, "--precision", ConfigError)
    return load_pretrained(args.attempt, which=args.from_, device=device, precision=args.precision)


def check_channel(channel: int | None) -> None:
    """``--channel``: an integer >= 0 (None: the model's ``data.channel``)."""
    if channel is not None and channel < 0:
        raise _usage(f"--channel: must be an integer >= 0, got {channel}")


def read_options(args: argparse.Namespace, pre: Any) -> Any:
    """How the command reads its recordings: ``--channel`` (default: the channel the model
    trained on, ``data.channel``) and ``--skip-invalid``."""
    from iqtrain.data.dataset import ReadOptions

    channel = pre.config.data.channel if args.channel is None else args.channel
    return ReadOptions(channel=channel, skip_invalid=args.skip_invalid)


def cmd_embed(args: argparse.Namespace) -> int:
    from iqtrain.pretrained.recordings import check_output, embed_recordings, write_embeddings

    out = Path(args.out)
    check_output(out, args.force)  # before the model or the data is read
    pre = _load(args)
    emb = embed_recordings(
        pre,
        args.data,
        per=args.per,
        layer=args.layer,
        key=args.label_key or DEFAULT_LABEL_KEY,
        read=read_options(args, pre),
        any_rate=args.any_rate,
    )
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
    table = score_recordings(
        pre,
        args.data,
        per=args.per,
        key=args.label_key or DEFAULT_LABEL_KEY,
        read=read_options(args, pre),
        any_rate=args.any_rate,
    )
    rows = table.rows
    shown = rows if args.top is None else rows[: args.top]
    unit = unit_of(pre)
    # "(k of n)": with --per recording, n counts every recording read (a recording too
    # short for a window has no score: a note named it).
    print(
        f"score of {pre.attempt} at {pre.checkpoint.name} (step {pre.step}): mean next-patch "
        f"loss per {args.per}, {unit}, highest first ({len(shown)} of {table.given})"
    )
    print(f"{'rank':>5}  {'score':>10}  {'windows':>7}  {'start':>10}  recording  label")
    for i, r in enumerate(shown, start=1):
        label = "" if r.label is None else f"  {_show(r.label)}"
        print(
            f"{i:>5}  {r.score:>10.5f}  {r.windows:>7}  {r.start:>10}  "
            f"{os.fspath(r.recording)}{label}"
        )
    if args.json:
        rows_json = [r.to_dict() for r in shown]
        print(json.dumps({**_source_json(pre), "per": args.per, "unit": unit, "rows": rows_json}))
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from iqtrain.console import note
    from iqtrain.pretrained.recordings import predict_recordings

    if args.rows is not None and args.rows < 0:
        raise _usage(f"--rows: must be >= 0, got {args.rows}")
    if args.stride is not None and (args.stride < 1 or args.per != "annotation"):
        raise _usage(f"--stride: an integer >= 1, with --per annotation; got {args.stride}")
    pre = _load(args)
    pred = predict_recordings(  # a pretraining attempt is refused before any data is read
        pre,
        args.data,
        per=args.per,
        stride=args.stride,
        key=args.label_key,
        read=read_options(args, pre),
        any_rate=args.any_rate,
    )
    if pred.unknown:
        n = sum(pred.unknown.values())
        names = ", ".join(f"{k!r}: {v}" for k, v in list(pred.unknown.items())[:8])
        more = ", ..." if len(pred.unknown) > 8 else ""
        note(
            f"predict: {n} {args.per}(s) carry a {pred.label_key} the model does not know "
            f"({names}{more}): predicted, not counted in the accuracy"
        )
    source = f"{pre.attempt} at {pre.checkpoint.name} (step {pre.step})"
    for line in prediction_lines(pred, source, args.rows):
        print(line)
    if args.json:
        print(json.dumps({**_source_json(pre), **pred.to_dict()}))
    return 0


def _rate(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.5f}"


def _show(name: str) -> str:
    """A class name as every command prints it (:func:`iqtrain.data.windows.show_class`,
    imported when a command prints: ``--help`` reads no recording module)."""
    from iqtrain.data.windows import show_class

    return show_class(name)


#: ``predict`` prints the confusion matrix of at most this many classes (``--json`` has all),
#: and its table's name columns at most this wide.
MAX_CONFUSION_CLASSES = 40
NAME_WIDTH = 24


def prediction_lines(pred: Any, source: str, rows: int | None = None) -> list[str]:
    """The text ``iqtrain predict`` prints for ``pred`` (a
    :class:`~iqtrain.pretrained.recordings.Prediction`): a header, the table (the first
    ``rows`` rows; all when None), then, where a row's label is one of the model's classes,
    accuracy, per-class accuracy and the confusion matrix (rows true, columns predicted).
    Class names as :func:`~iqtrain.data.windows.show_class` prints them."""
    shown = pred.rows if rows is None else pred.rows[:rows]
    how = (
        "the class maximising the mean of its windows' log-probabilities, probability the "
        "softmax of that mean"
        if pred.per == "annotation"
        else "the most probable class and its probability"
    )
    out = [
        f"predict of {source}: {len(pred.rows)} {pred.per}s ({how}); {len(pred.classes)} "
        f"classes; labels from {pred.label_key} ({len(shown)} of {len(pred.rows)} rows shown)"
    ]
    names = [_show(c) for c in pred.classes]
    labels = [_show(r.label) if r.label is not None else "-" for r in shown]
    # Columns as wide as the names shown, up to NAME_WIDTH (a longer name runs on).
    width = min(NAME_WIDTH, max([9, *(len(c) for c in names), *(len(lab) for lab in labels)]))
    if shown:
        out.append(
            f"{'row':>5}  {'start':>10}  {'windows':>7}  {'predicted':<{width}}  "
            f"{'probability':>11}  {'label':<{width}}  recording"
        )
    for i, (r, lab) in enumerate(zip(shown, labels, strict=True), start=1):
        out.append(
            f"{i:>5}  {r.start:>10}  {r.windows:>7}  {_show(r.predicted):<{width}}  "
            f"{r.probability:>11.5f}  {lab:<{width}}  {os.fspath(r.recording)}"
        )
    s = pred.scores
    if not s.labelled:
        out.append(
            f"accuracy n/a: no {pred.per} carries a {pred.label_key} that is one of the model's "
            "classes"
        )
        return out
    return out + _accuracy_lines(pred, names)


def _accuracy_lines(pred: Any, names: list[str]) -> list[str]:
    """Accuracy, per-class accuracy and the confusion matrix of ``pred`` (``names``: its
    classes as printed)."""
    s = pred.scores
    windows = ""
    if pred.window_scores is not None:
        w = pred.window_scores
        windows = f"; each of their {w.labelled} windows alone {_rate(w.accuracy)}"
    hits = sum(s.confusion[k][k] for k in range(len(pred.classes)))
    out = [
        f"accuracy {_rate(s.accuracy)} ({hits} correct of {s.labelled} {pred.per}s with a known "
        f"label{windows})"
    ]
    counts = [sum(row) for row in s.confusion]
    out.append(
        "class accuracy: "
        + ", ".join(
            f"{name} {_rate(s.class_accuracy[c])} ({n})"
            for c, name, n in zip(pred.classes, names, counts, strict=True)
        )
    )
    if len(pred.classes) > MAX_CONFUSION_CLASSES:
        out.append(
            f"confusion: {len(pred.classes)} classes, more than {MAX_CONFUSION_CLASSES} to "
            "print (--json holds it)"
        )
        return out
    out.append("confusion (rows: true class, columns: predicted class):")
    cw = max(5, *(len(c) for c in names), len(str(max(counts))))
    out.append(" " * cw + "".join(f"  {c:>{cw}}" for c in names))
    for name, row in zip(names, s.confusion, strict=True):
        out.append(f"{name:>{cw}}" + "".join(f"  {v:>{cw}}" for v in row))
    return out


def _usage(message: str) -> Exception:
    from iqtrain.errors import ConfigError

    return ConfigError(message)


def _source_json(pre: Any) -> dict[str, Any]:
    """The ``--json`` line's first keys: which model answered (a ``Pretrained``)."""
    return {"attempt": os.fspath(pre.attempt), "checkpoint": pre.checkpoint.name, "step": pre.step}


def add_read_flags(sp: argparse.ArgumentParser) -> None:
    """``--channel``, ``--skip-invalid`` and ``--any-rate``: how a command that runs a model
    reads its recordings (embed, score, predict, probe)."""
    sp.add_argument(
        "--channel",
        type=int,
        metavar="K",
        default=None,
        help="the channel read of multi-channel recordings (default: the model's data.channel)",
    )
    sp.add_argument(
        "--skip-invalid",
        action="store_true",
        help="read past recordings that cannot be read (each is named in a note)",
    )
    sp.add_argument(
        "--any-rate",
        action="store_true",
        help="read recordings at another sample rate than the model was trained at (or with "
        "none recorded): refused without it, since a model sees samples, not seconds",
    )


def _common(sp: argparse.ArgumentParser, label_default: str = DEFAULT_LABEL_KEY) -> None:
    sp.add_argument("attempt", help="an attempt directory, or a checkpoint directory in one")
    sp.add_argument(
        "--data",
        nargs="+",
        required=True,
        metavar="GLOB",
        help=".sigmf-meta files or glob patterns",
    )
    sp.add_argument("--from", dest="from_", default=None, help=_FROM_HELP)
    sp.add_argument(
        "--label-key",
        metavar="KEY",
        default=None,
        help=f"the annotation field that names a class, or a path into one "
        f"(signal:detail.mod_class); default: {label_default}",
    )
    add_read_flags(sp)
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


def add_predict_parser(sub: Any) -> None:
    """Add ``predict`` to ``sub`` (the subparsers of ``iqtrain``)."""
    sp = sub.add_parser(
        "predict",
        help="classify SigMF recordings with a fine-tuned (classifier) checkpoint: "
        "per annotation or window, with accuracy and a confusion matrix",
        description="The class a fine-tuned checkpoint predicts for every annotation (labelled "
        "or not; the class maximising the mean of its windows' log-probabilities, with the "
        "softmax of that mean as its probability) or every window (--per window: the grid of "
        "one window from each capture segment's start). A row's label is the value of the "
        "annotation field the model was trained on (data.label_key); over the rows whose label "
        "is one of the model's classes, accuracy, per-class accuracy and the confusion matrix "
        "(rows true, columns predicted) follow the table. Unlabelled recordings are fine: "
        "their rows have no label, and without annotations --per window still predicts.",
    )
    _common(sp, "the model's data.label_key, the field it trained on")
    sp.add_argument(
        "--per",
        choices=("annotation", "window"),
        default="annotation",
        help="a row per annotation holding a whole window (default), or per window",
    )
    sp.add_argument(
        "--stride",
        type=int,
        metavar="S",
        help="--per annotation: an annotation's windows every S samples from its start "
        "(default: one window; the run's data.stride gives the windows its validation read)",
    )
    sp.add_argument(
        "--rows",
        type=int,
        metavar="N",
        help="print only the first N rows of the table (0: the summary alone); accuracy and "
        "--json cover every row",
    )
    sp.add_argument("--json", action="store_true", help="also print one JSON object last")
    sp.set_defaults(func=cmd_predict)

"""The readable report of a probe (``iqtrain probe``'s table, docs/design.md "Linear probe"):
accuracies side by side with their standard errors, per class, per bin, per layer and per K,
then the pretrained confusion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from iqtrain.data.windows import show_class
from iqtrain.eval.bins import bin_span

if TYPE_CHECKING:
    from iqtrain.eval.probe import ProbeResult

__all__ = ["format_table"]

#: The models of a probe in the order they are printed, with their column titles.
COLUMNS = (
    ("pretrained", "pretrained"),
    ("random_init", "random-init"),
    ("classical", "classical"),
    ("combined", "classical+pretrained"),
)
CELL = 22


def _cell(value: float | None, se: float | None, width: int = CELL) -> str:
    """``0.2861 ± 0.0123``; a dash for no accuracy (a bin without windows), ``± -`` for no
    standard error (fewer than two annotations)."""
    if value is None:
        return f"{'-':>{width}}"
    spread = "-" if se is None else f"{se:.4f}"
    return f"{f'{value:.4f} ± {spread}':>{width}}"


def format_table(result: ProbeResult) -> str:
    """The readable report: accuracies side by side (pretrained, random init, classical
    features, both feature sets, chance), each with its standard error over annotations, per
    class, per bin of ``--by``, per layer and per K of ``--shots`` when asked, then the
    pretrained confusion matrix."""
    r = result
    cols = [(title, getattr(r, name)) for name, title in COLUMNS if getattr(r, name) is not None]
    layer = "" if r.layer is None else f", features of layer {r.layer}"
    lines = [
        f"linear probe of {r.attempt} at {r.checkpoint} (step {r.step}): {r.windows} windows "
        f"in {r.annotations} annotations, {len(r.classes)} classes, {r.folds} folds grouped "
        f"by annotation{layer}",
        "accuracy ± its standard error over annotations (windows of one annotation are not "
        "independent)",
        "",
        f"{'':<16}" + "".join(f"{name:>{CELL}}" for name, _ in cols) + f"{'chance':>9}",
        f"{'accuracy':<16}"
        + "".join(_cell(sc.accuracy, sc.accuracy_se) for _, sc in cols)
        + f"{r.chance:>9.4f}",
    ]
    names = [show_class(c) for c in r.classes]  # " 16QAM" and "16QAM" printed apart
    for c, name in zip(r.classes, names, strict=True):
        lines.append(
            f"  {name:<14}"
            + "".join(_cell(sc.per_class[c], sc.per_class_se.get(c)) for _, sc in cols)
        )
    lines += _by_lines(r) + _layer_lines(r) + _shot_lines(r)
    width = max(7, *(len(name) + 1 for name in names))
    lines += ["", "confusion of the pretrained model (rows true, columns predicted):"]
    lines.append(" " * 16 + "".join(f"{name:>{width}}" for name in names))
    for name, row in zip(names, r.pretrained.confusion, strict=True):
        lines.append(f"  {name:<14}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)


def _by_lines(r: ProbeResult) -> list[str]:
    if r.by is None:
        return []
    bins = r.by["bins"]
    names = [(n, title) for n, title in COLUMNS if n in bins[0]]
    outside = f" ({r.by['outside']} windows outside the bins)" if r.by["outside"] else ""
    lines = ["", f"accuracy by {r.by['key']}{outside}:"]
    lines.append(f"  {'bin':<18}{'windows':>8}" + "".join(f"{t:>{CELL}}" for _, t in names))
    closed_last = r.by.get("width") is None
    for i, b in enumerate(bins):
        span = bin_span(b["lo"], b["hi"], closed_last and i == len(bins) - 1)
        cells = "".join(_cell(b[n], b.get(f"{n}_se")) for n, _ in names)
        lines.append(f"  {span:<18}{b['windows']:>8}" + cells)
    return lines


def _layer_lines(r: ProbeResult) -> list[str]:
    if r.by_layer is None:
        return []
    lines = ["", "accuracy by layer (0 the patch embeddings, the last the final hidden states):"]
    lines.append(f"  {'layer':<8}{'pretrained':>{CELL}}{'random-init':>{CELL}}")
    for row in r.by_layer:
        lines.append(
            f"  {row['layer']:<8}"
            + _cell(row["pretrained"], row.get("pretrained_se"))
            + _cell(row["random_init"], row.get("random_init_se"))
        )
    return lines


def _shot_lines(r: ProbeResult) -> list[str]:
    if not r.shots:
        return []
    seeds = r.shots[0]["seeds"]
    names = [(n, title) for n, title in COLUMNS if n in r.shots[0]]
    width = 26
    lines = [
        "",
        f"accuracy with K labelled annotations per class drawn from each training fold, {seeds} "
        f"draw{'' if seeds == 1 else 's'} per K:",
        "  mean ± std over the draws (the draws' mean standard error over annotations)",
        f"  {'K':<6}" + "".join(f"{t:>{width}}" for _, t in names),
    ]
    for entry in r.shots:
        cells = []
        for n, _ in names:
            m = entry[n]
            std = "-" if m["std"] is None else f"{m['std']:.4f}"
            se = "-" if m["se"] is None else f"{m['se']:.4f}"
            text = f"{m['mean']:.4f} ± {std} ({se})"
            cells.append(f"{text:>{width}}")
        lines.append(f"  {entry['k']:<6}" + "".join(cells))
    return lines

"""Accuracy by a numeric annotation field (docs/design.md "Linear probe", --by): the bins of the
field's values (a width, or explicit edges) and the accuracies of each bin, read from the same
pooled held-out predictions. Errors name the option or config key the caller passes
(``name``, ``names``), never a flag of their own.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from iqtrain.data.windows import LabelledSet
from iqtrain.errors import ConfigError
from iqtrain.eval.folds import cluster_se

if TYPE_CHECKING:
    from iqtrain.eval.folds import ProbeScore

__all__ = [
    "DEFAULT_BIN_WIDTH",
    "MAX_BY_BINS",
    "accuracy_by",
    "bin_edges",
    "bin_index",
    "bin_span",
    "bin_windows",
    "check_bins",
]

#: The bins when none are given (``probe.bins``, ``iqtrain probe --bins``): 5 dB wide, the
#: field's SNR axis.
DEFAULT_BIN_WIDTH = 5.0


#: The most bins a width may make: more is a mistake (and 1e-300 would never end).
MAX_BY_BINS = 1000


def _width_edge(k: int, width: decimal.Decimal) -> float:
    """Edge ``k`` of a width: ``k · width`` computed in decimal (the width as written: the
    shortest decimal of its float) and rounded once to a float, so 3 · 0.1 is 0.3, not
    0.30000000000000004, and the edges print as the multiples a reader expects."""
    with decimal.localcontext() as ctx:
        ctx.prec = 60
        return float(k * width)


def _width_bin(v: float, width: float, step: decimal.Decimal, name: str) -> int:
    """The k with ``edge(k) <= v < edge(k + 1)`` (a ConfigError naming ``name`` when the edges
    around v cannot be told apart: the width is below the values' float resolution)."""
    k = math.floor(v / width)
    for _ in range(4):  # v / width is within an ulp or two of the true quotient
        if _width_edge(k, step) > v:
            k -= 1
        elif _width_edge(k + 1, step) <= v:
            k += 1
        else:
            return k
    raise ConfigError(
        f"{name}: a width of {width:g} is finer than the float resolution of the values near "
        f"{v:g}; choose a wider one"
    )


def bin_edges(values: np.ndarray, bins: float | list[float], name: str = "bins") -> list[float]:
    """The edges of the bins: explicit ones as given; for a width ``w``, the edges ``k · w``
    (:func:`_width_edge`) for every k from the bin of the smallest value to one past the bin of
    the largest, each value v in the bin ``[edge_k, edge_k+1)`` with ``edge_k <= v`` compared
    as floats (negative values included, for any width). More than :data:`MAX_BY_BINS` bins is
    a ConfigError naming ``name``."""
    if isinstance(bins, list):
        return bins
    lo_v, hi_v = float(values.min()), float(values.max())
    spread = hi_v / bins - lo_v / bins
    if not spread <= MAX_BY_BINS:  # inf and NaN included (an overflowing quotient)
        raise ConfigError(
            f"{name}: a width of {bins:g} cuts the values {lo_v:g} to {hi_v:g} into more than "
            f"{MAX_BY_BINS} bins; choose a wider one"
        )
    step = decimal.Decimal(repr(float(bins)))
    lo, hi = _width_bin(lo_v, bins, step, name), _width_bin(hi_v, bins, step, name)
    if hi - lo + 1 > MAX_BY_BINS:
        raise ConfigError(
            f"{name}: a width of {bins:g} cuts the values {lo_v:g} to {hi_v:g} into more than "
            f"{MAX_BY_BINS} bins; choose a wider one"
        )
    return [_width_edge(k, step) for k in range(lo, hi + 2)]


def bin_index(values: np.ndarray, edges: Sequence[float], width: float | None = None) -> np.ndarray:
    """Bin of each value, -1 outside: ``edges[k] <= v < edges[k + 1]`` compared as floats; with
    explicit edges (``width`` None) the last bin is closed. (Edges of a width, from
    :func:`bin_edges`, end past the largest value, so its last bin never needs closing.)"""
    e = np.asarray(edges, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    idx = np.searchsorted(e, values, side="right") - 1
    if width is None:
        idx[values == e[-1]] = len(e) - 2
    idx[(idx < 0) | (idx > len(e) - 2)] = -1
    return idx


def _number(x: float) -> str:
    """A bin edge as printed: ``:g`` when that is the edge exactly, else the shortest repr (so
    a printed edge is never rounded to the other side of a value)."""
    short = f"{x:g}"
    return short if float(short) == x else repr(float(x))


def bin_span(lo: float, hi: float, closed: bool) -> str:
    """A bin as printed: ``[lo, hi)``, or ``[lo, hi]`` when ``closed``."""
    return f"[{_number(lo)}, {_number(hi)}{']' if closed else ')'}"


def check_bins(
    values: np.ndarray,
    edges: Sequence[float],
    key: str,
    name: str,
    width: float | None = None,
) -> np.ndarray:
    """:func:`bin_index` of ``values``. A bin without windows stays a bin (shown with 0
    windows and no accuracy); no window in any bin is a ConfigError naming ``name``."""
    idx = bin_index(values, edges, width)
    if not bool((idx >= 0).any()):
        raise ConfigError(
            f"{name}: no window's {key} lies in the bins {bin_span(edges[0], edges[-1], True)} "
            f"(values span {_number(float(values.min()))} to {_number(float(values.max()))}); "
            "choose other bins"
        )
    return idx


def bin_windows(
    labelled: LabelledSet,
    key: str,
    bins: float | list[float],
    names: tuple[str, str] = ("by", "bins"),
) -> tuple[list[float], np.ndarray, float | None]:
    """``(edges, bin of each window, width or None)`` of annotation field ``key`` cut by
    ``bins`` (a width or edges), every refusal a ConfigError naming ``names`` (the option or
    config key of the field, and of the bins): what ``iqtrain probe --by`` and ``[probe] by``
    share."""
    values = labelled.numeric(key, name=names[0])
    edges = bin_edges(values, bins, names[1])
    width = None if isinstance(bins, list) else float(bins)
    return edges, check_bins(values, edges, key, names[1], width), width


def accuracy_by(
    key: str,
    edges: Sequence[float],
    idx: np.ndarray,
    width: float | None,
    labels: np.ndarray,
    groups: np.ndarray,
    scores: dict[str, ProbeScore],
) -> dict[str, Any]:
    """``{"key", "width", "outside", "bins": [{"lo", "hi", "windows", <name>, <name>_se, ...}]}``
    from the held-out predictions of each score (its pooled cross-validation). A bin without
    windows has ``windows`` 0 and None for every accuracy and standard error; ``width`` is
    None for explicit edges (whose last bin is closed)."""
    rows = []
    for k in range(len(edges) - 1):
        inside = idx == k
        row: dict[str, Any] = {
            "lo": float(edges[k]),
            "hi": float(edges[k + 1]),
            "windows": int(inside.sum()),
        }
        for name, sc in scores.items():
            assert sc.predicted is not None
            correct = sc.predicted[inside] == labels[inside]
            row[name] = float(correct.mean()) if correct.size else None
            row[f"{name}_se"] = cluster_se(correct, groups[inside])
        rows.append(row)
    return {"key": key, "width": width, "outside": int((idx < 0).sum()), "bins": rows}

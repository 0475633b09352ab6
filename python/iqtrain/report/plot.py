"""``iqtrain report ATTEMPT --plot out.png``: the training curves of an attempt in one figure.

Panels, sharing the step axis: loss (train raw and smoothed, validation, both baselines of the
first validation record, spikes; log scale, SNR in dB on the right), learning rate, gradient norm
(log scale, clipped steps and the clip threshold), and probe accuracy when the stream has
``probe`` records (with accuracy against the ``probe.by`` field and against K labelled
annotations per class when the last such record has them). A resumed attempt's stream already
holds its whole lineage (each child starts with its parent's records up to the checkpoint it
resumed from); every resume point of that lineage is a dashed vertical line labelled
``resumed from attempt N``. A labelled objective's attempt (a classifier: validation records
with ``accuracy``) has a cross-entropy loss panel (train and validation loss, no baselines or SNR)
and below it a validation accuracy panel: accuracy with its best point (the first of the
highest), each class's accuracy as a faint line, and the majority-class baseline.

matplotlib is an optional extra (``pip install 'iqtrain[plot]'``), imported only when a figure is
built, and drawn with the Agg canvas (no display, no pyplot state). This module imports no torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iqtrain.errors import ConfigError
from iqtrain.objectives import Objective
from iqtrain.report.summary import (
    AttemptView,
    Lineage,
    best_of,
    load_attempt,
    number,
    resume_points,
)
from iqtrain.storage import check_output_file, creatable_dir

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["build_figure", "check_plot_target", "ema", "smoothing_span", "write_plot"]

PLOT_EXTRA = "--plot needs matplotlib: pip install 'iqtrain[plot]'"
TRAIN, VAL, RAW, SPIKE, CLIP, RESUME = "C0", "C1", "#9ecae1", "C3", "C3", "0.35"


def _matplotlib() -> None:
    """Import matplotlib, or one ConfigError saying how to install it."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "matplotlib":
            raise ConfigError(PLOT_EXTRA) from None
        raise ConfigError(f"{PLOT_EXTRA} (it is installed, but {exc})") from None
    except ImportError as exc:  # installed but broken (a missing shared library, …)
        raise ConfigError(f"{PLOT_EXTRA} (it is installed, but {exc})") from None


def smoothing_span(n: int) -> int:
    """The EMA span for ``n`` train records: about 1/40 of the run, 1 to 200 steps."""
    return max(1, min(200, round(n / 40)))


def ema(values: list[float], span: int) -> list[float]:
    """Exponential moving average with ``alpha = 2 / (span + 1)``, bias-corrected at the start
    (as TensorBoard's smoothing), so the first value is the first sample, not a pull to zero."""
    alpha, acc, weight, out = 2.0 / (span + 1), 0.0, 0.0, []
    for v in values:
        acc = (1 - alpha) * acc + alpha * v
        weight = (1 - alpha) * weight + alpha
        out.append(acc / weight)
    return out


def _series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the records whose step and ``key`` are finite numbers."""
    steps, values = [], []
    for r in records:
        step, value = number(r, "step"), number(r, key)
        if step is not None and value is not None:
            steps.append(step)
            values.append(value)
    return steps, values


def _grad_clip(attempt: Path) -> float | None:
    """``optimizer.grad_clip`` of the attempt's resolved config, if it clips."""
    try:
        with open(attempt / "config.toml", "rb") as f:
            optimizer = tomllib.load(f).get("optimizer")
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return None
    clip = number(optimizer, "grad_clip") if isinstance(optimizer, dict) else None
    return clip if clip is not None and clip > 0 else None


def _train_loss(ax: Axes, train: list[dict[str, Any]]) -> bool:
    """Raw and smoothed train loss and the spikes; False if there is no train loss."""
    steps, loss = _series(train, "loss")
    if not steps:
        return False
    span = smoothing_span(len(loss))
    ax.plot(steps, loss, color=RAW, lw=0.7, alpha=0.6, label="train loss (raw)")
    if span > 1:
        label = f"train loss (EMA, span {span} steps)"
        ax.plot(steps, ema(loss, span), color=TRAIN, lw=1.6, label=label)
    s_steps, s_loss = _series([r for r in train if r.get("spike") is True], "loss")
    if s_steps:
        label = f"spike ({len(s_steps)}: loss > 3x running mean)"
        ax.plot(s_steps, s_loss, ls="none", marker="v", ms=6, color=SPIKE, label=label)
    return True


def _val_loss(ax: Axes, val: list[dict[str, Any]], objective: Objective) -> bool:
    """Validation loss and its best point, then the first validation's baselines; False if
    there is no validation loss. (An objective that monitors another field: the loss alone.)"""
    steps, loss = _series(val, "loss")
    if steps:
        ax.plot(steps, loss, color=VAL, marker="o", ms=3.5, lw=1.4, label="val loss")
    if steps and objective.monitor != "loss":
        return True
    best_record = best_of(objective, val)
    b_step, b_loss = number(best_record or {}, "step"), number(best_record or {}, "loss")
    if b_step is not None and b_loss is not None:
        best: dict[str, Any] = dict(ls="none", marker="*", ms=12, color=VAL, mec="k", mew=0.6)
        ax.plot([b_step], [b_loss], label=f"best val {b_loss:.4g} (step {b_step:.0f})", **best)
    if _objective_loss_differs(val):  # the predicted mean's NMSE, beside the baselines
        n_steps, nmse = _series(val, "nmse")
        ax.plot(n_steps, nmse, color=VAL, ls="--", marker=".", lw=1.0, label="val NMSE of mean")
    base = next((r for r in val if "baseline_zero_loss" in r), {})
    for key, name, style in (
        ("baseline_zero_loss", "zero-prediction baseline", ":"),
        ("baseline_copy_last_loss", "copy-last-patch baseline", "-."),
    ):
        value = number(base, key)
        if value is not None and value > 0:
            ax.axhline(value, color="0.25", ls=style, lw=1.1, label=f"{name} {value:.4g}")
    return bool(steps)


def _objective_loss_differs(val: list[dict[str, Any]]) -> bool:
    """Whether the validation records' loss is another objective's than the NMSE (then the
    right axis and the baselines belong to the ``nmse`` series)."""
    return any(number(r, "nmse") not in (None, number(r, "loss")) for r in val)


def _loss_panel(ax: Axes, view: AttemptView) -> None:
    drawn = _train_loss(ax, view.records("train"))
    drawn = _val_loss(ax, view.records("val"), view.objective) or drawn
    if not drawn:
        ax.text(0.5, 0.5, "no loss records", ha="center", va="center", transform=ax.transAxes)
        return
    _plain_log(ax)
    ax.legend(loc="upper right", fontsize=8, framealpha=0.85)


def _accuracy_panel(ax: Axes, val: list[dict[str, Any]], objective: Objective) -> None:
    """A labelled objective's validation accuracy: the accuracy with its best point (the first
    of the highest: the best checkpoint's), each class's accuracy as a faint line (a class
    without validation windows has none), and the first validation's majority-class
    baseline."""
    steps, acc = _series(val, "accuracy")
    per_class = [r["class_accuracy"] for r in val if isinstance(r.get("class_accuracy"), dict)]
    names = list(dict.fromkeys(name for per in per_class for name in per))
    drawn = 0
    for name in names:
        rows = [
            (step, value)
            for r in val
            if (step := number(r, "step")) is not None
            and isinstance(r.get("class_accuracy"), dict)
            and (value := number(r["class_accuracy"], name)) is not None
        ]
        if not rows:
            continue
        label = f"per-class accuracy ({len(names)} classes)" if not drawn else f"_{name}"
        c_steps, values = zip(*rows, strict=True)
        faint: dict[str, Any] = dict(color="0.5", lw=0.8, alpha=0.35, gid="class_accuracy")
        ax.plot(c_steps, values, label=label, **faint)
        drawn += 1
    if steps:
        ax.plot(steps, acc, color=VAL, marker="o", ms=3.5, lw=1.4, label="val accuracy")
        best = best_of(objective, val) or {}
        b_step, b_acc = number(best, "step"), number(best, "accuracy")
        if b_step is not None and b_acc is not None:
            star: dict[str, Any] = dict(ls="none", marker="*", ms=12, color=VAL, mec="k", mew=0.6)
            ax.plot([b_step], [b_acc], label=f"best val {b_acc:.4f} (step {b_step:.0f})", **star)
    base = next((r for r in val if "baseline_majority_accuracy" in r), {})
    majority = number(base, "baseline_majority_accuracy")
    if majority is not None:
        ax.axhline(majority, color="0.25", ls=":", lw=1.1, label=f"majority class {majority:.4f}")
    if not steps and not drawn and majority is None:
        ax.text(
            0.5, 0.5, "no validation accuracy", ha="center", va="center", transform=ax.transAxes
        )
        return
    ax.set_ylim(0, 1.02)
    ax.legend(loc="best", fontsize=8, framealpha=0.85)


def _plain_log(ax: Axes) -> None:
    """A log y axis labelled 0.6, 1, 2 rather than 6x10^-1 (the ticks matplotlib picks)."""
    from matplotlib.ticker import LogFormatter

    class Plain(LogFormatter):
        def __call__(self, x, pos=None):
            return f"{x:.3g}" if super().__call__(x, pos) else ""

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(Plain(base=10))
    ax.yaxis.set_minor_formatter(Plain(base=10, labelOnlyBase=False))


def _snr_axis(ax: Axes) -> None:
    """The loss panel's right axis: the same limits as prediction SNR, ``-10 log10 loss`` dB
    (linear in dB because the loss axis is logarithmic)."""
    lo, hi = ax.get_ylim()
    if ax.get_yscale() != "log" or lo <= 0:
        return
    twin = ax.twinx()
    twin.set_label("snr_db")
    twin.set_ylim(-10 * math.log10(lo), -10 * math.log10(hi))
    twin.set_ylabel("prediction SNR (dB)")


def _lr_panel(ax: Axes, view: AttemptView) -> None:
    steps, lr = _series(view.records("train"), "lr")
    ax.plot(steps, lr, color="C2", lw=1.2)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))


def _grad_panel(ax: Axes, view: AttemptView) -> None:
    train = view.records("train")
    steps, norm = _series(train, "grad_norm")
    ax.plot(steps, norm, color="C4", lw=0.8)
    clipped = [r for r in train if r.get("clipped") is True]
    c_steps, _ = _series(clipped, "grad_norm")
    if c_steps:  # a rug along the bottom: readable even when every step clips
        ax.plot(
            c_steps,
            [0.02] * len(c_steps),
            ls="none",
            marker="|",
            ms=7,
            color=CLIP,
            transform=ax.get_xaxis_transform(),
            label=f"clipped ({len(c_steps)} of {len(steps)} steps)",
        )
    clip = _grad_clip(view.path)
    if clip is not None and norm:
        ax.axhline(clip, color="0.25", ls="--", lw=0.9, label=f"clip threshold {clip:g}")
    if any(v > 0 for v in norm):
        _plain_log(ax)
    if c_steps or (clip is not None and norm):
        ax.legend(loc="upper right", fontsize=8, framealpha=0.85)


def _probe_panel(ax: Axes, probes: list[dict[str, Any]]) -> None:
    shown = []
    # (metric key, legend label, line style)
    series: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("accuracy", "probe accuracy", dict(color="C5", marker="o", ms=4, lw=1.4)),
        (
            "random_init_accuracy",
            "random-init model",
            dict(color="0.45", marker="s", ms=3, ls="--", lw=1),
        ),
        (
            "classical_accuracy",
            "classical features",
            dict(color="C1", marker="^", ms=3, ls="-.", lw=1),
        ),
        (
            "combined_accuracy",
            "classical + pretrained",
            dict(color="C2", marker="d", ms=3, ls="-", lw=1),
        ),
        ("chance", "chance", dict(color="0.25", ls=":", lw=1.1)),
    )
    for key, name, style in series:
        steps, values = _series(probes, key)
        if steps and key in ("chance", "classical_accuracy") and len(set(values)) == 1:
            # One probe set, one majority-class rate: a line across, even for a single probe.
            ax.axhline(values[0], label=name, **style)
            shown += values
        elif steps:
            ax.plot(steps, values, label=name, **style)
            shown += values
    _se_band(ax, probes)
    if shown and all(0 <= v <= 1 for v in shown):
        ax.set_ylim(0, 1.02)
    if shown:  # "best": the last probe sits at the right edge, where "lower right" hid it
        ax.legend(loc="best", fontsize=8, framealpha=0.85)


def _se_band(ax: Axes, probes: list[dict[str, Any]]) -> None:
    """The probe accuracy ± its standard error over annotations, shaded (records that have
    ``accuracy_se``; older attempts have none)."""
    rows = [
        (number(r, "step"), number(r, "accuracy"), number(r, "accuracy_se"))
        for r in probes
        if None not in (number(r, "step"), number(r, "accuracy"), number(r, "accuracy_se"))
    ]
    if rows:
        steps, acc, se = (list(v) for v in zip(*rows, strict=True))
        lo = [a - e for a, e in zip(acc, se, strict=True)]
        hi = [a + e for a, e in zip(acc, se, strict=True)]
        label = "± its standard error over annotations"
        ax.fill_between(steps, lo, hi, color="C5", alpha=0.2, lw=0, gid="probe_se", label=label)
        if len(rows) == 1:  # a band over one step has no width: a bar shows it
            ax.errorbar(steps, acc, yerr=se, color="C5", capsize=3, lw=1.2, gid="probe_se_bar")


#: The models of a probe's ``by`` bins and ``shots``: (key, legend label, line style).
MODELS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("pretrained", "pretrained", dict(color="C5", marker="o", ms=4, lw=1.4)),
    ("random_init", "random-init model", dict(color="0.45", marker="s", ms=3, ls="--")),
    ("classical", "classical features", dict(color="C1", marker="^", ms=3, ls="-.")),
    ("combined", "classical + pretrained", dict(color="C2", marker="d", ms=3, ls="-")),
)


def _by_panel(ax: Axes, record: dict[str, Any]) -> None:
    """Accuracy against the ``probe.by`` field (SNR) at the last probe that has it: the
    field's way of reporting modulation classification, one point per bin at its centre, a
    gap for a bin without windows, error bars of one standard error over annotations."""
    by = record["by"]
    bins = [b for b in by.get("bins", []) if isinstance(b, dict)]
    centres = [(number(b, "lo") or 0.0) / 2 + (number(b, "hi") or 0.0) / 2 for b in bins]
    for key, name, style in MODELS:
        values = [number(b, key) for b in bins]
        if any(v is not None for v in values):
            y = [math.nan if v is None else v for v in values]
            ax.plot(centres, y, label=name, **style)
            se = [number(b, f"{key}_se") for b in bins]
            if any(e is not None for e in se):
                err = [math.nan if e is None else e for e in se]
                ax.errorbar(centres, y, yerr=err, fmt="none", ecolor=style["color"], alpha=0.6)
    chance = number(record, "chance")
    if chance is not None:
        ax.axhline(chance, color="0.25", ls=":", lw=1.1, label="chance")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(f"{by.get('key', '?')} (probe at step {record.get('step', '?')})")
    ax.legend(loc="lower right", fontsize=8, framealpha=0.85)


def _shots_panel(ax: Axes, record: dict[str, Any]) -> None:
    """Accuracy against K labelled annotations per class at the last probe that has
    ``shots``: the mean over the draws with the draws' standard deviation as error bars."""
    entries = [e for e in record["shots"] if isinstance(e, dict) and number(e, "k") is not None]
    ks = [number(e, "k") or 0.0 for e in entries]
    for key, name, style in MODELS:
        scores = [e[key] if isinstance(e.get(key), dict) else {} for e in entries]
        means = [number(sc, "mean") for sc in scores]
        if not any(m is not None for m in means):
            continue
        stds = [number(sc, "std") for sc in scores]
        y = [math.nan if m is None else m for m in means]
        ax.plot(ks, y, label=name, **style)
        if any(v is not None for v in stds):
            err = [math.nan if v is None else v for v in stds]
            ax.errorbar(ks, y, yerr=err, fmt="none", ecolor=style["color"], capsize=3, alpha=0.7)
    chance = number(record, "chance")
    if chance is not None:
        ax.axhline(chance, color="0.25", ls=":", lw=1.1, label="chance")
    if ks and min(ks) > 0:
        ax.set_xscale("log")
        ax.set_xticks(ks, [f"{k:g}" for k in ks])
        ax.minorticks_off()
    ax.set_ylim(0, 1.02)
    seeds = entries[0].get("seeds", "?") if entries else "?"
    ax.set_xlabel(
        f"K labelled annotations per class (probe at step {record.get('step', '?')}; mean and "
        f"std of {seeds} draw{'' if seeds == 1 else 's'} per K)"
    )
    ax.legend(loc="lower right", fontsize=8, framealpha=0.85)


def _mark_resumes(axes: list[Axes], lineage: Lineage) -> None:
    for point in lineage.points:
        if point.step is None:
            continue
        for ax in axes:
            ax.axvline(point.step, color=RESUME, ls="--", lw=1.0, gid="resume")
        top = axes[0]
        top.text(
            point.step,
            0.98,
            f" resumed from attempt {point.parent_id} ",
            transform=top.get_xaxis_transform(),
            rotation=90,
            ha="right",
            va="top",
            fontsize=8,
            color=RESUME,
            gid="resume",
            bbox={"fc": "white", "ec": "none", "alpha": 0.75, "pad": 1},
        )


def _title(view: AttemptView) -> str:
    info = view.info
    run_dir = info.get("run_dir")
    run = Path(run_dir).name if isinstance(run_dir, str) else view.path.resolve().parent.parent.name
    device = info.get("device")
    device = device if isinstance(device, dict) else {}
    parts = [str(device[k]) for k in ("name", "precision") if device.get(k)]
    return f"{run} / attempt {info['id']} ({view.status})" + (
        f" — {', '.join(parts)}" if parts else ""
    )


def build_figure(attempt: Path) -> Figure:
    """The figure of attempt directory ``attempt`` (not saved; see :func:`write_plot`).

    Axes, top to bottom, each with its ``get_label()``: ``loss``, ``val_accuracy`` (only for
    a labelled objective's attempt), ``lr``, ``grad_norm`` and,
    only when the stream has probe records, ``probe``, then ``probe_by`` (a probe record with
    ``by``) and ``probe_shots`` (a probe record with ``shots``). ``ConfigError`` without
    matplotlib; ``CheckpointError`` if ``attempt`` is not an attempt directory.
    """
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    view = load_attempt(attempt)
    lineage = resume_points(view.path, view.info)
    probes = view.records("probe")
    extra = [
        (name, record, draw)
        for name, key, draw in (
            ("probe_by", "by", _by_panel),
            ("probe_shots", "shots", _shots_panel),
        )
        for record in [_last_with(probes, key)]
        if record is not None
    ]
    objective = view.objective
    labelled = objective.labelled
    names = ["loss", *(["val_accuracy"] if labelled else []), "lr", "grad_norm"]
    names += ["probe"] if probes else []
    ratios = [3.0, *([2.2] if labelled else []), 1.1, 1.3] + ([1.4] if probes else [])
    ratios += [1.6] * len(extra)
    fig = Figure(figsize=(11, 2.0 + 1.9 * sum(ratios)), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    every = fig.subplots(len(ratios), 1, gridspec_kw={"height_ratios": ratios})
    axes = list(every[: len(names)])  # the panels over steps share their x axis
    for ax in axes[1:]:
        ax.sharex(axes[0])
    ylabels = {
        "loss": "loss (NMSE)",
        "val_accuracy": "val accuracy",
        "lr": "learning rate",
        "grad_norm": "grad norm",
        "probe": "probe accuracy",
    }
    if labelled:  # a cross-entropy in nats: no NMSE, no SNR axis
        ylabels["loss"] = "loss (cross-entropy, nats)"
    elif _objective_loss_differs(view.records("val")):
        ylabels["loss"] = "loss (objective; NMSE dashed)"
    panel = dict(zip(names, axes, strict=True))
    for name, ax in panel.items():
        ax.set_label(name)
        ax.set_ylabel(ylabels[name])
        ax.grid(True, which="major", alpha=0.3)
    _loss_panel(panel["loss"], view)
    if labelled:
        _accuracy_panel(panel["val_accuracy"], view.records("val"), objective)
    else:
        _snr_axis(panel["loss"])
    _lr_panel(panel["lr"], view)
    _grad_panel(panel["grad_norm"], view)
    if probes:
        _probe_panel(panel["probe"], probes)
    _mark_resumes(axes, lineage)
    axes[-1].set_xlabel("step")
    for ax, (name, record, draw) in zip(every[len(names) :], extra, strict=True):
        ax.set_label(name)
        ax.set_ylabel("probe accuracy")
        ax.grid(True, which="major", alpha=0.3)
        draw(ax, record)
    fig.suptitle(_title(view), fontsize=12)
    notes = list(lineage.notes)
    if view.stream is not None and view.stream.torn:
        notes.append(f"the stream ends in a torn record ({view.stream.torn_bytes} bytes, ignored)")
    if notes:
        fig.text(0.01, 0.002, "note: " + "; ".join(notes), fontsize=7, va="bottom", wrap=True)
    return fig


def _last_with(probes: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The last probe record whose ``key`` is what its panel reads (``by``: an object,
    ``shots``: a non-empty list)."""
    kind = dict if key == "by" else list
    return next((r for r in reversed(probes) if isinstance(r.get(key), kind) and r[key]), None)


def check_plot_target(out: Path, force: bool = False) -> str:
    """The image format of ``--plot out`` (from its suffix, PNG without one), once everything
    about writing it is known to be possible: matplotlib is there, ``out`` names a file (not
    ``/``, ``.`` or a directory) in a directory that exists and is writable, outside any
    attempt directory, not a symbolic link, FIFO or device, not an existing file unless
    ``force`` (``embed --out``'s rules: :func:`~iqtrain.storage.check_output_file`), and the
    format is one matplotlib writes. ``ConfigError`` naming ``out`` otherwise; nothing is
    written."""
    out = Path(out)
    _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if out.name in ("", ".", "..") or out.is_dir():  # "/", ".", "": a directory, not an image
        raise ConfigError(f"--plot {out}: cannot write: Is a directory (name an image file)")
    if not out.parent.is_dir():
        raise ConfigError(f"--plot {out}: cannot write: No such file or directory")
    check_output_file(out, force, "--plot", "report --plot")
    why = creatable_dir(out.parent)
    if why is not None:
        raise ConfigError(f"--plot {out}: cannot write: {why}")
    fmt = out.suffix[1:].lower() or "png"
    formats = FigureCanvasAgg.get_supported_filetypes()
    if fmt not in formats:
        raise ConfigError(
            f"--plot {out}: unknown image format {fmt!r} (use one of {', '.join(sorted(formats))})"
        )
    return fmt


def write_plot(attempt: Path, out: Path, force: bool = False) -> Path:
    """Draw :func:`build_figure` into ``out`` (checked first: :func:`check_plot_target`;
    ``force`` replaces an existing file), written to a temporary file next to it and renamed;
    ``ConfigError`` naming ``out`` if it cannot be written."""
    out = Path(out)
    fmt = check_plot_target(out, force)
    from matplotlib import rc_context

    fig = build_figure(attempt)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        # Long runs draw long paths: Agg renders them in chunks instead of overflowing.
        with open(tmp, "wb") as f, rc_context({"agg.path.chunksize": 20000}):
            fig.savefig(f, format=fmt)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"--plot {out}: cannot write: {exc.strerror or exc}") from None
    return out

"""``iqtrain report --plot``: the figure's panels and lines, the PNG on disk, the errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import RECORDS, train_record, val_record, write_attempt, write_lineage

from iqtrain.cli.main import main
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.report.plot import build_figure, ema, smoothing_span, write_plot

BASELINES = {"baseline_zero_loss": 1.0, "baseline_copy_last_loss": 1.5}
LONG = [
    *(train_record(s, spike=s in (30, 70), clipped=s % 10 == 0) for s in range(1, 101)),
    *(val_record(s, 1.0 / s, True, **(BASELINES if s == 20 else {})) for s in range(20, 101, 20)),
]
LONG.sort(key=lambda r: (r["step"], r["kind"] == "val"))  # as written: val after its train step
PROBES = [
    {"kind": "probe", "step": 50, "accuracy": 0.5, "random_init_accuracy": 0.3, "chance": 0.25},
    {"kind": "probe", "step": 100, "accuracy": 0.7, "random_init_accuracy": 0.3, "chance": 0.25},
]


def _panels(fig):
    return {ax.get_label(): ax for ax in fig.axes}


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def _find(lines, prefix):
    hits = [line for label, line in lines.items() if label.startswith(prefix)]
    assert len(hits) == 1, (prefix, sorted(lines))
    return hits[0]


def test_the_figure_has_loss_lr_and_grad_panels(tmp_path):
    att = write_attempt(tmp_path / "run", records=LONG)
    fig = build_figure(att)
    panels = _panels(fig)
    assert list(panels) == ["loss", "lr", "grad_norm", "snr_db"]  # snr_db: the loss panel's twin
    loss, lr, grad = panels["loss"], panels["lr"], panels["grad_norm"]
    assert loss.get_yscale() == "log" and grad.get_yscale() == "log"
    assert loss.get_ylabel() == "loss (NMSE)" and panels["snr_db"].get_ylabel().endswith("(dB)")
    assert (lr.get_ylabel(), grad.get_ylabel(), grad.get_xlabel()) == (
        "learning rate",
        "grad norm",
        "step",
    )
    lines = _lines(loss)
    raw = _find(lines, "train loss (raw)")
    assert list(raw.get_xdata()) == list(range(1, 101)) and raw.get_ydata()[1] == 0.5
    smooth = _find(lines, "train loss (EMA, span 2 steps)")  # 100 steps: 1/40 of the run
    assert smooth.get_ydata()[0] == 1.0 and len(smooth.get_xdata()) == 100
    assert list(_find(lines, "val loss").get_xdata()) == [20, 40, 60, 80, 100]
    assert list(_find(lines, "zero-prediction baseline 1").get_ydata()) == [1.0, 1.0]
    assert list(_find(lines, "copy-last-patch baseline 1.5").get_ydata()) == [1.5, 1.5]
    assert list(_find(lines, "best val 0.01").get_xdata()) == [100]
    assert list(_find(lines, "spike (2:").get_xdata()) == [30, 70]
    assert list(_find(_lines(grad), "clipped (10 of 100 steps)").get_xdata()) == list(
        range(10, 101, 10)
    )
    assert list(_find(_lines(lr), "_").get_ydata()) == [1e-3] * 100  # unlabelled
    assert fig.get_suptitle() == "run / attempt 0001 (completed) \u2014 test-cpu, fp32"
    assert not [t for t in fig.texts if t.get_text().startswith("note")]


def test_no_spike_markers_without_spikes_and_a_probe_panel_only_with_probes(tmp_path):
    fig = build_figure(write_attempt(tmp_path / "a", records=RECORDS))
    assert "probe" not in _panels(fig)
    assert not [k for k in _lines(_panels(fig)["loss"]) if k.startswith("spike")]
    fig = build_figure(write_attempt(tmp_path / "b", records=[*LONG, *PROBES]))
    probe = _panels(fig)["probe"]
    assert fig.axes.index(probe) == 3 and probe.get_ylabel() == "probe accuracy"
    lines = _lines(probe)
    assert list(lines["probe accuracy"].get_ydata()) == [0.5, 0.7]
    assert list(lines["random-init model"].get_xdata()) == [50, 100]
    assert list(lines["chance"].get_ydata()) == [0.25, 0.25]  # a horizontal line across
    assert probe.get_ylim() == (0, 1.02)
    # Only what is there: accuracy alone draws one line.
    one = {"kind": "probe", "step": 3, "accuracy": 0.9}
    fig = build_figure(write_attempt(tmp_path / "c", records=[*RECORDS, one]))
    assert list(_lines(_panels(fig)["probe"])) == ["probe accuracy"]


def test_every_resume_point_of_the_lineage_is_marked(tmp_path):
    atts = write_lineage(tmp_path / "run", steps=(30, 70), records=LONG)
    fig = build_figure(atts[-1])
    panels = [ax for ax in fig.axes if ax.get_label() in ("loss", "lr", "grad_norm")]
    for ax in panels:
        marks = [line for line in ax.get_lines() if line.get_gid() == "resume"]
        assert [list(line.get_xdata()) for line in marks] == [[30, 30], [70, 70]]
    labels = [t.get_text().strip() for t in panels[0].texts if t.get_gid() == "resume"]
    assert labels == ["resumed from attempt 0001", "resumed from attempt 0002"]
    assert "attempt 0003" in fig.get_suptitle()
    assert not [t for t in build_figure(atts[0]).axes[0].texts if t.get_gid() == "resume"]


def test_a_lost_ancestor_and_a_torn_tail_are_notes_on_the_figure(tmp_path):
    atts = write_lineage(tmp_path / "run", steps=(30, 70), records=LONG)
    (atts[0] / "attempt.json").unlink()
    with (atts[2] / "metrics.jsonl").open("ab") as f:
        f.write(b'{"kind": "tr')
    fig = build_figure(atts[2])
    (note,) = [t.get_text() for t in fig.texts if t.get_text().startswith("note")]
    assert str(atts[0] / "attempt.json") in note and "torn record (12 bytes" in note
    marks = [t.get_text().strip() for t in fig.axes[0].texts if t.get_gid() == "resume"]
    assert marks == ["resumed from attempt 0001", "resumed from attempt 0002"]


def test_an_attempt_without_records_still_draws(tmp_path):
    att = write_attempt(tmp_path / "run", status="running", records=[])
    fig = build_figure(att)
    assert "(crashed)" in fig.get_suptitle()
    assert [t.get_text() for t in fig.axes[0].texts] == ["no loss records"]
    (att / "metrics.jsonl").unlink()
    write_plot(att, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


def test_the_png_is_a_real_image(tmp_path):
    from matplotlib.image import imread

    out = write_plot(write_attempt(tmp_path / "run", records=[*LONG, *PROBES]), tmp_path / "p.png")
    assert out == tmp_path / "p.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(out)
    assert pixels.shape[1] == 1210 and 1400 < pixels.shape[0] < 2000  # 11 in at 110 dpi
    assert pixels.std() > 0.05  # not a blank canvas
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.png", "run"]  # no temporary left
    svg = write_plot(tmp_path / "run" / "attempts" / "0001", tmp_path / "p.svg")
    assert svg.read_text().lstrip().startswith("<?xml")


@pytest.mark.parametrize(
    ("target", "expect"),
    [
        ("missing/p.png", "missing/p.png: cannot write: No such file or directory"),
        ("adir", "adir: cannot write: Is a directory"),
        ("p.docx", "p.docx: unknown image format 'docx' (use one of"),
    ],
)
def test_an_unwritable_output_is_one_config_error(tmp_path, target, expect):
    att = write_attempt(tmp_path / "run")
    (tmp_path / "adir").mkdir()
    with pytest.raises(ConfigError) as info:
        write_plot(att, tmp_path / target)
    message = str(info.value)
    assert message.startswith("--plot ") and expect in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "run"]


@pytest.mark.parametrize("target", ["/", ".", ""])
def test_a_directory_for_a_plot_is_one_line_exit_2(tmp_path, target, capsys):
    att = write_attempt(tmp_path / "run")
    assert main(["report", str(att), "--plot", target]) == 2
    err = capsys.readouterr().err
    assert err.startswith("iqtrain: error: --plot ") and "Is a directory" in err
    assert err.count("\n") == 1


def test_every_output_is_checked_before_any_is_written(tmp_path, capsys):
    # The plot could be written, the TensorBoard export cannot: neither is.
    att = write_attempt(tmp_path / "run")
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    args = ["report", str(att), "--plot", str(tmp_path / "p.png"), "--tensorboard", str(blocked)]
    assert main(args) == 2
    assert "--tensorboard" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_a_directory_that_is_not_an_attempt_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="no attempt.json"):
        write_plot(tmp_path, tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def test_without_matplotlib_the_command_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    att = write_attempt(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    with pytest.raises(ConfigError) as info:
        build_figure(att)
    assert str(info.value) == "--plot needs matplotlib: pip install 'iqtrain[plot]'"
    assert main(["report", str(att), "--plot", str(tmp_path / "p.png")]) == 2
    out, err = capsys.readouterr()
    assert err == "iqtrain: error: --plot needs matplotlib: pip install 'iqtrain[plot]'\n"
    assert out == "" and not (tmp_path / "p.png").exists()


def test_the_command_writes_the_plot_and_imports_no_torch(tmp_path):
    att = write_attempt(tmp_path / "run", records=LONG)
    script = textwrap.dedent(
        """
        import sys
        from iqtrain.cli.main import main
        rc = main(sys.argv[1:])
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "torch")
        assert not loaded, loaded
        sys.exit(rc)
        """
    )
    out = tmp_path / "p.png"
    args = ["report", att, "--plot", out, "--tensorboard", tmp_path / "tb"]
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(f"attempt {att} (completed)")
    assert f"plot: {out}" in proc.stdout and out.read_bytes()[:4] == b"\x89PNG"


def test_ema_is_bias_corrected():
    assert ema([2.0, 2.0, 2.0], 10) == [2.0, 2.0, 2.0]
    assert ema([1.0, 3.0], 1) == [1.0, 3.0]  # span 1: no smoothing
    smooth = ema([0.0] * 5 + [10.0] * 50, 5)
    assert smooth[0] == 0.0 and 0 < smooth[5] < 10 and abs(smooth[-1] - 10) < 1e-6
    assert [smoothing_span(n) for n in (1, 40, 100, 4000, 10**6)] == [1, 1, 2, 100, 200]


# ------------------------------------------------------------------------ a real lineage


@pytest.mark.usefixtures("one_torch_thread")
def test_a_real_resumed_attempt(tmp_path):
    from helpers import tiny_tables

    from iqtrain.config.schema import build_config
    from iqtrain.evidence.lineage import ParentRef
    from iqtrain.train.attempt import run_attempt

    tables = tiny_tables(tmp_path / "run", tmp_path / "cache", checkpoint_every=3, keep_last=0)
    cfg = build_config(tables)
    first = run_attempt(cfg).attempt
    child = run_attempt(cfg, ParentRef(first, "step_00000006")).attempt
    fig = build_figure(child)
    loss = fig.axes[0]
    assert list(_find(_lines(loss), "train loss (raw)").get_xdata()) == list(range(1, 13))
    assert list(_find(_lines(loss), "val loss").get_xdata()) == [4, 8, 12]
    assert [line.get_xdata()[0] for line in loss.get_lines() if line.get_gid() == "resume"] == [6]
    assert [t.get_text().strip() for t in loss.texts] == [f"resumed from attempt {first.name}"]
    assert _find(_lines(loss), "zero-prediction baseline")
    assert _find(_lines(_panels(fig)["grad_norm"]), "clip threshold 1")
    assert write_plot(child, tmp_path / "real.png").read_bytes()[:4] == b"\x89PNG"


def test_probe_records_by_snr_draw_accuracy_against_snr_with_the_classical_baseline(tmp_path):
    bins = [
        {
            "lo": -10.0,
            "hi": 0.0,
            "windows": 5,
            "pretrained": 0.3,
            "random_init": 0.2,
            "classical": 0.25,
        },
        {
            "lo": 0.0,
            "hi": 10.0,
            "windows": 5,
            "pretrained": 0.6,
            "random_init": 0.3,
            "classical": 0.5,
        },
        {
            "lo": 10.0,
            "hi": 20.0,
            "windows": 5,
            "pretrained": 0.9,
            "random_init": 0.4,
            "classical": 0.7,
        },
    ]
    probes = [
        {**PROBES[0], "classical_accuracy": 0.45},
        {
            **PROBES[1],
            "classical_accuracy": 0.45,
            "by": {"key": "iqtrain:snr_db", "outside": 0, "bins": bins},
        },
    ]
    fig = build_figure(write_attempt(tmp_path / "a", records=[*LONG, *probes]))
    panels = _panels(fig)
    assert list(_lines(panels["probe"])["classical features"].get_ydata()) == [0.45, 0.45]
    by = panels["probe_by"]
    assert by.get_xlabel() == "iqtrain:snr_db (probe at step 100)"
    lines = _lines(by)
    assert list(lines["pretrained"].get_xdata()) == [-5.0, 5.0, 15.0]
    assert list(lines["pretrained"].get_ydata()) == [0.3, 0.6, 0.9]
    assert list(lines["classical features"].get_ydata()) == [0.25, 0.5, 0.7]
    assert list(lines["chance"].get_ydata()) == [0.25, 0.25]
    # the step panels share x; the SNR panel has its own
    assert panels["lr"].get_shared_x_axes().joined(panels["loss"], panels["probe"])
    assert not panels["loss"].get_shared_x_axes().joined(panels["loss"], by)
    # without "by" in any probe record: no SNR panel
    fig = build_figure(write_attempt(tmp_path / "b", records=[*LONG, *PROBES]))
    assert "probe_by" not in _panels(fig)


def test_a_categorical_attempt_draws_its_nmse_beside_the_baselines(tmp_path):
    val = [val_record(s, 5.0 / s, True, nmse=0.9 - s / 1000) for s in range(20, 101, 20)]
    records = sorted([*LONG[:100], *val], key=lambda r: (r["step"], r["kind"] == "val"))
    fig = build_figure(write_attempt(tmp_path / "a", records=records))
    loss = _panels(fig)["loss"]
    assert loss.get_ylabel() == "loss (objective; NMSE dashed)"
    nmse = _find(_lines(loss), "val NMSE of mean")
    assert list(nmse.get_ydata()) == pytest.approx([0.88, 0.86, 0.84, 0.82, 0.8])


def _shot(k, pre, rand, classical, combined, std=0.02):
    names = ("pretrained", "random_init", "classical", "combined")
    scores = zip(names, (pre, rand, classical, combined), strict=True)
    entry = {"k": k, "seeds": 5}
    for name, mean in scores:
        entry[name] = {"mean": mean, "std": std, "se": 0.01, "draws": [mean] * 5}
    return entry


def test_probe_records_with_shots_draw_accuracy_against_k_with_error_bars(tmp_path):
    shots = [
        _shot(1, 0.3, 0.2, 0.4, 0.45),
        _shot(5, 0.5, 0.3, 0.6, 0.7),
        _shot(10, 0.6, 0.3, 0.65, 0.8),
    ]
    probes = [
        {**PROBES[0], "shots": [_shot(1, 0.1, 0.2, 0.4, 0.3)]},
        {**PROBES[1], "accuracy_se": 0.05, "combined_accuracy": 0.8, "shots": shots},
    ]
    fig = build_figure(write_attempt(tmp_path / "a", records=[*LONG, *probes]))
    panels = _panels(fig)
    assert "probe_shots" in panels and "probe_by" not in panels
    assert fig.axes.index(panels["probe_shots"]) == 4  # below the probe panel
    ax = panels["probe_shots"]
    assert ax.get_xscale() == "log" and ax.get_xlabel().startswith("K labelled annotations")
    assert "probe at step 100" in ax.get_xlabel() and "5 draws per K" in ax.get_xlabel()
    lines = _lines(ax)  # the last record that has shots, every model
    assert list(lines["pretrained"].get_xdata()) == [1, 5, 10]
    assert list(lines["pretrained"].get_ydata()) == [0.3, 0.5, 0.6]
    assert list(lines["classical + pretrained"].get_ydata()) == [0.45, 0.7, 0.8]
    assert list(lines["random-init model"].get_ydata()) == [0.2, 0.3, 0.3]
    assert list(lines["chance"].get_ydata()) == [0.25, 0.25]
    # one error bar (the draws' std) per K and model
    bars = [c for c in ax.containers if c.has_yerr]
    assert len(bars) == 4
    segments = bars[0].lines[2][0].get_segments()
    assert [tuple(np.round(s[:, 1], 6)) for s in segments] == [
        (0.28, 0.32),
        (0.48, 0.52),
        (0.58, 0.62),
    ]
    # the probe panel: the combined series and the standard-error band where recorded
    probe = panels["probe"]
    assert list(_lines(probe)["classical + pretrained"].get_xdata()) == [100]
    # one probe with a standard error: its band has no width, so a bar shows it too
    assert [c.get_gid() for c in probe.collections] == ["probe_se", "probe_se_bar"]


def test_an_snr_bin_without_windows_is_a_gap_not_a_point(tmp_path):
    bins = [
        {"lo": -20.0, "hi": -15.0, "windows": 4, "pretrained": 0.5, "pretrained_se": 0.1},
        {"lo": -15.0, "hi": -10.0, "windows": 0, "pretrained": None, "pretrained_se": None},
        {"lo": -10.0, "hi": -5.0, "windows": 4, "pretrained": 0.75, "pretrained_se": 0.1},
    ]
    by = {"key": "snr", "width": 5.0, "outside": 0, "bins": bins}
    fig = build_figure(write_attempt(tmp_path / "a", records=[*LONG, {**PROBES[1], "by": by}]))
    ax = _panels(fig)["probe_by"]
    line = _lines(ax)["pretrained"]
    assert list(line.get_xdata()) == [-17.5, -12.5, -7.5]
    y = list(line.get_ydata())
    assert y[0] == 0.5 and np.isnan(y[1]) and y[2] == 0.75  # nothing drawn at -12.5
    (bars,) = [c for c in ax.containers if c.has_yerr]
    assert len(bars.lines[2][0].get_segments()) == 3 and "random-init model" not in _lines(ax)
    # older records (no standard errors, no shots, no combined): the figure still draws
    fig = build_figure(write_attempt(tmp_path / "b", records=[*LONG, *PROBES]))
    assert "probe_shots" not in _panels(fig) and not _panels(fig)["probe"].collections


def test_a_plot_follows_the_output_rules_of_embed(tmp_path):
    """Not a symbolic link, FIFO or device, not inside an attempt, not over a file without
    --force: each one line naming --plot, nothing written or replaced."""
    import os

    att = write_attempt(tmp_path / "run")
    link = tmp_path / "link.png"
    link.symlink_to(tmp_path / "target.png")
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    for out, why in (
        (link, "is a symbolic link"),
        (fifo, "is not a regular file"),
        (att / "p.png", "is inside attempt"),
    ):
        with pytest.raises(ConfigError, match=f"^--plot: .*{why}"):
            write_plot(att, out)
    first = write_plot(att, tmp_path / "p.png")
    with pytest.raises(ConfigError, match="exists; pass --force"):
        write_plot(att, first)
    assert write_plot(att, first, force=True) == first
    assert not (tmp_path / "target.png").exists() and not list(att.glob("*.png"))

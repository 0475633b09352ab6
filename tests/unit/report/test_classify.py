"""A ``model.objective = "classify"`` attempt's records (accuracy, accuracy per class, the
majority-class baseline; no NMSE) in ``report``, ``report --plot``, ``report --tensorboard``,
the live views and ``iqtrain run``'s closing lines."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from helpers import report_lines, tensorboard_scalars, train_record, write_attempt

from iqtrain.config.sections import LoggingConfig
from iqtrain.report.live import TENSORBOARD_DIR, LiveLog
from iqtrain.report.summary import report
from iqtrain.report.tensorboard import export_tensorboard


def classify_val(step, loss, accuracy, best, per, **extra):
    """A classify validation record as the contract writes it (the baseline on the first)."""
    record = {
        "kind": "val",
        "step": step,
        "loss": loss,
        "accuracy": accuracy,
        "class_accuracy": per,
        "samples": 8,
        **extra,
    }
    return {**record, "best": best, "time_s": 0.1}


CLASSIFY = [
    train_record(1),
    train_record(2),
    classify_val(
        2,
        1.2,
        0.5,
        True,
        {"am": 0.25, "bpsk": None, "qpsk": 0.75},
        baseline_majority_accuracy=0.375,
    ),
    train_record(3),
    classify_val(3, 0.9, 0.75, True, {"am": 0.5, "bpsk": None, "qpsk": 1.0}),
    train_record(4),
    classify_val(4, 0.8, 0.75, False, {"am": 0.625, "bpsk": None, "qpsk": 0.875}),  # a tie
]


def _attempt(tmp_path, records=CLASSIFY):
    return write_attempt(tmp_path / "run", records=records)


def test_report_shows_accuracy_the_majority_baseline_and_the_best_classes(tmp_path):
    text = report(_attempt(tmp_path))
    lines = report_lines(text)
    assert "baselines: majority class 0.3750" in lines
    assert "val step 2: loss 1.20000, accuracy 0.5000 best" in lines
    assert "val step 3: loss 0.90000, accuracy 0.7500 best" in lines
    assert "val step 4: loss 0.80000, accuracy 0.7500" in lines  # a tie is not best
    # Best follows accuracy (the first of the highest), not the lowest loss (step 4).
    assert "best val accuracy 0.7500 at step 3 (loss 0.90000)" in lines
    assert "class accuracy at step 3: am 0.5000, bpsk -, qpsk 1.0000" in lines
    assert "dB" not in text and "zero-prediction" not in text and "best val loss" not in text


def test_report_of_classify_records_with_fields_missing(tmp_path):
    records = [train_record(1), {"kind": "val", "step": 1, "loss": 1.0, "accuracy": None}]
    text = report(_attempt(tmp_path, records))
    assert "val step 1: loss 1.00000, accuracy ?" in report_lines(text)
    assert "best val accuracy" not in text and "class accuracy" not in text


def test_the_plot_draws_accuracy_per_class_and_the_majority_baseline(tmp_path):
    pytest.importorskip("matplotlib")
    from iqtrain.report.plot import build_figure, write_plot

    att = _attempt(tmp_path)
    fig = build_figure(att)
    panels = {ax.get_label(): ax for ax in fig.axes}
    assert list(panels) == ["loss", "val_accuracy", "lr", "grad_norm"]  # no SNR axis
    loss, acc = panels["loss"], panels["val_accuracy"]
    assert loss.get_ylabel() == "loss (cross-entropy, nats)"
    loss_lines = {line.get_label() for line in loss.get_lines()}
    assert "val loss" in loss_lines and not [k for k in loss_lines if k.startswith("best")]
    lines = {line.get_label(): line for line in acc.get_lines()}
    assert list(lines["val accuracy"].get_xdata()) == [2, 3, 4]
    best = lines["best val 0.7500 (step 3)"]
    assert (list(best.get_xdata()), list(best.get_ydata())) == ([3], [0.75])
    assert list(lines["majority class 0.3750"].get_ydata()) == [0.375, 0.375]
    per_class = [line for line in acc.get_lines() if line.get_gid() == "class_accuracy"]
    assert len(per_class) == 2  # bpsk has no validation window: no line
    assert [line.get_label() for line in per_class] == ["per-class accuracy (3 classes)", "_qpsk"]
    assert list(per_class[1].get_ydata()) == [0.75, 1.0, 0.875]
    assert acc.get_ylim() == (0, 1.02)
    out = write_plot(att, tmp_path / "classify.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_export_writes_accuracy_per_class_and_the_baseline(tmp_path):
    pytest.importorskip("tensorboard")
    where, _ = export_tensorboard(_attempt(tmp_path), tmp_path / "tb")
    scalars = tensorboard_scalars(where)
    assert {k for k in scalars if k.startswith("val/")} == {
        "val/loss",
        "val/accuracy",
        "val/class_accuracy/am",
        "val/class_accuracy/qpsk",  # bpsk: null, no window of it
        "val/baseline_majority_accuracy",
        "val/time_s",
    }
    assert scalars["val/accuracy"] == [(2, 0.5), (3, 0.75), (4, 0.75)]
    assert scalars["val/class_accuracy/am"] == [(2, 0.25), (3, 0.5), (4, 0.625)]
    assert scalars["val/baseline_majority_accuracy"] == [(2, 0.375), (3, 0.375), (4, 0.375)]


def test_the_live_view_writes_the_same_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    att = _attempt(tmp_path)
    live = LiveLog.open(LoggingConfig(tensorboard=True), att)
    assert live is not None
    for record in CLASSIFY:
        live.record(record)
    live.close(ok=True)
    seen = tensorboard_scalars(att / TENSORBOARD_DIR)
    exported, _ = export_tensorboard(att, tmp_path / "tb")
    assert seen == tensorboard_scalars(exported)
    assert seen["val/class_accuracy/qpsk"] == [(2, 0.75), (3, 1.0), (4, 0.875)]
    assert seen["val/baseline_majority_accuracy"] == [(2, 0.375), (3, 0.375), (4, 0.375)]


def _result(**fields):
    values = {
        "attempt": "/runs/a/attempts/0001",
        "final_step": 4,
        "final_val_loss": 0.8,
        "best_val_loss": 0.9,
        "best_checkpoint": "attempts/0001/checkpoints/step_00000003",
        "rank": 0,
        "stopped_early": None,
        "final_val_nmse": None,
        "objective": "classify",
        "probe": None,
        "final_val_accuracy": None,
        "best_val_accuracy": None,
        **fields,
    }
    return SimpleNamespace(**values)


def test_run_prints_the_final_and_best_accuracy(capsys):
    from iqtrain.cli.main import _finish

    assert _finish(_result(final_val_accuracy=0.75, best_val_accuracy=0.8125)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  final val accuracy 0.7500 (loss 0.80000 nats per window), best 0.8125"
    # Without a validation: n/a.
    _finish(_result(final_val_loss=None))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "  final val accuracy n/a (loss n/a nats per window), best n/a"
    _finish(_result(objective="mse", final_val_loss=0.1, best_val_loss=0.1))
    assert capsys.readouterr().out.splitlines()[1] == (
        "  final val loss 0.10000 (10.00 dB), best 0.10000 (10.00 dB)"
    )


def test_wandb_logs_a_classifiers_scalars_as_the_export_does(tmp_path, offline_wandb):
    from helpers import wandb_offline_runs

    from iqtrain.config.sections import WandbConfig

    att = _attempt(tmp_path)
    logging = LoggingConfig(wandb=WandbConfig(project="iqtrain-test"))
    live = LiveLog.open(logging, att, run_id="cls00001", config={"x": 1})
    assert live is not None
    for record in CLASSIFY:
        live.record(record)
    live.close(ok=True)
    ((_, run),) = wandb_offline_runs(offline_wandb).items()
    names = {k for row in run["history"] for k in row if not k.startswith("_")}
    assert names == set(tensorboard_scalars(export_tensorboard(att, tmp_path / "tb")[0]))
    last = run["history"][-1]
    assert last["val/accuracy"] == 0.75 and last["val/class_accuracy/qpsk"] == 0.875

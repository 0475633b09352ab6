"""``iqtrain report --tensorboard``: events read back by TensorBoard's own reader; re-export
replaces, never duplicates; the errors are one line."""

from __future__ import annotations

import errno
import json
import sys

import pytest
from helpers import RECORDS, tensorboard_scalars, train_record, write_attempt, write_lineage

from iqtrain.cli.main import main
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.report.tensorboard import EVENT_PREFIX, EventFile, export_tensorboard

PROBE = {"kind": "probe", "step": 3, "accuracy": 0.75, "chance": 0.25, "classes": 4}


def _f32(x):
    import numpy as np

    return float(np.float32(x))


def test_every_number_becomes_a_scalar_at_its_step(tmp_path):
    records = [
        train_record(1, tflops=0.5, mfu=0.25),
        *RECORDS[1:],
        PROBE,
    ]
    att = write_attempt(tmp_path / "run", records=records)
    where, count = export_tensorboard(att, tmp_path / "tb")
    assert where == tmp_path / "tb" / "run" / "0001"
    scalars = tensorboard_scalars(where)
    assert set(scalars) == {
        *(f"train/{k}" for k in ("loss", "lr", "grad_norm", "step_time_s", "samples_per_s")),
        "train/tflops",
        "train/mfu",
        *(f"val/{k}" for k in ("loss", "pred_snr_db", "time_s")),
        "val/baseline_zero_loss",
        "val/baseline_copy_last_loss",
        *(f"probe/{k}" for k in ("accuracy", "chance", "classes")),
    }
    assert count == sum(len(v) for v in scalars.values())
    assert scalars["train/loss"] == [(1, 1.0), (2, 0.5), (3, _f32(1 / 3))]
    assert scalars["train/samples_per_s"] == [(1, 401.0), (2, 402.0), (3, 403.0)]
    assert scalars["train/mfu"] == [(1, 0.25)]  # only where recorded
    assert scalars["val/loss"] == [(2, 0.5), (3, 0.25)]
    # The first validation's baselines, drawn as lines over every validation step.
    assert scalars["val/baseline_zero_loss"] == [(2, 1.0), (3, 1.0)]
    assert scalars["val/baseline_copy_last_loss"] == [(2, 2.0), (3, 2.0)]
    assert scalars["probe/accuracy"] == [(3, 0.75)] and scalars["probe/chance"] == [(3, 0.25)]


def test_wall_times_add_up_the_recorded_compute_time(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    att = write_attempt(tmp_path / "run")  # started 2025-01-01T00:00:00+00:00
    where, _ = export_tensorboard(att, tmp_path / "tb")
    acc = EventAccumulator(str(where))
    acc.Reload()
    walls = [e.wall_time - 1735689600 for e in acc.Scalars("train/loss")]
    assert walls == pytest.approx([0.01, 0.02, 0.13])  # 3 steps of 0.01 s, a 0.1 s validation


def test_a_resumed_attempt_exports_its_whole_lineage(tmp_path):
    atts = write_lineage(tmp_path / "run", steps=(2,))
    where, _ = export_tensorboard(atts[-1], tmp_path / "tb")
    assert where.name == "0002" and [s for s, _ in tensorboard_scalars(where)["train/loss"]] == [
        1,
        2,
        3,
    ]


def test_exporting_again_replaces_and_never_duplicates(tmp_path):
    att = write_attempt(tmp_path / "run")
    where, first = export_tensorboard(att, tmp_path / "tb")
    again, second = export_tensorboard(att, tmp_path / "tb")
    assert again == where and second == first
    assert [p.name.startswith(EVENT_PREFIX) for p in where.iterdir()] == [True]
    assert tensorboard_scalars(where)["train/loss"] == [(1, 1.0), (2, 0.5), (3, _f32(1 / 3))]
    with (att / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(train_record(4)) + "\n")
    (where / f"{EVENT_PREFIX}0.other-host").write_bytes(b"")  # an older export's file name
    export_tensorboard(att, tmp_path / "tb")
    assert len(list(where.iterdir())) == 1
    assert [s for s, _ in tensorboard_scalars(where)["train/loss"]] == [1, 2, 3, 4]
    assert sorted(p.name for p in where.parent.iterdir()) == ["0001"]  # no temporary left
    other = write_attempt(tmp_path / "other")  # another run's 0001 does not collide
    assert export_tensorboard(other, tmp_path / "tb")[0] == tmp_path / "tb" / "other" / "0001"
    assert len(tensorboard_scalars(where)["train/loss"]) == 4


def test_a_full_disk_leaves_nothing_and_an_earlier_export_as_it_was(tmp_path, monkeypatch):
    att = write_attempt(tmp_path / "run")
    other = write_attempt(tmp_path / "other")
    where, _ = export_tensorboard(other, tmp_path / "tb")  # tb/other/0001, left alone
    before = tensorboard_scalars(where)

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(EventFile, "scalars", full)
    with pytest.raises(ConfigError, match=r"^--tensorboard .*: cannot write: No space left"):
        export_tensorboard(att, tmp_path / "tb")  # would make tb/run/0001
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["other"]
    with pytest.raises(ConfigError):
        export_tensorboard(other, tmp_path / "tb")  # replacing the earlier export
    assert sorted(p.name for p in where.parent.iterdir()) == ["0001"]
    assert tensorboard_scalars(where) == before
    with pytest.raises(ConfigError):
        export_tensorboard(att, tmp_path / "new" / "tb")
    assert not (tmp_path / "new").exists()


def test_a_directory_holding_other_files_is_refused_untouched(tmp_path):
    att = write_attempt(tmp_path / "run")
    target = tmp_path / "tb" / "run" / "0001"
    target.mkdir(parents=True)
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError) as info:
        export_tensorboard(att, tmp_path / "tb")
    message = str(info.value)
    assert message.startswith(f"--tensorboard {target}: holds notes.txt") and "\n" not in message
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_an_unwritable_directory_is_one_config_error(tmp_path):
    att = write_attempt(tmp_path / "run")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"^--tensorboard .*file.*: cannot write: "):
        export_tensorboard(att, tmp_path / "file")
    with pytest.raises(CheckpointError, match="no attempt.json"):
        export_tensorboard(tmp_path, tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_without_tensorboard_the_command_is_one_line_exit_2(tmp_path, monkeypatch, capsys):
    att = write_attempt(tmp_path / "run")
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    for name in [m for m in sys.modules if m.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError) as info:
        export_tensorboard(att, tmp_path / "tb")
    message = "--tensorboard needs tensorboard: pip install 'iqtrain[tensorboard]'"
    assert str(info.value) == message
    assert main(["report", str(att), "--tensorboard", str(tmp_path / "tb")]) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"iqtrain: error: {message}\n")
    assert not (tmp_path / "tb").exists()

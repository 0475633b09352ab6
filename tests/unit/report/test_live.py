"""Live views of a run (``[logging]``): the scalars of ``report --tensorboard``, record by
record; a view that fails is one note, never an error; missing packages are one ConfigError."""

from __future__ import annotations

import errno
import os
import sys
import types

import pytest
from helpers import RECORDS, tensorboard_scalars, train_record, write_attempt

from iqtrain.config.sections import LoggingConfig, WandbConfig
from iqtrain.errors import ConfigError
from iqtrain.report.live import (
    TENSORBOARD_DIR,
    WANDB_RUN_ID,
    LiveLog,
    check_live,
    wandb_run_id,
)
from iqtrain.report.tensorboard import EVENT_PREFIX, EventFile, export_tensorboard

TB = LoggingConfig(tensorboard=True)
PROBE = {"kind": "probe", "step": 3, "accuracy": 0.75, "per_class": {"a": 1.0}, "by": {}}


def _live(att, records, logging=TB, **kwargs):
    live = LiveLog.open(logging, att, **kwargs)
    assert live is not None
    for record in records:
        live.record(record)
    live.wait()  # written by the writer thread: wait for it
    return live


def test_nothing_asked_nothing_opened(tmp_path):
    assert LiveLog.open(LoggingConfig(), tmp_path) is None
    assert list(tmp_path.iterdir()) == []


def test_live_events_are_the_export_scalars_of_the_same_records(tmp_path):
    records = [train_record(1, tflops=0.5, mfu=0.25), *RECORDS[1:], PROBE]
    att = write_attempt(tmp_path / "run", records=records)
    live = _live(att, records)
    (event,) = (att / TENSORBOARD_DIR).iterdir()
    assert event.name.startswith(EVENT_PREFIX) and event.name.endswith(".iqtrain.run.0001")
    # Flushed record by record: TensorBoard reads every record before the attempt ends.
    seen = tensorboard_scalars(att / TENSORBOARD_DIR)
    live.close(ok=True)
    exported, _ = export_tensorboard(att, tmp_path / "tb")
    assert seen == tensorboard_scalars(exported)  # same names, steps and values
    assert seen["val/baseline_zero_loss"] == [(2, 1.0), (3, 1.0)]
    assert "probe/per_class" not in seen and "train/clipped" not in seen


def test_a_resumed_attempt_finds_the_lineage_baselines_in_its_inherited_stream(tmp_path):
    att = write_attempt(tmp_path / "run", records=RECORDS[:3])  # the parent's, val at 2
    new = [train_record(3), {"kind": "val", "step": 3, "loss": 0.25, "best": True}]
    live = _live(att, new, inherited=att / "metrics.jsonl")
    live.close(ok=True)
    seen = tensorboard_scalars(att / TENSORBOARD_DIR)
    assert seen["val/baseline_copy_last_loss"] == [(3, 2.0)]  # only its own records
    assert seen["train/loss"][0][0] == 3


def test_a_write_failure_is_one_note_and_the_view_is_off(tmp_path, monkeypatch, capsys):
    att = write_attempt(tmp_path / "run")
    live = _live(att, RECORDS[:1])

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device", "events")

    monkeypatch.setattr(EventFile, "scalars", full)
    for record in RECORDS[1:]:
        live.record(record)  # never raises
    live.close(ok=False)
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "iqtrain: note: logging.tensorboard: events: No space left on device; live logging "
        "there is off for the rest of this attempt"
    ]
    assert live.views == []


def test_a_removed_event_file_is_noticed_at_the_next_record(tmp_path, capsys):
    att = write_attempt(tmp_path / "run")
    live = _live(att, RECORDS[:1])
    for path in (att / TENSORBOARD_DIR).iterdir():
        path.unlink()
    (att / TENSORBOARD_DIR).rmdir()
    live.record(RECORDS[1])
    live.record(RECORDS[2])
    live.close(ok=True)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("iqtrain: note: logging.tensorboard: ") and "removed" in line
    assert not (att / TENSORBOARD_DIR).exists()  # nothing was created again


def test_a_directory_that_cannot_be_made_is_one_note(tmp_path, capsys):
    att = write_attempt(tmp_path / "run")
    (att / TENSORBOARD_DIR).write_text("in the way")
    live = _live(att, RECORDS)
    live.close(ok=True)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("iqtrain: note: logging.tensorboard: ") and "off" in line


@pytest.mark.parametrize(("package", "logging"), [("tensorboard", TB), ("wandb", None)])
def test_a_missing_package_is_one_config_error_naming_the_key(monkeypatch, package, logging):
    logging = logging or LoggingConfig(wandb=WandbConfig(project="p"))
    monkeypatch.setitem(sys.modules, package, None)
    for name in [m for m in sys.modules if m.startswith(f"{package}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError) as info:
        check_live(logging)
    assert str(info.value) == (
        f"logging.{package} needs {package}: pip install 'iqtrain[{package}]'"
    )
    check_live(LoggingConfig())  # nothing asked, nothing needed


def test_the_wandb_run_id_is_the_parents_or_a_new_one(tmp_path):
    on = LoggingConfig(wandb=WandbConfig(project="p"))
    assert wandb_run_id(LoggingConfig(), None) is None
    fresh = wandb_run_id(on, None)
    assert fresh is not None and len(fresh) == 8 and fresh.isalnum() and fresh.islower()
    assert wandb_run_id(on, None) != fresh
    parent = write_attempt(tmp_path / "run", **{WANDB_RUN_ID: "abc123xy"})
    assert wandb_run_id(on, parent) == "abc123xy"
    plain = write_attempt(tmp_path / "run", number="0002")  # its parent logged no W&B run
    assert wandb_run_id(on, plain) not in (None, "abc123xy")


def test_wandb_logs_the_same_scalars_at_the_same_steps(tmp_path, offline_wandb):
    # One run per process here: a resume continuing the run is a new process
    # (tests/e2e/test_live.py); wandb-core does not restart a finished run id in-process.
    from helpers import wandb_offline_runs

    logging = LoggingConfig(wandb=WandbConfig(project="iqtrain-test"))
    att = write_attempt(tmp_path / "run", records=RECORDS)
    _live(att, RECORDS, logging, run_id="run00001", config={"x": 1}).close(ok=True)
    ((where, run),) = wandb_offline_runs(offline_wandb).items()
    assert run["id"] == "run00001" and where.parent.parent == offline_wandb
    assert [row["_step"] for row in run["history"]] == [1, 2, 3]
    names = {k for row in run["history"] for k in row if not k.startswith("_")}
    assert names == set(tensorboard_scalars(export_tensorboard(att, tmp_path / "tb")[0]))
    row3 = run["history"][2]
    assert row3["val/baseline_zero_loss"] == 1.0 and row3["train/loss"] == pytest.approx(1 / 3)


def test_a_wandb_failure_is_one_note(tmp_path, offline_wandb, capsys):
    logging = LoggingConfig(wandb=WandbConfig(project="iqtrain-test"))
    att = write_attempt(tmp_path / "run")
    live = _live(att, RECORDS[:1], logging, run_id="run00002")
    (view,) = live.views  # the writer thread is idle (waited for)

    def broken(*args, **kwargs):
        raise RuntimeError("the service went away")

    view.run.log = broken
    live.record(RECORDS[1])
    live.record(RECORDS[2])
    live.close(ok=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("iqtrain")]
    assert lines == [
        "iqtrain: note: logging.wandb: RuntimeError: the service went away; live logging "
        "there is off for the rest of this attempt"
    ]
    assert live.views == []


class _FakeWandbRun:
    """What LiveLog uses of a W&B run; like wandb-core, ``log`` never fails (a record it cannot
    write to a full disk is dropped, said only in its debug-internal.log)."""

    def __init__(self):
        self.steps, self.exit_code = [], None
        self.config = types.SimpleNamespace(update=lambda *args, **kwargs: None)

    def log(self, values, step):
        self.steps.append(step)

    def finish(self, exit_code):
        self.exit_code = exit_code


def test_wandb_on_a_full_disk_is_one_note(tmp_path, monkeypatch, capsys):
    run = _FakeWandbRun()
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: run
    fake.Settings = lambda **kwargs: None
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_DIR", raising=False)  # the run's files go into the attempt
    att = write_attempt(tmp_path / "run")
    logging = LoggingConfig(wandb=WandbConfig(project="p"))
    live = _live(att, RECORDS[:1], logging, run_id="run00003")
    real = os.statvfs

    def full(path):
        st = real(path)
        return types.SimpleNamespace(f_frsize=st.f_frsize, f_bavail=0, f_bfree=0)

    monkeypatch.setattr(os, "statvfs", full)
    for record in RECORDS[1:]:
        live.record(record)  # never raises
    live.close(ok=True)
    assert capsys.readouterr().err.splitlines() == [
        f"iqtrain: note: logging.wandb: {att}: No space left on device; live logging there is "
        "off for the rest of this attempt"
    ]
    assert run.steps == [1] and run.exit_code == 1 and live.views == []


def test_the_loop_only_queues_and_close_writes_the_backlog(tmp_path):
    att = write_attempt(tmp_path / "run")
    live = LiveLog.open(TB, att)
    assert live is not None and live._writer.is_alive()
    records = [train_record(step) for step in range(1, 501)]
    for record in records:
        live.record(record)
    live.close(ok=True)  # every queued record is written before the file is closed
    assert not live._writer.is_alive()
    assert [s for s, _ in tensorboard_scalars(att / TENSORBOARD_DIR)["train/loss"]] == list(
        range(1, 501)
    )
    live.record(records[0])  # after close: nothing, no error

"""Watching a run (``[logging]``, ``training.profile_steps``) through the ``iqtrain`` command:
live TensorBoard scalars equal to ``report --tensorboard``'s, a resume writing its own event
file and continuing the W&B run, a Chrome trace of the profiled steps, verify ignoring all of
it, and the failures: a removed event directory is a note, bad keys and a missing package one
line, exit 2, before anything exists."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_tables, tensorboard_scalars, wandb_offline_runs

from iqtrain.config.schema import dumps_toml

WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}


def iqtrain(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


def _config(root: Path, logging: dict, **training) -> Path:
    tables = cli_tables(root / "run", root / "cache", **training)
    tables["logging"] = logging
    path = root / "cfg.toml"
    path.write_text(dumps_toml(tables))
    return path


def _one_clean_line(proc, key):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"iqtrain: error: {key}"), lines[0]


@pytest.fixture(scope="module")
def lineage(tmp_path_factory):
    """A 4-step run with TensorBoard, W&B (offline) and steps 2-3 profiled, then a resume of
    it from step 2: (attempts, the W&B dir, the size of the first event file after its run)."""
    pytest.importorskip("wandb", reason="needs wandb, the optional iqtrain[wandb] extra")
    root = tmp_path_factory.mktemp("live")
    logging = {"tensorboard": True, "wandb": {"project": "iqtrain-test"}}
    cfg = _config(root, logging, max_steps=4, profile_steps=[2, 3])
    env = {**WANDB_ENV, "WANDB_DIR": str(root / "wandb_dir")}
    (root / "wandb_dir").mkdir()
    first = iqtrain("run", cfg, env=env)
    assert first.returncode == 0, first.stderr
    attempts = root / "run" / "attempts"
    (event,) = (attempts / "0001" / "tensorboard").iterdir()
    size = event.stat().st_size
    second = iqtrain("resume", "--attempt", attempts / "0001", "--from", "step_00000002", env=env)
    assert second.returncode == 0, second.stderr
    return [attempts / "0001", attempts / "0002"], root / "wandb_dir", size


def test_live_scalars_are_those_report_tensorboard_exports(lineage, tmp_path):
    (first, child), _, _ = lineage
    live = tensorboard_scalars(first / "tensorboard")
    proc = iqtrain("report", first, "--tensorboard", tmp_path / "tb")
    assert proc.returncode == 0, proc.stderr
    exported = tensorboard_scalars(tmp_path / "tb" / "run" / "0001")
    assert live.keys() == exported.keys() and "val/baseline_zero_loss" in live
    for tag, points in live.items():  # the same steps and values; only wall times differ
        assert points == exported[tag], tag
    # The child shows its own records (steps 3-4) under the same names as its whole export.
    proc = iqtrain("report", child, "--tensorboard", tmp_path / "tb")
    assert proc.returncode == 0, proc.stderr
    child_live = tensorboard_scalars(child / "tensorboard")
    assert child_live.keys() == tensorboard_scalars(tmp_path / "tb" / "run" / "0002").keys()
    assert [s for s, _ in child_live["train/loss"]] == [3, 4]


def test_a_resume_writes_its_own_event_file(lineage):
    (first, child), _, size = lineage
    (mine,) = (child / "tensorboard").iterdir()
    assert mine.name.endswith(".iqtrain.run.0002")
    (theirs,) = (first / "tensorboard").iterdir()
    assert theirs.name.endswith(".iqtrain.run.0001") and theirs.stat().st_size == size


def test_verify_ignores_the_live_and_profile_directories(lineage):
    (first, child), _, _ = lineage
    assert (first / "profile").is_dir() and (first / "tensorboard").is_dir()
    for attempt in (first, child):
        proc = iqtrain("verify", attempt)
        assert proc.returncode == 0 and "NOTE" not in proc.stdout, proc.stdout + proc.stderr
    manifest = json.loads((first / "manifest.json").read_text())
    assert "tensorboard" not in json.dumps(manifest) and "profile" not in json.dumps(manifest)


def test_the_resume_continues_the_wandb_run(lineage):
    (first, child), wandb_dir, _ = lineage
    ids = [json.loads((a / "attempt.json").read_text())["wandb_run_id"] for a in (first, child)]
    assert ids[0] == ids[1]
    runs = list(wandb_offline_runs(wandb_dir).values())
    assert [r["id"] for r in runs] == ids
    assert [[row["_step"] for row in r["history"]] for r in runs] == [[1, 2, 3, 4], [3, 4]]
    names = {k for row in runs[0]["history"] for k in row if not k.startswith("_")}
    assert names == set(tensorboard_scalars(first / "tensorboard"))
    losses = {row["_step"]: row["train/loss"] for row in runs[1]["history"]}
    tb = dict(tensorboard_scalars(child / "tensorboard")["train/loss"])
    assert tb == pytest.approx(losses, rel=1e-6)  # float32 in TensorBoard


def test_profile_steps_write_a_chrome_trace_of_those_steps(lineage):
    (first, child), _, _ = lineage
    assert [p.name for p in (first / "profile").iterdir()] == ["trace_steps_2-3.json"]
    events = json.loads((first / "profile" / "trace_steps_2-3.json").read_text())["traceEvents"]
    marks = {e["name"] for e in events if e.get("name", "").startswith("iqtrain step")}
    assert marks == {"iqtrain step 2", "iqtrain step 3"} and len(events) > 10
    # The child resumed at step 2 and numbers on: it profiles what is left of the range.
    assert [p.name for p in (child / "profile").iterdir()] == ["trace_steps_3-3.json"]


def test_a_removed_event_directory_is_a_note_not_a_failure(tmp_path):
    # The directory goes while the run writes to it (until the attempt closes the file).
    cfg = _config(tmp_path, {"tensorboard": True}, max_steps=30, eval_every=15, checkpoint_every=30)
    proc = subprocess.Popen(
        [sys.executable, "-m", "iqtrain.cli.main", "run", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    live = tmp_path / "run" / "attempts" / "0001" / "tensorboard"
    deadline = time.monotonic() + 300
    while not (live.is_dir() and any(live.iterdir())) and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    shutil.rmtree(live)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    notes = [x for x in err.splitlines() if x.startswith("iqtrain: note: logging.tensorboard")]
    assert len(notes) == 1 and "removed" in notes[0], err
    assert not live.exists()
    attempt = live.parent
    assert iqtrain("verify", attempt).returncode == 0


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("training.profile_steps=[3, 2]", "training.profile_steps"),
        ("logging.tensorbord=true", "logging.tensorbord"),
    ],
)
def test_bad_logging_and_profile_keys_are_one_line(tmp_path, override, key):
    cfg = _config(tmp_path, {})
    _one_clean_line(iqtrain("run", cfg, "--set", override), key)
    assert not (tmp_path / "run").exists()


def test_wandb_missing_is_one_line_before_any_work(tmp_path):
    # A wandb that is not there, as the import system reports it.
    fake = tmp_path / "no_wandb"
    fake.mkdir()
    (fake / "wandb.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'wandb'\", name='wandb')\n"
    )
    cfg = _config(tmp_path, {"wandb": {"project": "p"}})
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    proc = iqtrain("run", cfg, env={"PYTHONPATH": path})
    _one_clean_line(proc, "logging.wandb needs wandb: pip install 'iqtrain[wandb]'")
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()

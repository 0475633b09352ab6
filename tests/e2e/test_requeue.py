"""``iqtrain run CONFIG --auto-resume``: the command a preempted, requeued job reruns. Killed
(kill -9, twice) or warned of its time limit (SIGUSR1), the same command resumes the newest
attempt from its latest checkpoint and ends where a straight run ends; run again once the run
completed, it changes no file; a config changed in a way resume refuses is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_tables, kill_after_checkpoints, snapshot, subprocess_env

from iqtrain.config.schema import dumps_toml
from iqtrain.errors import CheckpointError
from iqtrain.evidence.attempts import requeue_point
from iqtrain.evidence.lock import AttemptLock
from iqtrain.evidence.metrics import read_metrics, strip_timing

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(root: Path, name: str, **training) -> Path:
    tables = cli_tables(root / name, root / "cache", max_steps=12)
    tables["training"].update(
        {"eval_every": 4, "checkpoint_every": 4, "compile": False, **training}
    )
    tables["schedule"] = {"kind": "constant", "warmup_steps": 0}
    path = root / f"{name}.toml"
    path.write_text(dumps_toml(tables))
    return path


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "iqtrain", *map(str, args)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=300,
    )


def _records(attempt: Path) -> list[dict]:
    return strip_timing(read_metrics(attempt / "metrics.jsonl"))


def _weights(attempt: Path, step: int) -> bytes:
    return (attempt / "checkpoints" / f"step_{step:08d}" / "model.safetensors").read_bytes()


def test_killed_twice_the_same_command_ends_as_a_straight_run_then_changes_nothing(tmp_path):
    straight = _run("run", _config(tmp_path, "straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    want = tmp_path / "straight" / "attempts" / "0001"
    cfg = _config(tmp_path, "job")
    argv = [sys.executable, "-m", "iqtrain", "run", os.fspath(cfg), "--auto-resume"]
    attempts = tmp_path / "job" / "attempts"
    kill_after_checkpoints(argv, subprocess_env(), attempts / "0001" / "checkpoints", 1)
    assert requeue_point(tmp_path / "job") == attempts / "0001"
    # The requeued job, preempted again: its own child is now the newest unfinished attempt.
    kill_after_checkpoints(argv, subprocess_env(), attempts / "0002" / "checkpoints", 1)
    assert requeue_point(tmp_path / "job") == attempts / "0002"
    again = _run("run", cfg, "--auto-resume")
    assert again.returncode == 0, again.stderr[-2000:]
    last = attempts / "0003"
    info = json.loads((last / "attempt.json").read_text())
    assert info["parent"]["attempt"] == os.fspath((attempts / "0002").resolve())
    assert info["status"] == "completed" and info["final_step"] == 12
    assert _records(last) == _records(want)
    assert _weights(last, 12) == _weights(want, 12)
    assert _run("verify", last).returncode == 0
    before = snapshot(tmp_path / "job")
    done = _run("run", cfg, "--auto-resume")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"{last}: completed at step 12; nothing to resume\n"
    assert snapshot(tmp_path / "job") == before  # not a byte, not an mtime


def test_sigusr1_saves_and_exits_138_and_the_same_command_ends_as_a_straight_run(tmp_path):
    settings = {"max_steps": 80, "eval_every": 20, "checkpoint_every": 40}
    straight = _run("run", _config(tmp_path, "straight", **settings))
    assert straight.returncode == 0, straight.stderr[-2000:]
    cfg = _config(tmp_path, "job", **settings)
    argv = [sys.executable, "-m", "iqtrain", "run", os.fspath(cfg), "--auto-resume"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env()
    )
    first = tmp_path / "job" / "attempts" / "0001"
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        metrics = first / "metrics.jsonl"
        if metrics.is_file() and metrics.read_text().count('"train"') >= 3:
            proc.send_signal(signal.SIGUSR1)  # SLURM's warning before the time limit
            break
        time.sleep(0.01)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 138, err[-2000:]
    assert "interrupted (signal 10); checkpoint saved" in err, err[-2000:]
    info = json.loads((first / "attempt.json").read_text())
    stopped = info["final_step"]
    assert info["status"] == "interrupted" and 3 <= stopped < 80, info
    assert (first / "checkpoints" / f"step_{stopped:08d}").is_dir()
    again = _run("run", cfg, "--auto-resume")
    assert again.returncode == 0, again.stderr[-2000:]
    child = first.parent / "0002"
    want = tmp_path / "straight" / "attempts" / "0001"
    assert _records(child) == _records(want)
    assert _weights(child, 80) == _weights(want, 80)


def test_a_changed_config_is_refused_as_resume_refuses_it(tmp_path):
    cfg = _config(tmp_path, "job")
    argv = [sys.executable, "-m", "iqtrain", "run", os.fspath(cfg), "--auto-resume"]
    attempts = tmp_path / "job" / "attempts"
    kill_after_checkpoints(argv, subprocess_env(), attempts / "0001" / "checkpoints", 1)
    text = cfg.read_text()
    cfg.write_text(text + "\n[optimizer]\nlr = 0.002\n")  # edited between the jobs
    before = snapshot(tmp_path / "job")
    proc = _run("run", cfg, "--auto-resume")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("iqtrain: error: optimizer.lr: cannot change on resume"), (
        proc.stderr
    )
    assert len(proc.stderr.splitlines()) == 1
    assert snapshot(tmp_path / "job") == before
    # A key a resume may change is taken from CONFIG and recorded in the child.
    cfg.write_text(text.replace("max_steps = 12", "max_steps = 16"))
    proc = _run("run", cfg, "--auto-resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads((attempts / "0002" / "attempt.json").read_text())
    assert info["final_step"] == 16
    assert info["config_changes"] == {"training.max_steps": {"from": 12, "to": 16}}


def test_a_run_without_a_checkpoint_starts_and_a_running_one_is_refused(tmp_path):
    cfg = _config(tmp_path, "fresh")
    assert requeue_point(tmp_path / "fresh") is None
    proc = _run("run", cfg, "--auto-resume")  # nothing there: a fresh start
    assert proc.returncode == 0, proc.stderr[-2000:]
    attempt = tmp_path / "fresh" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    (attempt / "attempt.json").write_text(json.dumps({**info, "status": "running"}))
    lock = AttemptLock(attempt).acquire()  # another job holds it
    try:
        with pytest.raises(CheckpointError, match="still running"):
            requeue_point(tmp_path / "fresh")
        proc = _run("run", cfg, "--auto-resume")
        assert proc.returncode == 2 and "still running" in proc.stderr
    finally:
        lock.release()


@pytest.mark.distributed
@pytest.mark.exit_path
def test_under_torchrun_a_running_attempt_is_refused_on_every_rank_in_one_line(tmp_path):
    cfg = _config(tmp_path, "job")
    assert _run("run", cfg).returncode == 0
    attempt = tmp_path / "job" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    (attempt / "attempt.json").write_text(json.dumps({**info, "status": "running"}))
    lock = AttemptLock(attempt).acquire()  # another job holds it
    before = snapshot(tmp_path / "job")
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc-per-node", "2", "-m", "iqtrain", "run", os.fspath(cfg), "--auto-resume"]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=subprocess_env(), timeout=300
        )
    finally:
        lock.release()
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "still running" in lines[0], proc.stderr[-3000:]
    assert proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-3000:]  # every worker
    assert snapshot(tmp_path / "job") == before

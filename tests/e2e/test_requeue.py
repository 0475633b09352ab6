"""``iqtrain run CONFIG --auto-resume``: the command a preempted, requeued job reruns. Killed
after its first checkpoint, the same command resumes the attempt from its latest checkpoint and
ends where a straight run ends; run again once the run completed, it does nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import cli_tables, kill_after_checkpoints, subprocess_env

from iqtrain.config.schema import dumps_toml
from iqtrain.errors import CheckpointError
from iqtrain.evidence.attempts import requeue_point
from iqtrain.evidence.lock import AttemptLock

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _config(root: Path, name: str) -> Path:
    tables = cli_tables(root / name, root / "cache", max_steps=12)
    tables["training"].update(eval_every=4, checkpoint_every=4, compile=False)
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


def test_a_requeued_job_resumes_then_has_nothing_to_do(tmp_path):
    straight = _run("run", _config(tmp_path, "straight"))
    assert straight.returncode == 0, straight.stderr[-2000:]
    cfg = _config(tmp_path, "job")
    argv = [sys.executable, "-m", "iqtrain", "run", os.fspath(cfg), "--auto-resume"]
    first = tmp_path / "job" / "attempts" / "0001"
    kill_after_checkpoints(argv, subprocess_env(), first / "checkpoints", 1)  # preempted
    assert requeue_point(tmp_path / "job") == first
    again = _run("run", cfg, "--auto-resume")  # the requeued job: the same command
    assert again.returncode == 0, again.stderr[-2000:]
    second = tmp_path / "job" / "attempts" / "0002"
    info = json.loads((second / "attempt.json").read_text())
    assert info["parent"]["attempt"] == os.fspath(first.resolve()) and info["final_step"] == 12
    want = tmp_path / "straight" / "attempts" / "0001" / "checkpoints" / "step_00000012"
    got = second / "checkpoints" / "step_00000012"
    assert (got / "model.safetensors").read_bytes() == (want / "model.safetensors").read_bytes()
    done = _run("run", cfg, "--auto-resume")
    assert done.returncode == 0 and "completed at step 12; nothing to resume" in done.stdout
    assert sorted(p.name for p in (tmp_path / "job" / "attempts").iterdir()) == ["0001", "0002"]


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

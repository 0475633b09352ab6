"""The last stage of ``bash .ci/dev gpu`` (scripts/ci/gpu_study.py), smoke-tested at a tiny size
on the CPU: pretrain, probe with --shots, one summary line and summary.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.slow


def test_the_gpu_study_script_runs_end_to_end_at_a_tiny_size(tmp_path):
    exe = Path(sys.executable).parent / "iqtrain"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, REPO / "scripts" / "ci" / "gpu_study.py", exe, tmp_path, "--tiny"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("gpu study: 6 steps") and "MFU n/a" in line, line
    for part in ("pretrained", "random init", "classical", "chance", "K=1:", "K=2:", "combined"):
        assert part in line, line
    doc = json.loads((tmp_path / "summary.json").read_text())
    assert doc["run"]["steps"] == 6 and [r["k"] for r in doc["probe"]["shots"]] == [1, 2]
    assert doc["probe"]["annotations"] == 35

"""The last stage of ``bash .ci/dev gpu`` (scripts/ci/gpu_study.py): its step count from the bench
stage's line, and the whole script smoke-tested at a tiny size on the CPU (pretrain, probe with
--shots, one summary line, summary.json and its line in the GPU stage's summary)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

SCRIPT = REPO / "scripts" / "ci" / "gpu_study.py"


def _study():
    spec = importlib.util.spec_from_file_location("gpu_study", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_line(variant: str, ms: float) -> str:
    bench = [
        {"name": "test_cuda_study_step[x]", "extra_info": {"variant": variant, "ms_per_step": ms}}
    ]
    return json.dumps({"kind": "pytest", "stage": "bench", "benchmarks": bench})


def test_the_steps_come_from_the_bench_stages_compiled_deterministic_step(tmp_path: Path) -> None:
    study = _study()
    summary = tmp_path / "summary.jsonl"
    summary.write_text(
        "\n".join(
            [
                json.dumps({"kind": "stage", "stage": "bench", "result": "passed"}),
                _bench_line("cuda_study_compiled_nondeterministic", 5.0),
                "not json",
                _bench_line(study.BENCH_VARIANT, 12.5),
            ]
        )
    )
    step_s = study.bench_step_s(summary)
    assert step_s == pytest.approx(0.0125)
    assert study.plan_steps(25.0, step_s) == 2000
    assert study.plan_steps(25.0, 1.0) == study.MIN_STEPS
    assert study.plan_steps(25.0, 1e-4) == study.MAX_STEPS
    # No bench line (gpu --only study, or a failed bench stage): the default count.
    assert study.bench_step_s(tmp_path / "missing.jsonl") is None
    assert study.plan_steps(25.0, None) == study.DEFAULT_STEPS


@pytest.mark.slow
def test_the_gpu_study_script_runs_end_to_end_at_a_tiny_size(tmp_path):
    exe = Path(sys.executable).parent / "iqtrain"
    summary = tmp_path / "summary.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "IQTRAIN_GPU_SUMMARY": str(summary)}
    proc = subprocess.run(
        [sys.executable, SCRIPT, exe, tmp_path / "out", "--tiny"],
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
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert doc["run"]["steps"] == 6 and [r["k"] for r in doc["probe"]["shots"]] == [1, 2]
    assert doc["probe"]["annotations"] == 35
    (record,) = [json.loads(x) for x in summary.read_text().splitlines()]
    assert record["kind"] == "study" and record["line"] == line and record["steps"] == 6

"""The fine-tuning study (studies/finetune/finetune.py), smoke-tested at a tiny size on the CPU: a
tiny pretrained attempt, tiny labelled sets from ``iqtrain synth --annotations``, then every
cell (classical + LR, fine-tunes from the pretrained trunk and from random init), results.json,
table.md, and a second invocation that skips every run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, tiny_tables

from iqtrain.config.schema import dumps_toml

pytestmark = pytest.mark.slow

SCRIPT = REPO / "studies" / "finetune" / "finetune.py"
TIMEOUT = 600


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _run(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _labels(subset: Path) -> list[str]:
    return [
        a["core:label"]
        for meta in sorted(subset.glob("*.sigmf-meta"))
        for a in json.loads(meta.read_text())["annotations"]
    ]


def test_the_finetune_study_runs_end_to_end_at_a_tiny_size_and_resumes(tmp_path):
    cfg = tmp_path / "src.toml"
    cfg.write_text(dumps_toml(tiny_tables(tmp_path / "src", tmp_path / "cache", max_steps=6)))
    _run("-m", "iqtrain", "run", cfg)
    source = tmp_path / "src" / "attempts" / "0001"
    # 7 classes x 4 bursts of two 128-sample windows (the tiny model's): 1 dev + 3 pool a class
    for name, count, seed in (("pool", 28, 11), ("report", 14, 12)):
        sizes = ["--annotations", count, "--burst-samples", 256, "--seed", seed]
        _run("-m", "iqtrain", "synth", tmp_path / name, *sizes)
    out = tmp_path / "study"
    argv = [SCRIPT, "--tiny", "--out", out, "--pretrained", source]
    argv += ["--pool", tmp_path / "pool" / "*.sigmf-meta"]
    argv += ["--report", tmp_path / "report" / "*.sigmf-meta"]
    proc = _run(*argv)

    doc = json.loads((out / "results.json").read_text())
    assert doc["window"] == 128 and doc["report_annotations"] == 14
    assert doc["chance"] == pytest.approx(2 / 14)
    cells = {(r["k_name"], r["seed"], r["init"]): r for r in doc["runs"]}
    assert sorted(cells) == sorted(
        (k, 0, i) for k in ("1", "all") for i in ("classical", "pretrained", "random")
    )
    for (k, _, init), r in cells.items():
        assert r["k"] == (1 if k == "1" else 3)
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["window_accuracy"] <= 1.0
        assert r["annotations"] == 14 and r["windows"] == 28
        if init == "classical":
            assert r["train_windows"] == 7 * r["k"] * 2
            continue
        assert r["steps"] == 6 and r["step"] == 6 and r["dev_accuracy"] is not None
        attempt = json.loads((Path(r["attempt"]) / "attempt.json").read_text())
        if init == "pretrained":
            assert attempt["init"]["attempt"] == os.fspath(source.resolve())
        else:
            assert attempt["init"] is None

    # The dev set and each drawn subset: K annotations of every class, never a dev annotation.
    dev = json.loads((out / "data" / "dev" / "subset.json").read_text())
    assert sorted(_labels(out / "data" / "dev")) == sorted(doc["classes"])
    for k in ("1", "all"):
        subset = out / "data" / f"k{k}_s0"
        per_class = 1 if k == "1" else 3
        assert sorted(_labels(subset)) == sorted(doc["classes"] * per_class)
        drawn = json.loads((subset / "subset.json").read_text())
        assert not {tuple(x) for x in drawn} & {tuple(x) for x in dev}

    table = (out / "table.md").read_text()
    columns = ("pretrained fine-tune", "random-init fine-tune", "pretrained − random")
    for part in (*columns, "classical + LR", "chance", "| 1 | 1 |", "| all (3) | 1 |"):
        assert part in table, table
    assert "K=all seed 0 random" in proc.stdout

    again = _run(*argv)
    assert again.stdout.count("done before, skipped") == 6, again.stdout
    assert json.loads((out / "results.json").read_text())["runs"] == doc["runs"]

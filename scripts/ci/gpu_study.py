"""The last stage of ``bash .ci/dev gpu``: the recipe study's candidate on the GPU.

The quickstart's recipe (the recipe study's choice: categorical over 64 bins, patch 16, dim 192,
4 layers) pretrained in bf16, compiled, on the synthetic data it generates where it runs, for a
wall-clock budget, then probed, with label efficiency (``--shots``), on a labelled set made
beforehand (a TorchSig set as the recipe study makes it: ``studies/torchsig_data/
torchsig_data.py``; nothing large is committed), beside random init, classical features and
chance. One summary line (MFU and the accuracies), ``OUT/summary.json`` and, where
``$IQTRAIN_GPU_SUMMARY`` is set, one ``{"kind": "study"}`` line there::

    python scripts/ci/gpu_study.py IQTRAIN OUT --probe-data 'torchsig_report/*.sigmf-meta'

The step count is the budget over the compiled step time the bench stage measured at this very
shape (bench/test_step.py, its line in ``$IQTRAIN_GPU_SUMMARY``), or over ``--step-ms``; no
calibration run. Without either, DEFAULT_STEPS. Without ``--probe-data`` the probe reads a
labelled synthetic set it generates (the line says so). ``--tiny`` runs the same script at a
tiny size on the CPU (CI's smoke test of it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.toml"
BUDGET_S = 20.0
MIN_STEPS, MAX_STEPS, DEFAULT_STEPS = 100, 20000, 1000
# The bench's compiled, deterministic step at the study's shape (bench/test_step.py).
BENCH_VARIANT = "cuda_study_compiled_deterministic"
SHOTS = "1,5,10"
SEEDS = 3

GPU = [
    "training.device=cuda",
    "training.precision=bf16",
    "training.compile=true",
    "data.batch_size=256",
    "data.val_batch_size=256",
]
TINY = [
    "data.synthetic.train_recordings=2",
    "data.synthetic.val_recordings=1",
    "data.synthetic.samples=16384",
    "model.dim=32",
    "model.layers=1",
    "model.heads=2",
    "data.batch_size=8",
]


def _iqtrain(exe: str, *args: str) -> str:
    proc = subprocess.run([exe, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(
            f"gpu study: iqtrain {args[0]} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return proc.stdout


def _records(attempt: Path, kind: str) -> list[dict]:
    lines = (attempt / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def bench_step_s(summary: Path) -> float | None:
    """The compiled step time the bench stage wrote to the GPU stage's summary, if any."""
    if not summary.is_file():
        return None
    found = None
    for text in summary.read_text().splitlines():
        try:
            rec = json.loads(text)
        except ValueError:
            continue
        if not (isinstance(rec, dict) and rec.get("kind") == "pytest"):
            continue
        for b in rec.get("benchmarks", []):
            info = b.get("extra_info", {})
            if info.get("variant") == BENCH_VARIANT and info.get("ms_per_step"):
                found = float(info["ms_per_step"]) / 1e3
    return found


def plan_steps(budget_s: float, step_s: float | None) -> int:
    """Steps for ``budget_s`` of training at ``step_s`` per step, within [MIN, MAX]."""
    if step_s is None or step_s <= 0:
        return DEFAULT_STEPS
    return min(MAX_STEPS, max(MIN_STEPS, int(budget_s / step_s)))


def _run(exe: str, run_dir: Path, steps: int, sets: list[str]) -> Path:
    warmup, decay = max(1, steps // 20), max(1, (3 * steps) // 10)
    # One validation and one checkpoint, at the end: the summary reads the last val record.
    own = [f"run.dir={json.dumps(str(run_dir))}", f"training.max_steps={steps}"]
    own += [f"schedule.warmup_steps={warmup}", f"schedule.decay_steps={decay}"]
    own += [f"training.eval_every={steps}", f"training.checkpoint_every={steps}"]
    own += ["probe.every=0", "training.keep_last=1", "training.log_every=100"]
    _iqtrain(exe, "run", str(QUICKSTART), *(f"--set={s}" for s in own + sets))
    return sorted((run_dir / "attempts").iterdir())[-1]


def _acc(doc: dict, name: str) -> str:
    score = doc[name]
    se = score.get("accuracy_se")
    return f"{score['accuracy']:.3f}" + ("" if se is None else f" ± {se:.3f}")


def _shot(row: dict, name: str) -> str:
    return f"{row[name]['mean']:.3f}±{row[name]['std']:.3f}"


def summary_line(info: dict, doc: dict) -> str:
    """The one line the stage prints."""
    mfu = "n/a" if info["mfu"] is None else f"{100 * info['mfu']:.1f}%"
    line = (
        f"gpu study: {info['steps']} steps in {info['train_s']:.0f} s "
        f"({1000 * info['step_s']:.1f} ms/step, MFU {mfu}), val loss {info['val_loss']:.4f} "
        f"(NMSE {info['val_nmse']:.4f}); probe on {info['probe_set']}: pretrained "
        f"{_acc(doc, 'pretrained')}, random init {_acc(doc, 'random_init')}, classical "
        f"{_acc(doc, 'classical')}, chance {doc['chance']:.3f}"
    )
    for row in doc.get("shots", []):
        line += (
            f"; K={row['k']}: pretrained {_shot(row, 'pretrained')}, random "
            f"{_shot(row, 'random_init')}, classical {_shot(row, 'classical')}, combined "
            f"{_shot(row, 'combined')}"
        )
    return line


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("iqtrain", help="the iqtrain executable")
    p.add_argument("out", type=Path, help="a directory for the runs, data and summary.json")
    p.add_argument("--probe-data", help="labelled .sigmf-meta glob (a TorchSig set)")
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="training wall-clock budget")
    p.add_argument("--step-ms", type=float, help="the step time (default: the bench stage's)")
    p.add_argument("--tiny", action="store_true", help="a tiny CPU run (CI's smoke test)")
    args = p.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sets = [f"data.synthetic.cache_dir={json.dumps(str(out / 'cache'))}"]
    sets += TINY if args.tiny else GPU
    t0 = time.monotonic()
    summary = os.environ.get("IQTRAIN_GPU_SUMMARY")
    if args.tiny:
        steps, step_s = 6, None
    else:
        step_s = args.step_ms / 1e3 if args.step_ms else None
        if step_s is None and summary:
            step_s = bench_step_s(Path(summary))
        steps = plan_steps(args.budget_s, step_s)
    attempt = _run(args.iqtrain, out / "run", steps, sets)
    train, val = _records(attempt, "train"), _records(attempt, "val")
    mfus = [r["mfu"] for r in train[5:] if "mfu" in r]
    probe_set = args.probe_data
    if probe_set is None:
        n = 35 if args.tiny else 280
        _iqtrain(args.iqtrain, "synth", str(out / "probe"), "--annotations", str(n))
        probe_set = str(out / "probe" / "*.sigmf-meta")
    shots = ["--shots", "1,2" if args.tiny else SHOTS, "--seeds", str(2 if args.tiny else SEEDS)]
    folds = ["--folds", "3"] if args.tiny else []
    probe = _iqtrain(
        args.iqtrain, "probe", str(attempt), "--data", probe_set, *shots, *folds, "--json"
    )
    doc = json.loads(probe.strip().splitlines()[-1])
    info = {
        "steps": steps,
        "step_s": statistics.median(r["step_time_s"] for r in train),
        "planned_step_s": step_s,
        "train_s": sum(r["step_time_s"] for r in train),
        "mfu": statistics.median(mfus) if mfus else None,
        "val_loss": val[-1]["loss"],
        "val_nmse": val[-1]["nmse"],
        "probe_set": args.probe_data or "a synthetic labelled set (no --probe-data)",
        "wall_s": time.monotonic() - t0,
        "attempt": str(attempt),
    }
    (out / "summary.json").write_text(json.dumps({"run": info, "probe": doc}, indent=1))
    line = summary_line(info, doc)
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps({"kind": "study", "line": line, **info}) + "\n")
    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

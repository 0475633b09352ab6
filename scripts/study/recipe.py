"""The recipe study: which pretraining recipe gives features worth probing (issue 17, part 4).

Every candidate pretrains on the quickstart's data (``iqtrain synth``: BPSK/QPSK/8PSK/16QAM/
64QAM/GMSK/CPFSK bursts) for the same wall-clock budget on this machine, then ``iqtrain probe``
scores its features on labelled TorchSig recordings (scripts/study/torchsig_data.py: another
generator, another class set, never trained on), beside a random-init model of the same config,
twelve classical AMC features through the same windows and folds, and chance::

    python scripts/study/recipe.py --select '/work/study_data/torchsig_select/*.sigmf-meta' \\
        [--report '/work/study_data/torchsig_report/*.sigmf-meta' --choose NAME] \\
        [--budget-s 600] [--only NAME ...] --out study/

The budget. A candidate's step count is what fits into ``--budget-s`` at its own speed: a
calibration run of ``CALIBRATION_STEPS`` steps measures the median step time (after the first
two), and the real run takes ``budget / step time`` steps (validation and the probe come on top,
the same for all). Every candidate is calibrated first, one after the other, so they are timed
under the same conditions (the machine is shared: a later run may take longer in wall time,
never more steps); ``--out/calibration.json`` keeps the times. The schedule scales with the
steps (warmup 5%, decay 30%, as the quickstart).

The other way round (``--pretrain-on TRAIN VAL``): every candidate pretrains on these labelled
or unlabelled recordings instead (e.g. TorchSig's, generated with another seed), and ``--select``
/ ``--report`` are then ``iqtrain synth`` recordings, probed ``--by iqtrain:snr_db``::

    python scripts/study/recipe.py --pretrain-on '/work/study_data/torchsig_pre/*.sigmf-meta' \\
        '/work/study_data/torchsig_preval/*.sigmf-meta' --by iqtrain:snr_db \\
        --select '/work/study_data/synth_select/*.sigmf-meta' --only cat64-p16-d192x4 \\
        --out study_ts/

On a GPU, the same study at a longer budget (every run, calibration included, gets the
``--set`` overrides after its candidate's own)::

    python scripts/study/recipe.py --select '/work/study_data/torchsig_select/*.sigmf-meta' \\
        --set training.device=cuda --set training.precision=bf16 --set training.compile=true \\
        --budget-s 3600 --only cat64-p16-d192x4 --out study_gpu/

Held-out discipline: candidates are compared on ``--select`` only (seed 1 of the TorchSig
generator). ``--report`` (seed 2) is probed once, for the recipe chosen from the select table
(``--choose``), and is never used to choose anything. Each run's probe JSON is kept in ``--out``,
and ``--out/table.md`` gathers the table.
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
CALIBRATION_STEPS = 8

#: name -> --set overrides on the quickstart. The quickstart: P 8, N 64 (512 samples), dim 192,
#: 4 layers, "mse".
CANDIDATES: dict[str, list[str]] = {
    "mse-p8-d192x4": [],
    "cat64-p8-d192x4": ["model.objective=categorical", "model.bins=64"],
    "cat128-p8-d192x4": ["model.objective=categorical", "model.bins=128", "model.bin_range=4.0"],
    "cat64-p16-d192x4": [
        "model.objective=categorical",
        "model.bins=64",
        "data.patch_len=16",
        "data.seq_patches=32",
    ],
    # The chosen recipe with twice the bins (finer steps over the same +-4 range).
    "cat128-p16-d192x4": [
        "model.objective=categorical",
        "model.bins=128",
        "model.bin_range=4.0",
        "data.patch_len=16",
        "data.seq_patches=32",
    ],
    # The chosen recipe on 8x the recordings (256): the same model and steps, more
    # distinct bursts (the quickstart's 16384 windows are seen twice in its 1095 steps).
    "cat64-p16-d192x4-r256": [
        "model.objective=categorical",
        "model.bins=64",
        "data.patch_len=16",
        "data.seq_patches=32",
        "data.synthetic.train_recordings=256",
    ],
    "cat64-p8-d128x6": [
        "model.objective=categorical",
        "model.bins=64",
        "model.dim=128",
        "model.layers=6",
        "model.heads=4",
    ],
}


def _iqtrain(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "iqtrain", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False, cwd=REPO)


def _checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


#: ``--pretrain-on``'s data sets (``data.train`` and ``data.val``), or none: the quickstart's.
PRETRAIN_ON: list[str] = []
#: ``--set`` overrides for every run, after the candidate's own (e.g. a GPU study's device).
EXTRA: list[str] = []


def _sets(name: str, run_dir: Path, steps: int, evals: int) -> list[str]:
    warmup, decay = max(1, steps // 20), max(1, (3 * steps) // 10)
    every = max(1, steps // evals)
    out = [f"run.dir={json.dumps(str(run_dir))}", f"training.max_steps={steps}"]
    out += [f"schedule.warmup_steps={warmup}", f"schedule.decay_steps={decay}"]
    out += [f"training.eval_every={every}", f"training.checkpoint_every={steps}"]
    out += ["probe.every=0", "training.keep_last=1"]
    return out + CANDIDATES[name] + PRETRAIN_ON + EXTRA


def _attempt(run_dir: Path) -> Path:
    return sorted((run_dir / "attempts").iterdir())[-1]


def _records(attempt: Path, kind: str) -> list[dict]:
    lines = (attempt / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def calibrate(name: str, out: Path) -> float:
    """Median seconds per step of ``name`` over a short run (the first two steps excluded)."""
    run_dir = out / "calibration" / name
    sets = _sets(name, run_dir, CALIBRATION_STEPS, 1)
    _checked(_iqtrain("run", str(QUICKSTART), *(f"--set={s}" for s in sets)), f"{name} calib")
    times = [r["step_time_s"] for r in _records(_attempt(run_dir), "train")][2:]
    return statistics.median(times)


def calibrations(names: list[str], out: Path) -> dict[str, float]:
    """Seconds per step of every candidate, measured back to back (kept in calibration.json:
    a second invocation reuses them)."""
    path = out / "calibration.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    for name in names:
        if name not in known:
            # A shared machine makes every step slower, so the budget would buy fewer steps than
            # the idle machine's 10 minutes (the first table's calibration ran at about 3x the
            # idle step time: README "The recipe study").
            load = os.getloadavg()[0]
            if load > 0.5:
                print(f"warning: calibrating {name} at load {load:.2f}", file=sys.stderr)
            known[f"{name}.load_1min"] = round(load, 2)
            known[name] = calibrate(name, out)
            path.write_text(json.dumps(known, indent=1))
            print(f"calibrated {name}: {known[name]:.3f} s/step", flush=True)
    return known


def pretrain(name: str, out: Path, budget_s: float, step_s: float) -> tuple[Path, dict]:
    steps = max(10, int(budget_s / step_s))
    run_dir = out / "runs" / name
    t0 = time.monotonic()
    sets = _sets(name, run_dir, steps, 4)
    _checked(_iqtrain("run", str(QUICKSTART), *(f"--set={s}" for s in sets)), f"{name} run")
    attempt = _attempt(run_dir)
    val = _records(attempt, "val")
    train_s = sum(r["step_time_s"] for r in _records(attempt, "train"))
    info = {
        "name": name,
        "sets": CANDIDATES[name] + PRETRAIN_ON + EXTRA,
        "calibrated_step_s": step_s,
        "steps": steps,
        "train_s": train_s,
        "wall_s": time.monotonic() - t0,
        "val_loss": val[-1]["loss"],
        "val_nmse": val[-1].get("nmse", val[-1]["loss"]),
        "baseline_zero": val[0].get("baseline_zero_loss"),
        "baseline_copy": val[0].get("baseline_copy_last_loss"),
    }
    return attempt, info


def probe(attempt: Path, data: str, out_json: Path, by: str) -> dict:
    args = ["probe", str(attempt), "--data", data, "--json", "--layer", "all", "--by", by]
    proc = _checked(_iqtrain(*args), f"probe of {attempt}")
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    out_json.write_text(json.dumps(doc, indent=1))
    return doc


def _row(info: dict, doc: dict) -> str:
    best = max(doc["by_layer"], key=lambda r: r["pretrained"])
    return (
        f"| {info['name']} | {info['steps']} | {info['train_s']:.0f} | {info['val_loss']:.4f} | "
        f"{info['val_nmse']:.4f} | {doc['pretrained']['accuracy']:.3f} | "
        f"{best['pretrained']:.3f} (layer {best['layer']}) | "
        f"{doc['random_init']['accuracy']:.3f} | "
        f"{doc['classical']['accuracy']:.3f} | {doc['chance']:.3f} |"
    )


HEADER = (
    "| recipe | steps | train s | val loss | val NMSE | probe (final layer) | probe (best layer) "
    "| random init | classical | chance |\n|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--select", required=True, help="labelled data the recipe is chosen on")
    p.add_argument("--report", help="held-out labelled data, probed for --choose only")
    p.add_argument("--choose", help="the chosen recipe (after reading the select table)")
    p.add_argument("--budget-s", type=float, default=600.0)
    p.add_argument("--only", nargs="+", choices=sorted(CANDIDATES), default=list(CANDIDATES))
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--by", default="torchsig:snr_db", help="the probe's per-SNR annotation key")
    p.add_argument(
        "--pretrain-on",
        nargs=2,
        metavar=("TRAIN", "VAL"),
        help="pretrain on these recordings (globs) instead of the quickstart's synthetic data",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every run (calibration included), as iqtrain run --set",
    )
    args = p.parse_args()
    EXTRA[:] = args.sets
    if args.pretrain_on:
        train, val = (json.dumps([g]) for g in args.pretrain_on)
        PRETRAIN_ON[:] = [f"data.train={train}", f"data.val={val}"]
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    table = args.out / "table.md"
    rows = [HEADER] if not table.exists() else table.read_text().rstrip("\n").splitlines()
    names = args.only if not args.choose else []
    times = calibrations(names, args.out)
    for name in names:
        attempt, info = pretrain(name, args.out, args.budget_s, times[name])
        doc = probe(attempt, args.select, args.out / f"{name}.select.json", args.by)
        (args.out / f"{name}.run.json").write_text(json.dumps(info, indent=1))
        rows.append(_row(info, doc) + " select")
        table.write_text("\n".join(rows) + "\n")
        print(rows[-1], flush=True)
    if args.choose and args.report:
        attempt = _attempt(args.out / "runs" / args.choose)
        info = json.loads((args.out / f"{args.choose}.run.json").read_text())
        doc = probe(attempt, args.report, args.out / f"{args.choose}.report.json", args.by)
        rows.append(_row(info, doc) + " **report**")
        table.write_text("\n".join(rows) + "\n")
        print(rows[-1], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fine-tuning study: does pretraining pay? Accuracy against labels per class.

Venv: the project's (iqtrain installed; the fine-tunes and their evaluation run ``python -m
iqtrain``). Data: a pretrained attempt (the recipe study's chosen checkpoint,
studies/recipe/recipe.py) and two labelled TorchSig sets (studies/torchsig_data/torchsig_data.py,
seed 1 for ``--pool``, seed 2 for ``--report``). Results: studies/finetune/RESULTS.md.

Every cell fine-tunes a classifier (``model.objective = "classify"``, mean pooling, a new linear
head) on K labelled annotations per class of TorchSig recordings (``--pool``: seed 1 of
the TorchSig generator, 8 classes, 64 annotations of 4096 samples per class), twice at
the same recipe and the same steps: from the pretrained checkpoint (``--pretrained``: its trunk,
``[init] from``) and from random initialisation (the same config without ``[init]``). Beside
them, on the same K annotations per class: the twelve classical AMC features
(iqtrain/eval/classical.py) with iqtrain's logistic regression (``fit_logistic``, eval/probe.py),
and chance. Every number is the accuracy over the annotations of ``--report`` (seed 2 of the
same generator): an annotation's class is the argmax of the mean of its windows' log-probabilities
(the fine-tunes through ``iqtrain predict --per annotation``; the classical classifier's softmax
log-probabilities likewise), beside the accuracy over windows. K in 1, 5, 10, 50 and all (the
whole training pool: 56), three seeds each; the table gives mean +- std (n - 1) over the seeds
and the paired difference pretrained - random init::

    python studies/finetune/finetune.py --out study_ft/ \\
        --pool 'TORCHSIG_SEED1/*.sigmf-meta' --report 'TORCHSIG_SEED2/*.sigmf-meta' \\
        --pretrained RECIPE_RUN/attempts/0001 [--frozen]

On a GPU, the same study with every fine-tune on it (``--set`` overrides come after the
recipe's, for every fine-tune)::

    python studies/finetune/finetune.py --out study_ft_gpu/ --pool ... --report ... \\
        --pretrained ... --set training.device=cuda --set training.precision=bf16

The split. ``--pool`` is split once (seed ``SPLIT_SEED``): per class (sorted label names, a
class's annotations in file then annotation order, permuted by one generator) the first
``DEV_PER_CLASS`` (8) annotations are the dev set, every fine-tune's ``data.val``, and the rest
(56 per class) the training pool. A cell (K, seed) draws K annotations per class from the
training pool (one generator seeded by (DRAW_SEED, K, seed), classes in order); K = all takes
the whole pool, so its seeds differ only in ``run.seed`` (head initialisation, data order). The
drawn annotations are written as SigMF subsets under ``--out/data`` (each .sigmf-meta copied
with only the chosen annotations, the data file symlinked), listed in its ``subset.json``.

The recipe (``RECIPE``) was fixed before any number was seen: 300 steps, batch 32, AdamW lr 5e-4
(``--lr``; min_lr a tenth), warmup-stable-decay with 10% warmup and 30% linear decay, weight
decay 0.1, windows of the checkpoint's length on a grid of one window from each annotation's
start, validation every third of the run (``--steps`` scales all of these). The trunk's
``[model]`` keys and ``[data]`` patching (patch_len, seq_patches, norm, prefix_patches) are
copied from the pretrained attempt's config.toml, so the random-init model is the same network.

Held-out discipline: nothing is chosen on any number here. The dev set is only monitored (its
accuracy is recorded, never used to pick a checkpoint: every fine-tune is evaluated at its last
checkpoint, ``--from latest``, after the same number of steps); ``--report`` is read only for the
final numbers. The pretrained checkpoint was chosen by the recipe study on other data.

``--frozen``: a third fine-tune per cell from the pretrained checkpoint with
``model.freeze_trunk = true`` (the head alone trains: the linear probe, by training). ``--ks``,
``--seeds`` and ``--inits`` (classical, pretrained, random, frozen) run part of the grid (e.g.
one cell to time it); ``--eval api`` scores through ``iqtrain.load_pretrained`` and
``Pretrained.log_probs`` in this process instead of ``iqtrain predict`` (the same numbers; used
by itself where ``predict`` is missing). Chance is the majority class's share of the report
annotations (1/8 for TorchSig's balanced set). Draws for different K are independent (not
nested).

Output: ``--out/results.json`` (the split, the recipe, and every run: K, seed, init, report
accuracy over annotations and windows, dev accuracy, steps, wall and train time, attempt path,
the command) and ``--out/table.md``. Resumable: a run already in results.json is skipped (a run
directory left without a result is deleted and run again); a second invocation with another
recipe or split into the same ``--out`` is refused.

``--tiny``: a smoke test's sizes (6 steps, batch 8, 1 dev annotation per class, K in 1 and all,
seed 0 only), for a tiny pretrained attempt and tiny labelled sets (``iqtrain synth --annotations``;
tests/e2e/test_finetune_study.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
LABEL_KEY = "core:label"

SPLIT_SEED = 20261203
DRAW_SEED = 17
DEV_PER_CLASS = 8
KS: tuple[int | str, ...] = (1, 5, 10, 50, "all")
SEEDS = (0, 1, 2)

#: The fine-tune recipe, fixed before any number was seen (``--steps`` and ``--lr`` change it;
#: warmup, decay and the validation interval scale with the steps).
RECIPE = {
    "steps": 300,
    "batch_size": 32,
    "val_batch_size": 64,
    "lr": 5e-4,
    "weight_decay": 0.1,
    "grad_clip": 1.0,
    "warmup_frac": 0.1,
    "decay_frac": 0.3,
    "evals": 3,
}
TINY = {**RECIPE, "steps": 6, "batch_size": 8, "val_batch_size": 16}

#: The ``[model]`` keys that shape the trunk (what a fine-tune must share with its source), and
#: the training-only ones copied with them.
TRUNK_KEYS = ("dim", "layers", "heads", "mlp_hidden", "patch_len", "max_patches", "rope_theta")
COPIED_MODEL = (*TRUNK_KEYS, "dropout", "init_std")
COPIED_DATA = ("patch_len", "seq_patches", "norm", "prefix_patches")

INITS = ("pretrained", "random", "frozen")


# --------------------------------------------------------------------------- subprocesses


def _iqtrain(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "iqtrain", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)


def _checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _last_json(text: str) -> dict:
    """The JSON document a ``--json`` command printed (the whole output, or its last line)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return json.loads(text.strip().splitlines()[-1])


# --------------------------------------------------------------------------- the split


def read_annotations(pattern: str, key: str) -> list[tuple[str, int, str]]:
    """``(meta path, annotation index, label)`` of every annotation carrying ``key``, files in
    sorted order, annotations in file order."""
    import glob

    metas = sorted(glob.glob(pattern))
    if not metas:
        raise SystemExit(f"{pattern}: matches no file")
    out = []
    for meta in metas:
        doc = json.loads(Path(meta).read_text())
        for i, ann in enumerate(doc.get("annotations", [])):
            if key in ann:
                out.append((os.path.abspath(meta), i, str(ann[key])))
    return out


def split_pool(
    items: list[tuple[str, int, str]], dev_per_class: int
) -> tuple[list[str], dict[str, list], dict[str, list]]:
    """Classes, the dev set and the training pool, per class (one generator, SPLIT_SEED)."""
    by_class: dict[str, list] = defaultdict(list)
    for item in items:
        by_class[item[2]].append(item)
    classes = sorted(by_class)
    rng = np.random.default_rng(SPLIT_SEED)
    dev, pool = {}, {}
    for c in classes:
        perm = rng.permutation(len(by_class[c]))
        if len(perm) <= dev_per_class:
            raise SystemExit(f"class {c}: {len(perm)} annotations, not more than the dev set's")
        dev[c] = sorted(by_class[c][i] for i in perm[:dev_per_class])
        pool[c] = sorted(by_class[c][i] for i in perm[dev_per_class:])
    return classes, dev, pool


def draw(pool: dict[str, list], classes: list[str], k: int, seed: int) -> list:
    """K annotations per class from the training pool (the whole pool at its size)."""
    rng = np.random.default_rng([DRAW_SEED, k, seed])
    chosen = []
    for c in classes:
        if k >= len(pool[c]):
            chosen += pool[c]
            continue
        idx = rng.choice(len(pool[c]), size=k, replace=False)
        chosen += [pool[c][i] for i in sorted(idx)]
    return chosen


def write_subset(items: list, dest: Path) -> str:
    """SigMF recordings holding only ``items``' annotations (data files symlinked) in ``dest``;
    their glob. An existing subset must list the same annotations."""
    listing = [list(x) for x in sorted(items)]
    if (dest / "subset.json").is_file():
        if json.loads((dest / "subset.json").read_text()) != listing:
            raise SystemExit(f"{dest}: holds another subset (another pool or split?)")
        return os.path.join(dest, "*.sigmf-meta")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    chosen: dict[str, set[int]] = defaultdict(set)
    for meta, i, _ in items:
        chosen[meta].add(i)
    for n, (meta, keep) in enumerate(sorted(chosen.items())):
        doc = json.loads(Path(meta).read_text())
        doc["annotations"] = [a for i, a in enumerate(doc["annotations"]) if i in keep]
        # the source's name after a number: two pools may hold files of the same name
        stem = f"{n:03d}_{Path(meta).name.removesuffix('.sigmf-meta')}"
        data = doc["global"].pop("core:dataset", None) or meta.removesuffix("-meta") + "-data"
        data = os.path.join(os.path.dirname(meta), data)
        (tmp / f"{stem}.sigmf-meta").write_text(json.dumps(doc, indent=1))
        os.symlink(os.path.realpath(data), tmp / f"{stem}.sigmf-data")
    (tmp / "subset.json").write_text(json.dumps(listing))
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)
    return os.path.join(dest, "*.sigmf-meta")


# --------------------------------------------------------------------------- fine-tunes


def base_config(pretrained: Path, recipe: dict, label_key: str) -> tuple[dict, int]:
    """The fine-tune config (random init; no run.dir or data yet) and its window length."""
    from_cfg = tomllib.loads((pretrained / "config.toml").read_text())
    m, d = from_cfg["model"], from_cfg["data"]
    steps = recipe["steps"]
    window = d["patch_len"] * d["seq_patches"]
    tables = {
        "run": {"dir": "runs", "seed": 0},
        "data": {
            **{k: d[k] for k in COPIED_DATA if k in d},
            "stride": window,
            "batch_size": recipe["batch_size"],
            "val_batch_size": recipe["val_batch_size"],
            "label_key": label_key,
        },
        "model": {
            **{k: m[k] for k in COPIED_MODEL if k in m},
            "objective": "classify",
            "pool": "mean",
            "freeze_trunk": False,
        },
        "optimizer": {
            "lr": recipe["lr"],
            "min_lr": recipe["lr"] / 10,
            "weight_decay": recipe["weight_decay"],
            "grad_clip": recipe["grad_clip"],
        },
        "schedule": {
            "kind": "wsd",
            "warmup_steps": max(1, round(steps * recipe["warmup_frac"])),
            "decay_steps": max(1, round(steps * recipe["decay_frac"])),
            "decay_shape": "linear",
        },
        "training": {
            "device": "cpu",
            "precision": "fp32",
            "max_steps": steps,
            "eval_every": max(1, steps // recipe["evals"]),
            "checkpoint_every": steps,
            "keep_last": 1,
            "log_every": max(1, steps // 15),
        },
        "probe": {"every": 0},
    }
    return tables, window


def _sets(run_dir: Path, seed: int, train: str, val: str, init: str, args) -> list[str]:
    out = [
        f"run.dir={json.dumps(str(run_dir))}",
        f"run.seed={seed}",
        f"data.train={json.dumps([train])}",
        f"data.val={json.dumps([val])}",
    ]
    if init in ("pretrained", "frozen"):
        out += [
            f"init.from={json.dumps(str(args.pretrained))}",
            f"init.which={json.dumps(args.which)}",
        ]
    if init == "frozen":
        out.append("model.freeze_trunk=true")
    return out + args.sets


def _attempt(run_dir: Path) -> Path:
    return sorted((run_dir / "attempts").iterdir())[-1]


def _records(attempt: Path, kind: str) -> list[dict]:
    lines = (attempt / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("kind") == kind]


def fine_tune(config: Path, run_dir: Path, sets: list[str]) -> tuple[Path, dict]:
    if run_dir.exists():  # an interrupted run: no result was recorded for it
        print(f"  removing {run_dir} (no result recorded)", flush=True)
        shutil.rmtree(run_dir)
    t0 = time.monotonic()
    cmd = ["run", str(config), *(f"--set={s}" for s in sets)]
    _checked(_iqtrain(*cmd), f"iqtrain run {run_dir.name}")
    wall = time.monotonic() - t0
    attempt = _attempt(run_dir)
    train, val = _records(attempt, "train"), _records(attempt, "val")
    return attempt, {
        "steps": train[-1]["step"] if train else 0,
        "train_s": sum(r.get("step_time_s", 0.0) for r in train),
        "wall_s": wall,
        "dev_accuracy": val[-1].get("accuracy") if val else None,
        "dev_loss": val[-1].get("loss") if val else None,
        "command": ["iqtrain", *cmd],
    }


# --------------------------------------------------------------------------- evaluation


def per_annotation(log_probs: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> dict:
    """Window accuracy, and annotation accuracy by the argmax of the mean window log-prob."""
    pred = log_probs.argmax(axis=1)
    _, inverse = np.unique(groups, return_inverse=True)
    sums = np.zeros((inverse.max() + 1, log_probs.shape[1]))
    np.add.at(sums, inverse, log_probs)
    truth = np.zeros(inverse.max() + 1, dtype=np.int64)
    truth[inverse] = labels
    return {
        "accuracy": float((sums.argmax(axis=1) == truth).mean()),
        "window_accuracy": float((pred == labels).mean()),
        "annotations": int(len(truth)),
        "windows": int(len(labels)),
    }


_REPORT_CACHE: dict = {}


def report_windows(report: str, window: int, classes, key: str):
    """The report set's labelled windows (one grid of ``window``, read once)."""
    from iqtrain.data.windows import labelled_windows

    tag = (report, window, tuple(classes), key)
    if tag not in _REPORT_CACHE:
        _REPORT_CACHE[tag] = labelled_windows(report, window, classes=classes, key=key)
    return _REPORT_CACHE[tag]


PREDICT_MISSING = False


def evaluate(attempt: Path, args, window: int) -> dict:
    """Report-set accuracy of a fine-tune's last checkpoint: ``iqtrain predict`` (over
    annotations, and over windows), or iqtrain's Python API where ``predict`` is missing."""
    global PREDICT_MISSING
    if not PREDICT_MISSING and args.eval == "predict":
        base = ["predict", str(attempt), "--data", args.report, "--from", "latest", "--json"]
        proc = _iqtrain(*base, "--per", "annotation")
        if proc.returncode == 2 and "invalid choice: 'predict'" in proc.stderr:
            print("  iqtrain predict is missing: the Python API evaluates", flush=True)
            PREDICT_MISSING = True
        else:
            doc = _last_json(_checked(proc, f"iqtrain predict {attempt}").stdout)
            keep = ("accuracy", "class_accuracy", "window_accuracy", "windows", "step")
            out = {k: doc[k] for k in keep if k in doc}
            out["annotations"] = doc.get("labelled", len(doc.get("rows", [])))
            out["confusion"] = doc.get("confusion")
            if "window_accuracy" not in doc and not args.no_window_accuracy:
                proc = _iqtrain(*base, "--per", "window")
                wdoc = _last_json(_checked(proc, f"iqtrain predict --per window {attempt}").stdout)
                out["window_accuracy"] = wdoc["accuracy"]
                out["windows"] = len(wdoc["rows"]) if "rows" in wdoc else None
            out["how"] = "iqtrain predict"
            return out
    from iqtrain import load_pretrained

    p = load_pretrained(attempt, which="latest")
    ls = report_windows(args.report, p.window, p.classes, args.label_key)
    out = per_annotation(p.log_probs(ls.batches()), ls.labels, ls.groups)
    return {**out, "step": p.step, "how": "python api (load_pretrained, log_probs)"}


def classical(train_glob: str, args, window: int) -> dict:
    """The twelve classical features of the same training windows, iqtrain's logistic
    regression on them, scored on the report set like the fine-tunes."""
    import torch

    from iqtrain.data.windows import labelled_windows
    from iqtrain.eval.features import classical_matrix
    from iqtrain.eval.logistic import fit_logistic

    t0 = time.monotonic()
    train = labelled_windows(train_glob, window, key=args.label_key)
    fit = fit_logistic(classical_matrix(train), train.labels, len(train.classes))
    report = report_windows(args.report, window, train.classes, args.label_key)
    tag = ("classical", args.report, window, train.classes)
    if tag not in _REPORT_CACHE:
        _REPORT_CACHE[tag] = classical_matrix(report)
    z = (_REPORT_CACHE[tag].double() - fit.mean) / fit.std
    log_probs = torch.log_softmax(z @ fit.weight + fit.bias, dim=1).numpy()
    out = per_annotation(log_probs, report.labels, report.groups)
    return {**out, "train_windows": len(train), "wall_s": time.monotonic() - t0}


# --------------------------------------------------------------------------- the table


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}"


def table(doc: dict, field: str = "accuracy") -> str:
    runs = doc["runs"]
    names = {
        "pretrained": "pretrained fine-tune",
        "random": "random-init fine-tune",
        "diff": "pretrained − random",
        "frozen": "frozen trunk (head only)",
        "classical": "classical + LR",
    }
    present = {r["init"] for r in runs} | {"diff"}
    columns = [c for c in names if c in present]
    head = ["K per class", "seeds", *(names[c] for c in columns), "chance"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ks = sorted({(r["k"], r["k_name"]) for r in runs})
    for k, name in ks:
        cell = {
            c: {
                r["seed"]: r[field]
                for r in runs
                if r["k"] == k and r["init"] == c and r.get(field) is not None
            }
            for c in names
        }
        both = sorted(set(cell["pretrained"]) & set(cell["random"]))
        cell["diff"] = {s: cell["pretrained"][s] - cell["random"][s] for s in both}
        seeds = len({r["seed"] for r in runs if r["k"] == k})
        row = [f"{name} ({k})" if name == "all" else str(k), str(seeds)]
        row += [_spread([v for _, v in sorted(cell[c].items())]) for c in columns]
        row.append(f"{doc['chance']:.3f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_table(doc: dict, out: Path) -> None:
    text = [
        f"# Does pretraining pay? ({doc['pretrained']})",
        "",
        f"Report set {doc['report']} ({doc['report_annotations']} annotations): accuracy over "
        "annotations (argmax of the mean window log-probability), mean ± std over seeds; "
        f"every fine-tune {doc['recipe']['steps']} steps, evaluated at its last checkpoint.",
        "",
        table(doc),
        "",
        "Accuracy over windows:",
        "",
        table(doc, "window_accuracy"),
        "",
    ]
    (out / "table.md").write_text("\n".join(text))


# --------------------------------------------------------------------------- main


def _k_value(text: str) -> int | str:
    return "all" if text == "all" else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--pool", required=True, help="labelled SigMF: dev set and training pool")
    p.add_argument("--report", required=True, help="held-out labelled SigMF: final numbers only")
    p.add_argument("--pretrained", type=Path, required=True, help="the pretrained attempt dir")
    p.add_argument("--which", default="latest", help="its checkpoint (latest, best, step_N)")
    p.add_argument("--label-key", default=LABEL_KEY)
    p.add_argument("--ks", nargs="+", type=_k_value, help="K per class (default 1 5 10 50 all)")
    p.add_argument("--seeds", nargs="+", type=int, help="draw seeds (default 0 1 2)")
    p.add_argument("--steps", type=int, help="fine-tune steps (default 300)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 5e-4; min_lr a tenth)")
    p.add_argument("--frozen", action="store_true", help="also the frozen-trunk fine-tune")
    p.add_argument(
        "--inits",
        nargs="+",
        choices=("classical", *INITS),
        help="only these columns (default classical pretrained random, and frozen with --frozen)",
    )
    p.add_argument("--tiny", action="store_true", help="a smoke test's sizes")
    p.add_argument(
        "--eval",
        choices=("predict", "api"),
        default="predict",
        help="score through `iqtrain predict` (the Python API where it is missing) or the API",
    )
    p.add_argument(
        "--no-window-accuracy",
        action="store_true",
        help="skip the second `iqtrain predict --per window` pass",
    )
    p.add_argument(
        "--set",
        dest="sets",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every fine-tune, after the recipe's (as iqtrain run --set)",
    )
    args = p.parse_args(argv)
    args.pretrained = args.pretrained.resolve()
    recipe = dict(TINY if args.tiny else RECIPE)
    if args.steps is not None:
        recipe["steps"] = args.steps
    if args.lr is not None:
        recipe["lr"] = args.lr
    args.recipe = recipe
    args.dev_per_class = 1 if args.tiny else DEV_PER_CLASS
    args.ks = args.ks or ([1, "all"] if args.tiny else list(KS))
    args.seeds = args.seeds or ([0] if args.tiny else list(SEEDS))
    return args


def _load_results(path: Path, header: dict) -> dict:
    if not path.exists():
        return {**header, "runs": []}
    doc = json.loads(path.read_text())
    for key in ("pool", "pretrained", "which", "recipe", "sets", "split"):
        if doc.get(key) != header[key]:
            raise SystemExit(
                f"{path}: was made with another {key} ({doc.get(key)!r}, now {header[key]!r}): "
                "use another --out"
            )
    return {**doc, **header, "runs": doc["runs"]}


def _save(doc: dict, out: Path) -> None:
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(out / "results.json")
    write_table(doc, out)


def main(argv: list[str] | None = None) -> int:  # noqa: C901, PLR0915
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from iqtrain.config.schema import dumps_toml

    items = read_annotations(args.pool, args.label_key)
    classes, dev, pool = split_pool(items, args.dev_per_class)
    smallest = min(len(v) for v in pool.values())
    ks = [(smallest if k == "all" else k, str(k)) for k in args.ks]
    for k, _ in ks:
        if k > smallest:
            raise SystemExit(f"--ks {k}: the training pool holds {smallest} of some class")
    report = read_annotations(args.report, args.label_key)
    counts = [sum(1 for x in report if x[2] == c) for c in {x[2] for x in report}]
    config, window = base_config(args.pretrained, args.recipe, args.label_key)
    cfg_path = out / "finetune.toml"
    cfg_path.write_text(dumps_toml(config))
    header = {
        "pool": args.pool,
        "report": args.report,
        "pretrained": str(args.pretrained),
        "which": args.which,
        "recipe": args.recipe,
        "sets": args.sets,
        "config": str(cfg_path),
        "classes": classes,
        "split": {
            "seed": SPLIT_SEED,
            "draw_seed": DRAW_SEED,
            "dev_per_class": args.dev_per_class,
            "pool_per_class": {c: len(v) for c, v in pool.items()},
        },
        "report_annotations": len(report),
        "chance": max(counts) / len(report),
        "window": window,
    }
    doc = _load_results(out / "results.json", header)
    done = {(r["k_name"], r["seed"], r["init"]) for r in doc["runs"]}
    dev_glob = write_subset([x for c in classes for x in dev[c]], out / "data" / "dev")
    inits = args.inits or ["classical", "pretrained", "random"] + (["frozen"] * args.frozen)
    total = len(ks) * len(args.seeds) * len(inits)
    n = 0
    print(
        f"fine-tune study: {len(items)} pool annotations, {len(classes)} classes, dev "
        f"{args.dev_per_class}/class, pool {smallest}/class; K {[k for k, _ in ks]}, seeds "
        f"{args.seeds}; {args.recipe['steps']} steps; report {len(report)} annotations",
        flush=True,
    )
    for k, k_name in ks:
        for seed in args.seeds:
            chosen = draw(pool, classes, k, seed)
            train_glob = write_subset(chosen, out / "data" / f"k{k_name}_s{seed}")
            for init in inits:
                n += 1
                tag = f"[{n}/{total}] K={k_name} seed {seed} {init}"
                if (k_name, seed, init) in done:
                    print(f"{tag}: done before, skipped", flush=True)
                    continue
                row = {"k": k, "k_name": k_name, "seed": seed, "init": init}
                if init == "classical":
                    row.update(classical(train_glob, args, window))
                else:
                    run_dir = out / "runs" / f"k{k_name}_s{seed}_{init}"
                    sets = _sets(run_dir, seed, train_glob, dev_glob, init, args)
                    attempt, info = fine_tune(cfg_path, run_dir, sets)
                    row.update(info, attempt=str(attempt))
                    row.update(evaluate(attempt, args, window))
                    if row.get("step") not in (None, args.recipe["steps"]):
                        print(f"  warning: evaluated at step {row['step']}", flush=True)
                doc["runs"].append(row)
                _save(doc, out)
                extra = ""
                if init != "classical":
                    dev_acc = row["dev_accuracy"]
                    dev_text = "-" if dev_acc is None else f"{dev_acc:.3f}"
                    extra = f"{row['steps']} steps in {row['wall_s']:.0f} s, dev {dev_text}, "
                wacc = row.get("window_accuracy")
                wtext = f", windows {wacc:.3f}" if wacc is not None else ""
                print(f"{tag}: {extra}report {row['accuracy']:.3f}{wtext}", flush=True)
    _save(doc, out)
    print(table(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""verify of a ``model.objective = "classify"`` attempt: best is the first maximum of the
validation accuracy, early stopping counts accuracy improvements, and ``classes`` is the same in
attempt.json and every checkpoint's state.json.

The attempt is a finished next-patch attempt turned into a classify one: its config names the
objective, its validation records become classify records (same lines, same count), and every
hash that binds them is recomputed, the manifest republished with ``publish_manifest`` (so a
verified forgery here is what a classify run writes, as far as verify can see)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_tables

from iqtrain.checkpoint.files import list_checkpoints
from iqtrain.config.schema import build_config
from iqtrain.evidence.manifest import publish_manifest
from iqtrain.evidence.verify import check_attempt
from iqtrain.storage import file_digest
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Validations and checkpoints at 4, 8, 12 (every one kept): a checkpoint at every validation,
# where a classify run may have saved its best.
TRAINING = {"checkpoint_every": 4, "keep_last": 0}
CLASSES = ["am", "bpsk", "qpsk"]


@pytest.fixture(scope="module")
def completed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("classify")
    cfg = build_config(tiny_tables(root / "run", root / "cache", **TRAINING))
    return run_attempt(cfg).attempt


def _copy(completed: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(completed.parent.parent, run)
    attempt = run / "attempts" / completed.name
    for p in attempt.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    return attempt


def _line(record: dict) -> bytes:
    return (json.dumps(record, allow_nan=False, separators=(",", ":")) + "\n").encode()


def _classify_record(old: dict, accuracy: float, best: bool, first: bool) -> dict:
    record = {
        "kind": "val",
        "step": old["step"],
        "loss": old["loss"],
        "accuracy": accuracy,
        "class_accuracy": {"am": accuracy, "bpsk": None, "qpsk": 1.0 - accuracy},
        "samples": old["samples"],
    }
    if first:
        record["baseline_majority_accuracy"] = 0.5
    return {**record, "best": best, "time_s": old.get("time_s", 0.0)}


def _classify_lines(stream: bytes, accuracy: dict[int, float]) -> tuple[list, dict, int]:
    """The stream's lines with every validation record a classify one (the validation at step
    s scored ``accuracy[s]``), those records by step, and the step of the first maximum."""
    lines = stream.splitlines(keepends=True)
    top, best_step, val = None, 0, {}
    for i, raw in enumerate(lines):
        old = json.loads(raw)
        if old["kind"] != "val":
            continue
        acc = accuracy[old["step"]]
        new = _classify_record(old, acc, top is None or acc > top, first=top is None)
        if new["best"]:
            top, best_step = acc, old["step"]
        val[old["step"]] = new
        lines[i] = _line(new)
    return lines, val, best_step


def _rewrite_state(ckpt: Path, edit) -> None:
    """Edit a checkpoint's state.json and bind it again in its checkpoint.json."""
    state = json.loads((ckpt / "state.json").read_text())
    edit(state)
    (ckpt / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    index = json.loads((ckpt / "checkpoint.json").read_text())
    index["files"]["state.json"] = file_digest(ckpt / "state.json")
    (ckpt / "checkpoint.json").write_text(json.dumps(index, indent=2, sort_keys=True))


def _classifier_weights(ckpt: Path) -> None:
    """The checkpoint's weights with a classifier's head over CLASSES (what verify checks the
    tensors against), bound again in its checkpoint.json."""
    from safetensors.numpy import load_file, save_file

    weights = ckpt / "model.safetensors"
    tensors = load_file(weights)
    dim = tensors["head.weight"].shape[1]
    tensors["head.weight"] = np.zeros((len(CLASSES), dim), np.float32)
    tensors["head.bias"] = np.zeros(len(CLASSES), np.float32)
    save_file(tensors, weights)
    index = json.loads((ckpt / "checkpoint.json").read_text())
    index["files"]["model.safetensors"] = file_digest(weights)
    (ckpt / "checkpoint.json").write_text(json.dumps(index, indent=2, sort_keys=True))


def _forge_classify(
    completed: Path,
    tmp_path: Path,
    accuracy: dict[int, float],
    *,
    stop_at: int | None = None,
    patience: int = 0,
    min_delta: float = 0.0,
    best_at: int | None = None,
) -> Path:
    """A copy of ``completed`` as a classify attempt whose validation at step s scored
    ``accuracy[s]``; ``stop_at``: it stopped early there (``patience``, ``min_delta``);
    ``best_at``: the step its manifest names best (default: the first maximum)."""
    attempt = _copy(completed, tmp_path)
    config = attempt / "config.toml"
    text = config.read_text()
    assert 'objective = "mse"' in text
    text = text.replace('objective = "mse"', 'objective = "classify"')
    text = text.replace("early_stop_patience = 0", f"early_stop_patience = {patience}")
    text = text.replace("early_stop_min_delta = 0.0", f"early_stop_min_delta = {min_delta!r}")
    config.write_text(text)
    config_sha = file_digest(config)["sha256"]

    metrics = attempt / "metrics.jsonl"
    lines, val, best_step = _classify_lines(metrics.read_bytes(), accuracy)

    ckpts = attempt / "checkpoints"
    kept = list_checkpoints(ckpts)
    if stop_at is not None:
        for ckpt in kept:
            if int(ckpt.name[5:]) > stop_at:
                shutil.rmtree(ckpt)
        kept = list_checkpoints(ckpts)
    n_records = 0
    for ckpt in kept:
        step = int(ckpt.name[5:])
        seen = [r for s, r in val.items() if s <= step]
        best_acc = max((r["accuracy"] for r in seen), default=None)

        def edit(state, step=step, best_acc=best_acc):
            n = state["metrics"]["records"]
            prefix = b"".join(lines[:n])
            state["config_sha256"] = config_sha
            state["metrics"] = {
                "records": n,
                "bytes": len(prefix),
                "sha256": hashlib.sha256(prefix).hexdigest(),
            }
            state["classes"] = list(CLASSES)
            state["loop"]["best_val_accuracy"] = best_acc
            if step == stop_at:
                state["loop"]["stale_validations"] = patience

        _classifier_weights(ckpt)
        _rewrite_state(ckpt, edit)
        n_records = json.loads((ckpt / "state.json").read_text())["metrics"]["records"]
    if stop_at is not None:
        lines = lines[:n_records]
    metrics.write_bytes(b"".join(lines))

    info = json.loads((attempt / "attempt.json").read_text())
    info["classes"] = list(CLASSES)
    if stop_at is not None:
        info["final_step"] = stop_at
    (attempt / "attempt.json").write_text(json.dumps(info, indent=2))
    (attempt / "manifest.json").unlink()
    best_step = best_at if best_at is not None else best_step
    best = val[best_step]
    publish_manifest(
        attempt,
        config_sha=config_sha,
        records=len(lines),
        inherited=None,
        checkpoints=kept,
        best=(ckpts / f"step_{best_step:08d}", best["loss"], best["accuracy"]),
        record=info,
        stopped_early=None
        if stop_at is None
        else {"step": stop_at, "best_step": best_step, "reason": "forged"},
    )
    for p in (config, metrics):
        p.chmod(0o644)  # the tests below edit them further
    return attempt


def _edit_json(path: Path, edit) -> None:
    obj = json.loads(path.read_text())
    edit(obj)
    path.write_text(json.dumps(obj))


def test_a_classify_attempt_verifies_with_best_by_accuracy(completed, tmp_path):
    # The accuracy peaks at step 8 and ties there at step 12: best is the first maximum.
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.75})
    assert json.loads((attempt / "attempt.json").read_text())["classes"] == CLASSES
    check = check_attempt(attempt)
    assert check.problems == [] and check.notes == []
    manifest = json.loads((attempt / "manifest.json").read_text())
    vals = [json.loads(x) for x in (attempt / "metrics.jsonl").read_text().splitlines()]
    at8 = next(r for r in vals if r["kind"] == "val" and r["step"] == 8)
    assert manifest["best"]["step"] == 8
    assert manifest["best"]["val_accuracy"] == 0.75
    assert manifest["best"]["val_loss"] == at8["loss"]
    assert set(manifest["best"]) == {"path", "step", "bytes", "sha256", "val_loss", "val_accuracy"}
    assert set(manifest["latest"]) == {"path", "step", "bytes", "sha256"}


@pytest.mark.parametrize("best_at", [4, 12], ids=["a lower accuracy", "a later tie"])
def test_best_must_be_the_first_maximum_of_accuracy(completed, tmp_path, best_at):
    # (what a loss-ordered check would accept: the forged records' losses are the run's)
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.75}, best_at=best_at)
    problems = check_attempt(attempt).problems
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"manifest.json best: step {best_at}, val_accuracy ")
    assert "the first of the highest accuracy) is step 8, accuracy 0.75" in problems[0]


@pytest.mark.parametrize("key", ["val_accuracy", "val_loss"])
def test_best_records_the_best_validations_accuracy_and_loss(completed, tmp_path, key):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    _edit_json(attempt / "manifest.json", lambda m: m["best"].update({key: 0.125}))
    problems = check_attempt(attempt).problems
    assert len(problems) == 1 and f"{key} 0.125" in problems[0], problems


def test_best_without_val_accuracy_fails_for_classify(completed, tmp_path):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    _edit_json(attempt / "manifest.json", lambda m: m["best"].pop("val_accuracy"))
    problems = check_attempt(attempt).problems
    assert len(problems) == 1 and "val_accuracy None" in problems[0], problems


def test_a_val_record_without_accuracy_is_one_problem(completed, tmp_path):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    metrics = attempt / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    i = max(i for i, x in enumerate(lines) if '"kind":"val"' in x)
    record = json.loads(lines[i])
    record["accuracy"] = None
    lines[i] = _line(record).decode()
    metrics.write_text("".join(lines))
    _edit_json(attempt / "manifest.json", lambda m: m["metrics"].update(file_digest(metrics)))
    problems = check_attempt(attempt).problems
    assert any("a val record lacks its accuracy: step 12" in p for p in problems), problems


def test_a_checkpoint_with_other_classes_is_a_mismatch_naming_its_state(completed, tmp_path):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    ckpt = attempt / "checkpoints" / "step_00000008"
    _rewrite_state(ckpt, lambda s: s.update(classes=["am", "qpsk"]))

    def rebind(m):  # a forger rewrites the manifest too: the classes check still fails
        for entry in [*m["checkpoints"], m["latest"], m["best"]]:
            if entry["path"].endswith(ckpt.name):
                entry.update(file_digest(ckpt / "checkpoint.json"))

    _edit_json(attempt / "manifest.json", rebind)
    problems = check_attempt(attempt).problems
    assert problems == [
        f"{ckpt / 'state.json'}: classes ['am', 'qpsk'] differ from attempt.json classes "
        "['am', 'bpsk', 'qpsk']"
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", "verify", str(attempt)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"MISMATCH {ckpt / 'state.json'}: classes" in proc.stdout, proc.stdout


def test_a_checkpoint_without_classes_and_attempt_json_without_them_fail(completed, tmp_path):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    (attempt / "manifest.json").unlink()  # without a manifest the checkpoints are checked too
    _edit_json(attempt / "attempt.json", lambda i: i.update(status="interrupted"))
    ckpt = attempt / "checkpoints" / "step_00000004"
    _rewrite_state(ckpt, lambda s: s.pop("classes"))
    assert check_attempt(attempt).problems == [
        f"{ckpt / 'state.json'}: classes None differ from attempt.json classes "
        "['am', 'bpsk', 'qpsk']"
    ]
    _edit_json(attempt / "attempt.json", lambda i: i.pop("classes"))
    assert check_attempt(attempt).problems == [
        "attempt.json classes: missing, but config.toml model.objective is 'classify'"
    ]
    _edit_json(attempt / "attempt.json", lambda i: i.update(classes=["qpsk", "am"]))
    problems = check_attempt(attempt).problems
    assert problems == ["attempt.json classes is ['qpsk', 'am'], not sorted and distinct"]


def test_a_next_patch_attempt_records_no_classes(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    assert check_attempt(attempt).problems == []
    _edit_json(attempt / "attempt.json", lambda i: i.update(classes=CLASSES))
    assert check_attempt(attempt).problems == [
        "attempt.json classes: recorded, but config.toml model.objective is 'mse'"
    ]
    _edit_json(attempt / "attempt.json", lambda i: i.pop("classes"))
    ckpt = list_checkpoints(attempt / "checkpoints")[0]
    _rewrite_state(ckpt, lambda s: s.update(classes=CLASSES))
    (attempt / "manifest.json").unlink()
    _edit_json(attempt / "attempt.json", lambda i: i.update(status="interrupted"))
    assert check_attempt(attempt).problems == [
        f"{ckpt / 'state.json'}: classes ['am', 'bpsk', 'qpsk'] differ from attempt.json "
        "classes None"
    ]


def test_a_next_patch_best_with_val_accuracy_fails(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    _edit_json(attempt / "manifest.json", lambda m: m["best"].update(val_accuracy=0.5))
    assert check_attempt(attempt).problems == [
        "manifest.json best: records val_accuracy, but config.toml model.objective is 'mse'"
    ]


def test_an_unreadable_config_keeps_the_loss_checks(completed, tmp_path):
    attempt = _forge_classify(completed, tmp_path, {4: 0.5, 8: 0.75, 12: 0.625})
    (attempt / "config.toml").write_text("not [toml")
    problems = check_attempt(attempt).problems
    assert any("config.toml" in p for p in problems), problems
    assert not any("classes" in p or "accuracy" in p for p in problems), problems


@pytest.mark.parametrize(
    ("accuracy", "ok"),
    [
        ({4: 0.5, 8: 0.55}, True),  # 0.55 is not above 0.5 + 0.1: one stale validation
        ({4: 0.5, 8: 0.65}, False),  # above it: an improvement, nothing stale
    ],
    ids=["stale", "improved"],
)
def test_early_stopping_counts_accuracy_improvements(completed, tmp_path, accuracy, ok):
    attempt = _forge_classify(
        completed,
        tmp_path,
        {**accuracy, 12: 0.0},
        stop_at=8,
        patience=1,
        min_delta=0.1,
    )
    problems = check_attempt(attempt).problems
    if ok:
        assert problems == []
    else:
        assert problems == [
            "manifest.json stopped_early: the validation records count 0 in a row without an "
            "improvement larger than 0.1, but training.early_stop_patience is 1"
        ]

"""Verification of attempts: the manifest against its files, crash status, leftovers, parents."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import tiny_tables

from iqtrain.config.schema import build_config
from iqtrain.errors import CheckpointError
from iqtrain.evidence.lineage import ParentRef
from iqtrain.evidence.lock import AttemptLock, attempt_status
from iqtrain.evidence.verify import check_attempt, verify_attempt
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TRAINING = {"checkpoint_every": 3, "keep_last": 0}  # step 3, 4 (best), 6, 8, 9, 12 on disk


@pytest.fixture(scope="module")
def completed(tmp_path_factory) -> Path:
    """One completed attempt (12 steps, validations at 4, 8, 12), copied by each test."""
    root = tmp_path_factory.mktemp("lineage")
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


def _config(completed: Path, tmp_path: Path):
    """The completed attempt's config, pointing at the copy's run dir (same synthetic data)."""
    cache = completed.parents[2] / "cache"
    return build_config(tiny_tables(tmp_path / "run", cache, **TRAINING))


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def _edit_manifest(attempt: Path, edit) -> None:
    path = attempt / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def _older(m):
    return next(e for e in m["checkpoints"] if e["step"] < m["latest"]["step"])


EDITS = {
    "best.sha256": lambda m: m["best"].update(sha256="0" * 64),
    "best.val_loss": lambda m: m["best"].update(val_loss=m["best"]["val_loss"] * 0.5),
    "best.step": lambda m: m["best"].update(
        {k: v for k, v in _older(m).items() if k != "val_loss"}
    ),
    "metrics.records": lambda m: m["metrics"].update(records=m["metrics"]["records"] - 1),
    "checkpoint.step": lambda m: m["checkpoints"][0].update(step=m["checkpoints"][0]["step"] + 1),
    "latest.path": lambda m: m.update(latest=dict(_older(m))),
    "unlisted checkpoint": lambda m: m["checkpoints"].pop(0),
    "missing key": lambda m: m.pop("latest"),
    "version": lambda m: m.update(version=7),
    "extra key": lambda m: m.update(note="trust me"),
    "duplicate checkpoint": lambda m: m["checkpoints"].append(dict(m["checkpoints"][0])),
    "absolute latest.path": lambda m: m["latest"].update(path=m["latest"]["path"]),  # below
    "inherited on a root attempt": lambda m: m.update(
        inherited_metrics={"records": 1, "bytes": 10, "sha256": "0" * 64}
    ),
    "wrong type": lambda m: m.update(checkpoints="all of them"),
    "data.sha256": lambda m: m["data"].update(sha256="0" * 64),
    "data.sample_rate": lambda m: m["data"].update(sample_rate=2e6),
    "data missing": lambda m: m.pop("data"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_manifest_fails_verify_and_refuses_resume(completed, tmp_path, edit):
    attempt = _copy(completed, tmp_path)
    assert verify_attempt(attempt) == []
    if edit == "absolute latest.path":
        _edit_manifest(
            attempt, lambda m: m["latest"].update(path=str(attempt / m["latest"]["path"]))
        )
    else:
        _edit_manifest(attempt, EDITS[edit])
    assert verify_attempt(attempt) != []
    proc = _cli("verify", attempt)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "MISMATCH" in proc.stdout and "Traceback" not in proc.stderr + proc.stdout
    cfg = _config(completed, tmp_path)
    with pytest.raises(CheckpointError, match=": failed verification: "):
        run_attempt(cfg, ParentRef(attempt))
    assert sorted(p.name for p in attempt.parent.iterdir()) == [attempt.name]


def test_resume_never_restarts_a_completed_attempt_from_an_older_latest(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    _edit_manifest(attempt, EDITS["latest.path"])
    proc = _cli("resume", "--attempt", attempt, "--set", "training.max_steps=16")
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "latest" in proc.stderr
    assert sorted(p.name for p in attempt.parent.iterdir()) == [attempt.name]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", ""])
def test_an_unreadable_manifest_is_one_line(completed, tmp_path, content):
    attempt = _copy(completed, tmp_path)
    (attempt / "manifest.json").write_text(content)
    proc = _cli("verify", attempt)
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    assert [line for line in proc.stdout.splitlines() if "manifest.json" in line]
    proc = _cli("resume", "--attempt", attempt)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_a_completed_attempt_without_its_manifest_fails(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    (attempt / "manifest.json").unlink()
    problems = verify_attempt(attempt)
    assert any("manifest.json: missing" in p for p in problems), problems
    assert _cli("verify", attempt).returncode == 1


def test_unreadable_attempt_json_and_state_json_are_one_line(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    (attempt / "attempt.json").write_text("{")
    proc = _cli("verify", attempt)
    assert proc.returncode == 1 and "attempt.json" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr
    proc = _cli("resume", "--attempt", attempt)
    assert proc.returncode == 2 and "attempt.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_verify_of_something_that_is_not_an_attempt_is_exit_2(tmp_path):
    for path in (tmp_path, tmp_path / "missing"):
        proc = _cli("verify", path)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("iqtrain: error: ") and "not an attempt" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


def test_leftovers_of_a_crash_are_notes_not_failures(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    ckpts = attempt / "checkpoints"
    shutil.copytree(ckpts / "step_00000003", ckpts / ".pruned-step_00000003-999")
    (ckpts / ".pruned-step_00000003-999" / "model.safetensors").unlink()  # half deleted
    (ckpts / ".tmp-step_00000013-999").mkdir()
    check = check_attempt(attempt)
    assert check.problems == []
    assert len(check.notes) == 2 and all("leftover" in n for n in check.notes)
    proc = _cli("verify", attempt)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.count("NOTE ") == 2


def test_a_killed_attempt_reads_as_crashed(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    (attempt / "manifest.json").unlink()
    info = json.loads((attempt / "attempt.json").read_text())
    info["status"] = "running"
    (attempt / "attempt.json").write_text(json.dumps(info))
    assert attempt_status(attempt) == "crashed"
    check = check_attempt(attempt)
    assert check.status == "crashed" and check.problems == []
    assert any("crashed" in n for n in check.notes)
    lock = AttemptLock(attempt).acquire()  # a live holder: it is running, not crashed
    try:
        assert attempt_status(attempt) == "running"
        cfg = _config(completed, tmp_path)
        with pytest.raises(CheckpointError, match="still running"):
            run_attempt(cfg, ParentRef(attempt))
    finally:
        lock.release()
    assert attempt_status(attempt) == "crashed"
    proc = _cli("report", attempt)
    assert proc.returncode == 0 and "crashed" in proc.stdout, proc.stdout + proc.stderr


def test_resume_says_which_checkpoint_it_skipped_and_why(completed, tmp_path, capfd):
    attempt = _copy(completed, tmp_path)
    (attempt / "manifest.json").unlink()
    info = json.loads((attempt / "attempt.json").read_text())
    info["status"] = "running"  # killed: no manifest, no lock holder
    (attempt / "attempt.json").write_text(json.dumps(info))
    bad = attempt / "checkpoints" / "step_00000012" / "model.safetensors"
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0x40
    bad.write_bytes(bytes(data))
    cfg = _config(completed, tmp_path)
    child = run_attempt(cfg, ParentRef(attempt)).attempt
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "skipped checkpoint" in line]
    assert len(lines) == 1 and "step_00000012" in lines[0] and "model.safetensors" in lines[0]
    parent = json.loads((child / "attempt.json").read_text())["parent"]
    assert parent["checkpoint"] == "step_00000009"
    assert [s["checkpoint"] for s in parent["skipped_checkpoints"]] == ["step_00000012"]
    assert "model.safetensors" in parent["skipped_checkpoints"][0]["reason"]
    assert verify_attempt(child) == []
    assert os.path.basename(child) == "0002"


def _rehash_manifest_entry(attempt: Path, key: str) -> None:
    """Forge: rewrite the manifest's entry for ``key`` to match the edited file."""
    from iqtrain.storage import file_digest

    manifest = json.loads((attempt / "manifest.json").read_text())
    manifest[key].update(file_digest(attempt / manifest[key]["path"]))
    (attempt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("target", ["config.toml", "metrics.jsonl"])
def test_a_forged_file_with_a_rewritten_manifest_still_fails(completed, tmp_path, target):
    attempt = _copy(completed, tmp_path)
    path = attempt / target
    if target == "config.toml":
        path.write_text(path.read_text().replace("batch_size = 8", "batch_size = 16"))
    else:
        lines = path.read_text().splitlines(keepends=True)
        first = json.loads(lines[0])
        first["loss"] = first["loss"] / 2
        path.write_text(json.dumps(first, separators=(",", ":")) + "\n" + "".join(lines[1:]))
    _rehash_manifest_entry(attempt, "config" if target == "config.toml" else "metrics")
    problems = verify_attempt(attempt)
    assert any(target in p for p in problems), problems
    proc = _cli("resume", "--attempt", attempt, "--from", "step_9")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert sorted(p.name for p in attempt.parent.iterdir()) == [attempt.name]


def test_attempt_json_is_checked_against_the_evidence(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    info = json.loads((attempt / "attempt.json").read_text())
    info["final_step"] = 99
    (attempt / "attempt.json").write_text(json.dumps(info))
    assert any("final_step" in p for p in verify_attempt(attempt))
    (attempt / "attempt.json").write_text(json.dumps({}))
    assert any("not an attempt record" in p for p in verify_attempt(attempt))


def _forge_state(ckpt: Path, edit) -> None:
    from iqtrain.storage import file_digest

    state = json.loads((ckpt / "state.json").read_text())
    edit(state)
    (ckpt / "state.json").write_text(json.dumps(state))
    index = json.loads((ckpt / "checkpoint.json").read_text())
    index["files"]["state.json"] = file_digest(ckpt / "state.json")
    (ckpt / "checkpoint.json").write_text(json.dumps(index))


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(rng={}),
        lambda s: s.update(plan={}),
        lambda s: s["plan"].update(kind="bogus"),
        lambda s: s.update(loop=[]),
        lambda s: s["loop"].update(loss_ema="abc"),
        lambda s: s.update(data=None),
        lambda s: s.update(fingerprints=None),
        lambda s: s["optimizer"].update(param_groups=[]),
        lambda s: s["optimizer"].update(scalars=[]),
    ],
    ids=[
        "rng",
        "plan",
        "plan.kind",
        "loop",
        "loss_ema",
        "data",
        "fingerprints",
        "groups",
        "scalars",
    ],
)
def test_a_wrongly_shaped_parent_state_is_exit_2_and_no_child(completed, tmp_path, edit):
    attempt = _copy(completed, tmp_path)
    (attempt / "manifest.json").unlink()
    info = json.loads((attempt / "attempt.json").read_text())
    info["status"] = "running"  # crashed
    (attempt / "attempt.json").write_text(json.dumps(info))
    shutil.rmtree(attempt / "checkpoints" / "step_00000012")
    _forge_state(attempt / "checkpoints" / "step_00000009", edit)
    proc = _cli("resume", "--attempt", attempt)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "state.json" in proc.stderr
    assert sorted(p.name for p in attempt.parent.iterdir()) == [attempt.name]


def test_resume_refuses_to_move_the_child_elsewhere(completed, tmp_path):
    attempt = _copy(completed, tmp_path)
    proc = _cli("resume", "--attempt", attempt, "--set", f"run.dir='{tmp_path / 'x'}'")
    assert proc.returncode == 2 and "run.dir" in proc.stderr


def _rebind(attempt: Path, ckpt: Path) -> None:
    """Forge: every manifest entry naming ``ckpt`` rewritten to its checkpoint.json."""
    from iqtrain.storage import file_digest

    digest = file_digest(ckpt / "checkpoint.json")

    def edit(m):
        for entry in [*m["checkpoints"], m["latest"], m["best"]]:
            if (attempt / entry["path"]).resolve() == ckpt.resolve():
                entry.update(digest)

    _edit_manifest(attempt, edit)


@pytest.mark.parametrize(
    ("edit", "shown"),
    [
        (lambda s: s.update(sample_rate=2e6), "2000000.0"),
        (lambda s: s.update(sample_rate=None), "None"),
        (lambda s: s.update(sample_rate="1e6"), "'1e6'"),
        (lambda s: s.pop("sample_rate"), "absent"),
    ],
    ids=["another rate", "null", "a string", "absent"],
)
def test_a_state_whose_sample_rate_is_not_attempt_jsons_fails_verify(
    completed, tmp_path, edit, shown
):
    attempt = _copy(completed, tmp_path)
    ckpt = attempt / "checkpoints" / "step_00000006"
    _forge_state(ckpt, edit)
    _rebind(attempt, ckpt)  # bound again: only the rate itself gives it away
    assert check_attempt(attempt).problems == [
        f"{ckpt / 'state.json'}: sample_rate {shown} differs from attempt.json "
        "data.sample_rate (1000000.0)"
    ]


def test_an_attempt_written_before_the_data_record_verifies_loads_and_resumes(completed, tmp_path):
    from iqtrain.checkpoint.files import list_checkpoints
    from iqtrain.pretrained.load import load_pretrained
    from iqtrain.report.summary import report

    attempt = _copy(completed, tmp_path)
    info = json.loads((attempt / "attempt.json").read_text())
    del info["data"]
    (attempt / "attempt.json").write_text(json.dumps(info))
    _edit_manifest(attempt, lambda m: m.pop("data"))
    for ckpt in list_checkpoints(attempt / "checkpoints"):
        _forge_state(ckpt, lambda s: s.pop("sample_rate"))
        _rebind(attempt, ckpt)
    assert check_attempt(attempt).problems == []
    assert load_pretrained(attempt).sample_rate is None
    assert "data:" not in report(attempt)
    child = run_attempt(_config(completed, tmp_path), ParentRef(attempt, "step_9"))
    child_info = json.loads((child.attempt / "attempt.json").read_text())
    assert child_info["data"]["sample_rate"] == 1e6  # the child knows its data's rate
    assert check_attempt(child.attempt).problems == []
    # An old attempt.json beside states that record a rate: the record was removed.
    _forge_state(attempt / "checkpoints" / "step_00000012", lambda s: s.update(sample_rate=1e6))
    _rebind(attempt, attempt / "checkpoints" / "step_00000012")
    assert check_attempt(attempt).problems == [
        f"{attempt / 'checkpoints' / 'step_00000012' / 'state.json'}: sample_rate 1000000.0 "
        "differs from attempt.json data.sample_rate (absent)"
    ]


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d.update(sample_rate=0), "sample_rate is 0"),
        (lambda d: d.update(sample_rate=True), "sample_rate is True"),
        (lambda d: d.pop("refused"), "expected an object"),
        (lambda d: d["refused"].pop("data.val"), "refused is"),
        (lambda d: d["refused"].update({"data.train": [{"path": "x"}]}), "refused.data.train[0]"),
        (lambda d: d["refused"].update({"data.val": "x"}), "refused.data.val is"),
    ],
    ids=["zero", "bool", "no refused", "no data.val", "no reason", "not a list"],
)
def test_a_malformed_data_record_is_one_problem_naming_it(completed, tmp_path, edit, key):
    attempt = _copy(completed, tmp_path)
    info = json.loads((attempt / "attempt.json").read_text())
    edit(info["data"])
    (attempt / "attempt.json").write_text(json.dumps(info))
    (problem,) = check_attempt(attempt).problems
    assert problem.startswith("attempt.json data: ") and key in problem, problem

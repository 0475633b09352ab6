"""``iqtrain report``: any attempt (completed, crashed, torn) summarised; never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from iqtrain.errors import CheckpointError
from iqtrain.evidence import AttemptLock
from iqtrain.report import report


def _train(step, **extra):
    return {
        "kind": "train",
        "step": step,
        "loss": 1.0 / step,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "clipped": step == 2,
        "samples": 4,
        "patches": 28,
        "step_time_s": 0.01,
        "samples_per_s": 400.0 + step,
        "spike": False,
        **extra,
    }


def _val(step, loss, best, **extra):
    return {
        "kind": "val",
        "step": step,
        "loss": loss,
        "pred_snr_db": 3.0,
        "samples": 8,
        "patches": 56,
        "best": best,
        "time_s": 0.1,
        **extra,
    }


RECORDS = [
    _train(1),
    _train(2),
    _val(2, 0.5, True, baseline_zero_loss=1.0, baseline_copy_last_loss=2.0),
    _train(3),
    _val(3, 0.25, True),
]


def _attempt(tmp_path, status="completed", records=RECORDS, tail=b"", **info):
    att = tmp_path / "run" / "attempts" / "0001"
    att.mkdir(parents=True)
    info = {
        "id": "0001",
        "status": status,
        "parent": None,
        "device": {"kind": "cpu", "name": "test-cpu", "precision": "fp32"},
        "started": "2025-01-01T00:00:00+00:00",
        **info,
    }
    (att / "attempt.json").write_text(json.dumps(info))
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    (att / "metrics.jsonl").write_bytes(lines + tail)
    return att


def test_a_completed_attempt(tmp_path):
    att = _attempt(tmp_path, finished="2025-01-01T00:01:00+00:00")
    text = report(att)
    lines = text.splitlines()
    assert lines[0] == f"attempt {att} (completed), device test-cpu, fp32"
    assert "3 train steps, last step 3 loss 0.33333, clipped 1, spikes 0" in text
    assert "median samples/s 402" in text
    assert "baselines: zero-prediction 1.00000, copy-last-patch 2.00000" in text
    assert "val step       2: loss 0.50000 (3.00 dB)  best" in text
    assert "best val loss 0.25000 at step 3 (6.02 dB)" in text
    assert "note" not in text


def test_a_crashed_attempt_is_shown_as_crashed(tmp_path):
    att = _attempt(tmp_path, status="running")  # nobody holds its lock
    text = report(att)
    assert text.splitlines()[0].startswith(f"attempt {att} (crashed)")
    assert f"iqtrain resume --attempt {att}" in text
    (att / "attempt.lock").write_text("12345\n")  # a lock file left by a dead process
    assert "(crashed)" in report(att)


def test_a_running_attempt_is_shown_as_running(tmp_path):
    att = _attempt(tmp_path, status="running")
    lock = AttemptLock(att).acquire()
    try:
        text = report(att)
    finally:
        lock.release()
    assert "(running)" in text.splitlines()[0] and "crashed" not in text


def test_an_unopenable_lock_is_shown_not_raised(tmp_path):
    att = _attempt(tmp_path, status="running")
    (att / "attempt.lock").symlink_to("attempt.lock")  # ELOOP on open
    first = report(att).splitlines()[0]
    assert first.startswith(f"attempt {att} (running? lock Too many levels of symbolic links)")


def test_a_torn_tail_is_a_note(tmp_path):
    att = _attempt(tmp_path, status="running", tail=b'{"kind":"train","step":4,"lo')
    text = report(att)
    assert "3 train steps, last step 3" in text
    assert f"note: {att / 'metrics.jsonl'} ends in a torn record (28 bytes" in text
    assert "stopped in the middle of a record" in text
    lock = AttemptLock(att).acquire()  # a live writer: the record is still being written
    try:
        assert "a record still being written" in report(att)
    finally:
        lock.release()


def test_damage_before_the_last_line_is_an_error_naming_file_and_line(tmp_path):
    att = _attempt(tmp_path)
    data = (att / "metrics.jsonl").read_bytes().replace(b'"step": 2', b'"step": 2,,', 1)
    (att / "metrics.jsonl").write_bytes(data)
    with pytest.raises(CheckpointError, match=r"metrics.jsonl: line 2: not a JSON record"):
        report(att)


def test_missing_optional_fields_are_left_out(tmp_path):
    records = [
        {"kind": "train", "step": 1, "loss": 0.5},
        {"kind": "train", "step": 2},
        {"kind": "val", "step": 2, "loss": 0.0},
        {"kind": "val"},
        {"kind": "val", "step": 3, "loss": "bad", "pred_snr_db": None, "best": "yes"},
        {"step": 9},
    ]
    att = _attempt(tmp_path, records=records, device="gpu0", parent={"attempt": "/x/0000"})
    text = report(att)
    assert text.splitlines()[0] == f"attempt {att} (completed)"
    assert "resumed from /x/0000 at step ?" in text
    assert "2 train steps, last step 2 loss ?, clipped 0, spikes 0" in text
    assert "samples/s" not in text and "baselines" not in text
    assert "val step       ?: loss ?" in text
    assert "best val loss 0.00000 at step 2 (?)" in text


def test_an_attempt_that_never_wrote_metrics(tmp_path):
    att = _attempt(tmp_path, status="failed", error="StorageError: disk full\nsecond line")
    (att / "metrics.jsonl").unlink()
    text = report(att)
    assert "(failed)" in text and "error: StorageError: disk full second line" in text
    assert "no metric records" in text
    (att / "metrics.jsonl").write_bytes(b"")
    assert "no metric records" in report(att)


@pytest.mark.parametrize(
    ("setup", "expect"),
    [
        (None, "not a directory"),
        ("", "not an attempt directory (no attempt.json)"),
        ("{not json", "attempt.json: unreadable"),
        ("[1, 2]", "attempt.json: unreadable"),
        ('{"id": "0001"}', "attempt.json: not an attempt record (no 'status')"),
        ('{"status": 3, "id": "1"}', "no 'status'"),
        (b"\xff\xfe", "attempt.json: unreadable"),
    ],
)
def test_a_directory_that_is_not_an_attempt_is_one_checkpoint_error(tmp_path, setup, expect):
    target = tmp_path / "dir"
    if setup is not None:
        target.mkdir()
        if setup:
            data = setup if isinstance(setup, bytes) else setup.encode()
            (target / "attempt.json").write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        report(target)
    assert expect in str(info.value) and "\n" not in str(info.value)


def test_report_and_metrics_import_no_torch(tmp_path):
    # iqtrain/__init__ imports torch eagerly (issue 9); import the modules without running it.
    script = """
import importlib.util, sys, types
spec = importlib.util.find_spec("iqtrain")
pkg = types.ModuleType("iqtrain")
pkg.__path__ = list(spec.submodule_search_locations)
sys.modules["iqtrain"] = pkg
import iqtrain.report, iqtrain.metrics, iqtrain.lineage
import iqtrain.checkpoint  # listing, verifying and pruning need no torch either
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(iqtrain.report.report(iqtrain.report.Path(sys.argv[1])).splitlines()[0])
"""
    att = _attempt(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(att)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "(completed)" in proc.stdout


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "iqtrain.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_command_never_tracebacks(tmp_path):
    bad = _cli("report", tmp_path)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "Traceback" not in bad.stderr
    assert "attempt.json" in bad.stderr
    att = _attempt(tmp_path, status="running", tail=b'{"kind":')
    torn = _cli("report", att)
    assert torn.returncode == 0, torn.stderr
    assert "(crashed)" in torn.stdout and "torn record" in torn.stdout

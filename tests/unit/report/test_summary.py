"""``iqtrain report``: any attempt (completed, crashed, torn) summarised; never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import RECORDS, report_lines, write_attempt, write_lineage

from iqtrain.errors import CheckpointError
from iqtrain.evidence.lock import AttemptLock
from iqtrain.report.summary import load_attempt, report, resume_points


def _attempt(tmp_path, status="completed", records=RECORDS, tail=b"", **info):
    return write_attempt(tmp_path / "run", "0001", status, records, tail, **info)


def test_a_completed_attempt(tmp_path):
    att = _attempt(tmp_path, finished="2025-01-01T00:01:00+00:00")
    text = report(att)
    lines = text.splitlines()
    assert lines[0] == f"attempt {att} (completed), device test-cpu, fp32"
    assert "3 train steps, last step 3 loss 0.33333, clipped 1, spikes 0" in text
    assert "median samples/s 402" in text
    assert "baselines: zero-prediction 1.00000, copy-last-patch 2.00000" in text
    assert "val step 2: loss 0.50000 (3.00 dB) best" in report_lines(text)
    assert "best val loss 0.25000 at step 3 (6.02 dB)" in text
    assert "note" not in text


def test_several_ranks_are_named_in_the_header(tmp_path):
    world = {"size": 4, "backend": "nccl", "hosts": ["a", "b"], "parallel": "fsdp"}
    att = _attempt(tmp_path, world=world)
    assert report(att).splitlines()[0].endswith("fp32, 4 ranks (nccl, fsdp)")
    # One process says nothing about ranks; older attempts have no "parallel".
    one = write_attempt(tmp_path / "one", world={"size": 1})
    assert report(one).splitlines()[0].endswith("device test-cpu, fp32")
    old = write_attempt(tmp_path / "old", world={"size": 2, "backend": "gloo"})
    assert report(old).splitlines()[0].endswith("fp32, 2 ranks (gloo)")


def test_a_crashed_attempt_is_shown_as_crashed(tmp_path):
    att = _attempt(tmp_path, status="running")  # nobody holds its lock
    text = report(att)
    assert text.splitlines()[0].startswith(f"attempt {att} (crashed)")
    # It wrote no checkpoint: there is no resume to offer.
    assert "resume --attempt" not in text and "it wrote no checkpoint" in text
    (att / "checkpoints" / "step_00000004").mkdir(parents=True)
    assert f"resume with: iqtrain resume --attempt {att}" in report(att)
    (att / "attempt.lock").write_text("12345\n")  # a lock file left by a dead process
    assert "(crashed)" in report(att)


def test_a_crashed_multi_rank_attempt_is_resumed_under_torchrun(tmp_path):
    world = {"size": 4, "backend": "gloo", "hosts": ["a", "a", "b", "b"]}
    att = _attempt(tmp_path, status="running", world=world)
    (att / "checkpoints" / "step_00000004").mkdir(parents=True)
    text = report(att)
    want = "torchrun --nnodes 2 --nproc-per-node 2 <rendezvous options> -m iqtrain resume"
    assert f"{want} --attempt {att}" in text
    one_node = write_attempt(
        tmp_path / "one", status="running", world={**world, "hosts": ["a"] * 4}
    )
    (one_node / "checkpoints" / "step_00000004").mkdir(parents=True)
    assert f"torchrun --nproc-per-node 4 -m iqtrain resume --attempt {one_node}" in report(one_node)


def test_report_into_a_closed_pipe_is_quiet(tmp_path):
    # `iqtrain report ... | head`: the reader is gone before anything is written.
    att = _attempt(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "iqtrain", "report", str(att)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == "", err


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
    assert "val step ?: loss ?" in report_lines(text)
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
    # The package itself is imported as a user's code imports it (its __init__ included).
    script = """
import sys
import iqtrain.report.summary, iqtrain.evidence.metrics, iqtrain.evidence.lineage
import iqtrain.checkpoint.files  # listing, verifying and pruning need no torch either
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(iqtrain.report.summary.report(iqtrain.report.summary.Path(sys.argv[1])).splitlines()[0])
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    att = _attempt(tmp_path, data={"sample_rate": 1e6, "refused": {"data.train": []}})
    proc = subprocess.run(
        [sys.executable, "-c", script, str(att)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "(completed)" in proc.stdout


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "iqtrain.cli.main", *map(str, args)],
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


# ------------------------------------------------------------------------------ shared readers


def test_load_attempt_reads_record_status_and_stream(tmp_path):
    records = [*RECORDS, {"kind": "probe", "step": 3, "accuracy": 0.5}]
    view = load_attempt(_attempt(tmp_path, records=records, tail=b'{"kind"'))
    assert view.status == "completed" and view.info["id"] == "0001"
    assert [r["step"] for r in view.records("train")] == [1, 2, 3]
    assert [r["step"] for r in view.records("val")] == [2, 3]
    assert view.records("probe") == [records[-1]] and view.stream.torn
    (view.path / "metrics.jsonl").unlink()
    assert load_attempt(view.path).stream is None and load_attempt(view.path).records("val") == []


def test_resume_points_follow_the_parent_chain(tmp_path):
    atts = write_lineage(tmp_path / "run", steps=(4, 7))
    found = resume_points(atts[-1], load_attempt(atts[-1]).info)
    assert [(p.step, p.parent_id) for p in found.points] == [(4, "0001"), (7, "0002")]
    assert found.points[0].parent == atts[0].resolve() and found.notes == []
    assert resume_points(atts[0], load_attempt(atts[0]).info).points == []


def test_resume_points_survive_a_moved_run_dir(tmp_path):
    write_lineage(tmp_path / "run", steps=(4, 7))
    moved = tmp_path / "elsewhere"
    (tmp_path / "run").rename(moved)  # attempt.json still names the old absolute paths
    child = moved / "attempts" / "0003"
    found = resume_points(child, load_attempt(child).info)
    assert [(p.step, p.parent.parent) for p in found.points] == [
        (4, moved / "attempts"),
        (7, moved / "attempts"),
    ]
    assert found.notes == []


def test_a_lost_ancestor_or_a_cycle_ends_the_walk_with_a_note(tmp_path):
    atts = write_lineage(tmp_path / "run", steps=(4, 7))
    (atts[1] / "attempt.json").unlink()
    found = resume_points(atts[2], load_attempt(atts[2]).info)
    assert [p.step for p in found.points] == [7]
    assert len(found.notes) == 1 and str(atts[1] / "attempt.json") in found.notes[0]
    loop = {"id": "0001", "status": "completed", "parent": {"attempt": str(atts[0]), "step": 1}}
    (atts[0] / "attempt.json").write_text(json.dumps(loop))
    found = resume_points(atts[0], loop)
    assert [p.step for p in found.points] == [1] and "repeats the lineage" in found.notes[0]
    bad = {"id": "0001", "status": "completed", "parent": {"step": True}}
    found = resume_points(atts[0], bad)
    assert found.points == [] and "parent.attempt is not a path" in found.notes[0]


def test_report_prints_the_last_probe_with_standard_errors(tmp_path):
    old = {
        "kind": "probe",
        "step": 2,
        "accuracy": 0.5,
        "random_init_accuracy": 0.25,
        "classical_accuracy": 0.75,
        "chance": 0.125,
    }
    new = {
        **old,
        "step": 3,
        "accuracy_se": 0.01,
        "random_init_accuracy_se": 0.02,
        "classical_accuracy_se": None,
        "combined_accuracy": 0.8,
        "combined_accuracy_se": 0.03,
    }
    att = write_attempt(tmp_path, records=[*RECORDS, old])
    assert (
        "probe at step 2: accuracy 0.5000 ± -; random-init 0.2500 ± -, classical features "
        "0.7500 ± -, chance 0.1250"
    ) in report(att)
    att = write_attempt(tmp_path, number="0002", records=[*RECORDS, old, new])
    assert (
        "probe at step 3: accuracy 0.5000 ± 0.0100; random-init 0.2500 ± 0.0200, classical "
        "features 0.7500 ± -, classical + pretrained 0.8000 ± 0.0300, chance 0.1250"
    ) in report(att)


def _refused(n, key="data.train"):
    return [
        {"path": f"/d/r{i}.sigmf-meta", "reason": f"/d/r{i}.sigmf-meta: not valid JSON"}
        for i in range(n)
    ]


def test_the_sample_rate_and_the_inputs_read_past_are_shown(tmp_path):
    data = {"sample_rate": 2.4e6, "refused": {"data.train": [], "data.val": []}}
    assert "data: 2.4 MHz" in report_lines(report(_attempt(tmp_path, data=data)))
    data = {"sample_rate": None, "refused": {"data.train": _refused(4), "data.val": _refused(1)}}
    lines = report_lines(report(write_attempt(tmp_path / "b", data=data)))
    at = lines.index(
        "data: no one sample rate (none recorded, or several: data.sample_rate = 'any'); "
        "5 input(s) skipped as unreadable (data.skip_invalid):"
    )
    assert lines[at + 1 : at + 5] == [
        "data.train: /d/r0.sigmf-meta: not valid JSON",
        "data.train: /d/r1.sigmf-meta: not valid JSON",
        "data.train: /d/r2.sigmf-meta: not valid JSON",
        "… and 2 more (attempt.json data.refused)",
    ]
    # An attempt written before the record: no data line; a malformed one: shown as far as
    # it is there.
    assert "data:" not in report(write_attempt(tmp_path / "c"))
    text = report(write_attempt(tmp_path / "d", data={"sample_rate": "fast", "refused": 3}))
    assert "data: ?" in report_lines(text)

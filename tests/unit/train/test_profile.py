"""``training.profile_steps``: a Chrome trace of exactly the steps asked for, a CPU run never
touches the CUDA memory history, and a profile that cannot be written is one note."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from iqtrain.train.profile import StepProfiler


def _run(profiler: StepProfiler, steps: range) -> None:
    x = torch.ones(8, 8)
    for step in steps:
        profiler.before_step(step)
        (x @ x).sum()
        profiler.after_step(step)
    profiler.close()


def _step_marks(trace) -> list[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return sorted({e["name"] for e in events if e.get("name", "").startswith("iqtrain step")})


@pytest.fixture
def no_cuda_history(monkeypatch):
    """A CPU profile must never call the CUDA memory history (it needs CUDA)."""

    def refuse(*args, **kwargs):
        raise AssertionError("CUDA memory history used on CPU")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", refuse)


@pytest.mark.usefixtures("no_cuda_history")
def test_the_trace_holds_the_steps_asked_for(tmp_path, capsys):
    _run(StepProfiler((2, 3), tmp_path / "profile", "cpu"), range(1, 6))
    assert [p.name for p in (tmp_path / "profile").iterdir()] == ["trace_steps_2-3.json"]
    trace = tmp_path / "profile" / "trace_steps_2-3.json"
    assert _step_marks(trace) == ["iqtrain step 2", "iqtrain step 3"]
    assert any(e.get("name") == "aten::mm" for e in json.loads(trace.read_text())["traceEvents"])
    assert capsys.readouterr().err.strip().endswith(f"profile of steps 2-3: {trace}")


@pytest.mark.usefixtures("no_cuda_history")
def test_a_run_that_ends_or_resumes_inside_the_range_writes_what_it_covered(tmp_path):
    _run(StepProfiler((2, 9), tmp_path / "a", "cpu"), range(1, 5))  # ended at step 4
    assert _step_marks(tmp_path / "a" / "trace_steps_2-4.json")[-1] == "iqtrain step 4"
    _run(StepProfiler((2, 9), tmp_path / "b", "cpu"), range(6, 12))  # resumed at step 5
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["trace_steps_6-9.json"]
    _run(StepProfiler((2, 3), tmp_path / "c", "cpu"), range(5, 8))  # past the range
    _run(StepProfiler(None, tmp_path / "d", "cpu"), range(1, 4))  # off
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


def test_a_profile_that_cannot_be_written_is_one_note(tmp_path, capsys):
    (tmp_path / "profile").write_text("in the way")
    _run(StepProfiler((1, 2), tmp_path / "profile", "cpu"), range(1, 4))
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("iqtrain")]
    assert line.startswith("iqtrain: note: training.profile_steps: cannot profile: ")
    directory = tmp_path / "gone"
    profiler = StepProfiler((1, 2), directory, "cpu")
    profiler.before_step(1)
    directory.rmdir()  # removed while profiling
    profiler.after_step(1)
    profiler.after_step(2)
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("iqtrain")]
    assert line.startswith("iqtrain: note: training.profile_steps: cannot write the profile of ")


@pytest.mark.usefixtures("no_cuda_history")
def test_a_trace_on_a_full_disk_leaves_nothing(tmp_path, monkeypatch, capsys):
    # Kineto writes <trace>.tmp, then renames it; a full disk left that .tmp behind.
    def full(self, path):
        with open(f"{path}.tmp", "w") as f:
            f.write('{"traceEvents": [')
        raise OSError(errno.ENOSPC, "No space left on device", f"{path}.tmp")

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", full)
    _run(StepProfiler((1, 2), tmp_path / "profile", "cpu"), range(1, 4))
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("iqtrain")]
    assert line.startswith("iqtrain: note: training.profile_steps: cannot write the profile of ")
    assert "No space left on device" in line
    assert list(tmp_path.iterdir()) == []  # neither the .tmp nor the directory made for it


@pytest.mark.gpu
def test_cuda_writes_a_memory_snapshot_beside_the_trace(tmp_path):
    import pickle

    profiler = StepProfiler((1, 2), tmp_path, "cuda")
    x = torch.ones(256, 256, device="cuda")
    for step in (1, 2, 3):
        profiler.before_step(step)
        (x @ x).sum().item()
        profiler.after_step(step)
    profiler.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "memory_steps_1-2.pickle",
        "trace_steps_1-2.json",
    ]
    snapshot = pickle.loads((tmp_path / "memory_steps_1-2.pickle").read_bytes())
    assert snapshot["device_traces"] and any(snapshot["device_traces"])
    assert any(
        e.get("cat") == "kernel"
        for e in json.loads((tmp_path / "trace_steps_1-2.json").read_text())["traceEvents"]
    )

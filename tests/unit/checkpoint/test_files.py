"""Checkpoints: atomic write, hashes, exact round trip, refusal of non-finite state,
atomic pruning, crash leftovers, and storage failures that lose nothing."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import TESTS, checkpoint_state

import iqtrain.checkpoint.files as checkpoint_mod
from iqtrain.checkpoint.files import (
    crash_leftovers,
    list_checkpoints,
    load_checkpoint,
    remove_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.errors import CheckpointError, NonFiniteError, StorageError
from iqtrain.model.transformer import IQTransformer
from iqtrain.storage import file_digest, write_json_atomic
from iqtrain.train.step import TrainStep

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _stepper(steps=2):
    torch.manual_seed(0)
    model = IQTransformer(ModelConfig(dim=32, layers=1, heads=2, patch_len=4, max_patches=8))
    s = TrainStep(model, OptimizerConfig(lr=1e-3), device="cpu", precision="fp32", compile=False)
    for _ in range(steps):
        s.train_step([torch.randn(2, 8, 8)], 1e-3)
    return s


def test_round_trip_is_exact(tmp_path):
    s = _stepper()
    want_state = checkpoint_state(7, plan={"note": "x"})
    path = save_checkpoint(tmp_path, s.model_state_dict(), s.optimizer.state_dict(), want_state)
    assert path.name == "step_00000007"
    assert sorted(p.name for p in path.iterdir()) == [
        "checkpoint.json",
        "model.safetensors",
        "optimizer.safetensors",
        "state.json",
    ]
    assert verify_checkpoint(path) == []
    model, optim, state = load_checkpoint(path)
    assert state == dataclasses.replace(want_state, optimizer=state.optimizer)
    assert state.optimizer is not None
    for k, v in s.model_state_dict().items():
        assert torch.equal(model[k], v)
    fresh = _stepper(steps=0)
    fresh.load_model_state_dict(model)
    fresh.optimizer.load_state_dict(optim)
    want, got = s.optimizer.state_dict(), fresh.optimizer.state_dict()
    for idx, entry in want["state"].items():
        for key, value in entry.items():
            assert torch.equal(got["state"][idx][key], value), (idx, key)
    assert [g["weight_decay"] for g in got["param_groups"]] == [
        g["weight_decay"] for g in want["param_groups"]
    ]
    assert all(isinstance(g["lr"], torch.Tensor) for g in got["param_groups"])
    # both continue identically
    batch = torch.randn(2, 8, 8)
    a = s.train_step([batch], 5e-4)
    b = fresh.train_step([batch], 5e-4)
    assert a == b


def test_tampering_is_detected(tmp_path):
    s = _stepper(1)
    state = checkpoint_state(1)
    path = save_checkpoint(tmp_path, s.model_state_dict(), s.optimizer.state_dict(), state)
    f = path / "optimizer.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    (problem,) = verify_checkpoint(path)
    size = f.stat().st_size
    assert problem.startswith(f"{f}: {size} bytes sha256 ")
    assert f"but checkpoint.json records {size} bytes sha256 " in problem
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == problem


def test_non_finite_state_is_refused_before_writing(tmp_path):
    s = _stepper(1)
    model = s.model_state_dict()
    name = next(iter(model))
    model[name] = model[name].clone()
    model[name].view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError, match=name):
        save_checkpoint(tmp_path, model, s.optimizer.state_dict(), checkpoint_state(1))
    assert list(tmp_path.iterdir()) == []


def test_never_overwrites_and_torn_checkpoints_are_not_listed(tmp_path):
    s = _stepper(1)
    state = checkpoint_state(1)
    save_checkpoint(tmp_path, s.model_state_dict(), s.optimizer.state_dict(), state)
    with pytest.raises(CheckpointError, match="already exists"):
        save_checkpoint(tmp_path, s.model_state_dict(), s.optimizer.state_dict(), state)
    (tmp_path / ".tmp-step_00000002-123").mkdir()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000001"]
    torn = tmp_path / "step_00000003"
    torn.mkdir()
    assert verify_checkpoint(torn) == [f"{torn}/checkpoint.json: missing (checkpoint incomplete)"]


# ------------------------------------------------------------------------------ helpers


def _tiny(root, step, *, model_n=4, optim_n=4):
    """A checkpoint of a few hand-made tensors (no model needed)."""
    model = {"w": torch.arange(model_n, dtype=torch.float32)}
    optim = {
        "state": {0: {"exp_avg": torch.zeros(optim_n), "step": 3}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}],
    }
    return save_checkpoint(root, model, optim, checkpoint_state(step))


def _names(root):
    return sorted(p.name for p in root.iterdir())


# Run in a child process so a real resource limit or a real kill -9 hits real code.
_PRELUDE = """
import json, os, resource, shutil, signal, sys
from pathlib import Path
import torch
from helpers import checkpoint_state
from iqtrain.checkpoint.files import remove_checkpoint, save_checkpoint
from iqtrain.errors import IQTrainError
from iqtrain.storage import write_json_atomic

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG

def limit_file_size(nbytes):
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))

def tiny(root, step, model_n=4, optim_n=4, **plan):
    model = {"w": torch.arange(model_n, dtype=torch.float32)}
    optim = {"state": {0: {"exp_avg": torch.zeros(optim_n)}},
             "param_groups": [{"lr": 1e-3, "params": [0]}]}
    return save_checkpoint(root, model, optim, checkpoint_state(step, plan=plan))

def report(fn):
    try:
        fn()
    except IQTrainError as exc:
        print(json.dumps({"class": type(exc).__name__, "message": str(exc)}))
    else:
        print(json.dumps({"class": None}))
"""


def _child(tmp_path, body):
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.fspath(TESTS)},
        timeout=300,
    )
    return proc


def _child_result(tmp_path, body):
    proc = _child(tmp_path, body)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ pruning


def test_remove_checkpoint_leaves_the_namespace_by_rename_before_deleting(tmp_path, monkeypatch):
    for step in (1, 2, 3):
        _tiny(tmp_path, step)
    events = []
    real_rmtree, real_fsync_dir = shutil.rmtree, checkpoint_mod.fsync_dir

    def rmtree(path, *a, **kw):
        events.append(("rmtree", os.path.basename(path), _names(tmp_path)))
        return real_rmtree(path, *a, **kw)

    def fsync_dir(path):
        events.append(("fsync", os.fspath(path), _names(tmp_path)))
        return real_fsync_dir(path)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    monkeypatch.setattr(checkpoint_mod, "fsync_dir", fsync_dir)
    remove_checkpoint(tmp_path / "step_00000002")
    doomed = f".pruned-step_00000002-{os.getpid()}"
    # renamed out of the listed namespace, parent fsynced, and only then deleted
    listed = sorted([doomed, "step_00000001", "step_00000003"])
    assert events[0] == ("fsync", os.fspath(tmp_path), listed)
    assert events[1][:2] == ("rmtree", doomed)
    assert _names(tmp_path) == ["step_00000001", "step_00000003"]
    assert crash_leftovers(tmp_path) == []


def test_kill_9_while_pruning_leaves_only_complete_checkpoints_listed(tmp_path):
    # The child deletes one file of the pruned checkpoint, then is killed -9 in the middle
    # of the delete: a delete in place would leave a half-deleted step_N under its real name.
    proc = _child(
        tmp_path,
        """
        root = Path("ckpts")
        for step in (1, 2, 3):
            tiny(root, step)
        def crash_mid_delete(path, *a, **kw):
            os.unlink(Path(path) / "model.safetensors")
            os.kill(os.getpid(), signal.SIGKILL)
        shutil.rmtree = crash_mid_delete
        remove_checkpoint(root / "step_00000002")
        """,
    )
    assert proc.returncode == -9, proc.stderr
    root = tmp_path / "ckpts"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000001", "step_00000003"]
    assert all(verify_checkpoint(p) == [] for p in list_checkpoints(root))
    leftovers = crash_leftovers(root)
    assert [p.name.rsplit("-", 1)[0] for p in leftovers] == [".pruned-step_00000002"]
    # the next save and prune go on regardless of the leftover
    _tiny(root, 4)
    remove_checkpoint(root / "step_00000001")
    assert [p.name for p in list_checkpoints(root)] == ["step_00000003", "step_00000004"]


def test_kill_9_between_rename_and_delete(tmp_path):
    proc = _child(
        tmp_path,
        """
        root = Path("ckpts")
        for step in (1, 2):
            tiny(root, step)
        shutil.rmtree = lambda *a, **kw: os.kill(os.getpid(), signal.SIGKILL)
        remove_checkpoint(root / "step_00000001")
        """,
    )
    assert proc.returncode == -9, proc.stderr
    root = tmp_path / "ckpts"
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002"]
    (left,) = crash_leftovers(root)
    assert left.name.startswith(".pruned-step_00000001-") and left.is_dir()


def test_a_failed_prune_rename_raises_storage_error_and_keeps_the_checkpoint(tmp_path, monkeypatch):
    path = _tiny(tmp_path, 1)

    def rename(src, dst):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(checkpoint_mod.os, "rename", rename)
    with pytest.raises(StorageError, match="step_00000001") as info:
        remove_checkpoint(path)
    assert "\n" not in str(info.value)
    monkeypatch.undo()
    assert list_checkpoints(tmp_path) == [path] and verify_checkpoint(path) == []
    with pytest.raises(CheckpointError, match="not a checkpoint directory name"):
        remove_checkpoint(tmp_path / "notes")


def test_crash_leftovers_are_the_temporary_and_half_pruned_names_only(tmp_path):
    _tiny(tmp_path, 3)
    for name in (".tmp-step_00000004-123", ".pruned-step_00000001-9"):
        (tmp_path / name).mkdir()
    (tmp_path / ".attempt.json.tmp-77").write_text("{")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / ".hidden").mkdir()
    assert [p.name for p in crash_leftovers(tmp_path)] == [
        ".attempt.json.tmp-77",
        ".pruned-step_00000001-9",
        ".tmp-step_00000004-123",
    ]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003"]
    assert crash_leftovers(tmp_path / "absent") == []


# ------------------------------------------------------------------------------ storage errors


@pytest.mark.parametrize(
    ("failing", "sizes"),
    [
        ("model.safetensors", "model_n=1 << 20"),
        ("optimizer.safetensors", "optim_n=1 << 20"),
        ("state.json", "pad='x' * (1 << 20)"),
    ],
)
def test_a_full_disk_while_saving_loses_nothing(tmp_path, failing, sizes):
    # A real EFBIG from RLIMIT_FSIZE (what a full disk or a quota looks like to the writer).
    result = _child_result(
        tmp_path,
        f"""
        root = Path("ckpts")
        tiny(root, 1)
        limit_file_size(256 * 1024)
        report(lambda: tiny(root, 2, {sizes}))
        """,
    )
    assert result["class"] == "StorageError", result
    message = result["message"]
    assert "\n" not in message and failing in message and "step_00000002" in message
    assert "File too large" in message
    root = tmp_path / "ckpts"
    assert _names(root) == ["step_00000001"]  # no temporary, no partial step_00000002
    assert verify_checkpoint(root / "step_00000001") == []


@pytest.mark.parametrize("failing", ["model.safetensors", "checkpoint.json", ".tmp-step"])
def test_an_fsync_error_while_saving_loses_nothing(tmp_path, monkeypatch, failing):
    first = _tiny(tmp_path, 1)
    before = {p.name: file_digest(p) for p in first.iterdir()}
    real_fsync = os.fsync

    def fsync(fd):
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).startswith(failing):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_fsync(fd)

    monkeypatch.setattr(checkpoint_mod.os, "fsync", fsync)
    with pytest.raises(StorageError, match="Input/output error") as info:
        _tiny(tmp_path, 2)
    assert failing in str(info.value)
    monkeypatch.undo()
    assert _names(tmp_path) == ["step_00000001"]
    assert {p.name: file_digest(p) for p in first.iterdir()} == before


def test_write_json_atomic_on_a_full_disk_keeps_the_old_file(tmp_path):
    (tmp_path / "attempt.json").write_text('{"status": "running"}\n')
    result = _child_result(
        tmp_path,
        """
        limit_file_size(4096)
        report(lambda: write_json_atomic(Path("attempt.json"), {"pad": "x" * 100000}))
        """,
    )
    assert result["class"] == "StorageError", result
    assert "attempt.json" in result["message"] and "\n" not in result["message"]
    assert json.loads((tmp_path / "attempt.json").read_text()) == {"status": "running"}
    assert _names(tmp_path) == ["attempt.json"]  # the temporary file is gone


def test_write_json_atomic_error_leaves_an_absent_file_absent(tmp_path, monkeypatch):
    def replace(src, dst):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_mod.os, "replace", replace)
    with pytest.raises(StorageError, match="manifest.json: cannot write: No space left"):
        write_json_atomic(tmp_path / "manifest.json", {"a": 1})
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    write_json_atomic(tmp_path / "manifest.json", {"a": 1})
    assert json.loads((tmp_path / "manifest.json").read_text()) == {"a": 1}


# ------------------------------------------------------------------------------ the step


def _rewrite(path, name, text):
    """Replace a checkpoint file and re-bind it in checkpoint.json (a consistent forgery)."""
    (path / name).write_text(text)
    index = json.loads((path / "checkpoint.json").read_text())
    index["files"][name] = file_digest(path / name)
    (path / "checkpoint.json").write_text(json.dumps(index))


def test_verify_checks_the_step_three_ways(tmp_path):
    good = _tiny(tmp_path, 5)
    assert verify_checkpoint(good) == []
    # state.json disagrees with the name and checkpoint.json
    liar = _tiny(tmp_path, 6)
    state = json.loads((liar / "state.json").read_text())
    _rewrite(liar, "state.json", json.dumps({**state, "step": 5}))
    (problem,) = verify_checkpoint(liar)
    assert "state.json" in problem and "step 5" in problem and "step_00000006" in problem
    # a checkpoint copied under another name: checkpoint.json and state.json both disagree
    moved = tmp_path / "step_00000007"
    shutil.copytree(good, moved)
    problems = verify_checkpoint(moved)
    assert len(problems) == 2
    assert "checkpoint.json" in problems[0] and "state.json" in problems[1]
    with pytest.raises(CheckpointError, match="step_00000007"):
        load_checkpoint(moved)


@pytest.mark.parametrize(
    ("state_text", "expect"),
    [
        ('{"optimizer": {}}', "no integer 'step'"),
        ('{"step": "5"}', "no integer 'step'"),
        ("[5]", "no integer 'step'"),
        ("{not json", "unreadable"),
    ],
)
def test_verify_reports_an_unusable_state_step_as_a_problem(tmp_path, state_text, expect):
    path = _tiny(tmp_path, 5)
    _rewrite(path, "state.json", state_text)
    (problem,) = verify_checkpoint(path)
    assert "state.json" in problem and expect in problem


NO_FILES_TABLE = ["checkpoint.json: unreadable: no 'files' table"]


@pytest.mark.parametrize(
    ("index", "expect"),
    [
        ({"files": ["model.safetensors"], "step": 5}, NO_FILES_TABLE),
        ([1, 2], NO_FILES_TABLE),
        ({"step": 5}, NO_FILES_TABLE),
        (
            {"files": {"x": 1}},
            [
                "checkpoint.json: does not list model.safetensors",
                "checkpoint.json: does not list optimizer.safetensors",
                "checkpoint.json: does not list state.json",
                "checkpoint.json: lists 'x', which no checkpoint contains",
                "checkpoint.json: no integer 'step'",
            ],
        ),
    ],
)
def test_a_malformed_checkpoint_json_is_named_by_verify_and_refused_by_load(
    tmp_path, index, expect
):
    # verify returns every problem (it never raises); load refuses with the same problems.
    path = _tiny(tmp_path, 5)
    (path / "checkpoint.json").write_text(json.dumps(index))
    problems = verify_checkpoint(path)
    assert problems == [f"{path}/{p}" for p in expect]
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == "; ".join(problems)


# --------------------------------------------------------------------- sharded (dcp) format


def _shards(directory):
    """A stand-in for the ranks' torch.distributed.checkpoint write (tested in test_parallel)."""
    directory.mkdir()
    (directory / ".metadata").write_bytes(b"meta")
    for rank in range(2):
        (directory / f"__{rank}_0.distcp").write_bytes(bytes([rank]) * 64)


def _sharded(tmp_path, step=3):
    s = _stepper(1)
    state = checkpoint_state(step, components={"rng": {"world_size": 2, "ranks": [{}, {}]}})
    return save_checkpoint(tmp_path, s.model_state_dict(), None, state, sharded=_shards)


def test_a_sharded_checkpoint_lists_every_shard_and_loads_without_an_optimizer(tmp_path):
    path = _sharded(tmp_path)
    index = json.loads((path / "checkpoint.json").read_text())
    assert index["format"] == "dcp"
    assert sorted(index["files"]) == [
        "dcp/.metadata",
        "dcp/__0_0.distcp",
        "dcp/__1_0.distcp",
        "model.safetensors",
        "state.json",
    ]
    assert verify_checkpoint(path) == []
    model, optim, state = load_checkpoint(path)
    assert optim is None and state.step == 3 and model
    assert checkpoint_mod.sharded_state_dir(path) == path / "dcp"
    assert checkpoint_mod.sharded_state_dir(_tiny(tmp_path, 4)) is None


def test_a_changed_missing_or_extra_shard_fails_verification(tmp_path):
    path = _sharded(tmp_path)
    shard = path / "dcp" / "__1_0.distcp"
    shard.write_bytes(b"\x00" * 64)
    (problem,) = verify_checkpoint(path)
    assert str(shard) in problem and "sha256" in problem
    shard.unlink()
    assert verify_checkpoint(path) == [f"{shard}: missing"]
    # ... and unlisted too: two ranks wrote the checkpoint, so two shards must be listed.
    index = json.loads((path / "checkpoint.json").read_text())
    del index["files"]["dcp/__1_0.distcp"]
    (path / "checkpoint.json").write_text(json.dumps(index))
    (problem,) = verify_checkpoint(path)
    assert str(shard) in problem and "not listed (2 ranks wrote one each)" in problem
    # A shard nothing lists would be read by a load without being verified.
    other = _sharded(tmp_path, step=4)
    (other / "dcp" / "__2_0.distcp").write_bytes(b"x")
    (problem,) = verify_checkpoint(other)
    assert "__2_0.distcp" in problem and "not listed" in problem
    with pytest.raises(CheckpointError, match="not listed"):
        load_checkpoint(other)


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (lambda i: i["files"].pop("dcp/.metadata"), "does not list dcp/.metadata"),
        (lambda i: i.update(format="zarr"), "unknown format 'zarr'"),
        (lambda i: i["files"].update({"../step_00000003/state.json": {}}), "which no checkpoint"),
        (lambda i: i.pop("format"), "does not list optimizer.safetensors"),
    ],
)
def test_a_forged_sharded_listing_fails_verification(tmp_path, edit, expect):
    path = _sharded(tmp_path)
    index = json.loads((path / "checkpoint.json").read_text())
    edit(index)
    (path / "checkpoint.json").write_text(json.dumps(index))
    problems = verify_checkpoint(path)
    assert any(expect in p for p in problems), problems


def test_a_failed_shard_write_loses_nothing(tmp_path):
    _sharded(tmp_path, step=2)

    def full(directory):
        _shards(directory)
        raise StorageError(f"{directory}: cannot write the sharded state on rank(s) [1]")

    s = _stepper(1)
    with pytest.raises(StorageError, match="rank"):
        save_checkpoint(tmp_path, s.model_state_dict(), None, checkpoint_state(3), sharded=full)
    assert _names(tmp_path) == ["step_00000002"]
    assert crash_leftovers(tmp_path) == []


def test_exactly_one_of_optimizer_state_and_shards(tmp_path):
    s = _stepper(1)
    with pytest.raises(ValueError, match="exactly one"):
        save_checkpoint(tmp_path, s.model_state_dict(), None, checkpoint_state(1))
    with pytest.raises(ValueError, match="exactly one"):
        save_checkpoint(
            tmp_path,
            s.model_state_dict(),
            s.optimizer.state_dict(),
            checkpoint_state(1),
            sharded=_shards,
        )

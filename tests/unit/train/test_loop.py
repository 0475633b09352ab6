"""The loop's components: LoopState, the step's state, the checkpoint policy, the label ring.

The ``gpu`` case of the label ring's test checks what a CPU cannot: that the buffers the
labels are copied from are pinned (a non-blocking copy from pageable memory is staged through
a synchronous one).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from iqtrain.config.sections import ModelConfig, OptimizerConfig
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives import REGISTRY
from iqtrain.train.loop import LoopState
from iqtrain.train.step import TrainStep

MSE = REGISTRY["mse"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_loop_state_tracks_the_first_strict_minimum_and_round_trips():
    loop = LoopState()
    attempt = Path("/runs/x/attempts/0003")
    for step, loss, improved in [
        (4, 0.9, True),
        (8, 0.9, False),
        (12, 0.8, True),
        (16, 0.85, False),
    ]:
        loop.step = step
        assert loop.record_validation({"loss": loss}, attempt, MSE) is improved
    assert (loop.best_val_loss, loop.best_step, loop.validations) == (0.8, 12, 4)
    assert loop.best_checkpoint == "attempts/0003/checkpoints/step_00000012"
    assert loop.record_loss(1.0) is False and loop.record_loss(3.5) is True
    state = loop.state_dict()
    assert "step" not in state  # stored beside the components, as state.json "step"
    other = LoopState()
    other.load_state_dict(state)
    other.step = loop.step
    assert other == loop


def _step(seed: int) -> TrainStep:
    torch.manual_seed(seed)
    model = IQTransformer(ModelConfig(patch_len=4, max_patches=8, dim=16, layers=1, heads=2))
    return TrainStep(model, OptimizerConfig(lr=1e-2), device="cpu", precision="fp32", compile=False)


def test_the_step_owns_model_and_optimizer_state():
    a = _step(0)
    a.train_step([torch.randn(2, 8, 8)], 1e-2)
    b = _step(1)
    # state_dict() holds live references, as torch's do: a copy is what a checkpoint makes.
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for k, v in a.model_state_dict().items():
        assert torch.equal(v, b.model_state_dict()[k]), k
    x = torch.randn(2, 8, 8)
    ra, rb = a.train_step([x], 1e-2), b.train_step([x], 1e-2)
    assert (ra.loss, ra.grad_norm) == (rb.loss, rb.grad_norm)
    for k, v in a.model_state_dict().items():
        assert torch.equal(v, b.model_state_dict()[k]), k


# --------------------------------------------------------------------------- early stopping


def test_early_stopping_bookkeeping_needs_an_improvement_larger_than_min_delta():
    loop = LoopState()
    attempt = Path("/runs/x/attempts/0001")
    # (loss, improved for best, validations without a large enough improvement afterwards)
    for step, (loss, improved, stale) in enumerate(
        [
            (1.0, True, 0),
            (0.95, True, 1),  # a new best, but not 0.1 below the reference 1.0
            (0.85, True, 0),  # 0.15 below 1.0: the reference moves to 0.85
            (0.84, True, 1),
            (0.90, False, 2),
        ]
    ):
        loop.step = 4 * (step + 1)
        assert loop.record_validation({"loss": loss}, attempt, MSE, min_delta=0.1) is improved
        assert loop.stale_validations == stale
    assert loop.early_stop_ref == 0.85 and loop.best_val_loss == 0.84
    again = LoopState()
    again.load_state_dict(copy.deepcopy(loop.state_dict()))
    assert again.state_dict() == loop.state_dict()
    # A loop state without early stopping's counters was never written by a release: refused
    # (the restore turns it into one CheckpointError line naming state.json).
    old = {
        k: v
        for k, v in loop.state_dict().items()
        if k not in ("early_stop_ref", "stale_validations")
    }
    with pytest.raises(KeyError, match="early_stop_ref"):
        again.load_state_dict(old)


def _early_tables(tmp_path: Path, cache: Path, **training) -> dict:
    from helpers import tiny_tables

    # min_delta 1.0: no validation can improve by that much, so patience 2 with a validation
    # every 2 steps stops after step 6 (validations at 2, 4 and 6) of 12.
    settings = {"eval_every": 2, "early_stop_patience": 2, "early_stop_min_delta": 1.0}
    settings.update(checkpoint_every=2, keep_last=0)
    return tiny_tables(tmp_path / "run", cache, **{**settings, **training})


def test_early_stopping_saves_publishes_and_resumes_exactly(tmp_path, capsys):
    from iqtrain.cli.main import main
    from iqtrain.config.schema import build_config, dumps_toml
    from iqtrain.evidence.lineage import ParentRef
    from iqtrain.evidence.metrics import read_metrics, strip_timing
    from iqtrain.evidence.verify import check_attempt
    from iqtrain.train.attempt import run_attempt

    cache = tmp_path / "cache"
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(_early_tables(tmp_path, cache)))
    assert main(["run", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "stopped early at step 6: no validation improved on" in out
    attempt = tmp_path / "run" / "attempts" / "0001"
    manifest = __import__("json").loads((attempt / "manifest.json").read_text())
    stopped = manifest["stopped_early"]
    assert stopped["step"] == 6 and stopped["best_step"] == manifest["best"]["step"]
    assert manifest["latest"]["step"] == 6
    assert check_attempt(attempt).problems == [] and check_attempt(attempt).status == "completed"
    assert [r["step"] for r in read_metrics(attempt / "metrics.jsonl")][-1] == 6

    # The bookkeeping survives a restart: resumed from step 4 (one stale validation so far),
    # the child stops at step 6 again with the same records.
    tables = _early_tables(tmp_path, cache)
    child = run_attempt(build_config(tables), ParentRef(attempt, "step_4"))
    assert child.final_step == 6 and child.stopped_early["step"] == 6
    assert strip_timing(read_metrics(child.attempt / "metrics.jsonl")) == strip_timing(
        read_metrics(attempt / "metrics.jsonl")
    )
    # Both keys may change on resume: patience 0 trains on to max_steps.
    tables["training"]["early_stop_patience"] = 0
    done = run_attempt(build_config(tables), ParentRef(attempt))
    assert done.final_step == 12 and done.stopped_early is None
    assert check_attempt(done.attempt).problems == []


def test_verify_binds_the_early_stop_entry(tmp_path):
    import json
    import os

    from iqtrain.config.schema import build_config
    from iqtrain.evidence.verify import check_attempt
    from iqtrain.train.attempt import run_attempt

    result = run_attempt(build_config(_early_tables(tmp_path, tmp_path / "cache")))
    path = result.attempt / "manifest.json"
    original = json.loads(path.read_text())
    for forged, expect in [
        ({**original, "stopped_early": None}, "no stopped_early entry says why"),
        ({**original, "stopped_early": {**original["stopped_early"], "step": 4}}, "step 4"),
        ({**original, "stopped_early": {**original["stopped_early"], "best_step": 99}}, "99"),
        ({**original, "stopped_early": "tired"}, "malformed"),
    ]:
        os.chmod(path, 0o644)
        path.write_text(json.dumps(forged))
        problems = check_attempt(result.attempt).problems
        assert any(expect in p for p in problems), problems
    # A stopped_early entry in an attempt whose config has early stopping off.
    config = result.attempt / "config.toml"
    os.chmod(config, 0o644)
    config.write_text(
        config.read_text().replace("early_stop_patience = 2", "early_stop_patience = 0")
    )
    os.chmod(path, 0o644)
    path.write_text(json.dumps(original))
    problems = check_attempt(result.attempt).problems
    assert any("early stopping off" in p for p in problems), problems


def test_verify_refuses_a_forged_early_stop_of_a_truncated_attempt(tmp_path):
    # A hostile rewrite: an attempt with patience 100 that never stopped early, cut back to its
    # step 8 (later checkpoints and records removed) and given a self-consistent manifest that
    # says it stopped early there. Every hash matches; the counts do not.
    import json
    import shutil

    from iqtrain.checkpoint.files import list_checkpoints
    from iqtrain.checkpoint.state import CheckpointState
    from iqtrain.config.schema import build_config
    from iqtrain.evidence.manifest import publish_manifest
    from iqtrain.evidence.metrics import read_metrics
    from iqtrain.evidence.verify import check_attempt
    from iqtrain.storage import file_digest
    from iqtrain.train.attempt import run_attempt

    tables = _early_tables(tmp_path, tmp_path / "cache", early_stop_patience=100)
    tables["training"]["early_stop_min_delta"] = 0.0
    attempt = run_attempt(build_config(tables)).attempt
    assert check_attempt(attempt).problems == []
    ckpts = attempt / "checkpoints"
    for ckpt in list_checkpoints(ckpts):
        if int(ckpt.name[5:]) > 8:
            shutil.rmtree(ckpt)
    state = CheckpointState.read(ckpts / "step_00000008")
    assert state.stale_validations < 100
    metrics = attempt / "metrics.jsonl"
    metrics.chmod(0o644)
    metrics.write_bytes(metrics.read_bytes()[: state.metrics["bytes"]])
    vals = [r for r in read_metrics(metrics) if r["kind"] == "val"]
    best = min(vals, key=lambda r: r["loss"])
    info_path = attempt / "attempt.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "final_step": 8}))
    publish_manifest(
        attempt,
        config_sha=file_digest(attempt / "config.toml")["sha256"],
        records=state.metrics["records"],
        inherited=None,
        checkpoints=list_checkpoints(ckpts),
        best=(ckpts / f"step_{best['step']:08d}", best["loss"]),
        record=info,
        stopped_early={"step": 8, "best_step": best["step"], "reason": "forged"},
    )
    problems = check_attempt(attempt).problems
    assert any("training.early_stop_patience is 100" in p for p in problems), problems


def test_the_loop_state_is_exactly_the_checkpoint_schemas_loop_table():
    """state.json's ``loop`` keys and types are spelled once (checkpoint/state.py): what the
    loop writes is that table, and a value of the wrong type is refused naming its key."""
    from iqtrain.checkpoint.state import LOOP_FIELDS

    state = LoopState().state_dict()
    assert list(state) == list(LOOP_FIELDS)
    for key in LOOP_FIELDS:
        with pytest.raises(TypeError, match=f"loop.{key} is True"):
            LoopState().load_state_dict({**state, key: True})


def test_every_sink_hears_each_iteration_and_every_record_in_the_streams_order(
    tmp_path, monkeypatch
):
    """The loop's one list of sinks: each step's start and end, and every record in the order
    metrics.jsonl has it, then the loop's end once (an early stop included)."""
    import iqtrain.train.attempt as attempt_module
    from iqtrain.config.schema import build_config
    from iqtrain.evidence.metrics import read_metrics
    from iqtrain.train.loop import Trainer
    from iqtrain.train.sinks import LoopSink

    class Heard(LoopSink):
        def __init__(self) -> None:
            self.events: list[tuple] = []

        def before_step(self, step: int) -> None:
            self.events.append(("before", step))

        def on_record(self, record: dict) -> None:
            self.events.append((record["kind"], record["step"]))

        def after_step(self, step: int) -> None:
            self.events.append(("after", step))

        def close(self) -> None:
            self.events.append(("close",))

    heard = Heard()

    class Listened(Trainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.sinks.append(heard)

    monkeypatch.setattr(attempt_module, "Trainer", Listened)
    result = attempt_module.run_attempt(build_config(_early_tables(tmp_path, tmp_path / "cache")))
    assert result.stopped_early is not None and result.final_step == 6
    records = read_metrics(result.attempt / "metrics.jsonl")
    assert [e for e in heard.events if e[0] in ("train", "val")] == [
        (r["kind"], r["step"]) for r in records
    ]
    steps = [e for e in heard.events if e[0] in ("before", "after")]
    assert steps == [(hook, s) for s in range(1, 7) for hook in ("before", "after")]
    assert heard.events[-1] == ("close",) and heard.events.count(("close",)) == 1
    # each step's records come between its start and its end
    for s in range(1, 7):
        start, end = heard.events.index(("before", s)), heard.events.index(("after", s))
        assert heard.events.index(("train", s)) in range(start, end)
    assert result.probe is None and records[-1]["kind"] == "val"


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_classifiers_labels_come_from_a_label_ring_slot_held_with_its_batch(
    tmp_path, monkeypatch, device
):
    """Each microbatch's labels are copied into the label buffer of its batch's ring slot
    (pinned on CUDA, so the copy to the device is asynchronous) and that buffer is handed to
    the step; it is written again only once the stream hands the slot out again."""
    import numpy as np
    from helpers import tiny_tables

    import iqtrain.train.attempt as attempt_module
    from iqtrain.config.schema import build_config
    from iqtrain.train.loop import Trainer

    trainers: list[Trainer] = []
    seen: list[tuple[list[int], list[bool], np.ndarray, np.ndarray]] = []

    class Watched(Trainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            trainers.append(self)

    real_step = TrainStep.train_step

    def train_step(self, microbatches, lr, **kw):
        labels = kw["labels"]
        ptrs, pinned = [y.data_ptr() for y in labels], [y.is_pinned() for y in labels]
        got = torch.cat(labels).numpy().copy()
        seen.append((ptrs, pinned, got, np.asarray(kw["window_ids"], np.int64)))
        return real_step(self, microbatches, lr, **kw)

    monkeypatch.setattr(attempt_module, "Trainer", Watched)
    monkeypatch.setattr(TrainStep, "train_step", train_step)
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache", max_steps=6, grad_accum=2)
    tables["model"]["objective"] = "classify"
    tables["training"]["device"] = device
    result = attempt_module.run_attempt(build_config(tables))
    assert result.final_step == 6
    (trainer,) = trainers
    assert trainer.train_labels is not None
    ring = trainer.label_ring
    assert len(ring) == len(trainer.ring) and len({t.data_ptr() for t in ring}) == len(ring)
    assert all(t.dtype == torch.int64 and t.shape == (8,) for t in ring)  # data.batch_size
    assert len(seen) == 6
    for ptrs, pinned, got, ids in seen:
        assert len(set(ptrs)) == 2 and set(ptrs) <= {t.data_ptr() for t in ring}
        assert pinned == [device == "cuda"] * 2
        assert np.array_equal(got, trainer.train_labels[ids])

"""The fine-tuning step and loop state (model.objective = "classify"): labels travel with
their microbatches, the trunk's learning rate is scaled or the trunk frozen, validation counts
accuracy per class exactly, and the best checkpoint and early stopping follow accuracy.

Validation queues every batch without a host synchronisation. On the CPU that is checked by
the ops it dispatches (none that reads a tensor's values back to size its result); what only a
GPU can show, that no copy waits (a blocking copy from pageable memory) and that the pass
synchronises once, is the ``gpu`` test under ``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import contextlib
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from iqtrain.config.schema import Config
from iqtrain.config.sections import DataConfig, ModelConfig, OptimizerConfig
from iqtrain.errors import ConfigError, NonFiniteError
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives import REGISTRY
from iqtrain.train.loop import LoopState
from iqtrain.train.step import TrainStep
from iqtrain.train.validation import _classify_sums, validate_classify

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CLASSES = 3
CLASSIFY = REGISTRY["classify"]
TINY = {"dim": 32, "layers": 2, "heads": 2, "patch_len": 8, "max_patches": 16}


def sinusoid_batch(b: int = 4, seed: int = 0) -> torch.Tensor:
    """Normalised patches ``[b, 16, 16]`` of noise (what a classifier reads is irrelevant)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 16, 16, generator=g)


def make_classifier(seed: int = 0, model_kw: dict | None = None, **opt_kw) -> TrainStep:
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**TINY, "objective": "classify", **(model_kw or {})})
    return TrainStep(
        IQTransformer(cfg, CLASSES),
        OptimizerConfig(**opt_kw),
        device="cpu",
        precision="fp32",
        compile=False,
    )


def test_labels_travel_with_their_microbatches_and_accumulation_is_the_batch_mean():
    x, y = sinusoid_batch(b=8), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    one, two = make_classifier(grad_clip=0.0), make_classifier(grad_clip=0.0)
    r1 = one.train_step([x], 1e-3, labels=[y])
    r2 = two.train_step([x[:4], x[4:]], 1e-3, labels=[y[:4], y[4:]])
    assert r1.loss == pytest.approx(r2.loss, rel=1e-6)
    for a, b in zip(one.model.parameters(), two.model.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="labels"):
        one.train_step([x], 1e-3)  # a classifier without labels
    with pytest.raises(ValueError, match="labels"):
        one.train_step([x[:4], x[4:]], 1e-3, labels=[y[:4]])


def test_the_trunk_learns_at_its_scale_and_the_head_at_the_schedules_rate():
    step = make_classifier(trunk_lr_scale=0.1)
    groups = step.optimizer.param_groups
    assert [g["lr_scale"] for g in groups] == [0.1, 0.1, 1.0, 1.0]
    named = {id(p): n for n, p in step.model.named_parameters()}
    for g in groups:
        heads = {step.model.is_head(named[id(p)]) for p in g["params"]}
        assert heads == {g["lr_scale"] == 1.0}
    step.train_step([sinusoid_batch()], 2e-3, labels=[torch.tensor([0, 1, 2, 0])])
    assert [float(g["lr"]) for g in groups] == pytest.approx([2e-4, 2e-4, 2e-3, 2e-3])
    with pytest.raises(ConfigError, match="optimizer.trunk_lr_scale"):
        Config(optimizer=OptimizerConfig(trunk_lr_scale=0.5))  # an mse model is all trunk


def test_a_frozen_trunk_stays_exactly_as_loaded():
    step = make_classifier(model_kw={"freeze_trunk": True})
    before = {n: p.detach().clone() for n, p in step.model.named_parameters()}
    for _ in range(3):
        step.train_step([sinusoid_batch()], 1e-2, labels=[torch.tensor([0, 1, 2, 0])])
    for n, p in step.model.named_parameters():
        assert torch.equal(p, before[n]) != step.model.is_head(n), n
    assert all(step.model.is_head(n) for n in step.decay_param_names + step.no_decay_param_names)


class _Windows:
    """A validation set stand-in: ``windows(ids)`` of raw ``[b, L, 2]`` float32 windows."""

    def __init__(self, raw: np.ndarray) -> None:
        self.raw = raw
        self.num_windows = len(raw)

    def windows(self, ids: np.ndarray) -> np.ndarray:
        return self.raw[ids.astype(np.int64)]


def test_validation_counts_accuracy_per_class_exactly_over_a_partial_last_batch():
    step = make_classifier()
    rng = np.random.default_rng(0)
    raw = rng.standard_normal((11, 128, 2)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 0, 0, 1, 1, 0, 0])
    data = DataConfig(patch_len=8, seq_patches=16, val_batch_size=4)
    rec = validate_classify(step, _Windows(raw), labels, ("a", "b", "c"), data, 5, True)
    with torch.no_grad():
        from iqtrain.model.prepare import prepare_iq_input_reference

        patches, _ = prepare_iq_input_reference(torch.from_numpy(raw), 8)
        logits = step.model.eval()(patches)
    y = torch.from_numpy(labels)
    want = torch.nn.functional.cross_entropy(logits, y).item()
    predicted = logits.argmax(1).numpy()
    assert rec["loss"] == pytest.approx(want, rel=1e-6)
    assert rec["accuracy"] == (predicted == labels).mean()
    for k, name in enumerate("abc"):
        mine = labels == k
        assert rec["class_accuracy"][name] == (predicted[mine] == k).mean()
    assert rec["baseline_majority_accuracy"] == 6 / 11 and rec["samples"] == 11


def test_a_class_without_validation_windows_has_no_accuracy():
    step = make_classifier()
    raw = np.random.default_rng(1).standard_normal((4, 128, 2)).astype(np.float32)
    data = DataConfig(patch_len=8, seq_patches=16, val_batch_size=4)
    rec = validate_classify(
        step, _Windows(raw), np.array([0, 0, 1, 1]), ("a", "b", "c"), data, 1, False
    )
    assert rec["class_accuracy"]["c"] is None and "baseline_majority_accuracy" not in rec


class _Dispatched(TorchDispatchMode):
    """Records every aten op run inside it, with its arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[object, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


def _host_syncs(calls: list[tuple[object, tuple]]) -> list[str]:
    """The ops among ``calls`` that read a tensor's values on the host to size a result or
    return a number: on CUDA each waits for every kernel queued before it."""
    aten = torch.ops.aten
    reads = {aten.bincount.default, aten.nonzero.default, aten._local_scalar_dense.default}
    reads |= {aten.masked_select.default, aten.unique_consecutive.default}
    found = [str(f) for f, _ in calls if f in reads]
    for f, args in calls:
        bool_index = f is aten.index.Tensor and any(
            i is not None and i.dtype == torch.bool for i in args[1]
        )
        if bool_index:
            found.append("aten.index.Tensor with a bool index")
    return found


def test_classifier_validation_dispatches_no_op_that_reads_values_back():
    step = make_classifier()
    raw = np.random.default_rng(2).standard_normal((11, 128, 2)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 0, 0, 1, 1, 0, 2])
    data = DataConfig(patch_len=8, seq_patches=16, val_batch_size=4)
    want = validate_classify(step, _Windows(raw), labels, ("a", "b", "c"), data, 5, True)
    with _Dispatched() as ops:
        got = validate_classify(step, _Windows(raw), labels, ("a", "b", "c"), data, 5, True)
    assert _host_syncs(ops.calls) == [] and got == want
    # A label outside the classes is refused: the per-class sums would not count it.
    with pytest.raises(ValueError, match="labels"):
        _classify_sums(step, _Windows(raw), labels * 2, CLASSES, data)


@contextlib.contextmanager
def _sync_debug(mode: str):
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


@pytest.mark.gpu
def test_classifier_validation_synchronises_once_per_pass_on_cuda():
    torch.manual_seed(4)
    step = TrainStep(
        IQTransformer(ModelConfig(**TINY, objective="classify"), CLASSES),
        OptimizerConfig(),
        device="cuda",
        precision="bf16",
        compile=False,
    )
    raw = np.random.default_rng(2).standard_normal((11, 128, 2)).astype(np.float32)
    labels, classes = np.array([0, 1, 2, 0, 1, 0, 0, 1, 1, 0, 2]), ("a", "b", "c")
    data = DataConfig(patch_len=8, seq_patches=16, val_batch_size=4)
    # A first pass loads the kernels and fills the pinned-memory cache.
    want = validate_classify(step, _Windows(raw), labels, classes, data, 5, True)
    torch.cuda.synchronize()
    with _sync_debug("error"):  # any synchronising call raises
        table = _classify_sums(step, _Windows(raw), labels, CLASSES, data)
    assert table.device.type == "cuda" and table.shape == (3, 3 + 2 * CLASSES)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught, _sync_debug("warn"):
        warnings.simplefilter("always")
        got = validate_classify(step, _Windows(raw), labels, classes, data, 5, True)
    syncs = [str(w.message) for w in caught if "synchronizing" in str(w.message)]
    assert len(syncs) == 1, syncs  # the table's .tolist(), once per pass
    assert got["accuracy"] == want["accuracy"] and got["loss"] == pytest.approx(want["loss"])
    assert all(got["class_accuracy"][c] is not None for c in classes)


def test_the_best_validation_and_early_stopping_follow_accuracy(tmp_path):
    loop, attempt = LoopState(), Path(tmp_path / "0001")
    seen = []
    for step, (loss, acc) in enumerate([(2.0, 0.3), (1.5, 0.3), (1.9, 0.5), (1.0, 0.52)], 1):
        loop.step = step
        record = {"loss": loss, "accuracy": acc}
        seen.append(loop.record_validation(record, attempt, CLASSIFY, min_delta=0.05))
    # A lower loss at the same accuracy is no improvement; 0.52 is best but not by > 0.05.
    assert seen == [True, False, True, True]
    assert (loop.best_step, loop.best_val_accuracy, loop.best_val_loss) == (4, 0.52, 1.0)
    assert (loop.early_stop_ref, loop.stale_validations) == (0.5, 1)
    restored = LoopState()
    restored.load_state_dict(loop.state_dict())
    assert restored.state_dict() == loop.state_dict()
    old = {k: v for k, v in LoopState().state_dict().items() if k != "best_val_accuracy"}
    LoopState().load_state_dict(old)  # a state from before "classify" loads


def test_a_non_finite_window_is_refused_before_any_update():
    step = make_classifier()
    before = [p.detach().clone() for p in step.model.parameters()]
    x = sinusoid_batch()
    x[2, 3, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"training step 7: .*window ids \[10, 11, 12, 13\]"):
        step.train_step(
            [x], 1e-3, step=7, window_ids=np.arange(10, 14), labels=[torch.tensor([0, 1, 2, 0])]
        )
    assert all(torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))


@pytest.mark.slow
def test_a_compiled_classifier_step_and_evaluation_match_eager():
    eager = make_classifier(seed=5, model_kw={"pool": "attention"})
    compiled = TrainStep(
        IQTransformer(eager.model.config, CLASSES),
        OptimizerConfig(),
        device="cpu",
        precision="fp32",
        compile=True,
    )
    compiled.model.load_state_dict(eager.model.state_dict())
    x, y = sinusoid_batch(b=4, seed=5), torch.tensor([0, 1, 2, 1])
    for s, lr in enumerate((1e-3, 2e-3)):
        e = eager.train_step([x[:2], x[2:]], lr, step=s, labels=[y[:2], y[2:]])
        c = compiled.train_step([x[:2], x[2:]], lr, step=s, labels=[y[:2], y[2:]])
        assert abs(e.loss - c.loss) <= 1e-5 and c.grad_norm == pytest.approx(e.grad_norm, rel=1e-4)
    for b in (4, 3):  # a validation batch and a partial last one share the dynamic graph
        (et, en, ep), (ct, cn, cp) = eager.eval_sums(x[:b], y[:b]), compiled.eval_sums(x[:b], y[:b])
        assert en == cn == b and float(ct) == pytest.approx(float(et), rel=1e-5)
        assert torch.equal(ep, cp)


@pytest.mark.gpu
@pytest.mark.parametrize("compile", [False, True])
def test_a_cuda_bf16_classifier_step_tracks_the_cpu_fp32_one(compile):
    cpu = make_classifier(seed=3)
    gpu = TrainStep(
        IQTransformer(cpu.model.config, CLASSES),
        OptimizerConfig(),
        device="cuda",
        precision="bf16",
        compile=compile,
    )
    gpu.model.load_state_dict(cpu.model.state_dict())
    x, y = sinusoid_batch(b=8, seed=3), torch.tensor([0, 1, 2, 1, 0, 2, 2, 1])
    for s in range(3):
        c = cpu.train_step([x], 1e-3, step=s, labels=[y])
        g = gpu.train_step([x.to(torch.bfloat16)], 1e-3, step=s, labels=[y])
        assert g.loss == pytest.approx(c.loss, rel=0.05), (s, c, g)
    total, count, predicted = gpu.eval_sums(x.to(torch.bfloat16), y)
    assert count == 8 and predicted.device.type == "cuda" and torch.isfinite(total)

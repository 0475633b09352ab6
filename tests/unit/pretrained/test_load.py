"""load_pretrained and Pretrained: a trained model loaded verified, embedding and scoring IQ
exactly as training and the probe prepare it.

Without a GPU, ``device="cuda:N"`` is checked against a CUDA said to be there with one device
(``torch.cuda`` patched); loading onto a real GPU, and the bf16 numbers there, are the ``gpu``
tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
from helpers import cli_tables, misuse, refused_in_one_line

import iqtrain
from iqtrain.config.schema import build_config
from iqtrain.data.dataset import IQDataset
from iqtrain.data.sources import validation_patterns
from iqtrain.data.synth import synthesize
from iqtrain.data.windows import labelled_windows
from iqtrain.errors import CheckpointError, InputError
from iqtrain.eval.features import layer_features, probe_features
from iqtrain.evidence.metrics import read_metrics
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import (
    Pretrained,
    SampleRateWarning,
    load_pretrained,
    random_init_model,
    resolve_device,
)
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["categorical", "mse"])
def trained(request, tmp_path_factory):
    """A tiny trained attempt (4 steps, validations at 2 and 4) and labelled recordings."""
    root = tmp_path_factory.mktemp("pre")
    tables = cli_tables(root / "run", root / "cache", max_steps=4)
    tables["model"].update(objective=request.param, bins=16)
    tables["run"]["seed"] = 5
    result = run_attempt(build_config(tables))
    synthesize(root / "labelled", recordings=2, samples=8192, datatype="ci16_le", seed=9)
    return result.attempt, os.fspath(root / "labelled" / "*.sigmf-meta")


def test_the_public_call_loads_every_checkpoint_it_names(trained):
    attempt, _ = trained
    assert iqtrain.load_pretrained is load_pretrained and iqtrain.Pretrained is Pretrained
    best = load_pretrained(attempt)  # which="best"
    manifest = json.loads((attempt / "manifest.json").read_text())
    assert best.checkpoint == (attempt / manifest["best"]["path"]).resolve()
    vals = [r for r in read_metrics(attempt / "metrics.jsonl") if r["kind"] == "val"]
    assert best.step == min(vals, key=lambda r: r["loss"])["step"]
    latest = load_pretrained(attempt, which="latest")
    assert latest.step == 4 and latest.checkpoint.name == "step_00000004"
    assert not latest.model.training and latest.device == torch.device("cpu")
    assert latest.window == latest.config.data.window == 64
    assert latest.attempt.resolve() == attempt.resolve()
    step2 = load_pretrained(attempt, which="step_2")
    same = load_pretrained(attempt / "checkpoints" / "step_00000002")  # a checkpoint directory
    assert step2.step == same.step == 2
    assert step2.model_sha256 == same.model_sha256 != latest.model_sha256
    for k, v in step2.model.state_dict().items():
        assert torch.equal(v, same.model.state_dict()[k]), k


def test_bad_arguments_and_tampered_files_raise_the_typed_error_naming_them(trained, tmp_path):
    attempt, _ = trained
    with misuse("^which: expected latest, best or step_N"):
        load_pretrained(attempt, which="newest")
    with misuse("^device: expected 'cpu' or 'cuda"):
        load_pretrained(attempt, device="tpu")
    with misuse("^device: ", TypeError):
        load_pretrained(attempt, device=0)  # type: ignore[arg-type]
    with misuse("^precision: bf16 needs a CUDA device"):
        load_pretrained(attempt, precision="bf16")
    with pytest.raises(CheckpointError, match="not an attempt directory"):
        load_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_pretrained(attempt, which="step_3")
    copy = tmp_path / "run" / "attempts" / "0001"
    shutil.copytree(attempt, copy)
    weights = copy / "checkpoints" / "step_00000004" / "model.safetensors"
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_pretrained(copy, which="latest")
    weights.unlink()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_pretrained(copy / "checkpoints" / "step_00000004")


def test_a_cuda_index_past_the_visible_gpus_is_one_line_naming_the_device(
    trained, monkeypatch, capsys
):
    attempt, data = trained
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda")
    message = "device: 'cuda:1', but 1 CUDA device(s) are visible (cuda:0)"
    with misuse("cuda:1") as info:
        resolve_device("cuda:1")
    assert str(info.value) == message
    with misuse("cuda:1") as info:
        load_pretrained(attempt, device="cuda:1")
    assert str(info.value) == message
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with misuse(r"2 CUDA device\(s\) are visible \(cuda:0 \.\. cuda:1\)"):
        resolve_device(torch.device("cuda", 2))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    # The command line checks the flag at its boundary: one line naming --device, exit 2.
    refused_in_one_line(
        capsys,
        ["score", os.fspath(attempt), "--data", data, "--device", "cuda:1"],
        "--device: 'cuda:1'",
        "1 CUDA device(s) are visible",
    )


def test_bad_device_and_precision_flags_are_one_line_naming_the_flag(trained, capsys, tmp_path):
    attempt, data = trained
    out = tmp_path / "x.safetensors"
    base = ["embed", os.fspath(attempt), "--data", data, "--out", os.fspath(out)]
    refused_in_one_line(capsys, [*base, "--device", "tpu"], "--device: expected 'cpu'")
    refused_in_one_line(capsys, [*base, "--precision", "bf16"], "--precision: bf16 needs a CUDA")
    refused_in_one_line(capsys, [*base, "--layer", "9"], "--layer: expected 'all' or an integer")
    assert not out.exists()


def _as_complex(raw: np.ndarray) -> np.ndarray:
    return (raw[..., 0].astype(np.float32) + 1j * raw[..., 1].astype(np.float32)).astype(
        np.complex64
    )


def test_embed_equals_the_probes_features_for_the_same_windows(trained):
    attempt, data = trained
    pre = load_pretrained(attempt, which="latest")
    labelled = labelled_windows(data, pre.window)
    raw = np.concatenate(list(labelled.batches()))  # int16, as stored
    want = probe_features(pre.model, labelled, pre.config.data).numpy()
    for iq in (raw, raw.astype(np.float32), raw.astype(np.float64), _as_complex(raw)):
        got = pre.embed(iq)
        assert got.dtype == np.float32 and got.shape == (len(labelled), pre.config.model.dim)
        np.testing.assert_array_equal(got, want)
    layers = layer_features(pre.model, labelled, pre.config.data, [0, 1])
    np.testing.assert_array_equal(pre.embed(raw, layer=0), layers[0].numpy())
    # Leading dimensions flatten; pool=None keeps every patch; its mean is the pooled one.
    per_patch = pre.embed(raw[:6].reshape(2, 3, pre.window, 2), pool=None)
    assert per_patch.shape == (6, pre.config.data.seq_patches, pre.config.model.dim)
    np.testing.assert_allclose(per_patch.mean(axis=1), want[:6], rtol=1e-6, atol=1e-6)
    assert pre.embed(_as_complex(raw[0])).shape == (1, pre.config.model.dim)


@pytest.mark.parametrize(
    "iq",
    [
        np.zeros((3, 63), np.complex64),
        np.zeros((3, 64, 3), np.float32),
        np.zeros((3, 64, 2), np.float16),
        np.zeros((3, 64, 2), np.uint8),
        np.zeros((64,), np.float32),
        np.zeros((3, 64), np.complex256) if hasattr(np, "complex256") else np.zeros(0, object),
        "not an array",
    ],
)
def test_a_wrong_shape_or_dtype_is_one_error_naming_the_expected_window(trained, iq):
    attempt, _ = trained
    pre = load_pretrained(attempt, which="latest")
    for call in (pre.embed, pre.score):
        with pytest.raises(InputError, match=r"iq: expected complex \[\.\.\., 64\]") as info:
            call(iq)
        assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_embed_refuses_bad_layer_pool_and_non_finite_windows(trained):
    attempt, _ = trained
    pre = load_pretrained(attempt, which="latest")
    iq = np.ones((2, 64), np.complex64)
    with misuse("^layer: expected"):
        pre.embed(iq, layer=2)
    with misuse("^layer: embed takes one layer"):
        pre.embed(iq, layer="all")
    with misuse("^pool: expected 'mean' or None, got 'max'"):
        pre.embed(iq, pool="max")  # type: ignore[arg-type]
    with misuse("^batch_size: must be >= 1"):
        pre.embed(iq, batch_size=0)
    with misuse("^batch_size: must be an integer", TypeError):
        pre.embed(iq, batch_size=2.0)  # type: ignore[arg-type]
    iq[1, 5] = np.nan
    with pytest.raises(InputError, match="window 1 gives non-finite features"):
        pre.embed(iq)
    with pytest.raises(InputError, match="window 1 gives a non-finite score"):
        pre.score(iq)  # one rule for every use: the score command refuses such a set too


def test_score_of_the_validation_windows_is_the_validation_loss_recorded(trained):
    attempt, _ = trained
    records = [r for r in read_metrics(attempt / "metrics.jsonl") if r["kind"] == "val"]
    for record in records:
        pre = load_pretrained(attempt, which=f"step_{record['step']}")
        val = IQDataset(validation_patterns(pre.config.data), window=pre.window)
        raw = val.windows(np.arange(val.num_windows, dtype=np.uint64))
        scores = pre.score(raw, batch_size=5)
        assert scores.shape == (val.num_windows,) and scores.dtype == np.float64
        assert scores.mean() == pytest.approx(record["loss"], rel=1e-6)
        # Batching changes nothing but the float sums' rounding.
        np.testing.assert_allclose(pre.score(raw), scores, rtol=1e-6)


def test_random_init_is_trainings_step_0_beside_the_same_config(trained):
    attempt, _ = trained
    pre = load_pretrained(attempt, which="latest")
    base = pre.random_init()
    assert base.config is pre.config and base.step == 0 and not base.model.training
    torch.manual_seed(pre.config.run.seed)
    fresh = IQTransformer(pre.config.model)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, base.model.state_dict()[k]), k


@pytest.mark.gpu
def test_cuda_embeds_and_scores_as_the_cpu_does_in_fp32_and_near_it_in_bf16(trained):
    attempt, data = trained
    cpu = load_pretrained(attempt, which="latest")
    raw = np.concatenate(list(labelled_windows(data, cpu.window).batches()))
    fp32 = load_pretrained(attempt, which="latest", device="cuda")
    assert fp32.precision == "fp32" and fp32.device.type == "cuda"  # it trained in fp32
    np.testing.assert_allclose(fp32.embed(raw), cpu.embed(raw), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(fp32.score(raw), cpu.score(raw), rtol=1e-4)
    bf16 = load_pretrained(attempt, which="latest", device="cuda", precision="bf16")
    np.testing.assert_allclose(bf16.embed(raw), cpu.embed(raw), rtol=0.1, atol=0.1)
    np.testing.assert_allclose(bf16.score(raw), cpu.score(raw), rtol=0.05)


def test_any_array_like_input_is_taken_or_refused_in_one_line(trained):
    attempt, _ = trained
    pre = load_pretrained(attempt, which="latest")
    rng = np.random.default_rng(0)
    raw = rng.integers(-99, 99, (3, 64, 2)).astype(np.int16)
    want = pre.embed(raw)
    with pytest.warns(PendingDeprecationWarning):  # numpy's own advice against np.matrix
        matrix = np.matrix(raw[0])
    same = [
        raw.astype(">i2"),  # big-endian, as np.fromfile gives for ci16_be
        matrix,  # an ndarray subclass
        torch.from_numpy(raw[:1].astype(np.float32)).requires_grad_(),  # a tensor
        np.asfortranarray(raw),
        raw[:, :, ::-1][:, :, ::-1],  # non-contiguous views
    ]
    read_only = raw.copy()
    read_only.flags.writeable = False
    same.append(read_only)
    for iq in same:
        got = pre.embed(iq)
        np.testing.assert_array_equal(got, want[: len(got)])
    assert pre.embed(np.zeros((0, 64), np.complex64)).shape == (0, pre.config.model.dim)
    assert pre.score(np.zeros((0, 64, 2), np.int16)).shape == (0,)
    for bad in (
        torch.zeros((1, 64, 2), dtype=torch.bfloat16),
        [[1.0, 2.0], [3.0]],  # ragged
        np.zeros((2, 64, 2), dtype=object),
    ):
        with pytest.raises(InputError, match=r"iq: expected complex \[\.\.\., 64\]"):
            pre.embed(bad)
    with pytest.raises(InputError, match="got a tensor of torch.float32 on meta$"):
        pre.embed(torch.zeros((1, 64, 2), device="meta"))  # no values to copy out
    huge = np.full((2, 64, 2), 1e39)  # finite in float64, infinite in float32
    with pytest.raises(InputError, match="window 0 holds values beyond float32's range"):
        pre.score(huge)
    tiny = np.ones((3, 64), np.complex128)
    tiny[2] *= 1e-300  # a signal in float64, all zeros in float32: refused as the huge one is
    with pytest.raises(InputError, match="window 2 holds values below float32's range"):
        pre.embed(tiny)


def test_a_large_input_is_checked_without_a_copy_and_converted_batch_by_batch():
    from iqtrain.pretrained.inputs import check_windows, loader_batches

    big = np.broadcast_to(np.ones(64, np.complex128), (10**9, 64))  # 1 TB if copied
    windows = check_windows(big, 64)
    assert windows.shape == (10**9, 64) and np.shares_memory(windows, big)
    first = next(loader_batches(windows, 4))
    assert first.shape == (4, 64, 2) and first.dtype == np.float32 and first.flags.writeable
    # Leading dimensions a reshape cannot flatten without a copy (a broadcast view): rows are
    # read a batch at a time, in row-major order of the leading dimensions.
    rows = np.arange(3 * 64 * 2, dtype=np.int16).reshape(3, 64, 2)
    wide = np.broadcast_to(rows[None], (10**8, 3, 64, 2))  # 77 GB if copied
    windows = check_windows(wide, 64)
    assert windows.shape == (3 * 10**8, 64, 2) and len(windows) == 3 * 10**8
    first = next(loader_batches(windows, 5))
    assert np.array_equal(first, np.concatenate([rows, rows[:2]]))


def test_precision_is_fp32_unless_asked(trained):
    attempt, _ = trained
    assert load_pretrained(attempt).precision == "fp32"
    assert load_pretrained(attempt, precision="auto").precision == "fp32"  # CPU
    with misuse("^precision: expected"):
        load_pretrained(attempt, precision="fp16")  # type: ignore[arg-type]
    ckpt = attempt / "checkpoints" / "step_00000002"
    with misuse("^which: 'latest', but .* is itself a checkpoint"):
        load_pretrained(ckpt, which="latest")
    assert load_pretrained(ckpt, which="step_2").step == 2


def test_samples_at_another_rate_than_the_models_are_one_warning_naming_both(trained):
    attempt, _ = trained
    p = load_pretrained(attempt)
    assert p.sample_rate == 1e6  # the synthetic recordings' core:sample_rate
    assert issubclass(SampleRateWarning, RuntimeWarning)
    iq = np.zeros((2, p.window), np.complex64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none of these warns
        p.embed(iq)
        p.embed(iq, sample_rate=1e6)
        p.score(iq, sample_rate=np.float64(1e6))
        dataclasses.replace(p, sample_rate=None).embed(iq, sample_rate=2e6)  # model's unknown
    for call in (p.embed, p.score):
        with pytest.warns(SampleRateWarning) as record:
            call(iq, sample_rate=2.4e6)
        (w,) = record
        assert "1 MHz" in str(w.message) and "2.4 MHz" in str(w.message), str(w.message)
        assert "\n" not in str(w.message) and w.filename == __file__  # the caller's line
    classify = dataclasses.replace(p.config.model, objective="classify")
    classifier = dataclasses.replace(
        p,
        model=random_init_model(classify, 0, 2),
        config=dataclasses.replace(p.config, model=classify),
        classes=("a", "b"),
    )
    with pytest.warns(SampleRateWarning, match="2 MHz"):
        classifier.predict(iq, sample_rate=2e6)
    for bad in (0, -1.0, True, "1e6", float("nan")):
        with misuse("^sample_rate: ", (TypeError, ValueError)):
            p.embed(iq, sample_rate=bad)

"""Tests of iqtrain.model.flops: the peak table, the device lookup, achieved TFLOP/s and MFU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from iqtrain.model import flops
from iqtrain.model.flops import (
    PEAK_TFLOPS,
    achieved_tflops,
    device_peak_tflops,
    lookup_peak_tflops,
    mfu,
)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA GH200 480GB", "H100 SXM"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
    ],
)
def test_device_names_map_to_their_family(name: str, family: str) -> None:
    table = PEAK_TFLOPS[family]
    assert lookup_peak_tflops(name, "bf16") == table["bf16"]
    assert lookup_peak_tflops(name, "fp32") == table["fp32"]
    assert lookup_peak_tflops(name, "fp32", tf32=True) == table["tf32"]
    assert lookup_peak_tflops(name, "bf16", tf32=True) == table["bf16"]  # tf32 is fp32-only


def test_table_is_dense_and_ordered() -> None:
    for family, peaks in PEAK_TFLOPS.items():
        # bf16 tensor cores are 2x TF32 and far above the CUDA-core FP32 peak on these parts.
        assert peaks["bf16"] == pytest.approx(2 * peaks["tf32"], rel=0.01), family
        assert peaks["tf32"] > 5 * peaks["fp32"], family
    assert PEAK_TFLOPS["H100 SXM"]["bf16"] < 1000  # dense, not the 1979 "with sparsity"


def test_unknown_devices_and_precisions() -> None:
    assert lookup_peak_tflops("NVIDIA GeForce RTX 4090", "bf16") is None
    assert lookup_peak_tflops("Tesla V100-SXM2-16GB", "fp32") is None
    with pytest.raises(ValueError, match="precision"):
        lookup_peak_tflops("NVIDIA H100 PCIe", "fp16")


def test_device_peak_override_and_cpu() -> None:
    assert device_peak_tflops("cpu", "fp32") is None
    assert device_peak_tflops("cpu", "fp32", override=1.5) == 1.5
    assert device_peak_tflops("cuda", "bf16", override=400) == 400.0
    for bad in (0, -1.0, float("inf"), float("nan"), True, "1"):
        with pytest.raises(ValueError, match="peak_tflops"):
            device_peak_tflops("cuda", "bf16", override=bad)


@pytest.fixture
def fp32_precision():
    """Restores torch's process-wide fp32 matmul precision (the generic and the CUDA matmul
    level of the fp32_precision API) after the test."""
    import torch

    generic, matmul = torch.backends.fp32_precision, torch.backends.cuda.matmul.fp32_precision
    yield torch.backends
    torch.backends.fp32_precision = generic
    torch.backends.cuda.matmul.fp32_precision = matmul


@pytest.fixture
def an_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")


@pytest.mark.usefixtures("an_h100")
def test_device_peak_reads_the_current_gpu(fp32_precision, monkeypatch) -> None:
    import torch

    fp32_precision.cuda.matmul.fp32_precision = "ieee"
    assert device_peak_tflops("cuda", "bf16") == 989.4
    assert device_peak_tflops("cuda", "fp32") == 66.9
    fp32_precision.cuda.matmul.fp32_precision = "tf32"
    assert device_peak_tflops("cuda", "fp32") == 494.7
    # "none" inherits the generic level (torch's own default: none at both, no TF32).
    fp32_precision.cuda.matmul.fp32_precision = "none"
    fp32_precision.fp32_precision = "tf32"
    assert device_peak_tflops("cuda", "fp32") == 494.7
    fp32_precision.fp32_precision = "none"
    assert device_peak_tflops("cuda", "fp32") == 66.9
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_peak_tflops("cuda", "bf16") is None


@pytest.mark.usefixtures("an_h100")
def test_tf32_is_read_through_the_fp32_precision_api_alone(fp32_precision, monkeypatch) -> None:
    """The legacy getter (``matmul.allow_tf32``) is deprecated, and raises outright once the
    new API set a state it cannot represent: the MFU of a run that asked for TF32 the new way
    must not end the run."""
    import torch

    def legacy(*args: object) -> bool:
        raise AssertionError("read through torch.backends.cuda.matmul.allow_tf32")

    fp32_precision.cuda.matmul.fp32_precision = "tf32"  # the new API, as torch recommends
    assert device_peak_tflops("cuda", "fp32") == 494.7
    monkeypatch.setattr(torch._C, "_get_cublas_allow_tf32", legacy)
    assert device_peak_tflops("cuda", "fp32") == 494.7
    assert device_peak_tflops("cuda", "bf16") == 989.4


def test_achieved_and_mfu() -> None:
    # 1e9 FLOPs per patch x 2048 patches in 0.5 s = 4.096e12 FLOP/s.
    assert achieved_tflops(1e9, 2048, 0.5) == pytest.approx(4.096)
    assert achieved_tflops(1e9, 2048, 0.0) == 0.0  # never a non-finite record
    assert mfu(4.096, 989.4) == pytest.approx(4.096 / 989.4)
    assert mfu(4.096, None) is None
    with pytest.raises(ValueError, match="peak"):
        mfu(1.0, 0.0)


def test_module_does_not_import_torch() -> None:
    # iqtrain/__init__ may import torch itself; load flops.py alone to test the module.
    path = flops.__file__
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('flops_alone', {path!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m.lookup_peak_tflops('NVIDIA H200', 'bf16') == 989.4\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

"""``training.deterministic`` (iqtrain.train.determinism.configure): which of torch's
process-wide switches it sets on CUDA, that it refuses a cuBLAS workspace that is not
deterministic, restores what it found when turned off, and leaves the CPU alone.

These tests read torch's switches; none of them runs a CUDA kernel. Whether the switches make a
CUDA step bit-exact is what only a GPU can show: ``scripts/ci/gpu_determinism.py`` (the
determinism stage of ``bash .ci/dev gpu``) runs eager and compiled bf16 steps of the quickstart
model with dropout, restores the state and repeats them (``torch.equal`` on every parameter),
compares the parameters' sha256 across processes with their own cold compile caches, names
the attention kernels the steps ran, and times the steps with the mode on and off.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch._inductor.config as inductor_config

from iqtrain.errors import ConfigError
from iqtrain.train import determinism
from iqtrain.train.determinism import configure


def _switches() -> dict:
    return {
        "algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "inductor": inductor_config.deterministic,
        "fill": torch.utils.deterministic.fill_uninitialized_memory,
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cudnn_sdp": torch.backends.cuda.cudnn_sdp_enabled(),
        "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
    }


@pytest.fixture
def switches(monkeypatch):
    """torch's switches as this process had them, put back after the test; no
    CUBLAS_WORKSPACE_CONFIG, and no earlier configure() remembered."""
    # set first, so that the variable configure() sets is undone too (delenv of an unset
    # variable records nothing to undo)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    monkeypatch.setattr(determinism, "_before", None)
    before = _switches()
    yield before
    torch.use_deterministic_algorithms(before["algorithms"], warn_only=before["warn_only"])
    inductor_config.deterministic = before["inductor"]
    torch.utils.deterministic.fill_uninitialized_memory = before["fill"]
    torch.backends.cudnn.deterministic = before["cudnn_deterministic"]
    torch.backends.cudnn.benchmark = before["cudnn_benchmark"]
    torch.backends.cuda.enable_cudnn_sdp(before["cudnn_sdp"])


ON = {
    "algorithms": True,
    "warn_only": False,  # strict: flash attention's deterministic backward needs it
    "inductor": True,
    "fill": False,
    "cudnn_deterministic": True,
    "cudnn_benchmark": False,
    "cudnn_sdp": False,
    "cublas": ":4096:8",
}


def test_cuda_sets_every_switch(switches):
    assert switches != ON  # torch's defaults are not the deterministic mode
    configure("cuda", True)
    assert _switches() == ON


def test_warn_only_becomes_strict_and_benchmarking_stops(switches):
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = True
    configure("cuda", True)
    assert _switches() == ON


@pytest.mark.parametrize("value", [":16:8", ":4096:8"])
def test_a_deterministic_workspace_already_set_is_kept(switches, monkeypatch, value):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    configure("cuda", True)
    assert _switches() == {**ON, "cublas": value}


@pytest.mark.parametrize("value", [":0:0", "", ":4096:2"])
def test_another_workspace_is_refused_naming_the_key_and_changes_nothing(
    switches, monkeypatch, value
):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with pytest.raises(ConfigError) as info:
        configure("cuda", True)
    assert str(info.value) == (
        f"training.deterministic: the environment sets CUBLAS_WORKSPACE_CONFIG={value!r}, but "
        "deterministic cuBLAS needs ':4096:8' or ':16:8'; unset it, or set "
        "training.deterministic = false"
    )
    assert _switches() == {**switches, "cublas": value}


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_cpu_is_left_alone(switches, deterministic):
    configure("cpu", deterministic)
    assert _switches() == switches


def test_off_changes_nothing_that_configure_did_not_change(switches):
    torch.backends.cudnn.benchmark = True  # a user's own choice
    expected = _switches()
    configure("cuda", False)
    assert _switches() == expected


def test_off_after_on_restores_what_the_first_call_found(switches):
    torch.backends.cudnn.benchmark = True  # a user's own choice, restored too
    found = _switches()
    configure("cuda", True)
    configure("cuda", True)  # a second call does not forget the first one's finding
    assert _switches() == ON
    configure("cuda", False)
    # the workspace stays: the process's first matmul has read it
    assert _switches() == {**found, "cublas": ":4096:8"}
    configure("cuda", True)
    assert _switches() == ON

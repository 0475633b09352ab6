"""Shared pytest setup.

Triton reads TRITON_INTERPRET when it is first imported, so it must be set before anything
imports triton. Without a GPU the kernels run in the interpreter on CPU tensors.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

if shutil.which("nvidia-smi") is None and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"


def _interpreter_index_fix() -> None:
    """Triton 3.6's interpreter turns a scalar kernel argument into a Python int with
    ``int(array)`` on a one-element 1-d array, which numpy 2.5 refuses (``only 0-dimensional
    arrays can be converted to Python scalars``): every loop over a runtime bound (the kernel's
    ``range(0, n_norm, BLOCK)``) fails there. The GPU machine's stack is triton 3.6 with numpy
    2.5 (``bash .ci/dev device-stack``). Later triton converts ``array.squeeze()``; this applies
    that same conversion, under the interpreter only and only where the interpreter's own code
    has the old form, so the tests run the kernel rather than skip it. Compiled kernels (a GPU)
    never use the interpreter."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    try:
        import inspect

        from triton.runtime import interpreter
    except ImportError:  # no triton on this platform: the PyTorch reference runs instead
        return
    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or "int(self.handle.data))" not in inspect.getsource(patch):
        return

    def patched(tensor, scope):
        patch(tensor, scope)
        # The scope restores attributes in reverse order: this one first, then triton's own.
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    interpreter._patch_lang_tensor = patched


_interpreter_index_fix()


import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import random_iq, skip_gpu_tests_without_cuda, write_sigmf  # noqa: E402


@pytest.fixture
def make_recording(tmp_path):
    """Factory: write a recording of ``n`` random samples; returns (meta_path, components)."""
    counter = iter(range(10**6))

    def make(n: int, datatype: str = "ci16_le", seed: int | None = None, name=None, **fields):
        i = next(counter)
        rng = np.random.default_rng(i if seed is None else seed)
        iq = random_iq(rng, n, datatype)
        meta = write_sigmf(tmp_path / "rec", name or f"r{i:03d}", iq, datatype, **fields)
        return meta, iq

    return make


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """An offline W&B directory for this test alone (returned). wandb reads ``WANDB_DIR`` once
    per process, when its first run starts, so the process-wide setup is torn down after the
    test: the next test's runs land in its own directory, not in this one."""
    wandb = pytest.importorskip("wandb", reason="needs wandb, the optional iqtrain[wandb] extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb_dir").mkdir()
    yield tmp_path / "wandb_dir"
    wandb.teardown()


@pytest.fixture(scope="module")
def one_torch_thread():
    """Run a module's tiny models on one thread (use with ``pytest.mark.usefixtures``).

    The CPU cores here are shared; with two OpenMP threads a step that takes 4 ms alone
    stalls for 100s of ms at every parallel region whenever the other core is busy elsewhere.
    One thread is both faster for models this small and immune to that.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


E2E = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects: the tiers select on ``e2e``
def pytest_collection_modifyitems(config, items):
    """Every test under tests/e2e/ is marked ``e2e`` (CI's tiers: .ci/dev test, the fast tier
    is ``not e2e and not slow and not distributed``); ``gpu`` tests skip on a machine without
    CUDA (with the reason a user would accept)."""
    for item in items:
        if item.path.is_relative_to(E2E):
            item.add_marker(pytest.mark.e2e)
    skip_gpu_tests_without_cuda(items)


def pytest_addoption(parser):
    parser.addoption(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run each selected test N times (scripts/exit_paths.py: N in a row, with -x)",
    )


def pytest_generate_tests(metafunc):
    count = metafunc.config.getoption("repeat")
    if count > 1:
        metafunc.fixturenames.append("repeat_index")
        metafunc.parametrize("repeat_index", range(count), ids=lambda i: f"run{i + 1}")

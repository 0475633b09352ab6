"""Shared pytest setup.

Triton reads TRITON_INTERPRET when it is first imported, so it must be set before anything
imports triton. Without a GPU the kernels run in the interpreter on CPU tensors.
"""

from __future__ import annotations

import os
import shutil

if shutil.which("nvidia-smi") is None and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

# numpy dtype of one component, per SigMF complex datatype
COMPONENT_DTYPES = {
    "ci8": np.dtype("i1"),
    "cu8": np.dtype("u1"),
    "ci16_le": np.dtype("<i2"),
    "ci16_be": np.dtype(">i2"),
    "cf32_le": np.dtype("<f4"),
    "cf32_be": np.dtype(">f4"),
}


def write_sigmf(directory: Path, name: str, iq: np.ndarray, datatype: str, **global_fields) -> Path:
    """Write ``iq`` ([n, 2] components) as a SigMF recording with the sigmf package."""
    from sigmf import SigMFFile

    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{name}.sigmf-data"
    np.ascontiguousarray(iq, dtype=COMPONENT_DTYPES[datatype]).tofile(data_path)
    meta = SigMFFile(
        data_file=data_path,
        global_info={"core:datatype": datatype, "core:sample_rate": 1e6, **global_fields},
    )
    meta.add_capture(0, metadata={"core:frequency": 915e6})
    meta.tofile(directory / f"{name}.sigmf-meta")
    return directory / f"{name}.sigmf-meta"


def random_iq(rng: np.random.Generator, n: int, datatype: str) -> np.ndarray:
    dt = COMPONENT_DTYPES[datatype]
    if dt.kind == "f":
        return rng.standard_normal((n, 2)).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=(n, 2), endpoint=True).astype(dt)


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

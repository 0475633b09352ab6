"""The installed wheel: kernels ship under iqtrain, the extension is abi3, the API is public.

.ci/dev installs the wheel non-editable and runs pytest from the checkout, where python/ is
not on sys.path, so these tests see exactly what a user's `pip install` gets.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

import pytest

import iqtrain

REPO = Path(__file__).resolve().parents[2]
installed = "site-packages" in Path(iqtrain.__file__).parts


@pytest.mark.skipif(not installed, reason="running against a source tree, not an installed wheel")
def test_kernels_ship_inside_the_installed_wheel():
    files = {str(f) for f in md.files("iqtrain")}
    assert "iqtrain/kernels/normalize_patch.py" in files
    assert not any(f.startswith("kernels/") for f in files), "no top-level kernels package"
    # Exactly one extension module: a python/iqtrain/_native*.so left in the source tree by
    # `maturin develop` must not ride along (maturin skips it; .ci/dev checks the wheel too).
    native = [f for f in files if f.startswith("iqtrain/_native") and f.endswith(".so")]
    assert len(native) == 1 and native[0].endswith(".abi3.so"), native
    import iqtrain.kernels.normalize_patch as k

    path = Path(k.__file__)
    assert "site-packages" in path.parts and not path.is_symlink()
    assert path.read_bytes() == (REPO / "kernels" / "normalize_patch.py").read_bytes()
    assert "py.typed" in {Path(f).name for f in files}
    assert "_native.pyi" in {Path(f).name for f in files}


def test_public_api_and_private_extension():
    for name in iqtrain.__all__:
        assert hasattr(iqtrain, name), name
    assert {
        "IQDataset",
        "TrainStream",
        "prepare_iq_input",
        "IQTrainError",
        "DataError",
        "CursorMismatchError",
        "run_pretraining_attempt",
    } <= set(iqtrain.__all__)
    assert not any(n.startswith("Native") for n in iqtrain.__all__)
    from iqtrain import _native

    assert _native.NativeDataset.__module__ == "iqtrain._native"
    assert sys.version_info >= (3, 11)


def test_console_script_is_declared():
    eps = [e for e in md.entry_points(group="console_scripts") if e.name == "iqtrain"]
    assert eps and eps[0].value == "iqtrain.cli.main:main"


def test_triton_is_a_linux_x86_64_dependency():
    # DESIGN lists triton; its wheels exist for Linux x86_64 only, and elsewhere the kernels
    # are never imported (the PyTorch reference runs), so it carries that marker.
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    triton = [d for d in deps if d.replace(" ", "").startswith("triton")]
    assert len(triton) == 1, deps
    name, _, marker = triton[0].partition(";")
    assert name.strip().startswith("triton>=")
    assert {c.strip() for c in marker.split(" and ")} == {
        "sys_platform == 'linux'",
        "platform_machine == 'x86_64'",
    }
    if installed:  # the wheel's metadata carries the same requirement
        requires = [r.replace('"', "'") for r in md.requires("iqtrain") or []]
        assert any(r.startswith("triton") and "platform_machine == 'x86_64'" in r for r in requires)

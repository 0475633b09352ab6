"""The installed wheel: kernels ship under iqtrain, the extension is abi3, the API is public.

.ci/dev installs the wheel non-editable and runs pytest from the checkout, where python/ is
not on sys.path, so these tests see exactly what a user's `pip install` gets.
"""

from __future__ import annotations

import importlib.metadata as md
import sys
from pathlib import Path

import pytest

import iqtrain

REPO = Path(__file__).resolve().parent.parent
installed = "site-packages" in Path(iqtrain.__file__).parts


@pytest.mark.skipif(not installed, reason="running against a source tree, not an installed wheel")
def test_kernels_ship_inside_the_installed_wheel():
    files = {str(f) for f in md.files("iqtrain")}
    assert "iqtrain/kernels/normalize_patch.py" in files
    assert not any(f.startswith("kernels/") for f in files), "no top-level kernels package"
    assert any(f.startswith("iqtrain/_native") and f.endswith(".abi3.so") for f in files)
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
    assert eps and eps[0].value == "iqtrain.cli:main"

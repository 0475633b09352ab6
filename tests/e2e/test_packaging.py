"""What the installed package provides: the console script runs the CLI, the extension is an abi3
module of the package's own that gives the results every machine gives, every public name
resolves, the kernels ship under iqtrain, and triton is required on Linux x86_64 only.

.ci/dev installs the wheel non-editable and runs pytest from the checkout, where python/ is
not on sys.path, so these tests see exactly what a user's `pip install` gets; run against a
source tree (PYTHONPATH=python) the ones that need an installed wheel skip.
"""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import pytest

import iqtrain

REPO = Path(__file__).resolve().parents[2]
installed = "site-packages" in Path(iqtrain.__file__).parts
needs_wheel = pytest.mark.skipif(
    not installed,
    reason="checks the installed wheel; this run imports iqtrain from the source tree",
)


def _distribution() -> md.Distribution:
    try:
        return md.distribution("iqtrain")
    except md.PackageNotFoundError:
        pytest.skip("no iqtrain distribution installed (a bare source tree)")


@needs_wheel
def test_kernels_ship_inside_the_installed_wheel():
    files = {str(f) for f in md.files("iqtrain") or []}
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


def test_the_iqtrain_entry_point_is_the_cli(capsys):
    from iqtrain.cli.main import main

    dist = _distribution()
    (ep,) = [e for e in dist.entry_points if e.group == "console_scripts"]
    assert ep.name == "iqtrain"
    assert ep.load() is main
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: iqtrain")
    for command in ("run", "resume", "verify", "synth", "report", "probe", "predict"):
        assert command in out, command


@needs_wheel
def test_the_installed_console_script_runs():
    exe = Path(sys.executable).parent / "iqtrain"
    proc = subprocess.run(
        [exe, "verify", REPO / "no-such-attempt"], capture_output=True, text=True, timeout=120
    )
    # The script is the CLI itself: one error line naming the attempt, exit 2.
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        f"iqtrain: error: {REPO / 'no-such-attempt'}: not an attempt directory (no attempt.json)\n"
    )


def test_the_extension_is_an_abi3_module_of_the_package():
    from iqtrain import _native

    path = Path(_native.__file__)
    # abi3: one build loads on every CPython >= 3.11, so the file carries no version tag.
    assert path.parent == Path(iqtrain.__file__).parent
    assert path.name.startswith("_native.abi3."), path.name
    assert _native.NativeDataset.__module__ == "iqtrain._native"
    # Private: the public API wraps it and re-exports none of it.
    assert not any(n.startswith(("Native", "_native")) for n in iqtrain.__all__)


def test_every_public_name_resolves_to_an_iqtrain_object():
    names = [n for n in iqtrain.__all__ if n != "__version__"]
    for name in names:
        value = getattr(iqtrain, name)
        assert value.__module__.startswith("iqtrain."), (name, value.__module__)
        assert value.__name__ == name
        assert name in dir(iqtrain)
    if installed:
        assert iqtrain.__version__ == md.version("iqtrain")


@needs_wheel
def test_triton_is_required_on_linux_x86_64_only():
    from packaging.requirements import Requirement

    requires = [Requirement(r) for r in md.requires("iqtrain") or []]
    base = [r for r in requires if "extra" not in str(r.marker)]  # not an optional extra's
    (triton,) = [r for r in base if r.name == "triton"]

    def wanted(platform: str, machine: str) -> bool:
        assert triton.marker is not None
        return triton.marker.evaluate({"sys_platform": platform, "platform_machine": machine})

    assert wanted("linux", "x86_64")
    assert not wanted("linux", "aarch64")
    assert not wanted("darwin", "x86_64") and not wanted("win32", "AMD64")
    # Everything else the package needs is needed everywhere.
    assert {r.name for r in base if r.marker is not None} == {"triton"}


def test_the_extension_gives_the_shuffle_and_digests_every_machine_gives():
    # The digests were made on x86_64 and equal an aarch64 wheel's (built with zig, run under
    # qemu); the release workflow runs the same script on each wheel it builds.
    proc = subprocess.run(
        [sys.executable, REPO / "scripts" / "ci" / "native_check.py"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

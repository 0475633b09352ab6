""".ci/dev on a fresh machine: which interpreter the virtual environment is created with.

``bash .ci/dev find-python`` prints the interpreter ``setup`` would use. Each test runs it with a
PATH it controls: a directory of fake interpreters first, then one holding only the tools the
script needs (``dirname``), so no interpreter of the machine running the tests can be picked.
The fakes are what a fresh machine has: a pyenv shim for an inactive version (exits 127), an
interpreter that is too old, one without ``ensurepip`` (Debian without python3-venv), and a
working one (this test's own interpreter behind a wrapper).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEV = REPO / ".ci" / "dev"
BASH = shutil.which("bash")
VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"  # this interpreter's

pytestmark = pytest.mark.skipif(
    BASH is None or shutil.which("dirname") is None, reason="needs bash and dirname"
)

# The real interpreter runs the probe it is given with -c, seeing what an older or incomplete
# Python would: a lower sys.version_info, or no ensurepip module.
IMPOSTOR = """#!{python}
import sys

version = {version!r}
if sys.argv[1:2] == ["--version"]:
    print("Python %d.%d.%d" % version[:3])
    sys.exit(0)
if sys.argv[1:2] != ["-c"]:
    sys.exit("this fake interpreter only runs -c")
sys.version_info = version
if {no_ensurepip!r}:
    sys.modules["ensurepip"] = None  # import ensurepip -> ImportError
del sys.argv[1]
exec(compile(sys.argv[1], "<string>", "exec"), {{"__name__": "__main__"}})
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def pyenv_shim(directory: Path, name: str) -> Path:
    """What pyenv puts on PATH for a version that is installed but not active."""
    return _write(
        directory / name,
        f"#!/bin/sh\necho 'pyenv: {name}: command not found' >&2\nexit 127\n",
    )


def working(directory: Path, name: str) -> Path:
    return _write(directory / name, f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')


def impostor(directory: Path, name: str, *, version=None, no_ensurepip=False) -> Path:
    version = tuple(sys.version_info) if version is None else version
    text = IMPOSTOR.format(python=sys.executable, version=version, no_ensurepip=no_ensurepip)
    return _write(directory / name, text)


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    return tmp_path / "fake"


def dev(tmp_path: Path, fake: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    if not (tools / "dirname").exists():
        (tools / "dirname").symlink_to(shutil.which("dirname"))
    fake.mkdir(exist_ok=True)
    return subprocess.run(
        [BASH, os.fspath(DEV), *args],
        env={"PATH": f"{fake}{os.pathsep}{tools}", "HOME": os.fspath(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_broken_shims_and_old_pythons_are_skipped(tmp_path: Path, fake: Path) -> None:
    pyenv_shim(fake, "python3.13")
    pyenv_shim(fake, "python3.12")
    impostor(fake, "python3.11", version=(3, 10, 13, "final", 0))
    python3 = working(fake, "python3")

    r = dev(tmp_path, fake, "find-python")

    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{python3}\n"  # exactly the chosen path, nothing else on stdout
    err = r.stderr
    assert f"skipping {fake / 'python3.13'}: it does not run (exit 127)" in err
    assert f"skipping {fake / 'python3.12'}: it does not run (exit 127)" in err
    assert f"skipping {fake / 'python3.11'}: Python 3.10 is older than 3.11" in err
    assert f"using {python3} (Python {VERSION})" in err


def test_the_newest_working_candidate_wins(tmp_path: Path, fake: Path) -> None:
    pyenv_shim(fake, "python3.13")
    python312 = working(fake, "python3.12")
    working(fake, "python3")

    r = dev(tmp_path, fake, "find-python")

    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{python312}\n"


def test_no_working_candidate_is_one_clear_error(tmp_path: Path, fake: Path) -> None:
    pyenv_shim(fake, "python3.13")
    pyenv_shim(fake, "python3.12")
    impostor(fake, "python3.11", version=(3, 10, 13, "final", 0))
    impostor(fake, "python3", no_ensurepip=True)

    r = dev(tmp_path, fake, "find-python")

    assert r.returncode != 0
    assert r.stdout == ""
    assert f"skipping {fake / 'python3'}: Python {VERSION} has no venv/ensurepip" in r.stderr
    errors = [line for line in r.stderr.splitlines() if "error" in line]
    assert errors == [
        "iqtrain: error: no working Python >= 3.11 with venv and ensurepip on PATH "
        "(tried python3.13, python3.12, python3.11, python3); install one or set IQTRAIN_PYTHON"
    ]
    assert r.stderr.splitlines()[-1] == errors[0]


def test_setup_stops_before_creating_anything(tmp_path: Path, fake: Path) -> None:
    pyenv_shim(fake, "python3.12")
    venv = tmp_path / "venv"

    r = dev(tmp_path, fake, "setup", IQTRAIN_VENV=os.fspath(venv))

    assert r.returncode != 0
    assert r.stderr.splitlines()[-1].startswith("iqtrain: error: no working Python >= 3.11")
    assert "Traceback" not in r.stderr and not venv.exists()


def test_iqtrain_python_overrides_the_search(tmp_path: Path, fake: Path) -> None:
    working(fake, "python3")
    chosen = working(tmp_path / "elsewhere", "py")

    r = dev(tmp_path, fake, "find-python", IQTRAIN_PYTHON=os.fspath(chosen))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{chosen}\n"

    # Set, it is the only candidate: a broken one is an error, not a silent fallback.
    broken = pyenv_shim(tmp_path / "elsewhere", "python3.12")
    r = dev(tmp_path, fake, "find-python", IQTRAIN_PYTHON=os.fspath(broken))
    assert r.returncode != 0 and r.stdout == ""
    assert r.stderr.splitlines()[-1] == (
        f"iqtrain: error: IQTRAIN_PYTHON={broken} is not a working Python >= 3.11 "
        "with venv and ensurepip"
    )

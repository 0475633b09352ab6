""".ci/dev on a fresh machine: which interpreter the virtual environment is created with.

``bash .ci/dev find-python`` prints the interpreter ``setup`` would use. Each test runs it with a
PATH it controls: a directory of fake interpreters first, then one holding only the tools the
script needs (``dirname``), so no interpreter of the machine running the tests can be picked.
The fakes are what a fresh machine has: a pyenv shim for an inactive version (exits 127), an
interpreter that is too old, one without ``ensurepip`` (Debian without python3-venv), and a
working one (this test's own interpreter behind a wrapper).
"""

from __future__ import annotations

import json
import os
import re
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


# --------------------------------------------------------------------------- gpu-pack and gpu
# Both run against a copy of .ci/dev and scripts/ci/ in a scratch checkout (a few fake source
# files), with fakes for every program they may call: nothing here builds, downloads or touches
# the real checkout. The fakes log each call (name, arguments, a few variables) as JSON lines.

FAKE = """#!{python}
import json, os, sys
from pathlib import Path

name, args = Path(sys.argv[0]).name, sys.argv[1:]
keep = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "IQTRAIN_GPU_SUMMARY",
        "TRITON_INTERPRET")
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps({{"name": name, "args": args,
                           "env": {{k: os.environ.get(k) for k in keep}}}}) + "\\n")
if name == "nvidia-smi":
    print("GPU 0: NVIDIA H200 (UUID: GPU-fake)")
elif name == "maturin":  # build ... -o DIR: a wheel of FAKE_WHEEL_BYTES bytes
    out = Path(args[args.index("-o") + 1])
    out.mkdir(parents=True, exist_ok=True)
    tag = os.environ.get("FAKE_WHEEL_TAG", "manylinux_2_34_x86_64")
    size = int(os.environ.get("FAKE_WHEEL_BYTES", "1000"))
    (out / f"iqtrain-0.1.0-cp311-abi3-{{tag}}.whl").write_bytes(b"w" * size)
elif name == "python" and args[:3] == ["-m", "pip", "download"]:  # one small wheel per NAME==V
    dest = Path(args[args.index("-d") + 1])
    for req in (a for a in args if "==" in a):
        n, v = req.split("==")
        (dest / f"{{n.replace('-', '_')}}-{{v}}-py3-none-any.whl").write_bytes(b"d" * 100)
elif args[:1] == ["-c"] and "importlib.metadata" in args[1]:  # pack_requirements
    os.execv({python!r}, [{python!r}, *args])
elif any(a.endswith("gpu_summary.py") for a in args[:1]):  # the real summary
    os.execv({python!r}, [{python!r}, *args])
elif args and os.environ.get("FAKE_FAIL") in (Path(args[0]).stem.removeprefix("gpu_"), *args[1:2]):
    sys.exit(1)  # FAKE_FAIL names a stage: its script (gpu_NAME.py), or gpu_smoke.py's NAME
"""

# Everything .ci/dev's gpu-pack and gpu use besides the fakes (bash builtins aside).
TOOLS = [
    *("dirname", "basename", "date", "stat", "sha256sum", "cut", "du", "tail", "head", "grep"),
    *("cp", "rm", "mkdir", "touch", "find", "sort", "tr", "xargs", "awk", "diff", "timeout"),
    *("cat", "ls"),
]
RECORDERS = ("cargo", "maturin", "ruff", "mypy", "lint-imports", "pip")
STAGES = ["install", "smoke", "cuda-tests", "determinism", "resume", "bench", "study"]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A checkout with .ci/dev, scripts/ci/ and a few fake sources; fakes in tmp_path/fake,
    the venv's in tmp_path/venv/bin, the tools in tmp_path/tools."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(DEV, repo / ".ci" / "dev")
    shutil.copytree(REPO / "scripts" / "ci", repo / "scripts" / "ci")
    for name in ("python/iqtrain/__init__.py", "kernels/k.py", "rust/src/lib.rs"):
        _write(repo / name, f"# {name}\n")
    for name in ("rust/Cargo.toml", "rust/Cargo.lock"):
        _write(repo / name, "")
    fake = (tmp_path / "fake").resolve()
    text = FAKE.format(python=sys.executable)
    for name in ("nvidia-smi", "python3", *RECORDERS):
        _write(fake / name, text)
    for name in ("python", "maturin", "ruff", "mypy", "lint-imports"):
        _write(tmp_path / "venv" / "bin" / name, text)
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"needs the standard tool {tool} on PATH (gpu-pack and gpu call it)")
        (tools / tool).symlink_to(found)
    return repo


def run_dev(scratch: Path, *args: str, nvidia: bool = True, **env: str):
    """``bash .ci/dev ARGS`` of the scratch checkout; the fakes' calls as a list of dicts."""
    tmp = scratch.parent
    if not nvidia:
        (tmp / "fake" / "nvidia-smi").unlink(missing_ok=True)
    log = tmp / "calls.jsonl"
    log.unlink(missing_ok=True)
    base = {
        "PATH": f"{tmp / 'fake'}{os.pathsep}{tmp / 'tools'}",
        "HOME": os.fspath(tmp),
        "IQTRAIN_VENV": os.fspath(tmp / "venv"),
        "IQTRAIN_GPU_DIR": os.fspath(tmp / "gpu"),
        "FAKE_LOG": os.fspath(log),
        "TRITON_INTERPRET": "1",  # gpu must unset it
    }
    r = subprocess.run(
        [BASH, os.fspath(scratch / ".ci" / "dev"), *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return r, calls


def errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("iqtrain: error:")]


def limits(r: subprocess.CompletedProcess) -> dict[str, int]:
    """Each stage's limit, from its '== gpu: NAME (limit N s)' line."""
    found = re.findall(r"^== gpu: (\S+) \(limit (\d+) s\)$", r.stderr, re.MULTILINE)
    return {name: int(n) for name, n in found}


def row(r: subprocess.CompletedProcess, stage: str) -> list[str]:
    """The cells of ``stage``'s row in the summary table on stdout."""
    (line,) = re.findall(rf"^\| {re.escape(stage)} \|.*$", r.stdout, re.M)
    return [cell.strip() for cell in line.strip("|").split("|")]


def script_calls(calls: list[dict], script: str) -> list[dict]:
    return [c for c in calls if c["name"] == "python3" and script in " ".join(c["args"][:1])]


def test_gpu_pack_holds_the_wheel_the_missing_wheels_and_a_manifest(scratch: Path) -> None:
    r, calls = run_dev(scratch, "gpu-pack")

    assert r.returncode == 0, r.stderr
    pack = scratch / ".gpu-pack"
    names = sorted(p.name for p in pack.iterdir())
    assert "iqtrain-0.1.0-cp311-abi3-manylinux_2_34_x86_64.whl" in names
    for dep in ("sigmf", "jsonschema", "jsonschema_specifications", "referencing", "rpds_py"):
        assert any(n.startswith(f"{dep}-") for n in names), names
    assert "MANIFEST" in names and len(names) == 8
    manifest = (pack / "MANIFEST").read_text().splitlines()
    digest = run_dev(scratch, "source-digest")[0].stdout.strip()
    assert f"source-digest {digest}" in manifest
    wheels = [line.split() for line in manifest if line.startswith("wheel ")]
    assert sorted(w[5] for w in wheels) == sorted(n for n in names if n.endswith(".whl"))
    (download,) = [c["args"] for c in calls if c["args"][:3] == ["-m", "pip", "download"]]
    for flag in ("--no-deps", "--only-binary=:all:", "--python-version", "3.12"):
        assert flag in download
    assert download[download.index("manylinux_2_17_x86_64") - 1] == "--platform"
    assert not [c for c in calls if c["name"] in ("cargo", "ruff", "mypy", "lint-imports")]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAKE_WHEEL_BYTES": str(9 * 2**20)}, "more than 8388608"),
        ({"FAKE_WHEEL_TAG": "manylinux_2_39_x86_64"}, "with N <= 34"),
    ],
    ids=["too-large", "glibc-too-new"],
)
def test_gpu_pack_refuses_a_large_pack_or_a_new_glibc(scratch: Path, env, message) -> None:
    r, _ = run_dev(scratch, "gpu-pack", **env)

    assert r.returncode == 1
    (line,) = errors(r)
    assert message in line


def test_gpu_without_nvidia_smi_is_one_line(scratch: Path) -> None:
    r, calls = run_dev(scratch, "gpu", nvidia=False)

    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "iqtrain: error: gpu: nvidia-smi not found; this command needs a machine with a CUDA "
        "GPU (use test or bench here)"
    ]
    assert calls == [] and not (scratch.parent / "gpu").exists()


def test_gpu_without_a_pack_is_one_line(scratch: Path) -> None:
    r, calls = run_dev(scratch, "gpu")

    assert r.returncode == 1
    (line,) = errors(r)
    assert line.startswith(f"iqtrain: error: gpu: no pack in {scratch / '.gpu-pack'}")
    assert r.stderr.splitlines()[-1] == line
    assert [c["name"] for c in calls] == ["nvidia-smi"]


def test_gpu_with_a_stale_pack_is_one_line(scratch: Path) -> None:
    assert run_dev(scratch, "gpu-pack")[0].returncode == 0
    _write(scratch / "python" / "iqtrain" / "__init__.py", "# edited after packing\n")

    r, _ = run_dev(scratch, "gpu")

    assert r.returncode == 1
    (line,) = errors(r)
    assert "was built from other sources than these" in line


def test_gpu_installs_the_pack_offline_and_runs_every_stage_in_order(scratch: Path) -> None:
    assert run_dev(scratch, "gpu-pack")[0].returncode == 0
    gpu = scratch.parent / "gpu"

    r, calls = run_dev(scratch, "gpu")

    assert r.returncode == 0, r.stderr
    # Offline: the pack alone, into a target directory; nothing built, linted or downloaded.
    (pip,) = [c["args"] for c in calls if c["args"][:3] == ["-m", "pip", "install"]]
    assert "--no-index" in pip and pip[pip.index("--target") + 1] == os.fspath(gpu / "site")
    assert sorted(Path(a).name for a in pip if a.endswith(".whl")) == sorted(
        p.name for p in (scratch / ".gpu-pack").glob("*.whl")
    )
    assert not [c for c in calls if c["name"] in RECORDERS or c["name"] == "python"]
    # The stages, in order, under limits that sum to at most 460 s after install.
    assert list(limits(r)) == STAGES
    assert sum(limits(r).values()) - limits(r)["install"] <= 460
    assert sum(limits(r).values()) <= 480  # 8 minutes
    # Fresh compile caches and the pack first on sys.path, for every stage.
    stage_calls = [c for c in calls if c["name"] == "python3"]
    for c in stage_calls:
        assert c["env"]["PYTHONPATH"] == os.fspath(gpu / "site")
        assert c["env"]["TORCHINDUCTOR_CACHE_DIR"] == os.fspath(gpu / "inductor")
        assert c["env"]["TRITON_INTERPRET"] is None
    summary = os.fspath(gpu / "summary.jsonl")
    assert script_calls(calls, "gpu_determinism.py")[0]["args"][1:] == [summary]
    smoke = script_calls(calls, "gpu_smoke.py")[0]["args"]
    assert smoke[1:] == ["smoke", "--", "-x", "-m", "gpu and gpu_smoke", "tests"]
    resume = script_calls(calls, "resume_check.py")[0]["args"]
    assert resume[1:] == [
        os.fspath(gpu / "site/bin/iqtrain"),
        "examples/quickstart.toml",
        "--gpu-stage",
    ]
    # One summary block on stdout: a row per stage.
    for name in STAGES:
        assert re.search(
            rf"^\| {name} \| {limits(r)[name]} s \| \d+ s \| passed \|", r.stdout, re.M
        )


def test_a_failed_smoke_stage_stops_the_rest(scratch: Path) -> None:
    assert run_dev(scratch, "gpu-pack")[0].returncode == 0

    r, calls = run_dev(scratch, "gpu", FAKE_FAIL="smoke")

    assert r.returncode == 1
    assert errors(r)[-1] == "iqtrain: error: gpu: smoke failed; the stages after it did not run"
    assert list(limits(r)) == ["install", "smoke"]
    assert not script_calls(calls, "resume_check.py") and not script_calls(calls, "gpu_study.py")
    assert "failed (exit 1)" in row(r, "smoke") and "not run" in row(r, "study")


def test_a_later_failure_is_named_and_the_other_stages_still_run(scratch: Path) -> None:
    assert run_dev(scratch, "gpu-pack")[0].returncode == 0

    r, calls = run_dev(scratch, "gpu", FAKE_FAIL="determinism")

    assert r.returncode == 1
    assert errors(r)[-1] == "iqtrain: error: gpu: failed: determinism (the summary above says how)"
    assert list(limits(r)) == STAGES
    assert "failed (exit 1)" in row(r, "determinism")
    assert [stage for stage in STAGES if "passed" in row(r, stage)] == [
        stage for stage in STAGES if stage != "determinism"
    ]


def test_gpu_only_runs_install_and_the_stages_named(scratch: Path) -> None:
    assert run_dev(scratch, "gpu-pack")[0].returncode == 0

    r, calls = run_dev(scratch, "gpu", "--only", "bench,study", "--probe-data", "x/*.sigmf-meta")

    assert r.returncode == 0, r.stderr
    assert list(limits(r)) == ["install", "bench", "study"]
    assert script_calls(calls, "gpu_study.py")[0]["args"][-2:] == ["--probe-data", "x/*.sigmf-meta"]
    assert "not selected (--only)" in row(r, "smoke")

    r, _ = run_dev(scratch, "gpu", "--only", "nonsense")
    assert r.returncode == 2 and r.stderr.startswith("usage: bash .ci/dev gpu")


# ---------------------------------------------------------------------------- requirements

REQUIREMENTS = REPO / "scripts" / "ci" / "requirements.py"
# The distribution behind each program .ci/dev runs from the venv.
TOOL_PACKAGES = {
    "ruff": "ruff",
    "maturin": "maturin",
    "mypy": "mypy",
    "lint-imports": "import-linter",
    "check-jsonschema": "check-jsonschema",
}


def _requirements(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REQUIREMENTS), *args], capture_output=True, text=True, check=False
    )


def test_every_tool_the_checks_run_is_in_the_dev_extra() -> None:
    from packaging.requirements import Requirement

    text = DEV.read_text()
    tools = set(re.findall(r'"\$VENV/bin/([a-z-]+)"', text)) - {"iqtrain", "python"}
    modules = set(re.findall(r'"\$PY" -m ([a-z_]+)', text)) - {"pip", "venv"}
    assert tools and tools <= set(TOOL_PACKAGES), tools
    assert modules and modules <= {"pytest", "mypy"}, modules
    proc = _requirements("--extra", "dev")
    assert proc.returncode == 0, proc.stderr
    names = {Requirement(line).name for line in proc.stdout.splitlines()}
    assert {TOOL_PACKAGES[t] for t in tools} | modules <= names
    assert {"torch", "numpy", "pytest", "hypothesis", "import-linter"} <= names
    # what `.ci/dev wheel` runs without naming it: maturin's zig, check_wheel.py's auditwheel
    assert {"ziglang", "auditwheel"} <= names


def test_check_names_what_is_missing_and_passes_when_all_are_there(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[project]\ndependencies = ["pytest>=1"]\n'
        "[project.optional-dependencies]\n"
        'dev = ["iqtrain-no-such-package>=1", "pytest>=999", "pytest>=1; sys_platform == \'x\'"]\n'
    )
    proc = _requirements("--pyproject", str(pyproject), "--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["pytest>=1"]
    proc = _requirements("--pyproject", str(pyproject), "--extra", "dev", "--check")
    assert proc.returncode == 1
    assert "iqtrain-no-such-package>=1 (not installed)" in proc.stderr
    assert "pytest>=999 (" in proc.stderr and "installed)" in proc.stderr
    assert "sys_platform" not in proc.stderr  # a marker that does not apply here is not missing
    assert len(proc.stdout.splitlines()) == 4  # pip gets every line, markers and all
    proc = _requirements("--pyproject", str(pyproject), "--extra", "nope")
    assert proc.returncode == 1 and "no extra 'nope'" in proc.stderr


def test_the_two_tiers_are_complements_over_registered_markers() -> None:
    """Every test runs in exactly one tier: the fast tier's ``not a and not b ...`` against the
    slow tier's ``a or b ...`` over the same markers, each one registered."""
    import tomllib

    text = DEV.read_text()
    fast = re.search(r"^FAST_TIER='([^']*)'$", text, re.M)
    slow = re.search(r"^SLOW_TIER='([^']*)'$", text, re.M)
    assert fast and slow
    fast_terms = fast.group(1).split(" and ")
    assert all(t.startswith("not ") for t in fast_terms), fast_terms
    markers = [t.removeprefix("not ") for t in fast_terms]
    assert slow.group(1).split(" or ") == markers
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {m.split(":")[0] for m in ini["markers"]}
    assert set(markers) <= registered and "e2e" in markers

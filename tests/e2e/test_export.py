"""``iqtrain export``: a package folder and an ONNX file from an attempt of each objective, loaded
back and compared bit for bit (package) or within the check's tolerance (ONNX Runtime), run
without torch, and every bad input refused in one line with nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, cli_tables, refused_in_one_line, write_attempt

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config, dumps_toml
from iqtrain.errors import CheckpointError, ObjectiveError
from iqtrain.evidence.package import read_package
from iqtrain.pretrained.load import load_pretrained
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OBJECTIVES = ("mse", "categorical", "classify")


def _tables(root: Path, objective: str) -> dict:
    tables = cli_tables(root / objective, root / f"cache-{objective}", max_steps=6)
    tables["training"].update(eval_every=3, checkpoint_every=3, compile=False)
    tables["model"].update(dim=16, layers=2, heads=2, objective=objective)
    if objective == "categorical":
        tables["model"].update(bins=16)
    if objective == "classify":
        tables["data"]["synthetic"].update(samples=8192)
    return tables


@pytest.fixture(scope="module")
def attempts(tmp_path_factory) -> dict[str, Path]:
    """A finished six-step attempt of each objective (the classifier on the synthetic labelled
    set)."""
    root = tmp_path_factory.mktemp("export")
    return {o: run_attempt(build_config(_tables(root, o))).attempt for o in OBJECTIVES}


@pytest.fixture(scope="module")
def packages(attempts, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packages")
    out = {}
    for objective, attempt in attempts.items():
        out[objective] = root / objective
        assert main(["export", os.fspath(attempt), "--out", os.fspath(out[objective])]) == 0
    return out


def _windows(pre, n: int = 5) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((n, pre.window, 2)).astype(np.float32)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_a_package_gives_what_its_attempt_gives_bit_for_bit(attempts, packages, objective):
    a, p = load_pretrained(attempts[objective]), load_pretrained(packages[objective])
    assert (p.step, p.classes, p.sample_rate) == (a.step, a.classes, a.sample_rate)
    assert p.model_sha256 == a.model_sha256 and p.objective is a.objective
    x = _windows(a)
    assert np.array_equal(p.embed(x), a.embed(x))
    assert np.array_equal(p.embed(x, layer=1, pool=None), a.embed(x, layer=1, pool=None))
    for use in ("score", "predict"):
        if use in a.objective.uses:
            assert np.array_equal(getattr(p, use)(x), getattr(a, use)(x))
        else:
            with pytest.raises(ObjectiveError, match=f"which gives no {use}"):
                getattr(p, use)(x)
    files = sorted(f.name for f in packages[objective].iterdir())
    assert files == ["README.md", "config.json", "lineage.json", "model.safetensors"]
    # the weights are the checkpoint's file, byte for byte
    assert (packages[objective] / "model.safetensors").read_bytes() == (
        a.checkpoint / "model.safetensors"
    ).read_bytes()


def test_the_package_says_what_it_is_and_where_it_came_from(attempts, packages):
    doc = json.loads((packages["classify"] / "config.json").read_text())
    pre = load_pretrained(attempts["classify"])
    assert doc["objective"] == "classify" and doc["classes"] == list(pre.classes)
    assert doc["input"]["window"] == pre.window and doc["sample_rate"] == pre.sample_rate
    lineage = json.loads((packages["classify"] / "lineage.json").read_text())
    assert lineage["source"]["attempt"] == "0001" and lineage["source"]["step"] == pre.step
    card = (packages["classify"] / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: iqtrain\n")
    assert "validation accuracy" in card and "majority class" in card
    assert "out = model.predict(iq)" in card and "model.score" not in card
    # no machine path in what is shared
    for name in ("README.md", "config.json", "lineage.json"):
        assert (
            os.fspath(attempts["classify"].parent) not in (packages["classify"] / name).read_text()
        )


def test_an_export_is_byte_reproducible(attempts, packages, tmp_path):
    again = tmp_path / "again"
    assert main(["export", os.fspath(attempts["mse"]), "--out", os.fspath(again)]) == 0
    for f in packages["mse"].iterdir():
        assert (again / f.name).read_bytes() == f.read_bytes(), f.name
    assert main(["export", os.fspath(attempts["mse"]), "--out", os.fspath(again), "--force"]) == 0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_verify_checks_a_package_without_torch(packages, tmp_path):
    code = (
        "import sys; from iqtrain.cli.main import main\n"
        f"rc = main(['verify', {os.fspath(packages['categorical'])!r}])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "verified (package of 'categorical'" in proc.stdout


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _rehash(pkg: Path, *names: str) -> None:
    """Update lineage.json (and config.json's model_sha256 when the weights are named) to
    the edited files: an edit consistent with the package's own hashes."""
    from iqtrain.evidence.package import sha256_file

    lineage = json.loads((pkg / "lineage.json").read_text())
    for name in names:
        digest = sha256_file(pkg / name)
        lineage["files"][name] = {"bytes": (pkg / name).stat().st_size, "sha256": digest}
    (pkg / "lineage.json").write_text(json.dumps(lineage))


def _tamper(pkg: Path, how: str) -> None:
    config = json.loads((pkg / "config.json").read_text())
    weights = pkg / "model.safetensors"
    if how == "weights":
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x40
        weights.write_bytes(bytes(data))
    elif how == "weights and lineage":
        data = bytearray(weights.read_bytes())
        data[-3] ^= 0x40
        weights.write_bytes(bytes(data))
        _rehash(pkg, "model.safetensors")
    elif how == "config and lineage":
        config["architecture"]["dim"] = 32
        (pkg / "config.json").write_text(json.dumps(config))
        _rehash(pkg, "config.json")
    elif how in ("extra tensor", "non-finite weight"):
        from safetensors.numpy import load_file, save_file

        tensors = load_file(weights)
        if how == "extra tensor":
            tensors["extra"] = np.zeros(3, np.float32)
        else:
            tensors["norm.weight"][0] = np.nan
        save_file(tensors, weights)
        config["model_sha256"] = __import__("hashlib").sha256(weights.read_bytes()).hexdigest()
        (pkg / "config.json").write_text(json.dumps(config))
        _rehash(pkg, "model.safetensors", "config.json")
    elif how == "newer format":
        lineage = json.loads((pkg / "lineage.json").read_text())
        lineage["format_version"] = 99
        (pkg / "lineage.json").write_text(json.dumps(lineage))


@pytest.mark.parametrize(
    ("how", "match"),
    [
        ("weights", "model.safetensors: its SHA-256 is not the one lineage.json lists"),
        ("weights and lineage", "config.json: model_sha256 is not the weights' SHA-256"),
        ("config and lineage", "model.safetensors: tensor .* the architecture's is F32"),
        ("extra tensor", r"extra \['extra'\]"),
        ("non-finite weight", "tensor norm.weight holds non-finite values"),
        ("newer format", "written by a newer iqtrain"),
    ],
)
def test_an_edited_package_is_refused_by_verify_load_and_init(packages, tmp_path, how, match):
    pkg = _copy(packages["mse"], tmp_path / "pkg")
    _tamper(pkg, how)
    with pytest.raises(CheckpointError, match=match):
        read_package(pkg)
    with pytest.raises(CheckpointError, match=match):
        load_pretrained(pkg)
    proc = subprocess.run(
        [sys.executable, "-m", "iqtrain", "verify", os.fspath(pkg)], capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stdout.startswith("MISMATCH "), proc.stdout


def test_init_from_a_package_starts_from_its_weights_and_verifies(packages, tmp_path):
    from iqtrain.evidence.verify import verify_attempt

    tables = _tables(tmp_path, "classify")
    tables["init"] = {"from": os.fspath(packages["mse"])}
    result = run_attempt(build_config(tables))
    assert verify_attempt(result.attempt) == []
    info = json.loads((result.attempt / "attempt.json").read_text())
    assert info["init"]["package"] == os.fspath(packages["mse"].resolve())
    child = load_pretrained(result.attempt, which="step_3")
    assert child.objective.name == "classify"
    # a package changed after the child started: verify names it
    moved = _copy(packages["mse"], tmp_path / "kept")
    try:
        _tamper(packages["mse"], "weights")
        problems = verify_attempt(result.attempt)
        assert len(problems) == 1 and "is not the weights it records" in problems[0], problems
    finally:
        shutil.rmtree(packages["mse"])
        shutil.copytree(moved, packages["mse"])


def test_bad_outputs_and_sources_are_one_line_and_leave_nothing(
    attempts, packages, tmp_path, capsys
):
    att = os.fspath(attempts["mse"])
    inside = os.fspath(attempts["mse"] / "pkg")
    refused_in_one_line(capsys, ["export", att, "--out", inside], "inside attempt")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere")
    refused_in_one_line(capsys, ["export", att, "--out", os.fspath(link)], "symbolic link")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused_in_one_line(capsys, ["export", att, "--out", os.fspath(fifo)], "not a directory")
    refused_in_one_line(capsys, ["export", att, "--onnx", os.fspath(fifo)], "not a regular file")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep.txt").write_text("mine")
    refused_in_one_line(
        capsys, ["export", att, "--out", os.fspath(plain), "--force"], "not an iqtrain package"
    )
    assert (plain / "keep.txt").read_text() == "mine"
    refused_in_one_line(
        capsys, ["export", att, "--out", os.fspath(packages["mse"])], "pass --force"
    )
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if not os.access(ro, os.W_OK):  # root writes anyway
            refused_in_one_line(
                capsys, ["export", att, "--out", os.fspath(ro / "pkg")], "not writable"
            )
    finally:
        ro.chmod(stat.S_IRWXU)
    refused_in_one_line(capsys, ["export", att], "exactly one of --out DIR")
    refused_in_one_line(
        capsys, ["export", att, "--out", os.fspath(tmp_path / "x"), "--head", "score"], "--head"
    )
    refused_in_one_line(
        capsys,
        ["export", att, "--onnx", os.fspath(tmp_path / "m.onnx"), "--head", "predict"],
        "which gives no predict",
    )
    y = os.fspath(tmp_path / "y")
    refused_in_one_line(
        capsys, ["export", att, "--out", y, "--which", "step_5"], "no such checkpoint"
    )
    crashed = write_attempt(tmp_path / "run", status="crashed")
    (crashed / "config.toml").write_text(dumps_toml(_tables(tmp_path, "mse")))
    refused_in_one_line(capsys, ["export", os.fspath(crashed), "--out", os.fspath(tmp_path / "z")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["link", "fifo", "plain", "ro", "run"]
    )


def test_a_full_disk_leaves_nothing_behind(attempts, tmp_path):
    """A write that fails (the file size limit stands in for a full disk) is one line, exit 2,
    and leaves no package and no temporary directory."""
    code = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "from iqtrain.cli.main import main\n"
        f"sys.exit(main(['export', {os.fspath(attempts['mse'])!r}, '--out', "
        f"{os.fspath(tmp_path / 'pkg')!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "cannot write" in lines[0], proc.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("objective", "heads"),
    [("mse", ("embed", "score")), ("categorical", ("score",)), ("classify", ("predict", "embed"))],
)
def test_onnx_runtime_gives_what_the_model_gives(attempts, packages, tmp_path, objective, heads):
    import onnxruntime as ort

    pre = load_pretrained(packages[objective])
    for head in heads:
        out = tmp_path / f"{head}.onnx"
        argv = ["export", os.fspath(packages[objective]), "--onnx", os.fspath(out), "--head", head]
        assert main(argv) == 0
        session = ort.InferenceSession(os.fspath(out), providers=["CPUExecutionProvider"])
        meta = session.get_modelmeta().custom_metadata_map
        assert meta["head"] == head and meta["objective"] == objective
        assert meta["model_sha256"] == pre.model_sha256 and int(meta["window"]) == pre.window
        assert json.loads(meta["classes"]) == (None if pre.classes is None else list(pre.classes))
        x = _windows(pre, 33)  # another batch size than the export's example
        got = session.run(None, {"iq": x})[0]
        want = {"embed": pre.embed, "score": pre.score, "predict": pre.predict}[head](x)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())


def test_an_int16_graph_takes_samples_as_recorded(packages, tmp_path):
    import onnxruntime as ort

    out = tmp_path / "int16.onnx"
    argv = ["export", os.fspath(packages["classify"]), "--onnx", os.fspath(out)]
    assert main([*argv, "--input-dtype", "int16"]) == 0
    pre = load_pretrained(packages["classify"])
    x = np.random.default_rng(2).integers(-3000, 3000, (4, pre.window, 2)).astype(np.int16)
    session = ort.InferenceSession(os.fspath(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {"iq": x})[0]
    np.testing.assert_allclose(got, pre.predict(x), rtol=0, atol=1e-4 * np.abs(got).max())
    # the same file again: byte for byte
    again = tmp_path / "again.onnx"
    assert main([*argv[:3], os.fspath(again), "--input-dtype", "int16"]) == 0
    assert again.read_bytes() == out.read_bytes()


@pytest.mark.slow
def test_the_example_runs_with_numpy_and_onnxruntime_alone(attempts, packages, tmp_path):
    """examples/onnx_predict.py in a throwaway venv holding numpy and onnxruntime only."""
    model = tmp_path / "model.onnx"
    assert main(["export", os.fspath(packages["classify"]), "--onnx", os.fspath(model)]) == 0
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    pip = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "numpy",
            "onnxruntime",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert pip.returncode == 0, pip.stderr[-2000:]
    recording = next((attempts["classify"].parents[2] / "cache-classify").rglob("*.sigmf-meta"))
    proc = subprocess.run(
        [python, REPO / "examples" / "onnx_predict.py", model, recording, "--limit", "3"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ["PATH"]},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    pre = load_pretrained(packages["classify"])
    assert lines[0].endswith("head predict") and len(lines) == 4
    assert all(line.split(": ")[1].split(" (p")[0] in pre.classes for line in lines[1:])
    listed = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "torch" not in listed and "iqtrain" not in listed


def test_a_checkpoint_that_fails_is_named_when_an_older_one_answers(attempts, tmp_path, capsys):
    """A crashed attempt whose newest checkpoint is corrupt: the model loaded is an older
    checkpoint's, and a note says which answered and why."""
    run = shutil.copytree(attempts["mse"].parents[1], tmp_path / "run")
    att = run / "attempts" / "0001"
    info = json.loads((att / "attempt.json").read_text())
    (att / "attempt.json").write_text(json.dumps({**info, "status": "crashed"}))
    (att / "manifest.json").unlink()
    weights = att / "checkpoints" / "step_00000006" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    capsys.readouterr()
    pre = load_pretrained(att, which="latest")
    assert pre.step == 3
    err = capsys.readouterr().err
    assert "latest is step_00000003: checkpoint step_00000006 does not verify" in err, err


def test_embed_writes_the_same_bytes_for_the_same_input(packages, attempts, tmp_path):
    """Two processes embedding the same recordings write identical files (safetensors itself
    orders its metadata by a per-process hash)."""
    data = os.fspath(attempts["mse"].parents[2] / "cache-mse" / "*" / "val" / "*.sigmf-meta")
    outs = []
    for i in range(2):
        outs.append(tmp_path / f"e{i}.safetensors")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "iqtrain",
                "embed",
                os.fspath(packages["mse"]),
                "--data",
                data,
                "--out",
                os.fspath(outs[-1]),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert outs[0].read_bytes() == outs[1].read_bytes()


def test_a_running_or_unverifiable_attempt_and_a_device_are_refused(attempts, tmp_path, capsys):
    from iqtrain.evidence.lock import AttemptLock

    run = shutil.copytree(attempts["mse"].parents[1], tmp_path / "run")
    att = run / "attempts" / "0001"
    out = os.fspath(tmp_path / "pkg")
    refused_in_one_line(capsys, ["export", os.fspath(att), "--out", "/dev/null"], "not a dir")
    with (att / "metrics.jsonl").open("a") as f:
        f.write('{"kind": "note"}\n')
    refused_in_one_line(capsys, ["export", os.fspath(att), "--out", out], "failed verification")
    info = json.loads((att / "attempt.json").read_text())
    (att / "attempt.json").write_text(json.dumps({**info, "status": "running"}))
    lock = AttemptLock(att).acquire()
    try:
        refused_in_one_line(capsys, ["export", os.fspath(att), "--out", out], "still running")
        refused_in_one_line(
            capsys, ["export", os.fspath(att), "--onnx", out + ".onnx"], "still running"
        )
    finally:
        lock.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_onnx_file_that_does_not_match_the_model_is_not_written(packages, tmp_path, monkeypatch):
    from iqtrain.errors import IQTrainError
    from iqtrain.pretrained import onnx_export

    real = onnx_export._reference
    monkeypatch.setattr(onnx_export, "_reference", lambda *a: real(*a) * (1 + 1e-3))
    pre = load_pretrained(packages["mse"])
    with pytest.raises(
        IQTrainError, match=r"differ from the model's by 0.00\d+ .* nothing written"
    ):
        onnx_export.export_onnx(pre, tmp_path / "m.onnx", head="score")
    assert list(tmp_path.iterdir()) == []


def test_verify_and_load_look_inside_the_weights_they_vouch_for(attempts, tmp_path):
    """Weights whose bytes verify by hash but are no model (an extra tensor, a NaN) are named
    by verify and refused by load_pretrained, whatever the input."""
    from safetensors.numpy import load_file, save_file

    from iqtrain.evidence.verify import check_attempt

    run = shutil.copytree(attempts["mse"].parents[1], tmp_path / "run")
    att = run / "attempts" / "0001"
    weights = att / "checkpoints" / "step_00000003" / "model.safetensors"
    tensors = load_file(weights)
    tensors["norm.weight"][0] = np.nan
    save_file(tensors, weights)
    problems = check_attempt(att).problems
    assert any(
        "step_00000003/model.safetensors: tensor norm.weight holds non-finite" in p
        for p in problems
    ), problems
    tensors["norm.weight"][0] = 1.0
    tensors["extra"] = np.zeros(2, np.float32)
    save_file(tensors, weights)
    problems = check_attempt(att).problems
    assert any("do not fit the architecture (extra ['extra']" in p for p in problems), problems


def test_a_home_relative_source_loads(packages, attempts, monkeypatch):
    """``~`` expands in load_pretrained's source as in ``[init] from``."""
    monkeypatch.setenv("HOME", os.fspath(packages["mse"].parent))
    assert load_pretrained("~/mse").model_sha256 == load_pretrained(packages["mse"]).model_sha256
    monkeypatch.setenv("HOME", os.fspath(attempts["mse"].parent))
    assert load_pretrained("~/0001").step == load_pretrained(attempts["mse"]).step

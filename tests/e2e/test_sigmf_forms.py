"""Recordings as people and tools write them, through every command: a multi-recording
``.sigmf`` archive, a raw RTL-SDR capture described with ``iqtrain describe`` (a non-conforming
dataset with header bytes), a complex128 array written by ``sigmf.fromarray`` (cf64), a
``.sigmf-collection`` and a file in the shape other tools write (version "1.0", no annotations
list, an integer datetime). A run on them is killed with SIGKILL and resumed to the same
weights as a straight run, every attempt verifies with ``--data``, and a changed archive member
is named; embed, score, probe and (after a short fine-tune) predict read them as loose cf32
files are read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import sigmf
import torch
from helpers import kill_after_checkpoints, tiny_tables
from safetensors.torch import load_file
from sigmf import SigMFCollection, SigMFFile

from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing

pytestmark = pytest.mark.slow

STEPS = 10
BURST = 512  # samples per labelled burst: 4 windows of the tiny model's 128
CLASSES = ("am", "fm")


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def _run(*args, code: int = 0) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "iqtrain", *map(str, args)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=300)
    assert proc.returncode == code, proc.stderr[-4000:]
    return proc


def _bursts(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` bursts of two kinds (a tone, noise): complex128, labelled by CLASSES[i % 2]."""
    t = np.arange(BURST)
    out = []
    for i in range(n):
        if i % 2 == 0:
            out.append(np.exp(2j * np.pi * 0.05 * t) + 0.1 * rng.standard_normal(BURST))
        else:
            out.append(rng.standard_normal(BURST) + 1j * rng.standard_normal(BURST))
    return np.concatenate(out)


def _annotate(meta: SigMFFile, n: int) -> None:
    for i in range(n):
        meta.add_annotation(i * BURST, BURST, metadata={"core:label": CLASSES[i % 2]})


def _archive(folder: Path, rng: np.random.Generator) -> Path:
    """Three ci16 recordings in two folders of one tar, as sigmf-python writes each."""
    src = folder / "archive-src"
    for name in ("site1/a", "site1/b", "site2/c"):
        iq = _bursts(rng, 4)
        data = (np.stack([iq.real, iq.imag], -1) * 3000).astype("<i2")
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        data.tofile(src / f"{name}.sigmf-data")
        meta = SigMFFile(
            data_file=src / f"{name}.sigmf-data",
            global_info={"core:datatype": "ci16_le", "core:sample_rate": 1e6},
        )
        meta.add_capture(0)
        _annotate(meta, 4)
        meta.tofile(src / f"{name}.sigmf-meta")
    path = folder / "survey.sigmf"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for site in ("site1", "site2"):
            tar.add(src / site, arcname=f"survey/{site}")
    return path


def _raw_capture(folder: Path, rng: np.random.Generator) -> Path:
    """An rtl_sdr-style cu8 capture with a 32-byte header, described by iqtrain describe and
    its annotations added the way a labelling tool adds them."""
    iq = _bursts(rng, 4)
    data = np.clip(np.stack([iq.real, iq.imag], -1) * 40 + 128, 0, 255).astype(np.uint8)
    raw = folder / "capture.cu8"
    raw.write_bytes(b"\x00" * 32 + data.tobytes())
    _run("describe", raw, "--datatype", "cu8", "--sample-rate", "1e6", "--header-bytes", "32")
    meta = folder / "capture.sigmf-meta"
    md = json.loads(meta.read_text())
    md["annotations"] = [
        {"core:sample_start": i * BURST, "core:sample_count": BURST, "core:label": CLASSES[i % 2]}
        for i in range(4)
    ]
    meta.write_text(json.dumps(md))
    return meta


def _collection(folder: Path, rng: np.random.Generator) -> Path:
    """Two cf64 recordings (sigmf.fromarray of complex128) and the collection naming them."""
    for name in ("x", "y"):
        meta = sigmf.fromarray(_bursts(rng, 4))
        meta.sample_rate = 1e6
        meta.add_capture(0)
        _annotate(meta, 4)
        meta.tofile(folder / name)
    coll = SigMFCollection(["x.sigmf-meta", "y.sigmf-meta"], base_path=folder)
    coll.tofile(folder / "pair.sigmf-collection")
    return folder / "pair.sigmf-collection"


def _other_tools(folder: Path, rng: np.random.Generator) -> Path:
    """A cf32 recording in the shape other tools write: version "1.0", an integer datetime,
    no annotations list."""
    iq = _bursts(rng, 4).astype(np.complex64)
    iq.tofile(folder / "old.sigmf-data")
    md = {
        "global": {"core:datatype": "cf32_le", "core:version": "1.0", "core:sample_rate": 1e6},
        "captures": [{"core:sample_start": 0, "core:datetime": 1700000000}],
    }
    (folder / "old.sigmf-meta").write_text(json.dumps(md))
    return folder / "old.sigmf-meta"


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    root = tmp_path_factory.mktemp("forms")
    rng = np.random.default_rng(0)
    train, val = root / "train", root / "val"
    train.mkdir()
    val.mkdir()
    data = {
        "archive": _archive(train, rng),
        "raw": _raw_capture(train, rng),
        "collection": _collection(train, rng),
        "other": _other_tools(train, rng),
        "val": _archive(val, rng),
    }
    return root, data


def _tables(root: Path, data: dict, name: str, **training) -> dict:
    tables = tiny_tables(root / name, root / "cache", max_steps=STEPS, **training)
    tables["data"]["train"] = [
        os.fspath(data["archive"]),
        os.fspath(data["raw"]),
        os.fspath(data["collection"]),
        os.fspath(data["other"]),
    ]
    tables["data"]["val"] = [os.fspath(data["val"])]
    tables["data"].pop("synthetic")
    return tables


def _weights(attempt: Path) -> dict[str, torch.Tensor]:
    return load_file(attempt / "checkpoints" / f"step_{STEPS:08d}" / "model.safetensors")


def test_a_run_on_every_form_resumes_exactly_after_kill_9_and_verifies(forms):
    root, data = forms
    straight = root / "straight.toml"
    straight.write_text(dumps_toml(_tables(root, data, "straight", checkpoint_every=2)))
    out = _run("run", straight)
    # What other tools write is read, with a note for what iqtrain tolerates.
    assert "core:version" in out.stderr and "annotations: missing" in out.stderr
    ref = root / "straight" / "attempts" / "0001"
    killed = root / "killed.toml"
    killed.write_text(dumps_toml(_tables(root, data, "killed", checkpoint_every=2)))
    argv = [sys.executable, "-m", "iqtrain", "run", os.fspath(killed)]
    attempts = root / "killed" / "attempts"
    kill_after_checkpoints(argv, _env(), attempts / "0001" / "checkpoints", 2)
    _run("resume", "--attempt", attempts / "0001")
    done = attempts / "0002"
    assert strip_timing(read_metrics(done / "metrics.jsonl")) == strip_timing(
        read_metrics(ref / "metrics.jsonl")
    )
    want, got = _weights(ref), _weights(done)
    assert all(torch.equal(want[k], got[k]) for k in want)
    for attempt in (ref, attempts / "0001", done):
        _run("verify", attempt, "--data")
    # The archive's digest is of each member: a changed byte inside one is named by its member.
    state = json.loads((ref / "checkpoints" / f"step_{STEPS:08d}" / "state.json").read_text())
    keys = sorted(state["data"]["train"])
    assert any(k.endswith("survey.sigmf/survey/site1/a.sigmf-data") for k in keys)
    assert any(k.endswith("capture.cu8") for k in keys)
    archive = data["archive"]
    with tarfile.open(archive) as tar:
        member = tar.getmember("survey/site2/c.sigmf-data")
    raw = bytearray(archive.read_bytes())
    raw[member.offset_data + 100] ^= 0xFF
    saved = archive.read_bytes()
    archive.write_bytes(bytes(raw))
    try:
        bad = _run("verify", ref, "--data", code=1)
        assert "survey/site2/c.sigmf-data: content differs" in bad.stdout + bad.stderr
        refused = _run("resume", "--attempt", ref, code=2)
        assert "c.sigmf-data" in refused.stderr and refused.stderr.count("\n") == 1
    finally:
        archive.write_bytes(saved)


def test_embed_score_probe_and_predict_read_every_form(forms):
    root, data = forms
    cfg = root / "use.toml"
    cfg.write_text(dumps_toml(_tables(root, data, "use", checkpoint_every=5)))
    _run("run", cfg)
    attempt = root / "use" / "attempts" / "0001"
    emb = root / "emb.safetensors"
    every = [os.fspath(data[k]) for k in ("archive", "raw", "collection")]
    _run("embed", attempt, "--data", *every, "--per", "annotation", "--out", emb)
    from safetensors.numpy import load_file as load_np

    tensors = load_np(emb)
    assert tensors["embeddings"].shape[0] == 3 * 4 + 4 + 2 * 4  # one row per annotation
    scored = _run("score", attempt, "--data", *every)
    assert "survey.sigmf/survey/site1/a.sigmf-meta" in scored.stdout
    probe = _run("probe", attempt, "--data", *every, "--folds", "2")
    assert "classical" in probe.stdout
    ft = _tables(root, data, "ft", checkpoint_every=5)
    ft["model"]["objective"] = "classify"
    ft["data"]["train"] = every
    ft["data"]["val"] = [os.fspath(data["val"])]
    ft["init"] = {"from": os.fspath(attempt)}
    ft_cfg = root / "ft.toml"
    ft_cfg.write_text(dumps_toml(ft))
    _run("run", ft_cfg)
    pred = _run("predict", root / "ft" / "attempts" / "0001", "--data", os.fspath(data["val"]))
    assert "survey.sigmf/survey/site2/c.sigmf-meta" in pred.stdout

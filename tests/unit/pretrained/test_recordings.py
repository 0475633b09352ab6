"""iqtrain embed and iqtrain score: a trained model over SigMF recordings, from the command
line, refusals included (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import cli_tables, refused_in_one_line, write_sigmf
from safetensors import safe_open
from safetensors.numpy import load_file

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config
from iqtrain.data.synth import synthesize
from iqtrain.data.windows import grid_windows, labelled_windows
from iqtrain.pretrained.load import load_pretrained
from iqtrain.pretrained.recordings import score_recordings
from iqtrain.train.attempt import run_pretraining_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec")
    tables = cli_tables(root / "run", root / "cache", max_steps=2)
    attempt = run_pretraining_attempt(build_config(tables)).attempt
    synthesize(root / "labelled", recordings=2, samples=8192, datatype="ci16_le", seed=9)
    rng = np.random.default_rng(0)
    write_sigmf(root / "plain", "p", rng.integers(-99, 99, (1000, 2)), "ci16_le")
    return attempt, os.fspath(root / "labelled" / "*.sigmf-meta"), root


def test_embed_per_window_writes_rows_labels_and_metadata(trained, tmp_path, capsys):
    attempt, data, _ = trained
    out = tmp_path / "e.safetensors"
    assert main(["embed", os.fspath(attempt), "--data", data, "--out", os.fspath(out)]) == 0
    assert f"to {out}" in capsys.readouterr().out
    pre = load_pretrained(attempt)
    grid = grid_windows(data, pre.window)
    got = load_file(out)
    assert got["embeddings"].dtype == np.float32
    assert got["embeddings"].shape == (len(grid), pre.config.model.dim)
    np.testing.assert_array_equal(got["recording"], grid.recordings)
    np.testing.assert_array_equal(got["start"], grid.starts)
    np.testing.assert_array_equal(got["label"], grid.labels)
    assert (got["label"] >= 0).any() and (got["label"] < 0).any()  # gaps between bursts
    raw = np.concatenate(list(grid.batches()))
    np.testing.assert_array_equal(got["embeddings"], pre.embed(raw))
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert meta["format"] == "iqtrain-embeddings-1" and meta["per"] == "window"
    assert json.loads(meta["classes"]) == list(grid.classes)
    assert len(json.loads(meta["recordings"])) == 2
    assert meta["checkpoint"] == pre.checkpoint.name and meta["model_sha256"] == pre.model_sha256
    assert not [p for p in tmp_path.iterdir() if p.name != "e.safetensors"]  # no temporary left


def test_embed_per_annotation_mean_pools_each_annotations_windows(trained, tmp_path):
    attempt, data, _ = trained
    out = tmp_path / "a.safetensors"
    argv = ["embed", os.fspath(attempt), "--data", data, "--out", os.fspath(out)]
    assert main([*argv, "--per", "annotation", "--layer", "0", "--from", "latest"]) == 0
    pre = load_pretrained(attempt, which="latest")
    ls = labelled_windows(data, pre.window)
    got = load_file(out)
    assert got["embeddings"].shape == (ls.num_annotations, pre.config.model.dim)
    feats = pre.embed(np.concatenate(list(ls.batches())), layer=0)
    for g in range(ls.num_annotations):
        np.testing.assert_allclose(got["embeddings"][g], feats[ls.groups == g].mean(0), rtol=1e-5)
        assert got["windows"][g] == (ls.groups == g).sum()
        assert got["label"][g] == ls.labels[ls.groups == g][0]
        assert got["start"][g] == ls.group_start(g)


def test_embed_refusals_are_one_line_exit_2_and_write_nothing(trained, tmp_path, capsys):
    attempt, data, root = trained
    a = os.fspath(attempt)
    out = tmp_path / "x.safetensors"
    base = ["embed", a, "--data", data, "--out", os.fspath(out)]
    refused_in_one_line(
        capsys,
        ["embed", a, "--data", os.fspath(tmp_path / "no*.sigmf-meta"), "--out", os.fspath(out)],
        "no*.sigmf-meta",
    )
    plain = os.fspath(root / "plain" / "*.sigmf-meta")
    refused_in_one_line(
        capsys,
        ["embed", a, "--data", plain, "--out", os.fspath(out), "--per", "annotation"],
        "no labelled window",
    )
    refused_in_one_line(capsys, [*base, "--layer", "9"], "--layer")
    refused_in_one_line(capsys, [*base, "--layer", "all"], "--layer")
    refused_in_one_line(capsys, [*base, "--from", "newest"], "--from")
    refused_in_one_line(capsys, [*base, "--per", "recording"], "--per")
    refused_in_one_line(
        capsys, ["embed", a, "--data", data, "--out", os.fspath(tmp_path)], "directory"
    )
    refused_in_one_line(
        capsys,
        ["embed", a, "--data", data, "--out", os.fspath(tmp_path / "d" / "x")],
        "not a directory",
    )
    assert list(tmp_path.iterdir()) == []
    out.write_bytes(b"keep")
    refused_in_one_line(capsys, base, "--force")
    assert out.read_bytes() == b"keep"
    assert main([*base, "--force"]) == 0 and out.read_bytes() != b"keep"


def test_score_ranks_recordings_annotations_and_windows_highest_first(trained, capsys):
    attempt, data, root = trained
    pre = load_pretrained(attempt)
    grid = grid_windows(data, pre.window)
    windows = pre.score(np.concatenate(list(grid.batches())))
    rows = score_recordings(pre, [data], per="recording")
    assert sum(r.windows for r in rows) == len(grid) and len(rows) == 2
    for r in rows:
        idx = [i for i, p in enumerate(grid.dataset.recordings) if p.meta_path == r.recording][0]
        assert r.score == pytest.approx(windows[grid.recordings == idx].mean(), rel=1e-12)
    assert [r.score for r in rows] == sorted((r.score for r in rows), reverse=True)
    per_window = score_recordings(pre, [data], per="window")
    assert sorted(r.score for r in per_window) == sorted(windows.tolist())
    ls = labelled_windows(data, pre.window)
    per_ann = score_recordings(pre, [data], per="annotation")
    assert len(per_ann) == ls.num_annotations and all(r.label in ls.classes for r in per_ann)

    argv = ["score", os.fspath(attempt), "--data", data, "--per", "window", "--top", "3"]
    assert main([*argv, "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out[-1])
    assert doc["per"] == "window" and doc["unit"] == "NMSE" and len(doc["rows"]) == 3
    assert [r["score"] for r in doc["rows"]] == sorted(windows.tolist(), reverse=True)[:3]
    assert len(out) == 2 + 3 + 1 and "highest first (3 of" in out[0]
    plain = os.fspath(root / "plain" / "*.sigmf-meta")
    refused_in_one_line(
        capsys,
        ["score", os.fspath(attempt), "--data", plain, "--per", "annotation"],
        "no labelled window",
    )
    refused_in_one_line(capsys, [*argv, "--top", "0"], "--top")
    refused_in_one_line(
        capsys, ["score", os.fspath(attempt), "--data", "/nonexistent/*.sigmf-meta"], "/nonexistent"
    )


def test_long_work_notes_its_progress(trained, tmp_path, capsys, monkeypatch):
    import iqtrain.pretrained.recordings as recordings

    monkeypatch.setattr(recordings, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(recordings, "FEATURE_BATCH", 50)
    attempt, data, _ = trained
    out = tmp_path / "p.safetensors"
    assert main(["embed", os.fspath(attempt), "--data", data, "--out", os.fspath(out)]) == 0
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "embed: " in ln]
    assert notes and notes[0].endswith(f"embed: 50/{len(load_file(out)['start'])} windows")


def test_force_replaces_a_file_never_a_device_fifo_link_or_evidence(trained, tmp_path, capsys):
    attempt, data, _ = trained
    fifo, link, target = tmp_path / "fifo", tmp_path / "link", tmp_path / "target"
    os.mkfifo(fifo)
    target.write_bytes(b"keep")
    link.symlink_to(target)
    base = ["embed", os.fspath(attempt), "--data", data, "--force", "--out"]
    refused_in_one_line(capsys, [*base, os.fspath(fifo)], "not a regular file")
    refused_in_one_line(capsys, [*base, os.fspath(link)], "a symbolic link")
    weights = attempt / "checkpoints" / "step_00000002" / "model.safetensors"
    before = weights.read_bytes()
    refused_in_one_line(capsys, [*base, os.fspath(weights)], "inside attempt", "evidence")
    refused_in_one_line(capsys, [*base, os.fspath(attempt / "e.safetensors")], "inside attempt")
    assert weights.read_bytes() == before and target.read_bytes() == b"keep"
    assert fifo.is_fifo() and link.is_symlink()

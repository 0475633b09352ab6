"""iqtrain embed and iqtrain score: a trained model over SigMF recordings, from the command
line, refusals included (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from helpers import (
    cli_tables,
    random_iq,
    refused_in_one_line,
    set_sample_rate,
    write_annotated,
    write_sigmf,
)
from safetensors import safe_open
from safetensors.numpy import load_file

from iqtrain.cli.main import main
from iqtrain.config.schema import build_config
from iqtrain.data.synth import synthesize
from iqtrain.data.windows import grid_windows, labelled_windows
from iqtrain.errors import DataError
from iqtrain.pretrained.load import load_pretrained
from iqtrain.pretrained.recordings import embed_recordings, score_recordings
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec")
    tables = cli_tables(root / "run", root / "cache", max_steps=2)
    attempt = run_attempt(build_config(tables)).attempt
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
    table = score_recordings(pre, [data], per="recording")
    rows = table.rows
    assert sum(r.windows for r in rows) == len(grid) and len(rows) == 2 == table.given
    for r in rows:
        idx = [i for i, p in enumerate(grid.dataset.recordings) if p.meta_path == r.recording][0]
        assert r.score == pytest.approx(windows[grid.recordings == idx].mean(), rel=1e-12)
    assert [r.score for r in rows] == sorted((r.score for r in rows), reverse=True)
    per_window = score_recordings(pre, [data], per="window").rows
    assert sorted(r.score for r in per_window) == sorted(windows.tolist())
    ls = labelled_windows(data, pre.window)
    per_ann = score_recordings(pre, [data], per="annotation").rows
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


# --------------------------------------------------------------------------- real recordings in


def _labelled_at(directory, name, labels, rate=1e6, key_path=False, samples=64):
    """A ci16_le recording of back-to-back annotations of one 64-sample window each, labelled
    ``labels[i]`` (None: no label) under ``core:label`` or, with ``key_path``, under
    ``signal:detail.mod_class``; ``rate`` its core:sample_rate (None: none)."""
    iq = random_iq(np.random.default_rng(len(labels)), samples * max(len(labels), 1), "ci16_le")
    meta = write_annotated(
        directory, name, iq, "ci16_le", [(i * samples, samples, None) for i in range(len(labels))]
    )
    doc = json.loads(meta.read_text())
    for ann, label in zip(doc["annotations"], labels, strict=True):
        if label is not None and key_path:
            ann["signal:detail"] = {"mod_class": label}
        elif label is not None:
            ann["core:label"] = label
    meta.write_text(json.dumps(doc))
    return set_sample_rate(meta, rate)


def test_the_model_reads_recordings_at_its_own_sample_rate_unless_any_rate(
    trained, tmp_path, capsys
):
    attempt, data, _ = trained
    a = os.fspath(attempt)
    pre = load_pretrained(attempt)
    assert pre.sample_rate == 1e6  # the synthetic sets' rate, as trained
    fast = os.fspath(_labelled_at(tmp_path / "fast", "f", ["x", "y"], rate=2.4e6))
    none = os.fspath(_labelled_at(tmp_path / "none", "n", ["x", "y"], rate=None))
    out = os.fspath(tmp_path / "e.safetensors")
    for argv in (
        ["embed", a, "--data", fast, "--out", out],
        ["score", a, "--data", fast, "--per", "annotation"],
        ["score", a, "--data", data, fast],
    ):
        line = refused_in_one_line(capsys, argv, "--data", "1 MHz", "2.4 MHz", "--any-rate")
        assert "f.sigmf-meta" in line and "1 recording(s) have 2.4 MHz" in line
    refused_in_one_line(
        capsys, ["score", a, "--data", none], "--data", "1 MHz", "no core:sample_rate"
    )
    assert not os.path.exists(out)
    assert main(["embed", a, "--data", fast, none, "--out", out, "--any-rate"]) == 0
    assert main(["score", a, "--data", fast, none, "--any-rate"]) == 0
    with pytest.raises(DataError, match="the model was trained at 1 MHz, but"):
        score_recordings(pre, [fast], per="window")
    with pytest.raises(DataError, match="--any-rate"):
        embed_recordings(pre, [none])
    assert len(score_recordings(pre, [fast], per="window", any_rate=True).rows) == 2


def test_label_keys_may_be_paths_and_class_names_print_apart(trained, tmp_path, capsys):
    attempt, _, _ = trained
    a = os.fspath(attempt)
    nested = os.fspath(_labelled_at(tmp_path / "p", "p", [" BPSK", "BPSK", "QPSK"], key_path=True))
    key = ["--label-key", "signal:detail.mod_class"]
    out = tmp_path / "p.safetensors"
    argv = ["embed", a, "--data", nested, "--out", os.fspath(out), "--per", "annotation"]
    assert main([*argv, *key]) == 0
    with safe_open(out, "np") as f:
        assert json.loads(f.metadata()["classes"]) == [" BPSK", "BPSK", "QPSK"]
    assert load_file(out)["label"].tolist() == [0, 1, 2]
    capsys.readouterr()
    assert main(["score", a, "--data", nested, "--per", "window", *key]) == 0
    labels = [ln.rsplit("  ", 1)[-1] for ln in capsys.readouterr().out.splitlines()[2:]]
    assert sorted(labels) == ["' BPSK'", "BPSK", "QPSK"]  # " BPSK" and "BPSK" told apart
    refused_in_one_line(
        capsys, [*argv, "--force"], "--data", "no labelled window", "core:label", "--label-key"
    )
    refused_in_one_line(capsys, [*argv, "--force", "--label-key", " "], "--label-key")


def test_no_recording_is_dropped_without_a_word(trained, tmp_path, capsys):
    attempt, data, root = trained
    a = os.fspath(attempt)
    d = tmp_path / "mixed"
    _labelled_at(d, "labelled", ["x", "", "y"])  # a blank label: unlabelled, and said
    _labelled_at(d, "plain", [None, None])  # windows, but no labelled one
    _labelled_at(d, "short", [None], samples=40)  # no window at all
    mixed = os.fspath(d / "*.sigmf-meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning (0/0 of a recording without rows)
        assert main(["score", a, "--data", mixed, "--json"]) == 0
    cap = capsys.readouterr()
    assert "highest first (2 of 3)" in cap.out  # every recording read counts
    assert len(json.loads(cap.out.splitlines()[-1])["rows"]) == 2
    assert "--data: 1 recording(s) yield no window of 64 samples" in cap.err
    assert "short.sigmf-meta" in cap.err and "RuntimeWarning" not in cap.err
    assert "--data: 1 annotation(s) with an empty core:label are read as unlabelled" in cap.err
    assert main(["score", a, "--data", mixed, "--per", "annotation"]) == 0
    err = capsys.readouterr().err
    assert (
        "1 recording(s) yield no window of 64 samples inside an annotation with a core:label"
        in (err)
    )
    assert "plain.sigmf-meta" in err and "short.sigmf-meta" in err
    out = os.fspath(tmp_path / "m.safetensors")
    assert main(["embed", a, "--data", mixed, "--out", out]) == 0
    err = capsys.readouterr().err
    assert "short.sigmf-meta" in err and "empty core:label" in err


def test_skip_invalid_and_channel_read_as_the_flags_say(trained, tmp_path, capsys):
    attempt, _, _ = trained
    a = os.fspath(attempt)
    d = tmp_path / "d"
    _labelled_at(d, "good", ["x", "y"])
    (d / "bad.sigmf-meta").write_text("{not json")
    data = os.fspath(d / "*.sigmf-meta")
    refused_in_one_line(
        capsys, ["score", a, "--data", data], "--data", "bad.sigmf-meta", "--skip-invalid"
    )
    assert main(["score", a, "--data", data, "--skip-invalid"]) == 0
    cap = capsys.readouterr()
    assert "--data: 1 input(s) cannot be read and are skipped (--skip-invalid)" in cap.err
    assert "good.sigmf-meta" in cap.out
    two = set_sample_rate(
        write_sigmf(
            tmp_path / "c", "two", random_iq(np.random.default_rng(3), 512, "ci16_le"), "ci16_le"
        )
    )
    doc = json.loads(two.read_text())
    doc["global"]["core:num_channels"] = 2
    two.write_text(json.dumps(doc))
    refused_in_one_line(
        capsys, ["score", a, "--data", os.fspath(two)], "--data", "core:num_channels"
    )
    assert main(["score", a, "--data", os.fspath(two), "--channel", "1", "--per", "window"]) == 0
    assert "(4 of 4)" in capsys.readouterr().out  # 256 samples of one channel: 4 windows
    refused_in_one_line(
        capsys, ["score", a, "--data", os.fspath(two), "--channel", "-1"], "--channel"
    )

"""``iqtrain inspect``: one batch through every stage, for each objective."""

from __future__ import annotations

import math

import pytest
from helpers import tiny_tables

from iqtrain.config.schema import dumps_toml
from iqtrain.train.inspection import inspect_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("objective", ["mse", "categorical", "classify"])
def test_inspect_names_the_objective_and_its_untrained_loss(tmp_path, objective):
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache")
    tables["model"].update(objective=objective, bins=16)
    path = tmp_path / "c.toml"
    path.write_text(dumps_toml(tables))
    text = inspect_config(str(path), [])
    line = next(ln for ln in text.splitlines() if ln.startswith("5 untrained loss"))
    if objective == "mse":
        assert "vs zero-prediction" in line and "nats" not in line
    elif objective == "classify":  # the synthetic labelled set: 7 classes
        assert f"nats per window (uniform ln 7 = {math.log(7):.4f}" in line
        assert "classes (7, training windows each): 16QAM " in text
        assert "8 classified" in text
    else:
        assert f"nats per sample (categorical; uniform {2 * math.log(16):.4f})" in line
        assert "predicted-mean NMSE" in line
    assert "4 model predictions: " in text
    want = {"categorical": "(8, 16, 256)", "classify": "(8, 7)"}.get(objective, "(8, 16, 16)")
    assert want in next(ln for ln in text.splitlines() if ln.startswith("4 model predictions"))
    assert not (tmp_path / "run").exists()  # inspect creates no attempt


def test_inspect_gives_the_notes_on_its_data_that_run_gives(tmp_path, capsys):
    import numpy as np
    from helpers import random_iq, write_sigmf

    rng = np.random.default_rng(0)
    for name, samples in (("long", 4096), ("short", 100)):
        write_sigmf(tmp_path / "d", name, random_iq(rng, samples, "ci16_le"), "ci16_le")
    data = str(tmp_path / "d" / "*.sigmf-meta")
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache")
    tables["data"].update(train=[data], val=[data])
    path = tmp_path / "c.toml"
    path.write_text(dumps_toml(tables))
    inspect_config(str(path), [])
    err = capsys.readouterr().err
    for key in ("data.train", "data.val"):
        assert f"iqtrain: note: {key}: 1 recording(s) yield no window of 128 samples" in err
    assert "short.sigmf-meta" in err


def test_inspect_notes_blank_labels_and_prints_class_names_apart(tmp_path, capsys):
    from helpers import set_sample_rate, write_bursts

    d = tmp_path / "d"
    set_sample_rate(write_bursts(d, "b", [" a", "a", " ", "a", " a"] * 2, 128))
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache")
    tables["data"].update(train=[str(d / "*.sigmf-meta")], val=[str(d / "*.sigmf-meta")])
    tables["model"].update(objective="classify")
    path = tmp_path / "c.toml"
    path.write_text(dumps_toml(tables))
    text = inspect_config(str(path), [])
    assert "classes (2, training windows each): ' a' 8, a 8" in text
    err = capsys.readouterr().err
    for key in ("data.train", "data.val"):
        assert f"{key}: 2 annotation(s) with an empty core:label are read as unlabelled" in err

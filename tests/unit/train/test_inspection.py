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

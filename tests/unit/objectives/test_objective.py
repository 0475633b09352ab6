"""The objective as one type: its registry, its rules for the best and early stopping, the uses
of a trained model, the keys only some objectives read, and a fourth objective added by one
class and one registration that trains, verifies, reports and scores like the others."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from helpers import tiny_tables

from iqtrain import objectives
from iqtrain.config.schema import Config, build_config
from iqtrain.config.sections import DataConfig, ModelConfig, OptimizerConfig, ProbeConfig
from iqtrain.errors import ConfigError, ObjectiveError, exit_code
from iqtrain.objectives import REGISTRY, Objective
from iqtrain.objectives.next_patch import NextPatch, check_shapes

MSE, CATEGORICAL, CLASSIFY = (REGISTRY[n] for n in ("mse", "categorical", "classify"))


def test_the_registry_names_each_objective_once_and_its_optional_keys_agree():
    assert objectives.names() == ("mse", "categorical", "classify")
    assert all(REGISTRY[name].name == name for name in REGISTRY)
    assert objectives.get("categorical") is CATEGORICAL
    with pytest.raises(ValueError, match="model.objective: must be one of 'mse', "):
        objectives.get("regress")
    # One "off" value per optional key, whichever objectives list it.
    offs: dict[str, set] = {}
    for o in REGISTRY.values():
        for key, off in o.reads.items():
            offs.setdefault(key, set()).add(repr(off))
            section, _, name = key.partition(".")
            assert getattr(getattr(Config(), section), name) == off or key == "probe.every"
    assert all(len(v) == 1 for v in offs.values()), offs


def test_the_objective_a_config_names_is_its_type():
    assert Config().model.task is MSE
    assert ModelConfig(objective="classify").task is CLASSIFY
    with pytest.raises(ConfigError, match="model.objective: must be one of"):
        ModelConfig(objective="Classify")


@pytest.mark.parametrize(
    ("objective", "values", "best_index", "stale"),
    [
        # lower is better; the first of equal values stays best; min_delta 0.1 for staleness
        (MSE, [1.0, 0.95, 0.95, 0.8, 0.85], 3, 1),
        (CLASSIFY, [0.3, 0.3, 0.5, 0.55, 0.5], 3, 2),
    ],
)
def test_best_and_early_stopping_follow_the_monitored_field(objective, values, best_index, stale):
    records = [
        {"step": i, "loss": 2.0 - i if objective is CLASSIFY else v, "accuracy": v}
        for i, v in enumerate(values)
    ]
    if objective is MSE:
        for r in records:
            del r["accuracy"]
    assert objective.best_record(records) is records[best_index]
    ref, count = None, 0
    for r in records:
        value = objective.value_of(r)
        assert value is not None
        ref, count = (value, 0) if objective.beats(value, ref, 0.1) else (ref, count + 1)
    assert count == stale
    assert objective.best_record([]) is None


def test_a_record_without_its_monitored_value_is_named():
    with pytest.raises(ValueError, match="lacks its accuracy: step 4"):
        CLASSIFY.best_record([{"step": 2, "accuracy": 0.5}, {"step": 4, "loss": 1.0}])
    # A loss is a float, as JSON writes every loss; an accuracy may be any number.
    assert MSE.value_of({"loss": 1}) is None and MSE.value_of({"loss": True}) is None
    assert CLASSIFY.value_of({"accuracy": 1}) == 1.0
    with pytest.raises(ValueError, match="lacks its loss: step 3"):
        MSE.best_record([{"step": 3, "loss": float("nan")}])


def test_a_use_the_objective_does_not_give_is_one_line_naming_who_gives_it():
    with pytest.raises(
        ObjectiveError,
        match="runs/a: model.objective is 'classify', which gives "
        "no score: score needs a model trained with model.objective = 'mse' or "
        "'categorical'",
    ) as info:
        CLASSIFY.require("score", "runs/a")
    assert isinstance(info.value, ValueError) and exit_code(info.value) == 2
    with pytest.raises(ObjectiveError, match="= 'classify'$"):
        CATEGORICAL.require("predict", "runs/b")
    MSE.require("embed", "x")
    assert {u for o in REGISTRY.values() for u in o.uses} == set(objectives.USES)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"model": ModelConfig(), "probe": ProbeConfig(every=0)}, None),
        ({"optimizer": OptimizerConfig(trunk_lr_scale=0.5)}, "optimizer.trunk_lr_scale"),
        ({"data": DataConfig(label_key="x:y")}, "data.label_key"),
    ],
)
def test_a_key_only_another_objective_reads_is_refused_by_name(kwargs, key):
    if key is None:
        Config(**kwargs)
        with pytest.raises(ConfigError, match=r"^probe.every: only model.objective = 'mse' or "):
            Config(model=ModelConfig(objective="classify"), probe=ProbeConfig(every=1))
        return
    with pytest.raises(ConfigError, match=rf"^{key}: only model.objective = 'classify' reads"):
        Config(**kwargs)


def test_the_objective_modules_import_no_torch():
    code = (
        "import sys, iqtrain.objectives as o, iqtrain.config.schema;"
        "o.get('categorical').best_record([{'step': 1, 'loss': 0.5}]);"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class MAE(NextPatch):
    """A fourth objective, as a user would add one: the next patch's values under an L1 loss
    (its predicted mean is the output, so validation's NMSE is the output's)."""

    name = "mae"
    nll = False
    loss_unit = "mean absolute error"

    def loss(self, out, patches, labels, config, squared_error=False):
        with torch.autocast(device_type=out.device.type, enabled=False):
            b, n, width = check_shapes(out, patches, 1)
            err = out[:, :-1].float() - patches[:, 1:].float()
            total = err.abs().sum()
            count = b * (n - 1) * (width // 2)
            return total / count, total, count, err.square().sum()

    def window_losses(self, out, patches, config):
        _, n, width = check_shapes(out, patches, 1)
        err = out[:, :-1].float() - patches[:, 1:].float()
        return err.abs().sum(dim=(1, 2)) / ((n - 1) * (width // 2))

    def untrained_line(self, loss_sum, squared, count, zero, config, classes):
        return f"5 untrained loss {loss_sum / count:.4f} ({self.loss_unit})"


def test_a_fourth_objective_is_one_class_and_one_registration(tmp_path, monkeypatch, capsys):
    from iqtrain.evidence.verify import verify_attempt
    from iqtrain.pretrained.load import load_pretrained
    from iqtrain.report.summary import report
    from iqtrain.train.attempt import run_attempt

    assert isinstance(MAE(), Objective)
    monkeypatch.setitem(REGISTRY, "mae", MAE())
    tables = tiny_tables(tmp_path / "run", tmp_path / "cache", compile=False)
    tables["model"]["objective"] = "mae"
    result = run_attempt(build_config(tables))
    assert result.objective == "mae" and result.best_checkpoint is not None
    assert verify_attempt(result.attempt) == []
    text = report(result.attempt)
    assert "best val loss" in text
    pre = load_pretrained(result.attempt)
    assert pre.objective.name == "mae"
    windows = torch.randn(3, pre.window, 2).numpy()
    assert pre.score(windows).shape == (3,)
    with pytest.raises(ObjectiveError, match="'mae', which gives no predict"):
        pre.predict(windows)

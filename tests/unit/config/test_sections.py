"""The shared validators of iqtrain.config.sections: one integer rule for every setting and
argument (a config key, iqtrain synth's arguments); and the keys of a section checked here."""

from __future__ import annotations

import numpy as np
import pytest

from iqtrain.config.schema import build_config, config_to_dict
from iqtrain.config.sections import ModelConfig, SynthConfig, TrainingConfig, require_int
from iqtrain.errors import ConfigError


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_an_int_or_a_numpy_integer_is_a_python_int(value):
    got = require_int("k", value, minimum=0)
    assert got == 3 and type(got) is int


@pytest.mark.parametrize("value", [True, np.True_, 3.0, np.float64(3), "3", None, [3]])
def test_anything_else_is_not_an_integer(value):
    with pytest.raises(ConfigError) as info:
        require_int("model.dim", value, minimum=0)
    assert str(info.value) == f"model.dim: must be an integer, got {value!r}"


def test_the_bounds_name_the_key():
    with pytest.raises(ConfigError, match=r"^k: must be >= 2, got 1$"):
        require_int("k", np.int64(1), minimum=2)
    with pytest.raises(ConfigError, match=r"^k: must be <= 4, got 5$"):
        require_int("k", 5, minimum=0, maximum=4)


def test_a_section_holds_python_ints_whatever_it_was_given():
    model = ModelConfig(dim=np.int64(64), layers=np.int32(2), heads=2)
    assert (model.dim, model.layers) == (64, 2)
    assert type(model.dim) is int and type(model.layers) is int
    synth = SynthConfig(train_recordings=np.uint16(3), seed=np.int64(7))
    assert type(synth.train_recordings) is int and type(synth.seed) is int


def test_training_deterministic_is_a_bool_that_defaults_to_true():
    assert TrainingConfig().deterministic is True
    config = build_config({"training": {"deterministic": False}})
    assert config.training.deterministic is False
    # the resolved config (an attempt's config.toml) records it either way
    assert config_to_dict(build_config({}))["training"]["deterministic"] is True
    for value in ("false", 1, 0):
        with pytest.raises(ConfigError) as info:
            TrainingConfig(deterministic=value)
        assert str(info.value) == f"training.deterministic: must be true or false, got {value!r}"

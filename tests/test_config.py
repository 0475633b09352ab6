"""Config: strict TOML, typed --set overrides, resolved output, errors that name the key."""

from __future__ import annotations

import tomllib

import pytest

from iqtrain.config import (
    apply_overrides,
    build_config,
    config_to_dict,
    dumps_toml,
    load_config,
)
from iqtrain.errors import ConfigError

QUICKSTART = "examples/quickstart.toml"


def test_quickstart_loads_and_resolves_every_default():
    cfg = load_config(QUICKSTART)
    assert cfg.data.window == 512 and cfg.data.stride == 512
    assert cfg.model.patch_len == 8 and cfg.model.max_patches == 64
    assert cfg.model.mlp_hidden == 512  # 8/3 * 192 = 512
    tables = config_to_dict(cfg)
    assert tables["training"]["device"] == "cpu"
    assert tables["optimizer"]["betas"] == [0.9, 0.95]


def test_resolved_config_round_trips_through_toml():
    cfg = load_config(QUICKSTART, ["optimizer.lr=3e-4", "training.compile=true"])
    text = dumps_toml(config_to_dict(cfg))
    again = build_config(tomllib.loads(text))
    assert config_to_dict(again) == config_to_dict(cfg)
    assert dumps_toml(config_to_dict(again)) == text


def test_overrides_are_typed_by_toml():
    t = apply_overrides(
        {},
        [
            "training.max_steps=7",
            "training.device=cuda",
            "optimizer.betas=[0.8, 0.9]",
            "data.train=['a/*.sigmf-meta']",
        ],
    )
    assert t["training"] == {"max_steps": 7, "device": "cuda"}
    assert t["optimizer"]["betas"] == [0.8, 0.9]
    assert t["data"]["train"] == ["a/*.sigmf-meta"]


MALFORMED = [
    ({"trainig": {}}, "trainig"),
    ({"training": {"max_step": 5}}, "training.max_step"),
    ({"training": {"device": "cuda:0"}}, "training.device"),
    ({"training": {"device": "CPU"}}, "training.device"),
    ({"training": {"precision": "fp16"}}, "training.precision"),
    ({"training": {"precision": "bf16"}}, "training.precision"),  # bf16 on cpu
    ({"training": {"max_steps": 0}}, "training.max_steps"),
    ({"training": {"max_steps": "10"}}, "training.max_steps"),
    ({"training": {"compile": 1}}, "training.compile"),
    ({"training": {"grad_accum": 0}}, "training.grad_accum"),
    ({"schedule": {"warmup_steps": 600, "decay_steps": 500}}, "schedule.decay_steps"),
    ({"schedule": {"kind": "step"}}, "schedule.kind"),
    ({"optimizer": {"lr": -1.0}}, "optimizer.lr"),
    ({"optimizer": {"min_lr": 1.0}}, "optimizer.min_lr"),
    ({"optimizer": {"betas": [0.9]}}, "optimizer.betas"),
    ({"model": {"heads": 5}}, "model.heads"),
    ({"model": {"dim": "big"}}, "model.dim"),
    ({"model": {"patch_len": 8}}, "model.patch_len"),
    ({"model": {"max_patches": 8}}, "model.max_patches"),
    ({"data": {"patch_len": 0}}, "data.patch_len"),
    ({"data": {"seq_patches": 1}}, "data.seq_patches"),
    ({"data": {"norm": "zscore"}}, "data.norm"),
    ({"data": {"train": ["x"]}}, "data.val"),
    ({"data": {"batch_size": -2}}, "data.batch_size"),
    ({"data": {"synthetic": {"datatype": "rf32"}}}, "data.synthetic.datatype"),
    ({"data": {"synthetic": {"sample": 4}}}, "data.synthetic.sample"),
    ({"data": {"norm": "prefix", "prefix_patches": 100}}, "data.prefix_patches"),
    ({"run": {"seed": -1}}, "run.seed"),
    ({"run": {"dir": ""}}, "run.dir"),
    ({"run": "x"}, "run"),
]


@pytest.mark.parametrize(("tables", "key"), MALFORMED, ids=[k for _, k in MALFORMED])
def test_malformed_config_names_its_key(tables, key):
    with pytest.raises(ConfigError) as err:
        build_config(tables)
    assert str(err.value).startswith(key), str(err.value)


def test_unknown_override_and_bad_file(tmp_path):
    with pytest.raises(ConfigError, match="training.nope"):
        load_config(QUICKSTART, ["training.nope=1"])
    with pytest.raises(ConfigError, match="expected dotted.key=value"):
        load_config(QUICKSTART, ["training.max_steps"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad)


def test_world_size_divisibility():
    cfg = build_config({"data": {"batch_size": 6}})
    cfg.check_world_size(2)
    with pytest.raises(ConfigError, match="data.batch_size"):
        cfg.check_world_size(4)

"""Config: strict TOML, typed --set overrides, resolved output, errors that name the key."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from iqtrain.config.schema import (
    apply_overrides,
    build_config,
    config_to_dict,
    dumps_toml,
    load_config,
)
from iqtrain.errors import ConfigError

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart.toml"


def test_quickstart_loads_and_resolves_every_default():
    cfg = load_config(QUICKSTART)
    assert cfg.data.window == 512 and cfg.data.stride == 512
    assert cfg.model.patch_len == 16 and cfg.model.max_patches == 32
    assert cfg.model.objective == "categorical" and cfg.model.bins == 64
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
    # 1e14 s once overflowed the process group's timedelta on every rank (a traceback).
    ({"training": {"dist_timeout_s": 10**14}}, "training.dist_timeout_s"),
    ({"training": {"dist_timeout_s": 7 * 24 * 3600 + 1}}, "training.dist_timeout_s"),
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
    ({"run": {"dir": 3}}, "run.dir"),
    ({"data": {"train": ["a"], "val": [""]}}, "data.val[0]"),
    ({"data": {"synthetic": {"cache_dir": ""}}}, "data.synthetic.cache_dir"),
    (
        {"schedule": {"kind": "constant", "warmup_steps": 60}, "training": {"max_steps": 50}},
        "schedule.warmup_steps",
    ),
    (
        {"schedule": {"kind": "cosine", "warmup_steps": 50}, "training": {"max_steps": 50}},
        "schedule.warmup_steps",
    ),
    ({"run": "x"}, "run"),
    ({"training": {"profile_steps": 3}}, "training.profile_steps"),
    ({"training": {"profile_steps": [1, 2, 3]}}, "training.profile_steps"),
    ({"training": {"profile_steps": [0, 2]}}, "training.profile_steps[0]"),
    ({"training": {"profile_steps": [2, 1.5]}}, "training.profile_steps[1]"),
    ({"training": {"profile_steps": [3, 2]}}, "training.profile_steps"),
    ({"training": {"profile_steps": [5, 2000]}}, "training.profile_steps"),  # > max_steps
    ({"logging": {"tensorbord": True}}, "logging.tensorbord"),
    ({"logging": {"tensorboard": 1}}, "logging.tensorboard"),
    ({"logging": {"wandb": "proj"}}, "logging.wandb"),
    ({"logging": {"wandb": {}}}, "logging.wandb.project"),
    ({"logging": {"wandb": {"project": ""}}}, "logging.wandb.project"),
    ({"logging": {"wandb": {"project": "p", "team": "x"}}}, "logging.wandb.team"),
    ({"logging": {"wandb": {"project": "p", "name": 3}}}, "logging.wandb.name"),
    ({"logging": "on"}, "logging"),
    ({"probe": {"shots": 5}}, "probe.shots"),
    ({"probe": {"shots": [1, 0]}}, "probe.shots[1]"),
    ({"probe": {"shots": [1, "5"]}}, "probe.shots[1]"),
    ({"probe": {"shots": [5, 5]}}, "probe.shots"),
    ({"probe": {"seeds": 0}}, "probe.seeds"),
    ({"probe": {"synthetic_annotations": -1}}, "probe.synthetic_annotations"),
    ({"probe": {"synthetic_annotations": 10**6}}, "probe.synthetic_annotations"),
    ({"probe": {"label_key": ""}}, "probe.label_key"),
    ({"probe": {"label_key": " "}}, "probe.label_key"),
    ({"probe": {"label_key": ["core:label"]}}, "probe.label_key"),
    ({"init": {"from": 3}}, "init.from"),
    ({"init": {"which": "step_"}}, "init.which"),
    ({"init": {"which": "newest"}}, "init.which"),
    ({"init": {"from_": "x"}}, "init.from_"),  # the TOML key is "from"
    ({"init": "x"}, "init"),
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


# --------------------------------------------------------------------------- schedule plan


@pytest.mark.parametrize("kind", ["constant", "cosine"])
def test_decay_steps_only_constrains_wsd(kind):
    # decay_steps (default 200) is a wsd setting: a short constant or cosine run must build.
    cfg = build_config(
        {"schedule": {"kind": kind, "warmup_steps": 10}, "training": {"max_steps": 50}}
    )
    assert cfg.schedule.kind == kind and cfg.training.max_steps == 50
    # The resolved config round-trips (decay_steps is written, and ignored, for these kinds).
    again = build_config(tomllib.loads(dumps_toml(config_to_dict(cfg))))
    assert config_to_dict(again) == config_to_dict(cfg)


def test_wsd_still_refuses_decay_past_max_steps():
    with pytest.raises(ConfigError) as err:
        build_config({"schedule": {"warmup_steps": 10}, "training": {"max_steps": 50}})
    assert str(err.value) == (
        "schedule.decay_steps: warmup_steps (10) + decay_steps (200) exceeds "
        "training.max_steps (50)"
    )
    build_config(  # exactly warmup + decay steps is a complete plan
        {"schedule": {"warmup_steps": 10, "decay_steps": 40}, "training": {"max_steps": 50}}
    )


# --------------------------------------------------------------------------- paths


def _path_tables(train: str, val: str, run_dir: str, cache: str) -> dict:
    return {
        "run": {"dir": run_dir},
        "data": {"train": [train], "val": val, "synthetic": {"cache_dir": cache}},
    }


def test_relative_paths_resolve_against_the_cwd_at_build_time(tmp_path, monkeypatch):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    cfg = build_config(
        _path_tables("data/train/*.sigmf-meta", "./data/val/[ab]?.sigmf-meta", "runs/x", "cache")
    )
    assert cfg.data.train == [os.fspath(first / "data/train/*.sigmf-meta")]  # glob kept
    assert cfg.data.val == [os.fspath(first / "data/val/[ab]?.sigmf-meta")]
    assert cfg.run.dir == os.fspath(first / "runs/x")
    assert cfg.data.synthetic.cache_dir == os.fspath(first / "cache")

    # What an attempt writes, read back (as resume does) from another working directory.
    written = dumps_toml(config_to_dict(cfg))
    monkeypatch.chdir(second)
    again = build_config(tomllib.loads(written))
    assert config_to_dict(again) == config_to_dict(cfg)
    assert dumps_toml(config_to_dict(again)) == written
    # The same spelling built here would name other files: the written form must not be it.
    here = build_config(
        _path_tables("data/train/*.sigmf-meta", "./data/val/[ab]?.sigmf-meta", "runs/x", "cache")
    )
    assert here.data.train != again.data.train and here.run.dir != again.run.dir


def test_home_is_expanded_and_absolute_paths_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", os.fspath(tmp_path / "home"))
    cfg = build_config(_path_tables("~/iq/*.sigmf-meta", "/data/v.sigmf-meta", "~/runs", "/c"))
    assert cfg.data.train == [os.fspath(tmp_path / "home/iq/*.sigmf-meta")]
    assert cfg.data.val == ["/data/v.sigmf-meta"]
    assert cfg.run.dir == os.fspath(tmp_path / "home/runs")
    assert cfg.data.synthetic.cache_dir == "/c"
    # The default cache directory lives under the home directory, spelled out.
    default = build_config({})
    assert default.data.synthetic.cache_dir == os.fspath(tmp_path / "home/.cache/iqtrain/synth")
    assert Path(default.run.dir).is_absolute()


def test_load_config_resolves_against_the_cwd_not_the_file(tmp_path, monkeypatch):
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    path = cfg_dir / "c.toml"
    path.write_text('[run]\ndir = "runs/r"\n[data]\ntrain = ["d/*"]\nval = ["v/*"]\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(path, ["data.val=['w/*']"])
    assert cfg.run.dir == os.fspath(tmp_path / "runs/r")
    assert cfg.data.train == [os.fspath(tmp_path / "d/*")]
    assert cfg.data.val == [os.fspath(tmp_path / "w/*")]  # --set values follow the same rule


# --------------------------------------------------------------------------- the shared names


def test_one_datatype_table_for_reader_synth_and_config():
    import numpy as np
    from helpers import COMPONENT_DTYPES

    from iqtrain.config.sections import SIGMF_DATATYPES, SYNTH_DATATYPES
    from iqtrain.data.sigmf.datatypes import parse_datatype

    # The reader takes every datatype in the table as itself: the 14 complex ones of SigMF.
    assert len(SIGMF_DATATYPES) == 14
    assert all(parse_datatype(name) == (name, None) for name in SIGMF_DATATYPES)
    assert set(COMPONENT_DTYPES) == set(SIGMF_DATATYPES)
    for name, dt in SIGMF_DATATYPES.items():
        assert dt.bytes_per_sample == 2 * COMPONENT_DTYPES[name].itemsize, name
        assert np.dtype(dt.component) == COMPONENT_DTYPES[name], name
    # Synth writes a subset; a config that names no datatype gets its first.
    assert build_config({}).data.synthetic.datatype == SYNTH_DATATYPES[0]
    for name in SYNTH_DATATYPES:
        assert build_config({"data": {"synthetic": {"datatype": name}}}).data.synthetic.datatype
    with pytest.raises(ConfigError, match=r"^data\.synthetic\.datatype: .*'cu8', got 'ci16_be'"):
        build_config({"data": {"synthetic": {"datatype": "ci16_be"}}})  # read, never written


def test_device_and_precision_names_are_defined_once():
    from iqtrain.config.sections import DEVICES

    for device in DEVICES:
        precision = "bf16" if device == "cuda" else "fp32"
        cfg = build_config({"training": {"device": device, "precision": precision}})
        assert (cfg.training.device, cfg.training.precision) == (device, precision)
    with pytest.raises(ConfigError, match=r"^training\.device: must be one of 'cpu', 'cuda'"):
        build_config({"training": {"device": "tpu"}})
    with pytest.raises(ConfigError, match=r"^training\.precision: must be one of 'fp32', 'bf16'"):
        build_config({"training": {"precision": "fp16"}})


def test_every_section_is_defined_in_the_torch_free_sections_module():
    import dataclasses

    from iqtrain.config import schema, sections

    classes = (sections.ModelConfig, sections.OptimizerConfig, sections.ScheduleConfig)
    for cls in classes:
        assert dataclasses.is_dataclass(cls) and cls.__module__ == "iqtrain.config.sections", cls
    assert set(schema._SECTIONS.values()) >= set(classes)


def test_logging_and_profiling_are_off_by_default_and_round_trip():
    cfg = build_config({})
    assert cfg.logging.tensorboard is False and cfg.logging.wandb is None
    assert cfg.training.profile_steps is None
    assert "profile_steps" not in config_to_dict(cfg)["training"]  # None fields are omitted
    tables = {
        "logging": {"tensorboard": True, "wandb": {"project": "iq", "entity": "lab"}},
        "training": {"profile_steps": [2, 5]},
    }
    cfg = build_config(tables)
    assert cfg.training.profile_steps == (2, 5)
    assert (cfg.logging.wandb.project, cfg.logging.wandb.entity) == ("iq", "lab")
    text = dumps_toml(config_to_dict(cfg))
    assert "[logging.wandb]" in text and "profile_steps = [2, 5]" in text
    assert config_to_dict(build_config(tomllib.loads(text))) == config_to_dict(cfg)
    over = apply_overrides({}, ["logging.wandb.project=x", "training.profile_steps=[1, 1]"])
    assert build_config(over).logging.wandb.project == "x"
    with pytest.raises(ConfigError, match=r"^logging\.wandb: is a table, set one of its keys"):
        apply_overrides({}, ["logging.wandb=x"])
    with pytest.raises(ConfigError, match=r"^logging\.wandb\.team: unknown key"):
        apply_overrides({}, ["logging.wandb.team=x"])

"""What may change on resume (``config_changes``): the parent's config is read as this version
resolves it, so a key added since is its default, not a change."""

from __future__ import annotations

import copy

import pytest
from helpers import misuse, refused_in_one_line, tiny_tables

from iqtrain.config.schema import build_config, config_to_dict
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.lineage import ParentRef, config_changes


@pytest.fixture
def parent_tables(tmp_path):
    return config_to_dict(build_config(tiny_tables(tmp_path / "run", tmp_path / "cache")))


def test_a_key_the_parent_predates_is_its_default_not_a_change(parent_tables):
    config = build_config(copy.deepcopy(parent_tables))
    older = copy.deepcopy(parent_tables)
    del older["training"]["parallel"]  # written before training.parallel existed
    assert config_changes(older, config) == {}


def test_the_experiment_cannot_change_on_resume(parent_tables):
    tables = copy.deepcopy(parent_tables)
    tables["model"]["dim"] *= 2
    with pytest.raises(ConfigError, match=r"model.dim: cannot change on resume \(32 -> 64\)"):
        config_changes(parent_tables, build_config(tables))


def test_resumable_keys_are_reported(parent_tables):
    tables = copy.deepcopy(parent_tables)
    tables["training"]["max_steps"] += 4
    tables["training"]["parallel"] = "fsdp"  # the same state, held another way
    changes = config_changes(parent_tables, build_config(tables))
    assert changes == {"training.max_steps": (12, 16), "training.parallel": ("ddp", "fsdp")}


def test_a_parent_config_this_version_cannot_read_is_a_checkpoint_error(parent_tables):
    broken = copy.deepcopy(parent_tables)
    broken["training"]["parallel"] = "zero3"
    with pytest.raises(CheckpointError, match="parent's config.toml: training.parallel"):
        config_changes(broken, build_config(copy.deepcopy(parent_tables)))


def test_how_a_run_is_watched_may_change_on_resume(parent_tables):
    # [logging] is not part of the experiment: any of it may change (and is recorded), as may
    # the profiled steps; a parent written before [logging] existed reads as all defaults.
    older = copy.deepcopy(parent_tables)
    del older["logging"]
    tables = copy.deepcopy(parent_tables)
    tables["logging"] = {"tensorboard": True, "wandb": {"project": "p", "entity": "me"}}
    tables["training"]["profile_steps"] = [2, 3]
    changes = config_changes(older, build_config(tables))
    assert changes == {
        "logging.tensorboard": (False, True),
        "logging.wandb.project": (None, "p"),
        "logging.wandb.entity": (None, "me"),
        "training.profile_steps": (None, [2, 3]),
    }
    back = copy.deepcopy(parent_tables)
    assert set(config_changes(config_to_dict(build_config(tables)), build_config(back))) == {
        *changes
    }


def test_the_refusal_names_the_sections_that_may_change(parent_tables):
    tables = copy.deepcopy(parent_tables)
    tables["optimizer"]["lr"] = 1.0
    with pytest.raises(ConfigError, match=r"training\.profile_steps, logging\.\* may change$"):
        config_changes(parent_tables, build_config(tables))


def test_a_parent_ref_names_a_checkpoint_or_is_a_value_error(tmp_path):
    for which in ("latest", "best", "step_3", "step_00000003"):
        assert ParentRef(tmp_path, which).checkpoint == which
    for bad in ("newest", "step_", "step_\u0661", ""):
        with misuse("^checkpoint: expected latest, best or step_N"):
            ParentRef(tmp_path, bad)


def test_resume_from_a_bad_checkpoint_name_is_one_line_naming_the_flag(tmp_path, capsys):
    argv = ["resume", "--attempt", str(tmp_path), "--from", "newest"]
    refused_in_one_line(capsys, argv, "--from: expected latest, best or step_N, got 'newest'")

"""[init] from: a new attempt that starts from a verified checkpoint's weights, recorded in
attempt.json and the manifest, checked by verify, named by report, refused on a mismatch."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from helpers import cli_tables
from safetensors.torch import load_file

from iqtrain.cli.main import main
from iqtrain.config.schema import apply_overrides, build_config, config_to_dict, dumps_toml
from iqtrain.config.sections import ARCHITECTURE_KEYS, ModelConfig
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.lineage import ParentRef
from iqtrain.evidence.verify import check_attempt
from iqtrain.pretrained.load import random_init_model
from iqtrain.report.summary import report
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("init")
    tables = cli_tables(root / "src", root / "cache", max_steps=4)
    tables["model"].update(objective="categorical", bins=16)
    return root, tables, run_attempt(build_config(tables)).attempt


def _child(root, tables, name, source, **init):
    t = json.loads(json.dumps(tables))
    t["run"]["dir"] = os.fspath(root / name)
    t["init"] = {"from": os.fspath(source), **init}
    return t


def _weights(attempt, step):
    return load_file(attempt / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


def test_a_new_attempt_starts_from_the_source_weights_with_everything_else_fresh(source):
    root, tables, src = source
    t = _child(root, tables, "ft", src, which="step_2")
    t["optimizer"] = {"lr": 1e-12, "min_lr": 0.0}  # the weights barely move: compare them
    t["training"].update(max_steps=2, eval_every=2, checkpoint_every=2)
    t["schedule"] = {"kind": "constant", "warmup_steps": 0}  # schedule, data, optimizer may
    t["data"]["batch_size"] = 2  # differ from the source's
    result = run_attempt(build_config(t))
    info = json.loads((result.attempt / "attempt.json").read_text())
    assert info["parent"] is None and info["final_step"] == 2
    want = load_file(src / "checkpoints" / "step_00000002" / "model.safetensors")
    assert info["init"] == {
        "attempt": os.fspath(src.resolve()),
        "checkpoint": "step_00000002",
        "step": 2,
        "model_sha256": __import__("hashlib")
        .sha256((src / "checkpoints" / "step_00000002" / "model.safetensors").read_bytes())
        .hexdigest(),
    }
    manifest = json.loads((result.attempt / "manifest.json").read_text())
    assert manifest["init"] == info["init"]
    got = _weights(result.attempt, 2)
    fresh = random_init_model(build_config(t).model, build_config(t).run.seed).state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=0, atol=1e-6)
    assert any(not torch.equal(fresh[k], want[k]) for k in want)  # not the random init
    assert check_attempt(result.attempt).problems == []
    assert "initialised from " + os.fspath(src.resolve()) in report(result.attempt)
    # A resume continues the parent's weights and keeps the lineage's record.
    child = run_attempt(
        build_config(apply_overrides(t, ["training.max_steps=4"])),
        ParentRef(result.attempt),
    )
    child_info = json.loads((child.attempt / "attempt.json").read_text())
    assert child_info["init"] == info["init"] and child_info["parent"]["step"] == 2
    assert check_attempt(child.attempt).problems == []
    with pytest.raises(ConfigError, match="init.which: cannot change on resume"):
        run_attempt(
            build_config(apply_overrides(t, ["training.max_steps=6", "init.which=best"])),
            ParentRef(child.attempt),
        )


@pytest.mark.parametrize("key", ARCHITECTURE_KEYS)
def test_any_architecture_key_that_differs_is_one_line_naming_it_and_nothing_is_created(
    source, key
):
    root, tables, src = source
    t = _child(root, tables, f"bad-{key}", src)
    changed = {
        "dim": 32,
        "layers": 2,
        "heads": 4,
        "mlp_hidden": 128,
        "patch_len": 4,
        "max_patches": 16,
        "rope_theta": 500.0,
        "objective": "mse",
        "bins": 32,
        "bin_range": 3.0,
    }[key]
    if key == "patch_len":
        t["data"]["patch_len"] = changed
    t["model"][key] = changed
    with pytest.raises(ConfigError, match=rf"^model\.{key}: .* every architecture key"):
        run_attempt(build_config(t))
    assert not (root / f"bad-{key}").exists()


def test_dropout_and_init_std_may_differ(source):
    root, tables, src = source
    t = _child(root, tables, "dropout", src)
    t["model"].update(dropout=0.1, init_std=0.05)
    t["training"].update(max_steps=1, eval_every=1, checkpoint_every=1)
    t["schedule"] = {"kind": "constant", "warmup_steps": 0}
    assert run_attempt(build_config(t)).final_step == 1


def test_a_source_that_fails_verification_is_refused_naming_init_from(source, tmp_path, capsys):
    root, tables, src = source
    copy = tmp_path / "copy" / "attempts" / "0001"
    shutil.copytree(src, copy)
    (copy / "checkpoints" / "step_00000004" / "state.json").chmod(0o644)
    (copy / "checkpoints" / "step_00000004" / "state.json").write_text("{}")
    t = _child(root, tables, "refused", copy, which="latest")
    with pytest.raises(CheckpointError, match="^init.from: .*: failed verification: "):
        run_attempt(build_config(t))
    with pytest.raises(CheckpointError, match="^init.from: .*not an attempt directory"):
        run_attempt(build_config(_child(root, tables, "r2", tmp_path / "none")))
    assert not (root / "refused").exists() and not (root / "r2").exists()
    with pytest.raises(ConfigError, match="init.which: expected latest, best or step_N"):
        build_config(_child(root, tables, "r3", src, which="first"))
    with pytest.raises(ConfigError, match=r"init.form: unknown key \(did you mean init.from\?\)"):
        build_config({**tables, "init": {"form": "x"}})
    cfg = tmp_path / "c.toml"
    from iqtrain.config.schema import dumps_toml

    cfg.write_text(dumps_toml(tables))
    assert main(["run", os.fspath(cfg), "--set", f"init.from={tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iqtrain: error: init.from: "), err


def test_the_resolved_config_writes_init_from_as_its_toml_key(source):
    root, tables, src = source
    cfg = build_config(_child(root, tables, "x", src))
    assert config_to_dict(cfg)["init"] == {"from": os.fspath(src)}  # which unset: best
    assert cfg.init.from_ == os.fspath(src) and cfg.init.which is None
    with pytest.raises(ConfigError, match="init.which: needs init.from"):
        build_config({**tables, "init": {"which": "best"}})
    with pytest.raises(ConfigError, match="init.which: expected"):  # ASCII digits only
        build_config(_child(root, tables, "x", src, which="step_\u0661"))


def test_a_checkpoint_directory_names_its_own_checkpoint(source):
    root, tables, src = source
    ckpt = src / "checkpoints" / "step_00000002"
    t = _child(root, tables, "from-ckpt", ckpt)
    t["training"].update(max_steps=1, eval_every=1, checkpoint_every=1)
    t["schedule"] = {"kind": "constant", "warmup_steps": 0}
    attempt = run_attempt(build_config(t)).attempt
    info = json.loads((attempt / "attempt.json").read_text())
    assert (info["init"]["attempt"], info["init"]["checkpoint"]) == (
        os.fspath(src.resolve()),
        "step_00000002",
    )
    assert check_attempt(attempt).problems == []
    with pytest.raises(ConfigError, match="init.which: 'latest', but .* is itself a checkpoint"):
        run_attempt(build_config(_child(root, tables, "mixed", ckpt, which="latest")))
    assert not (root / "mixed").exists()


def test_verify_checks_the_record_against_the_config_the_manifest_and_the_source(source, tmp_path):
    root, tables, src = source
    srccopy = tmp_path / "src" / "attempts" / "0001"
    shutil.copytree(src, srccopy)
    t = _child(root, tables, "verified", srccopy, which="latest")
    t["training"].update(max_steps=1, eval_every=1, checkpoint_every=1)
    t["schedule"] = {"kind": "constant", "warmup_steps": 0}
    attempt = run_attempt(build_config(t)).attempt
    assert check_attempt(attempt).problems == []
    info_path = attempt / "attempt.json"
    info = json.loads(info_path.read_text())

    def problems_with(record):
        info_path.write_text(json.dumps(record))
        try:
            return check_attempt(attempt).problems
        finally:
            info_path.write_text(json.dumps(info))

    assert any("manifest.json init" in p for p in problems_with({**info, "init": None}))
    assert any("attempt.json init: missing" in p for p in problems_with({**info, "init": None}))
    forged = {**info["init"], "step": 3}
    assert any("manifest.json init" in p for p in problems_with({**info, "init": forged}))
    bad = {**info["init"], "step": "4"}
    assert any("init.step" in p for p in problems_with({**info, "init": bad}))
    # The source's weights, while they exist, must be what the record says.
    weights = srccopy / "checkpoints" / "step_00000004" / "model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:-1] + bytes([weights.read_bytes()[-1] ^ 1]))
    assert any("is not the weights it records" in p for p in check_attempt(attempt).problems)
    shutil.rmtree(srccopy)  # gone (pruned, moved): nothing to compare, and a note says so
    check = check_attempt(attempt)
    assert check.problems == [] and any("the init source is gone" in n for n in check.notes)


def test_a_resume_takes_the_record_its_parents_checkpoint_binds_not_attempt_json(source):
    root, tables, src = source
    t = _child(root, tables, "crashed", src, which="latest")
    t["training"].update(max_steps=2, eval_every=1, checkpoint_every=1)
    t["schedule"] = {"kind": "constant", "warmup_steps": 0}
    parent = run_attempt(build_config(t)).attempt
    info = json.loads((parent / "attempt.json").read_text())
    # A crash (no manifest, status running, its lock free) with a damaged attempt.json init.
    (parent / "manifest.json").unlink()
    (parent / "attempt.json").write_text(json.dumps({**info, "status": "running", "init": 3}))
    child = run_attempt(
        build_config(apply_overrides(t, ["training.max_steps=3"])), ParentRef(parent)
    ).attempt
    assert json.loads((child / "attempt.json").read_text())["init"] == info["init"]
    assert check_attempt(child).problems == []


def test_a_config_takes_the_architecture_keys_it_does_not_give_from_its_source(source, tmp_path):
    from iqtrain.config.schema import load_config

    root, tables, src = source
    t = _child(root, tables, "inherit", src)
    t["model"] = {"dropout": 0.1}  # no architecture key given
    del t["data"]["patch_len"]
    path = tmp_path / "child.toml"
    path.write_text(dumps_toml(t))
    config = load_config(path)
    want = build_config(tables).model
    for key in ARCHITECTURE_KEYS:
        assert getattr(config.model, key) == getattr(want, key), key
    assert config.data.patch_len == want.patch_len and config.model.dropout == 0.1
    # a fine-tune takes the trunk's keys; its objective and head are its own
    t["model"] = {"objective": "classify"}
    path.write_text(dumps_toml(t))
    tuned = load_config(path)
    assert (tuned.model.dim, tuned.model.layers, tuned.model.objective) == (
        want.dim,
        want.layers,
        "classify",
    )
    assert tuned.model.bins == ModelConfig().bins  # not the source's 16: no trunk key
    # a key given and different is still refused, naming it
    t["model"] = {"dim": want.dim * 2}
    path.write_text(dumps_toml(t))
    with pytest.raises(ConfigError, match=r"^model\.dim: .* every architecture key"):
        run_attempt(load_config(path))
    # --set init.from= clears [init] whole (which too): the random-init baseline
    t["init"]["which"] = "latest"
    path.write_text(dumps_toml(t))
    assert load_config(path, ["init.from="]).init.which is None


def test_verify_follows_the_whole_init_chain_and_resume_says_what_is_gone(source, tmp_path, capsys):
    """A -> B -> C by [init]: a change to A's weights fails C's verify as B's; A gone is a
    note in both, and a resume of C says so."""
    root, tables, src = source
    a = shutil.copytree(src.parents[1], tmp_path / "a") / "attempts" / "0001"
    b = _child(tmp_path, tables, "b", a, which="step_4")
    b["training"].update(max_steps=2, eval_every=2, checkpoint_every=2)
    b_attempt = run_attempt(build_config(b)).attempt
    c = _child(tmp_path, tables, "c", b_attempt, which="step_2")
    c["training"].update(max_steps=2, eval_every=2, checkpoint_every=2)
    c["schedule"] = {"kind": "constant", "warmup_steps": 0}  # max_steps may grow on resume
    c_attempt = run_attempt(build_config(c)).attempt
    assert check_attempt(c_attempt).problems == []
    weights = a / "checkpoints" / "step_00000004" / "model.safetensors"
    weights.chmod(0o644)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    problems = check_attempt(c_attempt).problems
    assert any(f"{weights} is not the weights it records" in p for p in problems), problems
    shutil.rmtree(a.parents[1])
    check = check_attempt(c_attempt)
    assert check.problems == [] and any("the init source is gone" in n for n in check.notes)
    capsys.readouterr()
    more = build_config(apply_overrides(c, ["training.max_steps=3"]))
    run_attempt(more, ParentRef(c_attempt, "latest"))
    assert "the parent: " in capsys.readouterr().err

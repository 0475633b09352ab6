"""``[probe]`` during training: probe records, and training exactly as without them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from iqtrain.config.schema import build_config
from iqtrain.data.synth import synthesize, synthesize_labelled
from iqtrain.errors import ConfigError, DataError
from iqtrain.evidence.lineage import ParentRef
from iqtrain.evidence.metrics import read_metrics, strip_timing
from iqtrain.evidence.verify import check_attempt
from iqtrain.train.attempt import run_attempt

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("labelled")
    synthesize(root, recordings=2, samples=16384, datatype="ci16_le", seed=9)
    return str(root / "*.sigmf-meta")


@pytest.fixture(scope="module")
def bursts(tmp_path_factory) -> str:
    """28 bursts of 2 windows (128 samples, the tiny attempt's window), 4 of each class: with 2
    folds, 2 annotations of each class train when its fold is held out."""
    root = tmp_path_factory.mktemp("bursts")
    synthesize_labelled(root, annotations=28, burst_samples=256, datatype="ci8", seed=4)
    return str(root / "*.sigmf-meta")


def _tables(tmp_path: Path, name: str, probe: dict | None) -> dict:
    from helpers import tiny_tables

    tables = tiny_tables(tmp_path / name, tmp_path / "cache", checkpoint_every=4, keep_last=0)
    if probe is not None:
        tables["probe"] = probe
    return tables


def _weights(attempt: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(attempt / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


def test_probe_records_leave_training_and_its_resume_exact(tmp_path, bursts):
    probe = {"every": 2, "data": [bursts], "folds": 2, "by": "iqtrain:snr_db", "bins": 10}
    probe.update(shots=[2, 1], seeds=2)
    with_probe = run_attempt(build_config(_tables(tmp_path, "a", probe))).attempt
    without = run_attempt(build_config(_tables(tmp_path, "b", None))).attempt
    records = read_metrics(with_probe / "metrics.jsonl")
    probes = [r for r in records if r["kind"] == "probe"]
    # validations at 4, 8, 12: every 2nd (the 2nd, at step 8) and the last
    assert [r["step"] for r in probes] == [8, 12]
    first = probes[0]
    for r in probes:
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 < r["chance"] <= 1.0
        assert r["folds"] == 2 and r["windows"] == 56 and r["annotations"] == 28
        assert set(r["per_class"]) == set(r["per_class_se"]) == set(r["classical_per_class_se"])
        # the baselines: computed once
        for key in ("random_init_accuracy", "classical_accuracy", "classical_per_class"):
            assert r[key] == first[key] and r[f"{key}_se"] == first[f"{key}_se"]
        for key in ("accuracy", "random_init_accuracy", "classical_accuracy", "combined_accuracy"):
            assert 0.0 <= r[key] <= 1.0 and 0.0 <= r[f"{key}_se"] < 0.5
        assert set(r["classical_per_class"]) == set(r["per_class"])
        assert r["by"]["key"] == "iqtrain:snr_db" and r["by"]["width"] == 10.0
        assert sum(b["windows"] for b in r["by"]["bins"]) == r["windows"]
        pooled = sum(b["pretrained"] * b["windows"] for b in r["by"]["bins"] if b["windows"])
        assert pooled / r["windows"] == pytest.approx(r["accuracy"], abs=1e-9)
        # few-shot: K ascending, the baselines' draws the same at every probe
        assert [e["k"] for e in r["shots"]] == [1, 2]
        for e, e0 in zip(r["shots"], first["shots"], strict=True):
            assert e["seeds"] == 2 and e["random_init"] == e0["random_init"]
            assert e["classical"] == e0["classical"]
            assert {len(e[m]["draws"]) for m in ("pretrained", "combined")} == {2}
    # The probe reads the model and nothing else: the same training, number for number.
    others = [r for r in records if r["kind"] != "probe"]
    assert strip_timing(others) == strip_timing(read_metrics(without / "metrics.jsonl"))
    a, b = _weights(with_probe, 12), _weights(without, 12)
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert check_attempt(with_probe).problems == []
    # Exact resume with the probe on: from step 4, the same records (probes included).
    child = run_attempt(
        build_config(_tables(tmp_path, "a", probe)), ParentRef(with_probe, "step_4")
    ).attempt
    assert strip_timing(read_metrics(child / "metrics.jsonl")) == strip_timing(records)


def test_probe_settings_are_checked_before_the_attempt_exists(tmp_path, labelled):
    bad = {"every": 1, "data": [str(tmp_path / "none" / "*.sigmf-meta")]}
    with pytest.raises(DataError):
        run_attempt(build_config(_tables(tmp_path, "c", bad)))
    with pytest.raises(ConfigError, match="probe.folds"):
        tables = _tables(tmp_path, "c", {"every": 1, "data": [labelled], "folds": 500})
        run_attempt(build_config(tables))
    assert not (tmp_path / "c" / "attempts").exists()
    with pytest.raises(ConfigError, match="probe.every"):
        build_config(_tables(tmp_path, "c", {"every": -1}))
    with pytest.raises(ConfigError, match="probe.by torchsig:snr_db: no labelled annotation"):
        tables = _tables(tmp_path, "c", {"every": 1, "data": [labelled], "by": "torchsig:snr_db"})
        run_attempt(build_config(tables))
    with pytest.raises(ConfigError, match=r"probe.bins: no window's .* in the bins \[100, 200\]"):
        probe = {"every": 1, "data": [labelled], "by": "iqtrain:snr_db", "bins": [100, 200]}
        run_attempt(build_config(_tables(tmp_path, "c", probe)))
    # 1 annotation of each class in the synthetic recordings: no class trains in its own fold
    with pytest.raises(ConfigError, match=r"probe.shots: K = 1 .* class 16QAM has only 0"):
        probe = {"every": 1, "data": [labelled], "folds": 2, "shots": [1]}
        run_attempt(build_config(_tables(tmp_path, "c", probe)))
    for bins, match in ((0, "probe.bins"), ([3, 1], "probe.bins"), (["a", 2], r"probe.bins\[0\]")):
        with pytest.raises(ConfigError, match=match):
            build_config(_tables(tmp_path, "c", {"every": 1, "bins": bins}))
    assert not (tmp_path / "c" / "attempts").exists()


def test_the_probe_defaults_to_the_validation_recordings(tmp_path):
    from iqtrain.cli.main import main

    tables = _tables(tmp_path, "d", {"every": 3, "folds": 2})
    tables["data"]["synthetic"].update(val_recordings=2, samples=16384)
    result = run_attempt(build_config(tables))
    probes = [r for r in read_metrics(result.attempt / "metrics.jsonl") if r["kind"] == "probe"]
    assert [r["step"] for r in probes] == [12]
    # ... and so does `iqtrain probe` without --data.
    assert main(["probe", str(result.attempt), "--folds", "2", "--json"]) == 0
    # with probe.synthetic_annotations: the synthetic labelled probe set instead
    from iqtrain.train.probe import TrainingProbe

    config = build_config({**tables, "probe": {"every": 3, "synthetic_annotations": 14}})
    probe = TrainingProbe(config.probe, config.data, config.model, config.run.seed)
    assert probe.labelled.num_annotations == 14


def test_probe_runs_at_an_early_stop_and_a_failing_probe_does_not_end_training(
    tmp_path, labelled, monkeypatch, capsys
):
    from iqtrain.train.probe import TrainingProbe

    tables = _tables(tmp_path, "e", {"every": 10, "data": [labelled], "folds": 2})
    tables["training"].update(eval_every=2, early_stop_patience=2, early_stop_min_delta=1.0)
    result = run_attempt(build_config(tables))
    assert result.stopped_early["step"] == 6
    probes = [r for r in read_metrics(result.attempt / "metrics.jsonl") if r["kind"] == "probe"]
    assert [r["step"] for r in probes] == [6]  # the last validation, though not every 10th

    def broken(self, model, step):
        raise DataError(f"{labelled}: changed while training")

    monkeypatch.setattr(TrainingProbe, "record", broken)
    tables = _tables(tmp_path, "f", {"every": 1, "data": [labelled], "folds": 2})
    done = run_attempt(build_config(tables))
    assert done.final_step == 12
    assert not [r for r in read_metrics(done.attempt / "metrics.jsonl") if r["kind"] == "probe"]
    assert capsys.readouterr().err.count("skipped: ") == 3  # validations at 4, 8, 12
    assert check_attempt(done.attempt).problems == []


# --------------------------------------------------------------------------- real recordings in


def _plain(directory: Path, count: int = 2) -> str:
    """``count`` unlabelled ci16_le recordings of 4096 samples at 1 MHz; their glob."""
    import numpy as np
    from helpers import random_iq, write_sigmf

    rng = np.random.default_rng(7)
    for i in range(count):
        write_sigmf(directory, f"p{i}", random_iq(rng, 4096, "ci16_le"), "ci16_le")
    return str(directory / "*.sigmf-meta")


def test_a_probe_without_labels_is_refused_in_one_line_naming_the_setting(tmp_path, capsys):
    from helpers import refused_in_one_line

    from iqtrain.config.schema import dumps_toml

    plain = _plain(tmp_path / "plain")
    for probe, names in (
        ({"every": 2}, ["data.val (probe.data is empty)"]),  # the default probe set
        ({"every": 2, "data": [plain]}, ["probe.data"]),
        ({"every": 2, "data": [plain], "label_key": "x:mod"}, ["probe.data", "x:mod"]),
    ):
        tables = _tables(tmp_path, "g", probe)
        tables["data"].update(train=[plain], val=[plain])
        path = tmp_path / "g.toml"
        path.write_text(dumps_toml(tables))
        line = refused_in_one_line(
            capsys,
            ["run", str(path)],
            "probe.every = 2",
            "no labelled window",
            "probe.label_key",
            "probe.every = 0",
            *names,
        )
        assert "\n" not in line
    assert not (tmp_path / "g").exists()  # nothing created


def test_probe_label_key_reads_a_path_and_is_checked(tmp_path, bursts):
    import json

    from iqtrain.train.probe import TrainingProbe

    nested = tmp_path / "nested"
    nested.mkdir()
    for meta in Path(bursts).parent.glob("*.sigmf-meta"):
        doc = json.loads(meta.read_text())
        for ann in doc["annotations"]:
            ann["signal:detail"] = {"mod_class": ann.pop("core:label")}
        (nested / meta.name).write_text(json.dumps(doc))
        (nested / meta.with_suffix(".sigmf-data").name).write_bytes(
            meta.with_suffix(".sigmf-data").read_bytes()
        )
    probe = {"every": 1, "data": [str(nested / "*.sigmf-meta")], "folds": 2}
    config = build_config(_tables(tmp_path, "h", {**probe, "label_key": "signal:detail.mod_class"}))
    assert config.probe.label_key == "signal:detail.mod_class"
    made = TrainingProbe(config.probe, config.data, config.model, config.run.seed)
    assert made.labelled.num_annotations == 28 and len(made.labelled.classes) == 7
    assert build_config(_tables(tmp_path, "h", probe)).probe.label_key == "core:label"
    for bad in ("", "  ", 3):
        with pytest.raises(ConfigError, match="probe.label_key"):
            build_config(_tables(tmp_path, "h", {**probe, "label_key": bad}))


def test_probe_data_at_another_rate_than_the_training_data_is_refused(tmp_path, bursts):
    import json

    from iqtrain.train.probe import TrainingProbe, training_rate

    fast = tmp_path / "fast"
    fast.mkdir()
    for meta in Path(bursts).parent.glob("*"):
        (fast / meta.name).write_bytes(meta.read_bytes())
    for meta in fast.glob("*.sigmf-meta"):
        doc = json.loads(meta.read_text())
        doc["global"]["core:sample_rate"] = 2e6
        meta.write_text(json.dumps(doc))
    probe = {"every": 1, "data": [str(fast / "*.sigmf-meta")], "folds": 2}
    config = build_config(_tables(tmp_path, "i", probe))
    assert training_rate(config.data) == 1e6  # the synthetic sets'
    args = (config.probe, config.data, config.model, config.run.seed)
    with pytest.raises(DataError) as caught:
        TrainingProbe(*args)
    line = str(caught.value)
    assert line.startswith("probe.data: the training data has 1 MHz, but 2 recording(s) have 2 MHz")
    assert 'data.sample_rate = "any"' in line and "probe.every = 0" in line and "\n" not in line
    assert TrainingProbe(*args, sample_rate=2e6).labelled.num_annotations == 28  # as given
    with pytest.raises(DataError, match="the training data has no core:sample_rate, but 2 rec"):
        TrainingProbe(*args, sample_rate=None)
    tables = _tables(tmp_path, "i", probe)
    tables["data"]["sample_rate"] = 1e6
    config = build_config(tables)
    with pytest.raises(DataError, match="probe.data: data.sample_rate is 1 MHz, but"):
        TrainingProbe(config.probe, config.data, config.model, config.run.seed)
    tables["data"]["sample_rate"] = "any"
    config = build_config(tables)
    made = TrainingProbe(config.probe, config.data, config.model, config.run.seed)
    assert made.labelled.num_annotations == 28
    with pytest.raises(DataError, match="probe.data: the training data has 1 MHz"):
        run_attempt(build_config(_tables(tmp_path, "i", probe)))
    assert not (tmp_path / "i" / "attempts").exists()

"""Where an attempt's recordings come from: the configured globs or the synthetic cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import TESTS, rated_recordings

from iqtrain.config.schema import build_config
from iqtrain.config.sections import SynthConfig
from iqtrain.data.sources import ensure_synthetic, ensure_synthetic_probe, open_datasets
from iqtrain.errors import ConfigError, DataError

SMALL = {"train_recordings": 2, "val_recordings": 1, "samples": 4096}


def test_a_cache_directory_with_glob_characters_finds_its_own_recordings(tmp_path):
    # The cache path is not a pattern: only the recordings' file names are.
    cache = tmp_path / "odd [cache] *dir?"
    config = build_config(
        {"data": {"seq_patches": 8, "synthetic": {**SMALL, "cache_dir": str(cache)}}}
    )
    train, val = open_datasets(config.data)
    assert len(train.recordings) == 2 and len(val.recordings) == 1
    assert all(str(r.meta_path).startswith(str(cache)) for r in train.recordings)


@pytest.mark.parametrize(
    ("synthetic", "key"),
    [
        ({"seed": (1 << 64) - 1}, "data.synthetic.seed"),  # the validation seed would overflow
        ({"train_recordings": 1_000_001}, "data.synthetic.train_recordings"),
        ({"val_recordings": 1_000_001}, "data.synthetic.val_recordings"),
        ({"samples": 100}, "data.synthetic.samples"),
    ],
)
def test_the_generators_limits_name_the_config_key(tmp_path, synthetic, key):
    with pytest.raises(ConfigError) as info:
        build_config({"data": {"synthetic": {**synthetic, "cache_dir": str(tmp_path / "c")}}})
    assert str(info.value).startswith(key)
    assert not (tmp_path / "c").exists()


def test_a_full_disk_while_generating_names_the_file_and_leaves_no_partial_set(tmp_path):
    # A real file-size limit in a child process: the second recording cannot be written.
    script = textwrap.dedent(
        f"""
        import resource, signal, sys
        from iqtrain.config.schema import build_config
        from iqtrain.data.sources import ensure_synthetic
        from iqtrain.errors import ConfigError, DataError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails: EFBIG
        config = build_config({{"data": {{"synthetic": {{
            "train_recordings": 3, "val_recordings": 1, "samples": 65536,
            "cache_dir": {str(tmp_path / "cache")!r}}}}}}})
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            ensure_synthetic(config.data.synthetic)
        except ConfigError as exc:
            print(exc)
            sys.exit(2)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.fspath(TESTS)}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 2, proc.stderr
    line = proc.stdout.strip()
    assert line.startswith("data.synthetic.cache_dir: ") and "cannot write" in line, line
    assert ".sigmf-data" in line  # names the file
    leftovers = [p.name for p in (tmp_path / "cache").iterdir()]
    assert leftovers == [], leftovers


def test_the_synthetic_set_is_generated_once(tmp_path):
    s = build_config({"data": {"synthetic": {**SMALL, "cache_dir": str(tmp_path)}}}).data.synthetic
    first = ensure_synthetic(s)
    (marker,) = list(tmp_path.iterdir())
    stamp = (marker / "COMPLETE").stat().st_mtime_ns
    assert ensure_synthetic(s) == first
    assert (marker / "COMPLETE").stat().st_mtime_ns == stamp


def test_the_probe_reads_probe_data_else_a_synthetic_probe_set_else_validation(tmp_path):
    from iqtrain.data.sources import probe_patterns, validation_patterns
    from iqtrain.data.windows import labelled_windows

    synthetic = {**SMALL, "cache_dir": str(tmp_path / "cache")}
    config = build_config({"data": {"seq_patches": 8, "synthetic": synthetic}})
    assert probe_patterns(config.probe, config.data) == validation_patterns(config.data)
    tables = {"data": {"seq_patches": 8, "synthetic": synthetic}}
    config = build_config({**tables, "probe": {"synthetic_annotations": 21}})
    patterns = probe_patterns(config.probe, config.data)
    assert patterns == probe_patterns(config.probe, config.data)  # cached, the same set
    found = labelled_windows(patterns, config.data.window)
    assert found.num_annotations == 21 and len(found) == 21 * 4
    config = build_config({**tables, "probe": {"synthetic_annotations": 21, "data": ["x*"]}})
    assert probe_patterns(config.probe, config.data) == [os.fspath(os.path.abspath("x*"))]


def _data(tmp_path, train, val, **data):
    tables = {
        "data": {
            "seq_patches": 8,
            "train": [rated_recordings(tmp_path / "train", train)],
            "val": [rated_recordings(tmp_path / "val", val, seed=1)],
            **data,
        }
    }
    return build_config(tables).data


@pytest.mark.parametrize(
    ("train", "val", "rule", "rate"),
    [
        ({"a": 2.4e6, "b": 2.4e6}, {"c": 2.4e6}, "same", 2.4e6),
        ({"a": None}, {"c": None}, "same", None),  # none recorded
        ({"a": 1e6, "b": 2e6}, {"c": 1e6}, "any", None),  # several
        ({"a": 1e6}, {"c": 1e6}, "any", 1e6),
        ({"a": 1e6}, {"c": 1e6}, 1e6, 1e6),
    ],
    ids=["same", "none recorded", "any mixed", "any one", "fixed"],
)
def test_the_pair_keeps_the_one_sample_rate(tmp_path, train, val, rule, rate):
    sets = open_datasets(_data(tmp_path, train, val, sample_rate=rule))
    train_set, val_set = sets  # a (train, val) pair, the rate beside it
    assert len(train_set.recordings) == len(train) and len(val_set.recordings) == len(val)
    assert sets.sample_rate == rate and isinstance(sets, tuple)


@pytest.mark.parametrize(
    ("train", "val", "rule", "said"),
    [
        ({"a": 1e6}, {"c": 2e6}, "same", "recordings at 2 sample rates: 1 MHz (1, e.g. "),
        ({"a": 1e6}, {"c": None}, "same", "no core:sample_rate (1, e.g. "),
        ({"a": 1e6, "b": 2e6}, {"c": 2e6}, 2e6, "data.sample_rate = 2e+06 but 1 recording(s)"),
    ],
    ids=["two rates", "one unrecorded", "fixed"],
)
def test_rates_the_rule_refuses_are_one_data_error_naming_them(tmp_path, train, val, rule, said):
    with pytest.raises(DataError) as err:
        open_datasets(_data(tmp_path, train, val, sample_rate=rule))
    message = str(err.value)
    assert message.startswith("data.train and data.val: ") and said in message, message
    assert "\n" not in message and err.value.exit_code == 2


def test_labelled_sets_keep_their_sample_rate_too(tmp_path):
    from helpers import write_bursts

    from iqtrain.data.sources import open_labelled

    for part in ("train", "val"):
        write_bursts(tmp_path / part, part, ["a", "b"], 64)
    tables = {
        "data": {
            "seq_patches": 8,
            "train": [os.fspath(tmp_path / "train" / "*.sigmf-meta")],
            "val": [os.fspath(tmp_path / "val" / "*.sigmf-meta")],
        },
        "model": {"objective": "classify"},
    }
    sets = open_labelled(build_config(tables).data)
    train, val = sets
    assert train.classes == ("a", "b") and sets.sample_rate is None  # none recorded


def test_a_synthetic_probe_set_the_generator_refuses_is_one_config_error_naming_the_key(tmp_path):
    # synthesize_labelled's ValueError (an argument), said of the config key that asked for it.
    synth = SynthConfig(cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="^probe.synthetic_annotations: annotations: must be >="):
        ensure_synthetic_probe(synth, 3, 64)
    with pytest.raises(ConfigError, match=r"^probe.synthetic_annotations: bursts of 4 windows"):
        ensure_synthetic_probe(synth, 7, 8)  # bursts of 32 samples: shorter than synth's least
    assert not list((tmp_path / "cache").glob("*/COMPLETE"))

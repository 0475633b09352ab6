"""Where an attempt's recordings come from: the configured globs or the synthetic cache."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from helpers import TESTS

from iqtrain.config.schema import build_config
from iqtrain.data.sources import ensure_synthetic, open_datasets
from iqtrain.errors import ConfigError

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
        from iqtrain.errors import ConfigError
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

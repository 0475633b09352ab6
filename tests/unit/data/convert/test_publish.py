"""OUT_DIR, all or nothing (iqtrain.data.convert.publish): checked before the source is read,
written under OUT_DIR.tmp-<pid> and renamed onto it; a failure leaves nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from iqtrain.data import sigmf_write
from iqtrain.data.convert import convert_radioml2016, output
from iqtrain.data.convert import rml2016 as rml2016_reader
from iqtrain.errors import ConfigError, StorageError


def test_out_dir_must_be_absent_or_empty(rml2016, tmp_path):
    path, _ = rml2016
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        convert_radioml2016(path, full)
    assert [p.name for p in full.iterdir()] == ["keep"]
    with pytest.raises(ConfigError, match="exists and is not a directory"):
        convert_radioml2016(path, full / "keep")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert convert_radioml2016(path, empty).recordings == 1
    nested = tmp_path / "a" / "b" / "out"  # parents are made
    assert convert_radioml2016(path, nested).out_dir == nested


def test_a_write_failure_leaves_nothing(rml2016, tmp_path, monkeypatch):
    path, _ = rml2016
    monkeypatch.setattr(output, "MAX_RECORDING_SAMPLES", 128 * 4)
    calls = []

    def failing_fsync(p):
        calls.append(p)
        if len(calls) == 5:  # the third recording's metadata
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(sigmf_write, "fsync_file", failing_fsync)
    out = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(StorageError) as info:
        convert_radioml2016(path, out)
    assert str(info.value).endswith(
        "radioml2016_00002.sigmf-data: cannot write: No space left on device"
    )
    assert not (tmp_path / "new").exists()  # the parents it made go too


def test_an_interrupted_conversion_leaves_nothing(
    rml2016, tmp_path, monkeypatch, assert_nothing_written
):
    path, _ = rml2016

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "write_json_atomic", interrupted)
    with pytest.raises(KeyboardInterrupt):
        convert_radioml2016(path, tmp_path / "out")
    assert_nothing_written(tmp_path / "out")


def _long_name(tmp_path: Path) -> Path:
    # As long as a name may be, so OUT_DIR.tmp-<pid> (its sibling, written first) is too long.
    return tmp_path / ("o" * os.pathconf(tmp_path, "PC_NAME_MAX"))


def _symlink_loop(tmp_path: Path) -> Path:
    (tmp_path / "loop").symlink_to("loop")
    return tmp_path / "loop" / "out"


def _symlink_to_a_directory(tmp_path: Path) -> Path:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to("real")
    return tmp_path / "link"


@pytest.mark.parametrize(
    "make, message",
    [
        (_symlink_to_a_directory, "is a symbolic link"),
        (_symlink_loop, "cannot be created: "),
        (_long_name, "cannot be created: "),
    ],
    ids=["symlink to a directory", "parent a symlink loop", "name too long for OUT.tmp-<pid>"],
)
def test_an_out_dir_that_cannot_take_the_result_is_refused_before_reading(
    rml2016, tmp_path, monkeypatch, make, message
):
    path, _ = rml2016
    out = make(tmp_path)

    def unread(*args):
        raise AssertionError("the source was read before OUT_DIR was checked")

    monkeypatch.setattr(rml2016_reader, "unpickle", unread)
    with pytest.raises(ConfigError) as info:
        convert_radioml2016(path, out)
    text = str(info.value)
    assert text.startswith(f"{out}: ") and message in text and "\n" not in text, text
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_mount_point_out_dir_is_refused(rml2016, tmp_path, monkeypatch):
    # rename(2) cannot put the new directory onto a mount point (EBUSY, after the whole work).
    path, _ = rml2016
    out = tmp_path / "mnt"
    out.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: os.fspath(p) == os.fspath(out) or real(p))
    with pytest.raises(ConfigError) as info:
        convert_radioml2016(path, out)
    assert str(info.value).startswith(f"{out}: is a mount point")
    assert list(out.iterdir()) == []

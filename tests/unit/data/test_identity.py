"""Data identity: digests, the resume comparison (symlinks included), verify --data."""

from __future__ import annotations

import os

import pytest
from helpers import checkpoint_state

from iqtrain.data.dataset import IQDataset
from iqtrain.data.identity import check_parent_data, compute_digests, verify_data
from iqtrain.data.synth import synthesize
from iqtrain.errors import CursorMismatchError, DataError


@pytest.fixture
def linked(tmp_path):
    """Train and val recordings named through symlinks, and another set to point them at."""
    real = synthesize(tmp_path / "real", recordings=3, samples=4096, seed=1)
    other = synthesize(tmp_path / "other", recordings=1, samples=4096, seed=2)
    links = tmp_path / "links"
    links.mkdir()
    for meta in real:
        for suffix in (".sigmf-meta", ".sigmf-data"):
            src = meta.with_suffix(suffix)
            (links / src.name).symlink_to(src)
    return links, real, other


def _open(links):
    train = IQDataset([os.fspath(links / "synth_000[01].sigmf-meta")], window=64)
    val = IQDataset([os.fspath(links / "synth_0002.sigmf-meta")], window=64)
    return train, val


def _recorded(train, val):
    fingerprints = {"train": train.fingerprint, "val": val.fingerprint}
    return checkpoint_state(4, data=compute_digests(train, val), fingerprints=fingerprints)


def test_the_same_data_passes_and_is_read_once(linked):
    train, val = _open(linked[0])
    digests = check_parent_data(_recorded(train, val), train, val, read=True)
    assert digests == compute_digests(train, val)
    assert check_parent_data(_recorded(train, val), train, val, read=False) is None


def test_a_retargeted_symlink_is_named_as_one(linked):
    links, _, other = linked
    train, val = _open(links)
    recorded = _recorded(train, val)
    link = links / "synth_0000.sigmf-meta"
    link.unlink()
    link.symlink_to(other[0])  # the same name now means another recording
    train, val = _open(links)
    with pytest.raises(CursorMismatchError) as info:
        check_parent_data(recorded, train, val, read=True)
    assert f"{link} is a symlink that now resolves to" in str(info.value)
    assert "retargeted" in str(info.value)


def test_a_symlink_to_nothing_names_the_link_and_its_target(linked):
    links = linked[0]
    link = links / "synth_0000.sigmf-meta"
    link.unlink()
    link.symlink_to(links / "gone.sigmf-meta")
    with pytest.raises(DataError) as info:
        _open(links)
    assert (
        str(info.value) == f"{link}: a symlink to {links / 'gone.sigmf-meta'}, which does not exist"
    )


def test_verify_data_rereads_what_the_state_recorded(linked):
    train, val = _open(linked[0])
    recorded = _recorded(train, val)
    assert verify_data(recorded, "step_00000004") == []
    data = train.recordings[0].data_path
    blob = bytearray(data.read_bytes())
    blob[100] ^= 0xFF
    data.write_bytes(bytes(blob))
    problems = verify_data(recorded, "step_00000004")
    assert any("content differs from what step_00000004 recorded" in p for p in problems)

"""Data identity: digests, the resume comparison (symlinks included), verify --data."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import checkpoint_state, random_iq, write_sigmf

import iqtrain.data.identity as identity
from iqtrain.data.dataset import IQDataset
from iqtrain.data.identity import (
    DataIdentity,
    DigestPlan,
    check_parent_data,
    compute_digests,
    share_of,
    verify_data,
)
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


def test_the_same_data_passes(linked):
    train, val = _open(linked[0])
    check_parent_data(_recorded(train, val), train, val, compute_digests(train, val))
    check_parent_data(_recorded(train, val), train, val, None)  # a rank other than 0


def test_shares_split_the_bytes_and_cover_every_piece_once():
    sizes = [100, 0, 5, 300, 64, 64, 64, 1]
    for world in range(1, 6):
        shares = [share_of(sizes, r, world) for r in range(world)]
        assert sorted(i for s in shares for i in s) == list(range(len(sizes)))
        for s in shares:  # contiguous runs, in order
            assert s == list(range(s[0], s[0] + len(s))) if s else True
    assert share_of([], 0, 3) == [] and share_of([0, 0], 0, 2) == [0, 1]
    big = [1 << 26] * 32  # 2 GiB of whole pieces over 4 ranks: 8 pieces each
    assert [len(share_of(big, r, 4)) for r in range(4)] == [8] * 4


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_merged_shares_equal_the_whole_file_digests(tmp_path, monkeypatch, world):
    # 1 KiB pieces (the production piece is 64 MiB): files of one, a few and many pieces.
    monkeypatch.setattr(identity, "PIECE", 1024)
    rng = np.random.default_rng(0)
    for i, samples in enumerate([100, 512, 513, 3000]):  # ci8: 2 bytes a sample
        write_sigmf(tmp_path / "t", f"r{i}", random_iq(rng, samples, "ci8"), "ci8")
    train = IQDataset([os.fspath(tmp_path / "t" / "r[0-2].sigmf-meta")], window=16)
    val = IQDataset([os.fspath(tmp_path / "t" / "r3.sigmf-meta")], window=16)
    plan = DigestPlan.of(train, val)
    shares = [plan.share(r, world) for r in range(world)]
    assert sum(s.bytes for s in shares) == sum(
        rec.num_samples * 2 for ds in (train, val) for rec in ds.recordings
    )
    assert plan.merge(shares) == compute_digests(train, val)
    with pytest.raises(DataError, match="read by no rank"):
        plan.merge(shares[1:] if world > 1 else [])


def test_a_share_names_a_file_that_changed_length(linked):
    train, val = _open(linked[0])
    data = train.recordings[1].data_path
    os.truncate(data, 100)
    with pytest.raises(DataError, match=rf"{data}: data file changed length"):
        DigestPlan.of(train, val).share(0, 1)


def test_the_background_identity_is_the_digests_and_a_failed_share_is_raised(linked):
    train, val = _open(linked[0])
    assert DataIdentity(train, val).digests() == compute_digests(train, val)
    digests = compute_digests(train, val)
    checked = DataIdentity(train, val, digests, checked=True)  # a resume's: nothing is re-read
    assert checked._thread is None and checked.digests() is digests
    data = train.recordings[0].data_path
    os.truncate(data, 100)
    with pytest.raises(DataError, match="changed length"):
        DataIdentity(train, val).digests()


class _Ranks:
    """A World of two ranks seen from ``rank``, whose one gather hands back ``others`` as the
    other rank's part (what agree sends: error, same, payload); the rest are no-ops."""

    distributed, world_size = True, 2

    def __init__(self, rank, others):
        self.rank, self.is_main, self.others, self.gathers = rank, rank == 0, others, 0

    def wait_for_main(self):
        pass

    def ending(self):
        pass

    def all_gather_object(self, obj):
        self.gathers += 1
        return [obj, self.others] if self.rank == 0 else [self.others, obj]


def test_a_failed_share_is_agreed_with_exit_1_on_every_rank(linked):
    from iqtrain.distributed.world import RankExit

    train, val = _open(linked[0])
    # Rank 0, rank 1's share failed: a DataError naming rank 1 (the attempt exists: exit 1).
    world = _Ranks(0, ((1, "/x.sigmf-data: data file changed length"), None, None))
    with pytest.raises(DataError) as info:
        DataIdentity(train, val, world=world).digests()
    assert str(info.value) == "rank 1: /x.sigmf-data: data file changed length"
    assert type(info.value) is DataError and world.gathers == 2  # agree's closing gather
    # Rank 1, its own share fine, rank 0's failed: exit 1, silently.
    world = _Ranks(1, ((1, "boom"), None, None))
    with pytest.raises(RankExit) as exit_info:
        DataIdentity(train, val, world=world).digests()
    assert exit_info.value.exit_code == 1
    # Rank 0's own failure is raised as it was.
    os.truncate(train.recordings[0].data_path, 100)
    world = _Ranks(0, (None, None, None))
    with pytest.raises(DataError, match="changed length") as own:
        DataIdentity(train, val, world=world).digests()
    assert not str(own.value).startswith("rank ")


def test_a_retargeted_symlink_is_named_as_one(linked):
    links, _, other = linked
    train, val = _open(links)
    recorded = _recorded(train, val)
    link = links / "synth_0000.sigmf-meta"
    link.unlink()
    link.symlink_to(other[0])  # the same name now means another recording
    train, val = _open(links)
    with pytest.raises(CursorMismatchError) as info:
        check_parent_data(recorded, train, val, compute_digests(train, val))
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


def test_metadata_digests_are_of_the_bytes_the_dataset_parsed(linked):
    from iqtrain.data.identity import meta_digest

    train, val = _open(linked[0])
    digests = compute_digests(train, val)
    for key, ds in (("train_meta", train), ("val_meta", val)):
        assert digests[key] == {str(r.meta_path): meta_digest(r.meta_path) for r in ds.recordings}
    # Taken when the dataset opened, not read again: an edit since then is the resume check's
    # and verify --data's to find (they open the data again), not a silent new digest.
    meta = train.recordings[0].meta_path
    before = digests["train_meta"][str(meta)]
    meta.write_bytes(meta.read_bytes() + b" ")
    assert compute_digests(train, val)["train_meta"][str(meta)] == before != meta_digest(meta)

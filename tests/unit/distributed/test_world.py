"""The World without processes: torchrun's environment, and the ranks' agreement."""

from __future__ import annotations

import pytest

from iqtrain.distributed.world import RankExit, World, agree, world_from_env
from iqtrain.errors import ConfigError, DataError, TrainingError, exit_code


def test_world_from_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert world_from_env() == World()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not world_from_env().distributed
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    w = world_from_env()
    assert (w.rank, w.world_size, w.local_rank, w.is_main) == (3, 4, 1, False)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ConfigError, match="RANK=4"):
        world_from_env()
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="WORLD_SIZE='two'"):
        world_from_env()


def test_agree_in_one_process_raises_the_error_itself():
    assert agree(World(), None, payload="share") == ["share"]
    with pytest.raises(DataError, match="bad file"):
        agree(World(), DataError("bad file"))


class _FakeWorld(World):
    """A world whose all_gather returns given per-rank objects (no process group)."""

    def __init__(self, rank: int, gathered: list):
        super().__init__(rank, len(gathered), rank, "gloo")
        object.__setattr__(self, "_gathered", gathered)

    def all_gather_object(self, obj):
        return list(self._gathered)

    def wait_for_main(self):
        pass


@pytest.fixture
def keep_sigterm(monkeypatch):
    """agree() stops taking SIGTERM once the ranks agreed to fail: not in the test process."""
    import iqtrain.distributed.world

    monkeypatch.setattr(iqtrain.distributed.world.signal, "signal", lambda *a: None)


def _failure(exc, same=None):
    """One rank's contribution to agree()'s gather: (exit code, message), its ``same`` and its
    payload."""
    return ((exit_code(exc), str(exc)), same, None)


def _ok(same=None, payload=None):
    return (None, same, payload)


def test_agree_rank_0_reports_and_the_others_exit_silently(keep_sigterm):
    err = DataError("x.sigmf-data: truncated")
    gathered = [_ok(), _failure(err)]
    with pytest.raises(ConfigError, match="rank 1: x.sigmf-data: truncated"):
        agree(_FakeWorld(0, gathered), None)
    with pytest.raises(RankExit) as info:
        agree(_FakeWorld(1, gathered), err)
    assert info.value.exit_code == 2
    late = TrainingError("boom")
    with pytest.raises(TrainingError, match="rank 1: boom"):
        agree(_FakeWorld(0, [_ok(), _failure(late)]), None)
    with pytest.raises(RankExit) as info:
        agree(_FakeWorld(1, [_failure(err), _ok()]), None)
    assert info.value.exit_code == 2


def test_agree_refuses_ranks_that_do_not_run_the_same_thing(keep_sigterm):
    # Rank 1 was given its own edited copy of the config: both ranks refuse, rank 0 names it.
    ours, theirs = {"optimizer.lr": 0.003, "training.max_steps": 9}, {"optimizer.lr": 0.001}
    theirs["training.max_steps"] = 9
    gathered = [_ok(ours), _ok(theirs)]
    with pytest.raises(ConfigError, match=r"rank 1 has optimizer.lr = 0.001, rank 0 has 0.003"):
        agree(_FakeWorld(0, gathered), None, same=ours)
    with pytest.raises(RankExit) as info:
        agree(_FakeWorld(1, gathered), None, same=theirs)
    assert info.value.exit_code == 2
    agree(_FakeWorld(0, [_ok(ours), _ok(dict(ours))]), None, same=ours)  # the same: no error


def test_agree_hands_every_rank_all_payloads_in_rank_order(keep_sigterm):
    gathered = [_ok(payload="a"), _ok(payload=None), _ok(payload="c")]
    for rank in range(3):
        assert agree(_FakeWorld(rank, gathered), None, payload="ignored") == ["a", None, "c"]

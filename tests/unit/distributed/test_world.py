"""The World without processes: torchrun's environment, and the ranks' agreement (its ranks
threads of this process exchanging what agree() contributes)."""

from __future__ import annotations

import threading

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


class _ThreadRank(World):
    """One rank of a world whose ranks are threads of this process: ``all_gather_object``
    really exchanges what each rank's agree() contributes (no process group, no fake data)."""

    def __init__(self, rank: int, slots: list, barrier: threading.Barrier):
        super().__init__(rank, len(slots), rank, "gloo")
        object.__setattr__(self, "_slots", slots)
        object.__setattr__(self, "_barrier", barrier)

    def all_gather_object(self, obj):
        self._slots[self.rank] = obj
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()  # every rank has read before any writes the next round
        return out

    def wait_for_main(self):
        self._barrier.wait()


def _agree_on_every_rank(calls: list[dict]) -> list:
    """``agree(world, **calls[r])`` on each rank r of a world of ``len(calls)`` thread ranks;
    what each returned, or the exception it raised, in rank order."""
    barrier = threading.Barrier(len(calls), timeout=30)
    slots: list = [None] * len(calls)
    outcomes: list = [None] * len(calls)

    def rank(r: int) -> None:
        try:
            outcomes[r] = agree(_ThreadRank(r, slots, barrier), **calls[r])
        except Exception as exc:  # the outcome under test
            outcomes[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still waiting in agree()"
    return outcomes


def _no_error(**kwargs) -> dict:
    return {"error": None, **kwargs}


def test_agree_hands_every_rank_every_payload_in_rank_order():
    outcomes = _agree_on_every_rank([_no_error(payload=f"share {r}") for r in range(3)])
    assert outcomes == [["share 0", "share 1", "share 2"]] * 3


def test_agree_rank_0_reports_a_failed_rank_and_the_others_exit_silently():
    err = DataError("x.sigmf-data: truncated")
    main, other = _agree_on_every_rank([_no_error(payload="a"), {"error": err}])
    assert isinstance(main, ConfigError) and str(main) == "rank 1: x.sigmf-data: truncated"
    assert isinstance(other, RankExit) and other.exit_code == exit_code(err) == 2
    # A training failure keeps its class and exit code on rank 0.
    late = TrainingError("boom")
    main, other = _agree_on_every_rank([_no_error(), {"error": late}])
    assert type(main) is TrainingError and str(main) == "rank 1: boom"
    assert isinstance(other, RankExit) and other.exit_code == exit_code(late)


def test_agree_rank_0_raises_its_own_error_itself():
    err = DataError("bad file")
    main, other = _agree_on_every_rank([{"error": err}, _no_error()])
    assert main is err
    assert isinstance(other, RankExit) and other.exit_code == 2 and str(other) == "bad file"


def test_agree_names_the_first_failed_rank():
    errors = [None, DataError("one"), TrainingError("two")]
    main, *others = _agree_on_every_rank([{"error": e} for e in errors])
    assert isinstance(main, ConfigError) and str(main) == "rank 1: one"
    assert [(type(o), o.exit_code) for o in others] == [(RankExit, 2), (RankExit, 2)]


def test_agree_refuses_ranks_that_do_not_run_the_same_thing():
    # Rank 1 was given its own edited copy of the config: both ranks refuse, rank 0 names it.
    ours = {"optimizer.lr": 0.003, "training.max_steps": 9}
    theirs = {"optimizer.lr": 0.001, "training.max_steps": 9}
    main, other = _agree_on_every_rank([_no_error(same=ours), _no_error(same=theirs)])
    assert isinstance(main, ConfigError)
    assert str(main) == (
        "the ranks must run the same thing: rank 1 has optimizer.lr = 0.001, rank 0 has 0.003"
    )
    assert isinstance(other, RankExit) and other.exit_code == 2
    # A key only one rank has differs too.
    main, _ = _agree_on_every_rank([_no_error(same=ours), _no_error(same={**ours, "x": 1})])
    assert str(main).endswith("rank 1 has x = 1, rank 0 has None")
    # The same values (equal, not the same object): every rank gets the payloads.
    same = _agree_on_every_rank([_no_error(same=ours, payload=1), _no_error(same=dict(ours))])
    assert same == [[1, None]] * 2

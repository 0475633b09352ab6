"""The World without processes: torchrun's environment, the ranks' agreement (its ranks
threads of this process exchanging what agree() contributes), and the join: the agreement
through the rendezvous store (a HashStore the thread ranks share) before any process group,
and the group NCCL gets (blocking wait). One NCCL rank on a GPU: test_nccl.py."""

from __future__ import annotations

import os
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


# ------------------------------------------------------------------ joining (no process group)


class _Named(World):
    """A World of its own class (the NCCL tests' one-rank world is one)."""


def _record_groups(monkeypatch) -> list:
    """Patch torch.distributed's group creation: each ``init_process_group`` call's keyword
    arguments and TORCH_NCCL_BLOCKING_WAIT as it was then, in order."""
    import torch.distributed as dist

    made: list = []

    def init_process_group(**kwargs):
        made.append((kwargs, os.environ.get("TORCH_NCCL_BLOCKING_WAIT")))

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "new_group", lambda **kwargs: "the wait group")
    return made


def test_an_nccl_group_waits_for_its_collectives_in_the_rank(monkeypatch):
    # Without blocking wait a collective that times out is NCCL's watchdog's to find, and it
    # kills the process (SIGABRT, no line); with it the collective raises here (PeerError).
    import torch

    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "unset")  # restored after the test
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    made = _record_groups(monkeypatch)
    world = World(0, 2, 0).connect("cuda", 30)
    ((kwargs, blocking),) = made
    assert kwargs["backend"] == "nccl" and kwargs["device_id"] == torch.device("cuda", 0)
    assert blocking == "1"
    assert world == World(0, 2, 0, "nccl")
    # Set by the environment, the user's choice stays.
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "0")
    World(0, 2, 0).connect("cuda", 30)
    assert made[1][1] == "0"
    # The CPU backend is gloo, and a World of another class keeps its class.
    world = _Named(1, 2, 1).connect("cpu", 30)
    assert type(world) is _Named and world.backend == "gloo"
    # A local rank without a GPU of its own is refused before anything is made.
    with pytest.raises(ConfigError, match="local rank 1 has no GPU of its own"):
        World(1, 2, 1).connect("cuda", 30)
    assert len(made) == 3


def test_an_nccl_world_refuses_to_all_reduce_a_host_tensor():
    import torch

    with pytest.raises(ValueError, match="a cpu tensor on the NCCL process group"):
        World(0, 2, 0, "nccl").all_reduce_sum(torch.zeros(2))


def _join_on_every_rank(monkeypatch, loads: list, size: int | None = None) -> tuple[list, list]:
    """``join(loads[r])`` on each rank r of a world of ``size`` (default ``len(loads)``) thread
    ranks sharing one rendezvous store (a HashStore), group creation recorded: what each rank
    returned or raised, in rank order, and the groups made."""
    import torch.distributed as dist

    import iqtrain.distributed.world as world_mod

    store, local = dist.HashStore(), threading.local()
    size = len(loads) if size is None else size
    monkeypatch.setattr(world_mod, "world_from_env", lambda: World(local.rank, size, local.rank))
    monkeypatch.setattr(world_mod, "_rendezvous", lambda world, timeout_s: store)
    made = _record_groups(monkeypatch)
    outcomes: list = [None] * len(loads)

    def rank(r: int) -> None:
        local.rank = r
        try:
            outcomes[r] = world_mod.join(loads[r])
        except Exception as exc:  # the outcome under test
            outcomes[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(loads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank is still joining"
    return outcomes, made


def _refuse(exc: Exception):
    def load():
        raise exc

    return load


def test_ranks_that_can_start_agree_before_they_make_the_group(monkeypatch):
    from torch.distributed import PrefixStore

    from iqtrain.config.schema import Config

    config = Config()
    ((w0, c0), (w1, c1)), made = _join_on_every_rank(monkeypatch, [lambda: config] * 2)
    assert (w0, w1) == (World(0, 2, 0, "gloo"), World(1, 2, 1, "gloo")) and c0 is c1 is config
    for kwargs, _ in made:
        assert kwargs["backend"] == "gloo" and kwargs["world_size"] == 2
        assert isinstance(kwargs["store"], PrefixStore)
    assert sorted(kwargs["rank"] for kwargs, _ in made) == [0, 1]


def test_a_rank_whose_config_fails_stops_every_rank_before_any_group_exists(monkeypatch):
    # Once, the failed rank joined on gloo while its peers made an NCCL group: a job that
    # waited for training.dist_timeout_s. Now no rank makes a group at all.
    from iqtrain.config.schema import Config

    err = ConfigError("training.max_stepz: unknown key")
    config = Config()
    (main, other), made = _join_on_every_rank(monkeypatch, [lambda: config, _refuse(err)])
    assert isinstance(main, ConfigError) and str(main) == f"rank 1: {err}"
    assert isinstance(other, RankExit) and other.exit_code == 2
    assert made == []
    # Rank 0's own refusal is raised as it is.
    (main, other), made = _join_on_every_rank(monkeypatch, [_refuse(err), lambda: config])
    assert main is err and isinstance(other, RankExit) and made == []


def test_a_rank_without_a_gpu_of_its_own_stops_every_rank_before_any_group_exists(monkeypatch):
    import torch

    from iqtrain.config.schema import Config
    from iqtrain.config.sections import TrainingConfig

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # local rank 1 has none
    config = Config(training=TrainingConfig(device="cuda"))
    (main, other), made = _join_on_every_rank(monkeypatch, [lambda: config] * 2)
    assert isinstance(main, ConfigError)
    assert str(main) == "rank 1: training.device: local rank 1 has no GPU of its own (1 visible)"
    assert isinstance(other, RankExit) and other.exit_code == 2
    assert made == []


def test_ranks_that_do_not_run_the_same_config_are_refused_before_any_group_exists(monkeypatch):
    from iqtrain.config.schema import Config
    from iqtrain.config.sections import TrainingConfig

    ours, theirs = Config(), Config(training=TrainingConfig(dist_timeout_s=7))
    (main, other), made = _join_on_every_rank(monkeypatch, [lambda: ours, lambda: theirs])
    assert isinstance(main, ConfigError) and str(main) == (
        "the ranks must run the same thing: rank 1 has training.dist_timeout_s = 7, "
        f"rank 0 has {ours.training.dist_timeout_s}"
    )
    assert isinstance(other, RankExit) and other.exit_code == 2 and made == []


def test_a_rank_that_never_comes_is_named_at_the_timeout(monkeypatch):
    from iqtrain.config.schema import Config
    from iqtrain.config.sections import TrainingConfig
    from iqtrain.distributed.world import PeerError

    config = Config(training=TrainingConfig(dist_timeout_s=1))
    (main,), made = _join_on_every_rank(monkeypatch, [lambda: config], size=2)
    assert isinstance(main, PeerError) and str(main) == (
        "rank 0: cannot join the process group: no word from rank(s) [1] within "
        "training.dist_timeout_s (1 s)"
    )
    assert made == []

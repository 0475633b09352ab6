"""Data-parallel ranks under torchrun (docs/design.md "Distribution"): who this process is, how the
ranks join and agree, and the few collectives the trainer needs.

iqtrain does not launch processes: ``torchrun`` does, and sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (with the rendezvous in ``MASTER_ADDR``/``MASTER_PORT``). :func:`world_from_env`
reads them without connecting to anything. Without those variables, or with ``WORLD_SIZE=1``,
iqtrain is one process and nothing here touches torch.distributed.

Joining (:func:`join`). Every rank loads its config and checks that it has a GPU of its own
when ``training.device = "cuda"``; then the ranks agree on the outcome through torchrun's
rendezvous store, before any process group (NCCL or gloo) exists: a refusal is exit 2 on every
rank, printed once by rank 0, and the ranks must run the same resolved config (compared key by
key). Only when every rank can start do they create the process group, on that same store.

Every collective goes through this module, so a peer that died or timed out is one
:class:`PeerError` (a TrainingError: exit 1, one line) rather than a backend traceback, and
the process group's timeout (``training.dist_timeout_s``) bounds every wait but the ones for
work rank 0 does alone (:meth:`World.wait_for_main`). On NCCL that needs blocking wait
(``TORCH_NCCL_BLOCKING_WAIT=1``, set unless the environment sets it): without it a collective
that times out or fails is found by NCCL's watchdog thread, which kills the process (SIGABRT,
no line of ours); with it the collective raises in the rank that waits for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, NoReturn

from iqtrain.config.schema import Config, config_to_dict, flatten
from iqtrain.config.sections import Device, TrainingConfig
from iqtrain.console import SignalLatch
from iqtrain.errors import ConfigError, IQTrainError, TrainingError, exit_code

__all__ = [
    "NODE_LOCAL",
    "RANK0_WORK_TIMEOUT",
    "PeerError",
    "RankExit",
    "World",
    "agree",
    "join",
    "world_from_env",
]

#: Config keys a node may hold its own value of (its cache path, how far its loader reads
#: ahead, the labelled data only rank 0 probes): every other key must be the same on every
#: rank. The data itself is compared by its fingerprints after it opened.
NODE_LOCAL = frozenset({"data.synthetic.cache_dir", "data.prefetch", "probe.data"})
#: How long ranks wait for work rank 0 does alone (a digest of a 1 TB dataset from disk takes
#: about half an hour). Generous on purpose: a rank 0 that dies ends the wait at once.
RANK0_WORK_TIMEOUT = datetime.timedelta(hours=24)


class PeerError(TrainingError):
    """A collective failed: another rank died, timed out or the connection broke (exit 1)."""


class RankExit(IQTrainError):
    """Raised on a rank other than 0 when the ranks agreed to fail: rank 0 prints the error,
    the others exit with ``exit_code`` silently (W copies of one line help nobody)."""

    def __init__(self, code: int, message: str) -> None:
        self.exit_code = code
        super().__init__(message)


def _first_line(exc: BaseException) -> str:
    """An exception's first line (a backend's message can run to a page), or its class."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _env_int(name: str, minimum: int) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment {name}={raw!r}: not an integer") from None
    if value < minimum:
        raise ConfigError(f"environment {name}={raw!r}: must be >= {minimum}")
    return value


@dataclass(frozen=True)
class World:
    """This process's place among the ranks (one process: rank 0 of 1, no backend)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: Literal["gloo", "nccl"] | None = None  # once connected; None for one process
    # A CPU group whose barrier waits as long as rank 0 works alone (see wait_for_main).
    wait_group: Any = field(default=None, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ---------------------------------------------------------------- process group

    def check_device(self, device: Device) -> None:
        """Several ranks with ``training.device = "cuda"``: this local rank needs a GPU of its
        own (ConfigError otherwise). Checked before the ranks join (:func:`join`), so a rank
        without one refuses with the others instead of joining a group it cannot serve. One
        process: nothing to check here (the step refuses CUDA without a device)."""
        if device != "cuda" or not self.distributed:
            return
        import torch

        visible = torch.cuda.device_count()
        if visible <= self.local_rank:
            raise ConfigError(
                f"training.device: local rank {self.local_rank} has no GPU of its own "
                f"({visible} visible)"
            )

    def connect(self, device: Device, timeout_s: int, store: Any = None) -> World:
        """Join the process group (NCCL on CUDA, one GPU per local rank; gloo on CPU); returns
        this world (its own class) with its backend. ``store``: the rendezvous store the ranks
        agreed through (:func:`join`; the group's keys go under it), else torchrun's
        ``env://`` rendezvous. One process: returns itself, connects nothing.

        NCCL runs with blocking wait (``TORCH_NCCL_BLOCKING_WAIT=1`` unless the environment
        says otherwise): a collective that times out (``timeout_s``) or fails then raises
        DistBackendError in this rank, which :meth:`collective` turns into one PeerError line
        (exit 1). Without it NCCL's watchdog thread aborts the process instead (SIGABRT, torch's
        default and torchrun's). The price: the CPU waits for each collective to finish."""
        if not self.distributed:
            return self
        import torch
        import torch.distributed as dist

        self.check_device(device)
        backend: Literal["gloo", "nccl"] = "nccl" if device == "cuda" else "gloo"
        extra: dict[str, Any] = {}
        if device == "cuda":
            # "cuda" then means this rank's GPU everywhere (tensors, the model, DDP).
            torch.cuda.set_device(self.local_rank)
            extra["device_id"] = torch.device("cuda", self.local_rank)
            os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # read when the group is made
        if store is not None:
            extra.update(store=store, rank=self.rank, world_size=self.world_size)
        try:
            dist.init_process_group(
                backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **extra
            )
            wait_group = dist.new_group(backend="gloo", timeout=RANK0_WORK_TIMEOUT)
        except (RuntimeError, ValueError) as exc:  # rendezvous failed or timed out
            raise PeerError(
                f"rank {self.rank}: cannot join the process group: {_first_line(exc)}"
            ) from None
        return dataclasses.replace(self, backend=backend, wait_group=wait_group)

    def wait_for_main(self) -> None:
        """Every rank calls it at the same point; the others wait there while rank 0 does work
        of its own (digesting every data file for the first checkpoint or a resume, a probe,
        writing a checkpoint). That wait is bounded by ``RANK0_WORK_TIMEOUT``, not by
        ``training.dist_timeout_s``, which keeps bounding the collectives of the loop; if rank 0
        dies meanwhile, the connection closes and the wait ends at once."""
        if self.distributed:
            import torch.distributed as dist

            self._guard(dist.barrier, group=self.wait_group)

    def close(self) -> None:
        if self.backend is None:
            return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    # ---------------------------------------------------------------- collectives

    def all_reduce_sum(self, tensor: Any) -> Any:
        """Sum ``tensor`` over ranks in place (on its device) and return it. On NCCL the tensor
        must be on this rank's GPU (ValueError otherwise: NCCL reduces CUDA tensors only; a
        host value travels by :meth:`all_gather_object`)."""
        if self.distributed:
            import torch.distributed as dist

            if self.backend == "nccl" and tensor.device.type != "cuda":
                raise ValueError(
                    f"all_reduce_sum: a {tensor.device.type} tensor on the NCCL process group "
                    "(NCCL reduces CUDA tensors only)"
                )

            self._guard(dist.all_reduce, tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order."""
        if not self.distributed:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        self._guard(dist.all_gather_object, out, obj)
        return out

    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        import torch.distributed as dist

        box = [obj]
        self._guard(dist.broadcast_object_list, box, src=0)
        return box[0]

    def _guard(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        with self.collective("a collective with the other ranks"):
            fn(*args, **kwargs)

    @contextlib.contextmanager
    def collective(self, what: str) -> Iterator[None]:
        """Turn a backend failure inside the block into one :class:`PeerError` line.

        The backend raises ``RuntimeError`` (``DistBackendError`` is one; DDP's gradient
        all-reduce inside a backward surfaces as a plain one) with a message naming the peer
        and the cause (connection closed, timeout). Its first line is kept, and so is the
        context, since a RuntimeError in the block could also be this rank's own.
        """
        if not self.distributed:
            yield
            return
        import torch
        from torch._dynamo.exc import TorchDynamoException

        try:
            yield
        except (torch.OutOfMemoryError, TorchDynamoException):
            raise  # this rank's own failure, with its own message
        except RuntimeError as exc:
            raise PeerError(
                f"rank {self.rank}: {what} failed (when another rank ended or timed out, its "
                f"output says why): {_first_line(exc)}"
            ) from None

    def ending(self) -> None:
        """This rank is on its way out with a known exit code. torchrun sends SIGTERM to the
        workers still running as soon as one has exited: a rank that is merely slower to
        write its last record or to exit must not be killed (-15) on the way."""
        latch = SignalLatch.current()
        if latch is not None:
            latch.ending()
        elif self.distributed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # library use: no latch

    def hosts(self) -> list[str]:
        """Every rank's host name, in rank order."""
        return self.all_gather_object(socket.gethostname())


def world_from_env() -> World:
    """This process's rank from torchrun's environment, without connecting (one process when
    ``WORLD_SIZE`` is absent or 1). A malformed variable is a ConfigError naming it."""
    world_size = _env_int("WORLD_SIZE", 1)
    if world_size is None or world_size == 1:
        return World()
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    if rank is None or local_rank is None:
        raise ConfigError("environment: WORLD_SIZE is set but RANK or LOCAL_RANK is not")
    if rank >= world_size:
        raise ConfigError(f"environment RANK={rank}: must be < WORLD_SIZE={world_size}")
    return World(rank, world_size, local_rank)


def _difference(rank: int, mine: dict[str, Any], main: dict[str, Any]) -> str | None:
    """The first key whose value rank ``rank`` does not share with rank 0, as one phrase."""
    for key in sorted(mine.keys() | main.keys()):
        if mine.get(key) != main.get(key):
            return f"rank {rank} has {key} = {mine.get(key)!r}, rank 0 has {main.get(key)!r}"
    return None


class _Verdict(NamedTuple):
    """Why the ranks stop: the first failed rank (or the first whose ``same`` differs from rank
    0's), its exit code, its message, and the line rank 0 reports for it."""

    rank: int
    code: int
    message: str
    line: str


def _verdict(outcomes: list[tuple[Any, dict[str, Any] | None]]) -> _Verdict | None:
    """The ranks' agreed outcome from each rank's ``((exit code, message) | None, same)``, in
    rank order: None when every rank may go on."""
    for rank, (failure, _) in enumerate(outcomes):
        if failure is not None:
            code, message = failure
            return _Verdict(rank, code, message, f"rank {rank}: {message}")
    main = outcomes[0][1]
    if main is None:
        return None
    for rank, (_, theirs) in enumerate(outcomes):
        what = _difference(rank, theirs or {}, main)
        if what is not None:
            line = f"the ranks must run the same thing: {what}"
            return _Verdict(rank, ConfigError.exit_code, line, line)
    return None


def _raise_verdict(world: World, error: BaseException | None, verdict: _Verdict) -> NoReturn:
    """Rank 0 raises its own error, or one naming the failed rank with that rank's exit code;
    the other ranks :class:`RankExit` with that code (rank 0 prints the job's one line)."""
    if not world.is_main:
        raise RankExit(verdict.code, verdict.message)
    if error is not None and verdict.rank == 0:
        raise error
    cls = ConfigError if verdict.code == ConfigError.exit_code else TrainingError
    raise cls(verdict.line)


def agree(
    world: World,
    error: BaseException | None,
    same: dict[str, Any] | None = None,
    payload: Any = None,
) -> list[Any]:
    """Every rank calls this at the same point with the error it hit (or None) and, optionally,
    ``same``: flat key -> value that every rank must share (the resolved config, the data's
    fingerprints). If any rank failed, or any rank's ``same`` differs from rank 0's, every rank
    raises: rank 0 its own error, or one naming the first failed rank (or the first key that
    differs) with that rank's exit code; the other ranks :class:`RankExit` with that code,
    printing nothing (one line per job). Before raising, every rank stops taking signals and
    waits for the others to do the same, so no rank's exit lets torchrun's SIGTERM kill a peer
    that has its exit code already. Returns every rank's ``payload``, in rank order (the shares
    of a resume's data check travel with the preflight agreement)."""
    if not world.distributed:
        if error is not None:
            raise error
        return [payload]
    mine = None if error is None else (exit_code(error), str(error))
    world.wait_for_main()  # the ranks' shares of a resume's data check take unequal time
    gathered = world.all_gather_object((mine, same, payload))
    verdict = _verdict([(failure, theirs) for failure, theirs, _ in gathered])
    if verdict is None:
        return [p for _, _, p in gathered]
    world.ending()
    with contextlib.suppress(PeerError):
        world.all_gather_object(None)  # every rank has stopped taking signals
    _raise_verdict(world, error, verdict)


def _rendezvous(world: World, timeout_s: int) -> Any:
    """The ranks' key-value store from torchrun's environment (``env://``): under torchrun a
    client of the store its agent serves at ``MASTER_ADDR:MASTER_PORT``; launched otherwise,
    rank 0 serves it. The process group is made on it later (:meth:`World.connect`)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store, _, _ = next(dist.rendezvous("env://", world.rank, world.world_size, timeout=timeout))
    except (RuntimeError, ValueError) as exc:  # no MASTER_ADDR, or no store in time
        raise PeerError(
            f"rank {world.rank}: cannot join the process group: {_first_line(exc)}"
        ) from None
    return store


def _await(store: Any, keys: dict[int, str], deadline: float, world: World, timeout_s: int) -> None:
    """Wait until ``store`` holds every key of ``keys`` (rank -> the key that rank posts),
    polling, so that a Python signal handler (library use) runs meanwhile; PeerError naming the
    ranks not heard from at ``deadline``."""
    pause = 0.005
    while keys and not store.check(list(keys.values())):
        if time.monotonic() >= deadline:
            silent = [r for r, key in keys.items() if not store.check([key])]
            raise PeerError(
                f"rank {world.rank}: cannot join the process group: no word from rank(s) "
                f"{silent} within training.dist_timeout_s ({timeout_s} s)"
            )
        time.sleep(pause)
        pause = min(2 * pause, 0.1)


def _agree_to_start(
    world: World,
    error: IQTrainError | None,
    same: dict[str, Any] | None,
    store: Any,
    timeout_s: int,
) -> None:
    """:func:`agree` on the join's outcome, through the rendezvous ``store`` before any
    process group exists, so that a rank that cannot start (its config, its arguments, no GPU
    of its own) never makes a backend its peers would wait in: each rank posts its outcome
    (``(exit code, message) | None`` and its resolved config), rank 0 posts the verdict, and on
    a failure every rank stops taking signals and says so, rank 0 answers once all have, and
    every rank raises as agree() does. Keys live under ``iqtrain/join/<torchrun restart>``."""
    from torch.distributed import PrefixStore

    keys = PrefixStore(f"iqtrain/join/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    others = {r: f"ack/{r}" for r in range(1, world.world_size)}
    mine = None if error is None else [exit_code(error), str(error)]
    deadline = time.monotonic() + timeout_s
    try:
        # (A value JSON cannot hold is compared as its repr, alike on every rank.)
        keys.set(f"outcome/{world.rank}", json.dumps({"error": mine, "same": same}, default=repr))
        if world.is_main:
            posted = {r: f"outcome/{r}" for r in range(world.world_size)}
            _await(keys, posted, deadline, world, timeout_s)
            outcomes = [json.loads(keys.get(key)) for key in posted.values()]
            verdict = _verdict([(o["error"], o["same"]) for o in outcomes])
            keys.set("verdict", json.dumps(verdict))
        else:
            _await(keys, {0: "verdict"}, deadline, world, timeout_s)
            found = json.loads(keys.get("verdict"))
            verdict = None if found is None else _Verdict(*found)
    except RuntimeError as exc:  # the store's connection broke (its server, or ours)
        raise PeerError(
            f"rank {world.rank}: cannot join the process group: {_first_line(exc)}"
        ) from None
    if verdict is None:
        return
    world.ending()
    deadline = time.monotonic() + timeout_s
    # Served by rank 0 (no torchrun), the store ends with rank 0, which has heard every rank.
    with contextlib.suppress(PeerError, RuntimeError):
        if world.is_main:
            _await(keys, others, deadline, world, timeout_s)
            keys.set("done", "1")
        else:
            keys.set(others[world.rank], "1")
            _await(keys, {0: "done"}, deadline, world, timeout_s)
    _raise_verdict(world, error, verdict)


def join(load: Callable[[], Config]) -> tuple[World, Config]:
    """This process's world and config, agreed with the other ranks (one process: loaded).

    Every rank calls ``load`` (reading and checking its config, which may fail) and checks
    that it has a GPU of its own when ``training.device = "cuda"``; the ranks agree on that
    through the rendezvous store, before any of them makes a process group: any failure is
    every rank's, printed once, and every rank must hold the same resolved config. Then they
    join the process group with the config's backend and timeout. Returns only when all is
    well on every rank."""
    world = world_from_env()
    latch = SignalLatch.current()
    if latch is not None:
        latch.announce = world.is_main
    config: Config | None = None
    error: IQTrainError | None = None
    try:
        config = load()
        config.check_world_size(world.world_size)
        world.check_device(config.training.device)
    except IQTrainError as exc:
        error = exc
    if not world.distributed:
        if error is not None:
            raise error
        assert config is not None
        return world, config
    from torch.distributed import PrefixStore

    # A rank whose config failed waits for the others as long as the default config says.
    t = config.training if config is not None else TrainingConfig()
    same = None
    if config is not None:
        same = {k: v for k, v in flatten(config_to_dict(config)).items() if k not in NODE_LOCAL}
    store = _rendezvous(world, t.dist_timeout_s)
    _agree_to_start(world, error, same, store, t.dist_timeout_s)
    assert config is not None
    # The group's keys under the prefix torch's own env:// initialisation gives them.
    return world.connect(t.device, t.dist_timeout_s, PrefixStore("default_pg", store)), config

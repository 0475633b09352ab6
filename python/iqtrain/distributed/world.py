"""Data-parallel ranks under torchrun (docs/design.md section 9): who this process is, how the
ranks join and agree, and the few collectives the trainer needs.

iqtrain does not launch processes: ``torchrun`` does, and sets ``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` (with the rendezvous in ``MASTER_ADDR``/``MASTER_PORT``). :func:`world_from_env`
reads them without connecting to anything. Without those variables, or with ``WORLD_SIZE=1``,
iqtrain is one process and nothing here touches torch.distributed.

Joining (:func:`join`). Every rank loads its config, then joins the process group even when
its config failed (on the CPU backend, to say so), and the ranks agree on the outcome
(:func:`agree`) before any of them reports or exits: a refusal is exit 2 on every rank, printed
once by rank 0, and the ranks must run the same resolved config (compared key by key).

Every collective goes through this module, so a peer that died or timed out is one
:class:`PeerError` (a TrainingError: exit 1, one line) rather than a backend traceback, and
the process group's timeout (``training.dist_timeout_s``) bounds every wait but the ones for
work rank 0 does alone (:meth:`World.wait_for_main`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from iqtrain.config.schema import Config, config_to_dict, flatten
from iqtrain.config.sections import TrainingConfig
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
    backend: str | None = None  # "gloo" or "nccl" once connected; None for one process
    # A CPU group whose barrier waits as long as rank 0 works alone (see wait_for_main).
    wait_group: Any = field(default=None, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    # ---------------------------------------------------------------- process group

    def connect(self, device: str, timeout_s: int) -> World:
        """Join torchrun's process group (NCCL on CUDA, one GPU per local rank; gloo on CPU);
        returns the world with its backend. One process: returns itself, connects nothing."""
        if not self.distributed:
            return self
        import torch
        import torch.distributed as dist

        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            if torch.cuda.device_count() <= self.local_rank:
                raise ConfigError(
                    f"training.device: local rank {self.local_rank} has no GPU of its own "
                    f"({torch.cuda.device_count()} visible)"
                )
            # "cuda" then means this rank's GPU everywhere (tensors, the model, DDP).
            torch.cuda.set_device(self.local_rank)
        extra: dict[str, Any] = (
            {"device_id": torch.device("cuda", self.local_rank)} if device == "cuda" else {}
        )
        try:
            dist.init_process_group(
                backend=backend, timeout=datetime.timedelta(seconds=timeout_s), **extra
            )
            wait_group = dist.new_group(backend="gloo", timeout=RANK0_WORK_TIMEOUT)
        except (RuntimeError, ValueError) as exc:  # rendezvous failed or timed out
            raise PeerError(f"rank {self.rank}: cannot join the process group: {exc}") from None
        return World(self.rank, self.world_size, self.local_rank, backend, wait_group)

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
        """Sum ``tensor`` over ranks in place (on its device) and return it."""
        if self.distributed:
            import torch.distributed as dist

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
            text = str(exc).strip()
            first = text.splitlines()[0] if text else type(exc).__name__
            raise PeerError(
                f"rank {self.rank}: {what} failed (when another rank ended or timed out, its "
                f"output says why): {first}"
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
    failed = [(r, f) for r, (f, _, _) in enumerate(gathered) if f is not None]
    if not failed and same is not None:
        main = gathered[0][1]
        for r, (_, theirs, _) in enumerate(gathered):
            what = _difference(r, theirs, main)
            if what is not None:
                failed = [
                    (r, (ConfigError.exit_code, f"the ranks must run the same thing: {what}"))
                ]
                break
    if not failed:
        return [p for _, _, p in gathered]
    world.ending()
    with contextlib.suppress(PeerError):
        world.all_gather_object(None)  # every rank has stopped taking signals
    rank, (code, message) = failed[0]
    if world.is_main:
        if error is not None and rank == 0:
            raise error
        cls = ConfigError if code == ConfigError.exit_code else TrainingError
        raise cls(message if message.startswith("the ranks") else f"rank {rank}: {message}")
    raise RankExit(code, message)  # rank 0 prints the job's one line


def join(load: Callable[[], Config]) -> tuple[World, Config]:
    """This process's world and config, agreed with the other ranks (one process: loaded).

    Every rank calls ``load`` (reading and checking its config, which may fail), joins the
    process group with the config's backend and timeout (the CPU backend and the default
    timeout when its config failed, or when ``training.device = "cuda"`` finds no GPU for it),
    and the ranks agree: any failure is every rank's, printed once, and every rank must hold
    the same resolved config. Returns only when all is well on every rank."""
    world = world_from_env()
    latch = SignalLatch.current()
    if latch is not None:
        latch.announce = world.is_main
    config: Config | None = None
    error: IQTrainError | None = None
    try:
        config = load()
        config.check_world_size(world.world_size)
    except IQTrainError as exc:
        error = exc
    if not world.distributed:
        if error is not None:
            raise error
        assert config is not None
        return world, config
    t = config.training if config is not None else TrainingConfig()
    try:
        world = world.connect(t.device, t.dist_timeout_s)
    except ConfigError as exc:  # no GPU for this rank: join on the CPU to tell the others
        error = error or exc
        world = world.connect("cpu", t.dist_timeout_s)
    same = None
    if config is not None:
        same = {k: v for k, v in flatten(config_to_dict(config)).items() if k not in NODE_LOCAL}
    agree(world, error, same=same)
    assert config is not None
    return world, config

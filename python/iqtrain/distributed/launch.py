"""``iqtrain launch``: torchrun, with iqtrain's defaults and iqtrain's way of ending.

``iqtrain launch [torchrun options] run|resume ...`` is ``torchrun [torchrun options] -m iqtrain
run|resume ...`` run in this process (torch's own agent, rendezvous and worker supervision:
``torch.distributed.run``), with three differences:

- **Defaults a cluster needs.** SIGUSR1 (a batch system's warning before a time limit) is among
  the signals the agent forwards to its workers; the rendezvous waits for the other nodes
  (c10d's ``join_timeout``, the static backend's ``timeout``) and for its store
  (``read_timeout``, at most 60 s) no longer than the config's ``training.dist_timeout_s``. An
  option given on the command line wins.
- **One line, not a page.** A rendezvous that fails (a node that never joins, an endpoint that
  nothing listens on) ends with one ``iqtrain: error:`` line naming the endpoint and the time
  waited, exit 1 (:class:`RendezvousFailed`). The agent's own log is off (torchrun's Python log
  below CRITICAL, but for the line saying that it had to SIGKILL a worker that did not stop in
  time; torch's C++ log below FATAL); the workers' is untouched.
- **The workers' exit code, not 1.** The agent exits with its workers' code: the first failure
  torchrun names (2 for a refused config, 1 for a training failure, 128 + signum after a
  signal), so a batch script can tell a stop worth requeueing from one that is not. A worker
  that a signal killed (the kernel's OOM killer, say) printed nothing: the agent says which
  rank, exit 1. A signal to the agent itself ends it with 128 + signum once its workers have
  stopped; before any worker started it ends the launch at once, whatever the agent is waiting
  in, with one line (:func:`_until_workers_start`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

from iqtrain.console import error
from iqtrain.distributed.world import PeerError, _first_line
from iqtrain.errors import ConfigError

__all__ = ["COMMANDS", "RendezvousFailed", "launch"]

#: The commands a launch runs: the ones that train (under torchrun, every other command runs
#: as it does in one process, W times over).
COMMANDS = ("run", "resume")
#: The signal added to torchrun's ``--signals-to-handle`` when it lacks it.
SIGUSR1 = "SIGUSR1"
#: The most the rendezvous waits for its store to answer (torchrun's own default).
READ_TIMEOUT_S = 60
#: torchrun's line when a worker did not stop within ``--shutdown-timeout`` (kept: the one
#: sign that a checkpoint was cut short).
FORCED_KILL = "forcefully exiting via"


class RendezvousFailed(PeerError):  # noqa: N818 - named for what the user sees
    """The nodes did not meet: one never joined, or nothing answered at the endpoint (exit 1)."""


def launch(argv: list[str], dist_timeout_s: Callable[[list[str]], int]) -> int:
    """Run ``iqtrain launch ARGV``; the exit code (module docstring). ``dist_timeout_s`` gives
    ``training.dist_timeout_s`` of the config an iqtrain command line (``run CONFIG ...``,
    ``resume --attempt ...``) will run."""
    with _quiet_cpp_log():
        from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException

    args = _parse(torchrun, argv)
    conf = _default_rendezvous(args, dist_timeout_s(args.training_script_args))
    handled = [getattr(signal, name) for name in args.signals_to_handle.split(",")]
    try:
        with _agent_log(), _until_workers_start(handled):
            return _run(torchrun, args, conf)
    except SignalException as exc:  # one that came as the agent finished: the workers are gone
        return 128 + int(exc.sigval)


def _run(torchrun: Any, args: Any, conf: dict[str, str]) -> int:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousError,
        RendezvousTimeoutError,
    )

    where = _endpoint(args)
    try:
        torchrun.run(args)
    except ChildFailedError as exc:
        return _child_code(exc)
    except SignalException as exc:
        return 128 + int(exc.sigval)
    except RendezvousTimeoutError:
        raise RendezvousFailed(
            f"rendezvous {where}: the other nodes did not join within {conf['join_timeout']} s "
            f"(--nnodes {args.nnodes}; torchrun's join_timeout)"
        ) from None
    except RendezvousConnectionError as exc:
        cause = f": {_first_line(exc.__cause__)}" if exc.__cause__ is not None else ""
        raise RendezvousFailed(
            f"rendezvous {where}: nothing answered within {conf['read_timeout']} s "
            f"(is the first node's launch running?){cause}"
        ) from None
    except (RendezvousError, DistError) as exc:  # the static backend's store raises DistError
        raise RendezvousFailed(f"rendezvous {where}: {_first_line(exc)}") from None
    return 0


@contextlib.contextmanager
def _quiet_cpp_log() -> Iterator[None]:
    """The agent's C++ log (each retry of a rendezvous store prints a page) from FATAL up:
    torch reads ``TORCH_CPP_LOG_LEVEL`` once, when it loads, so it is set around the import
    and restored after, and the workers get the caller's."""
    key = "TORCH_CPP_LOG_LEVEL"
    before = os.environ.get(key)
    if before is None:
        os.environ[key] = "FATAL"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


class _AgentLog(logging.Filter):
    """torchrun's records below CRITICAL are dropped, but for the forced kill of a worker."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("torch.distributed"):
            return True
        return record.levelno >= logging.CRITICAL or FORCED_KILL in record.getMessage()


@contextlib.contextmanager
def _agent_log() -> Iterator[None]:
    """:class:`_AgentLog` on the handlers torch's records reach, for the launch: torch's own
    (its logging sets one on "torch" and on "torch.distributed", neither propagating) and the
    root's, in case."""
    loggers = [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch."))
    ]
    handlers = {id(h): h for lg in [*loggers, logging.getLogger()] for h in lg.handlers}.values()
    quiet = _AgentLog()
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


def _parse(torchrun: Any, argv: list[str]) -> Any:
    """torchrun's own parser, its errors as :class:`ConfigError` (one line, exit 2); the script
    becomes ``-m iqtrain COMMAND``, and SIGUSR1 is among the signals handled."""
    parser = torchrun.get_args_parser()
    parser.prog = "iqtrain launch"

    def refuse(message: str) -> None:
        raise ConfigError(f"launch: {message}")

    parser.error = refuse
    args = parser.parse_args(argv)
    if args.module or args.no_python or args.run_path:
        raise ConfigError(
            "launch: -m, --no-python and --run-path are the launch's own: give COMMAND only"
        )
    if args.training_script not in COMMANDS:
        raise ConfigError(
            f"launch: {args.training_script!r} is not a command it launches "
            f"(one of: {', '.join(COMMANDS)})"
        )
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.module, args.training_script = True, "iqtrain"
    wanted = [s.strip() for s in args.signals_to_handle.split(",") if s.strip()]
    for name in wanted:
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise ConfigError(f"launch: --signals-to-handle: {name!r} is not a signal")
    args.signals_to_handle = ",".join([*wanted, *([SIGUSR1] if SIGUSR1 not in wanted else [])])
    return args


def _default_rendezvous(args: Any, timeout: int) -> dict[str, str]:
    """The rendezvous's timeouts, unless ``--rdzv-conf`` names them (read by torch's own
    parser; a malformed one is a ConfigError); the settings in force."""
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    try:
        conf = _parse_rendezvous_config(args.rdzv_conf)
    except ValueError as exc:
        raise ConfigError(f"launch: --rdzv-conf {args.rdzv_conf!r}: {exc}") from None
    conf.setdefault("join_timeout", str(timeout))
    conf.setdefault("read_timeout", str(min(timeout, READ_TIMEOUT_S)))
    if args.rdzv_backend == "static":
        conf.setdefault("timeout", str(timeout))
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())
    return conf


def _endpoint(args: Any) -> str:
    if args.standalone:
        return "(standalone)"
    if args.rdzv_backend == "static" and not args.rdzv_endpoint:
        return f"{args.master_addr}:{args.master_port or 29500}"
    return f"{args.rdzv_endpoint or '?'} (id {args.rdzv_id})"


def _child_code(exc: Any) -> int:
    """The agent's exit code from its workers' failures: the first one's own code, or 1 with a
    line when a signal killed it (it could print nothing)."""
    rank, failure = exc.get_first_failure()
    if failure.exitcode > 0:
        return int(failure.exitcode)
    try:
        name = signal.Signals(-failure.exitcode).name
    except ValueError:
        name = f"signal {-failure.exitcode}"
    error(f"rank {rank} (pid {failure.pid}) was killed by {name}; see the lines above it")
    return 1


@contextlib.contextmanager
def _until_workers_start(signals: list[signal.Signals]) -> Iterator[None]:
    """Until torchrun installs its own handlers for ``signals`` (just before it starts the
    workers), each of them ends the launch at once with 128 + signum and one line. The
    agent's main thread may be blocked in C++ then (a store that retries its connection, a
    master waiting for its clients), where no Python handler runs, so the C-level handler's
    wake-up byte is read by a thread that ends the process; while a signal still has this
    handler no worker exists to be left behind. (Known limit: a signal in the instant between
    that check and the exit, while torchrun installs its handlers and starts the workers, can
    leave those workers to fail on their own, their rendezvous gone.)"""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old = {sig: signal.signal(sig, _no_op) for sig in signals}
    try:
        old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except ValueError:  # not the main thread: torchrun itself then handles no signal either
        for sig, handler in old.items():
            signal.signal(sig, handler)
        os.close(read_fd)
        os.close(write_fd)
        yield
        return
    stop = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(read_fd, set(signals), stop), name="iqtrain-launch", daemon=True
    )
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        signal.set_wakeup_fd(old_fd)
        os.write(write_fd, b"\0")  # wakes the watcher, which sees `stop`
        watcher.join(timeout=5)
        for sig, handler in old.items():
            signal.signal(sig, handler)
        os.close(write_fd)
        os.close(read_fd)


def _no_op(signum: int, frame: object) -> None:
    """The Python-level handler while :func:`_watch` acts (it must not be the default)."""


def _watch(read_fd: int, signals: set[signal.Signals], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        for signum in data:
            if stop.is_set() or signum not in signals:
                continue
            if signal.getsignal(signum) is _no_op:  # torchrun's handler is not in place yet
                error(f"stopped by signal {signum} before the workers started")
                os._exit(128 + signum)

"""``iqtrain launch``: torchrun, with iqtrain's defaults and iqtrain's way of ending.

``iqtrain launch [torchrun options] run|resume ...`` is ``torchrun [torchrun options] -m iqtrain
run|resume ...`` run in this process (torch's own agent, rendezvous and worker supervision:
``torch.distributed.run``), with three differences:

- **Defaults a cluster needs.** SIGUSR1 (a batch system's warning before a time limit) is among
  the signals the agent forwards to its workers; the rendezvous waits for the other nodes
  (``join_timeout``) and for its store (``read_timeout``, at most 60 s) no longer than the
  config's ``training.dist_timeout_s``. An option given on the command line wins.
- **One line, not a page.** A rendezvous that fails (a node that never joins, an endpoint that
  nothing listens on) ends with one ``iqtrain: error:`` line naming the endpoint and the time
  waited, exit 1 (:class:`RendezvousFailed`); the agent's own log lines (torchrun's Python log
  below CRITICAL, torch's C++ log below FATAL) are off; the workers' are untouched.
- **The workers' exit code, not 1.** The agent exits with its workers' code: the first failure
  torchrun names (2 for a refused config, 1 for a training failure, 128 + signum after a
  signal), so a batch script can tell a stop worth requeueing from one that is not. A worker
  that a signal killed (the kernel's OOM killer, say) printed nothing: the agent says which
  rank, exit 1. A signal to the agent itself ends it with 128 + signum once its workers have
  stopped; before any worker started, it says so in one line.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from iqtrain.console import error
from iqtrain.distributed.world import PeerError
from iqtrain.errors import ConfigError

__all__ = ["COMMANDS", "RendezvousFailed", "launch"]

#: The commands a launch runs: the ones that train (under torchrun, every other command runs
#: as it does in one process, W times over).
COMMANDS = ("run", "resume")
#: The signals the agent forwards to its workers by default: torchrun's four and SIGUSR1 (which
#: is added to a ``--signals-to-handle`` that lacks it); until the workers start, each ends the
#: launch at once.
SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1")
#: The most the rendezvous waits for its store to answer (torchrun's own default).
READ_TIMEOUT_S = 60


class RendezvousFailed(PeerError):  # noqa: N818 - named for what the user sees
    """The nodes did not meet: one never joined, or nothing answered at the endpoint (exit 1)."""


def launch(argv: list[str], dist_timeout_s: Callable[[list[str]], int]) -> int:
    """Run ``iqtrain launch ARGV``; the exit code (module docstring). ``dist_timeout_s`` gives
    ``training.dist_timeout_s`` of the config an iqtrain command line (``run CONFIG ...``,
    ``resume --attempt ...``) will run."""
    with _quiet_cpp_log():
        from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousConnectionError,
        RendezvousError,
        RendezvousTimeoutError,
    )

    args = _parse(torchrun, argv)
    timeout = dist_timeout_s(args.training_script_args)
    conf = _default_rendezvous(args, timeout)
    where = _endpoint(args)
    # torchrun's loggers each set their own level: off below CRITICAL in this process only.
    logging.disable(logging.ERROR)
    with contextlib.ExitStack() as stack:
        stack.callback(logging.disable, logging.NOTSET)
        early = stack.enter_context(_early_signals(SignalException))
        try:
            torchrun.run(args)
        except ChildFailedError as exc:
            return _child_code(exc)
        except SignalException as exc:
            if early:
                error(f"stopped by signal {int(exc.sigval)} before the workers started")
            return 128 + int(exc.sigval)
        except RendezvousTimeoutError:
            raise RendezvousFailed(
                f"rendezvous {where}: the other nodes did not join within "
                f"{conf['join_timeout']} s "
                f"(--nnodes {args.nnodes}; torchrun's join_timeout)"
            ) from None
        except RendezvousConnectionError as exc:
            cause = _first_line(exc.__cause__) if exc.__cause__ is not None else ""
            raise RendezvousFailed(
                f"rendezvous {where}: nothing answered within {conf['read_timeout']} s "
                "(is the first node's launch running?)" + (f": {cause}" if cause else "")
            ) from None
        except RendezvousError as exc:
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


def _parse(torchrun: Any, argv: list[str]) -> Any:
    """torchrun's own parser, its errors as :class:`ConfigError` (one line, exit 2); the script
    becomes ``-m iqtrain COMMAND``."""
    parser = torchrun.get_args_parser()
    parser.prog = "iqtrain launch"

    def refuse(message: str) -> None:
        raise ConfigError(f"launch: {message}")

    parser.error = refuse  # type: ignore[method-assign]
    args = parser.parse_args(argv)
    if args.module or args.no_python:
        raise ConfigError("launch: -m and --no-python are the launch's own: give COMMAND only")
    if args.training_script not in COMMANDS:
        raise ConfigError(
            f"launch: {args.training_script!r} is not a command it launches "
            f"(one of: {', '.join(COMMANDS)})"
        )
    args.training_script_args = [args.training_script, *args.training_script_args]
    args.module, args.training_script = True, "iqtrain"
    wanted = [s.strip() for s in args.signals_to_handle.split(",") if s.strip()]
    args.signals_to_handle = ",".join([*wanted, *(["SIGUSR1"] if "SIGUSR1" not in wanted else [])])
    return args


def _default_rendezvous(args: Any, timeout: int) -> dict[str, str]:
    """The rendezvous's timeouts, unless ``--rdzv-conf`` names them; the ones in force."""
    conf = dict(
        part.split("=", 1) if "=" in part else (part, "")
        for part in (p.strip() for p in args.rdzv_conf.split(","))
        if part
    )
    conf.setdefault("join_timeout", str(timeout))
    conf.setdefault("read_timeout", str(min(timeout, READ_TIMEOUT_S)))
    args.rdzv_conf = ",".join(f"{k}={v}" for k, v in conf.items())
    return conf


def _endpoint(args: Any) -> str:
    if args.standalone:
        return "(standalone)"
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
def _early_signals(exception: type[BaseException]) -> Iterator[list[int]]:
    """Until the agent installs its own handlers (when it starts the workers), a signal ends
    the launch: ``exception`` is raised with its ``sigval``, and the yielded list is non-empty
    when that happened (torch's handler raises the same exception later, with no worker
    without its signal)."""
    early: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        early.append(signum)
        sigval = signal.Signals(signum)
        raise exception(f"Process {os.getpid()} got signal: {sigval}", sigval=sigval)  # type: ignore[call-arg]

    old = {}
    for name in SIGNALS:
        sig = getattr(signal, name)
        if signal.getsignal(sig) is not signal.SIG_IGN:
            old[sig] = signal.signal(sig, handle)
    try:
        yield early
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

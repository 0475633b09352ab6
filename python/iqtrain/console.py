"""What the person at the terminal sees and does: progress lines, notes, signals, interruption.

Torch-free, so the CLI can import it without loading the model stack. Library code does not
print: a note for the user goes through :func:`note` (or a :class:`Progress`'s ``note`` inside
the loop), an error line through :func:`error`.

Signals. The ``run`` and ``resume`` commands (and every command under torchrun) install one
:class:`SignalLatch` first thing: SIGINT, SIGTERM, SIGHUP and SIGUSR1 (the last two unless
ignored at start, as SIGHUP is under ``nohup``) are blocked in every thread and taken by one
thread with ``sigwait``, so a signal is seen at once whatever the main thread is doing, a
blocking call in C included (a rendezvous, a barrier, a digest). What it does depends on the
phase the attempt is in (docs/design.md "Signals and exits"):

- ``start`` (until just before the attempt is claimed): nothing exists that a checkpoint could
  save, so the process ends at once with 128 + signum, saying so on rank 0;
- ``held`` (from the claim on): the signal is a flag; the loop stops after the step it is in,
  saves a checkpoint and ends with 128 + signum (:class:`Interrupted`). A second signal in one
  process means the user insists (KeyboardInterrupt); under torchrun it is dropped (torchrun
  escalates to SIGKILL on its own);
- ``ending`` (the process has its exit code): signals are dropped, so torchrun's SIGTERM to the
  workers still running when one exits cannot turn a rank's own exit code into -15.

Library use (``run_attempt`` called from Python) installs no latch: the loop's
:class:`SignalGuard` then handles SIGINT/SIGTERM/SIGHUP/SIGUSR1 with Python handlers while it runs.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, ClassVar

from iqtrain.errors import ConfigError

__all__ = [
    "Interrupted",
    "Progress",
    "SignalGuard",
    "SignalLatch",
    "StoppedBeforeStart",
    "error",
    "failure",
    "note",
    "resume_command",
]


def note(text: str) -> None:
    """One ``iqtrain: note:`` line on stderr (a fact worth knowing that changes no outcome)."""
    print(f"iqtrain: note: {text}", file=sys.stderr, flush=True)


def failure(exc: BaseException) -> str:
    """What went wrong, as a phrase for a note: an OSError's file and reason, a ConfigError's
    own message (it names its key), anything else its class and message."""
    if isinstance(exc, OSError) and exc.strerror:
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror}"
    return str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"


def resume_command(attempt: Path, world_size: int = 1, per_node: int | None = None) -> str:
    """How to resume ``attempt`` as it was launched (any world size resumes it; the same one
    resumes it bit-exactly): ``iqtrain`` for one process, torchrun with the same ranks per node
    (``per_node``; all on one node when it is None or the whole world) otherwise."""
    if world_size <= 1:
        launcher = "iqtrain"
    elif per_node is None or per_node >= world_size or per_node < 1:
        launcher = f"torchrun --nproc-per-node {world_size} -m iqtrain"
    else:
        nodes = world_size // per_node
        launcher = (
            f"torchrun --nnodes {nodes} --nproc-per-node {per_node} <rendezvous options> -m iqtrain"
        )
    return f"{launcher} resume --attempt {attempt}"


def error(text: str) -> None:
    """The one ``iqtrain: error:`` line a failed command ends with."""
    print(f"iqtrain: error: {text}", file=sys.stderr, flush=True)


class Interrupted(Exception):  # noqa: N818 - it is a control-flow signal, not an error
    """SIGINT/SIGTERM/SIGHUP/SIGUSR1 arrived; a checkpoint was saved. ``exit_code`` is
    128 + signum."""

    def __init__(self, signum: int, attempt: Path, world_size: int = 1):
        self.signum = signum
        self.attempt = attempt
        self.world_size = world_size  # > 1: the resume runs under torchrun too
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}")


class StoppedBeforeStart(Exception):  # noqa: N818 - control flow, like Interrupted
    """A signal ended the job before its attempt existed (nothing was created)."""

    def __init__(self, signum: int, after_peer: bool = False):
        self.signum = signum
        self.exit_code = 128 + signum
        # A peer that had gone first may have crashed (torchrun then signals the others): its
        # own output says why.
        peer = ", after a peer had ended (its output says why)" if after_peer else ""
        super().__init__(
            f"stopped by signal {signum} before the attempt existed{peer}; nothing was created"
        )


def _signals() -> list[signal.Signals]:
    """SIGINT, SIGTERM, SIGHUP and SIGUSR1 (a batch system's warning before a time limit:
    SLURM's ``--signal=USR1@120``), except a SIGHUP or SIGUSR1 ignored at start (as SIGHUP is
    under ``nohup``)."""
    out = [signal.SIGINT, signal.SIGTERM]
    for optional in (signal.SIGHUP, signal.SIGUSR1):
        if signal.getsignal(optional) is not signal.SIG_IGN:
            out.append(optional)
    return out


class SignalLatch:
    """The process's SIGINT/SIGTERM/SIGHUP/SIGUSR1, from a command's first line to its exit (see the
    module docstring for the phases). Installed once, from the main thread, before any other
    thread exists (threads inherit the signal mask: torch's, gloo's and rayon's must block the
    signals too, or the kernel would deliver them there)."""

    _current: ClassVar[SignalLatch | None] = None

    def __init__(self, *, distributed: bool) -> None:
        self.distributed = distributed
        self.announce = True  # rank 0 only, once the rank is known
        self.signum: int | None = None
        self.phase = "start"
        self._signals = _signals()
        self._lock = threading.Lock()
        self._arrived = threading.Event()
        self._seen: int | None = None
        self.after_peer = False  # a peer had gone before this process had its signal

    @classmethod
    def install(cls, *, distributed: bool) -> SignalLatch:
        if cls._current is not None:
            return cls._current
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("SignalLatch.install: only from the main thread")
        latch = cls(distributed=distributed)
        # Rank 0 alone speaks for the job; torchrun's RANK is known before the world is.
        latch.announce = os.environ.get("RANK", "0") == "0"
        signal.pthread_sigmask(signal.SIG_BLOCK, latch._signals)
        threading.Thread(target=latch._run, name="iqtrain-signals", daemon=True).start()
        cls._current = latch
        return latch

    @classmethod
    def current(cls) -> SignalLatch | None:
        return cls._current

    def hold(self) -> None:
        """From here a signal is a flag the loop acts on (the attempt is about to exist)."""
        with self._lock:
            if self.phase == "start":
                self.phase = "held"

    def ending(self) -> None:
        """This process has its exit code: drop every signal from here on."""
        with self._lock:
            self.phase = "ending"

    def wait(self, timeout: float) -> int | None:
        """The signal that arrived, waiting up to ``timeout`` seconds for one."""
        self._arrived.wait(timeout)
        return self.signum

    def pending_or_taken(self, grace: float = 0.0) -> int | None:
        """The signal this process has received: taken by the signal thread, or still pending
        for it (delivered by the kernel, not yet taken), or one that arrives within ``grace``
        seconds; None when none was sent.

        The grace is for a peer that a signal ended: torchrun forwards a signal to its workers
        one after the other, so a worker that exits at once can close its connections before
        this worker has its own copy of the signal."""
        pending = signal.sigpending() & set(self._signals)
        if self.signum is None and (pending or self._seen is not None):
            self.wait(5.0)  # the signal thread records it in a moment
        elif self.signum is None and grace > 0:
            self.after_peer = True
            self.wait(grace)  # in the start phase the signal thread ends the process itself
        if self.signum is not None:
            return self.signum
        if self._seen is not None:
            return self._seen
        return int(min(pending)) if pending else None

    def _run(self) -> None:
        while True:
            signum = int(signal.sigwait(self._signals))
            self._seen = signum  # taken from the kernel, before the lock (pending_or_taken)
            # This thread must never die: the signals would stay blocked with no one to take them.
            with contextlib.suppress(BaseException):
                self._take(signum)

    def _take(self, signum: int) -> None:
        with self._lock:
            if self.phase == "ending":
                return
            first = self.signum is None
            if first:
                self.signum = signum
                self._arrived.set()
            if self.phase == "start":
                try:
                    if self.announce:
                        stopped = StoppedBeforeStart(signum, self.after_peer)
                        _write_stderr(f"\niqtrain: error: {stopped}\n")
                finally:
                    os._exit(128 + signum)
            if first:
                if self.announce:
                    _write_stderr(
                        f"\nsignal {signum}: finishing this step, then saving a checkpoint\n"
                    )
            elif not self.distributed:  # the user insists
                _thread.interrupt_main()


def _write_stderr(text: str) -> None:
    """Write to fd 2 from the signal thread; a terminal that is gone (a hang-up: EIO) or a
    closed pipe costs the line, never the thread."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


class SignalGuard:
    """The loop's view of SIGINT/SIGTERM/SIGHUP/SIGUSR1: ``signum`` is the first one that arrived.

    Under the CLI it reads the process's :class:`SignalLatch`. Without one (library use) it
    installs Python handlers while the loop runs, announced on stderr unless ``announce`` is
    false (ranks other than 0 stay quiet), and a second signal raises KeyboardInterrupt. SIGHUP
    is there because torchrun forwards it (a closed terminal or SSH session): it ends the run
    like SIGTERM, with a checkpoint, exit 129. SIGUSR1 is a batch system's warning that the
    time limit is near: the same, exit 138."""

    def __init__(self, announce: bool = True) -> None:
        self.announce = announce
        self._signum: int | None = None
        self._latch = SignalLatch.current()
        self._old: dict[int, Any] = {}

    @property
    def signum(self) -> int | None:
        return self._latch.signum if self._latch is not None else self._signum

    def __enter__(self) -> SignalGuard:
        if self._latch is not None:
            self._latch.hold()
        elif threading.current_thread() is threading.main_thread():
            for sig in _signals():
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._signum is not None:  # a second signal: the user insists
            raise KeyboardInterrupt
        self._signum = signum
        if self.announce:
            print(
                f"\nsignal {signum}: finishing this step, then saving a checkpoint",
                file=sys.stderr,
            )

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Progress:
    """tqdm on a terminal; plain log lines every ``log_every`` steps otherwise; nothing at all
    when not ``enabled`` (ranks other than 0: one progress display per job)."""

    def __init__(self, first: int, total: int, log_every: int, enabled: bool = True):
        self.total, self.log_every, self.t0, self.first = (
            total,
            log_every,
            time.perf_counter(),
            first,
        )
        self.enabled = enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=first, unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, lr: float, sps: float) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", samples_s=f"{sps:.0f}")
            return
        if step % self.log_every and step != self.total:
            return
        elapsed = time.perf_counter() - self.t0
        rate = (step - self.first) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        print(
            f"step {step}/{self.total}  loss {loss:.5f}  lr {lr:.3e}  samples/s {sps:.0f}  "
            f"eta {eta:.0f}s",
            file=sys.stderr,
            flush=True,
        )

    def note(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

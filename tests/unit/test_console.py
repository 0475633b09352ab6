"""Signals: the loop's guard (library use) and the process's latch (the CLI), by phase."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from iqtrain.console import SignalGuard


def test_sigint_sigterm_sighup_and_sigusr1_become_a_flag():
    # The suite may itself run under nohup (SIGHUP ignored, which the guard keeps ignored:
    # the next test): start from the default disposition, as a terminal session has it.
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            before = signal.getsignal(sig)
            with SignalGuard(announce=False) as guard:
                os.kill(os.getpid(), sig)
                assert guard.signum == sig
            assert signal.getsignal(sig) == before  # restored on exit
    finally:
        signal.signal(signal.SIGHUP, hup)


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1], ids=["hup", "usr1"])
def test_a_hangup_or_usr1_ignored_at_start_stays_ignored(sig):
    old = signal.signal(sig, signal.SIG_IGN)  # as SIGHUP is under nohup
    try:
        with SignalGuard(announce=False) as guard:
            os.kill(os.getpid(), sig)
            assert guard.signum is None
            assert signal.getsignal(sig) is signal.SIG_IGN
    finally:
        signal.signal(sig, old)


def _latch_child(body: str) -> subprocess.CompletedProcess:
    """A fresh interpreter that installs the process's SignalLatch, then runs ``body``."""
    prelude = (
        "import os, signal, sys, time\n"
        # A terminal session's SIGHUP, even when the suite itself runs under nohup.
        "signal.signal(signal.SIGHUP, signal.SIG_DFL)\n"
        "from iqtrain.console import SignalLatch\n"
        "latch = SignalLatch.install(distributed=True)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + body], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["term", "usr1"])
def test_a_signal_before_the_attempt_exists_ends_the_process_at_once_with_128_plus_it(sig):
    # Even from inside a blocking call in C (here: a sleep the main thread never returns from).
    proc = _latch_child(f"os.kill(os.getpid(), {int(sig)})\ntime.sleep(30)\nsys.exit(7)")
    assert proc.returncode == 128 + sig, proc.stderr
    want = f"stopped by signal {int(sig)} before the attempt existed; nothing was created"
    assert want in proc.stderr


def test_a_held_signal_is_a_flag_and_an_ending_process_drops_them():
    proc = _latch_child(
        "latch.hold()\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "assert latch.wait(10) == signal.SIGHUP\n"
        "os.kill(os.getpid(), signal.SIGTERM)  # a second one, under torchrun: dropped\n"
        "time.sleep(0.5)\n"
        "assert latch.signum == signal.SIGHUP\n"
        "latch.ending()\n"
        "os.kill(os.getpid(), signal.SIGINT)  # the process has its exit code: dropped\n"
        "time.sleep(0.5)\n"
        "print(latch.signum)\n"
        "sys.exit(3)\n"
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == str(int(signal.SIGHUP))
    assert proc.stderr.count("finishing this step, then saving a checkpoint") == 1


def test_a_pending_signal_counts_before_the_signal_thread_takes_it():
    proc = _latch_child(
        "latch.hold()\n"
        "with latch._lock:  # the signal thread cannot record it meanwhile\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    assert latch.signum is None  # taken from the kernel, not yet recorded\n"
        "print(latch.pending_or_taken())\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(int(signal.SIGTERM))


def test_a_signal_within_the_grace_counts_and_none_after_it_is_none():
    # A peer's signal came first and it has gone; this process's own copy comes a moment later.
    proc = _latch_child(
        "latch.hold()\n"
        "import threading\n"
        "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()\n"
        "print(latch.pending_or_taken(grace=10.0))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(int(signal.SIGUSR1))
    proc = _latch_child(
        "latch.hold()\n"
        "t = time.monotonic()\n"
        "print(latch.pending_or_taken(grace=0.2), round(time.monotonic() - t) < 5)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "True"]

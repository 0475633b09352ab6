"""The signal guard: which signals end a run, and which are left alone."""

from __future__ import annotations

import os
import signal

from iqtrain.console import SignalGuard


def test_sigint_sigterm_and_sighup_become_a_flag():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        before = signal.getsignal(sig)
        with SignalGuard(announce=False) as guard:
            os.kill(os.getpid(), sig)
            assert guard.signum == sig
        assert signal.getsignal(sig) == before  # restored on exit


def test_a_hangup_ignored_at_start_stays_ignored():
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup
    try:
        with SignalGuard(announce=False) as guard:
            os.kill(os.getpid(), signal.SIGHUP)
            assert guard.signum is None
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, old)

"""What the person at the terminal sees and does: progress lines, signals, interruption.

Torch-free, so the CLI can import :class:`Interrupted` without loading the model stack.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Interrupted", "Progress", "SignalGuard"]


class Interrupted(Exception):  # noqa: N818 - it is a control-flow signal, not an error
    """SIGINT/SIGTERM arrived; a checkpoint was saved. ``exit_code`` is 130 or 143."""

    def __init__(self, signum: int, attempt: Path, world_size: int = 1):
        self.signum = signum
        self.attempt = attempt
        self.world_size = world_size  # > 1: the resume runs under torchrun too
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}")


class SignalGuard:
    """Turn SIGINT/SIGTERM/SIGHUP into a flag the loop checks after each completed step
    (announced on stderr unless ``announce`` is false: ranks other than 0 stay quiet). SIGHUP
    is there because torchrun forwards it (a closed terminal or SSH session): it ends the run
    like SIGTERM, with a checkpoint, exit 129."""

    def __init__(self, announce: bool = True) -> None:
        self.signum: int | None = None
        self.announce = announce
        self._old: dict[int, Any] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) is signal.SIG_IGN and sig == signal.SIGHUP:
                    continue  # started under nohup: a hang-up must not end the run
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second signal: the user insists
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            print(
                f"\nsignal {signum}: finishing this step, then saving a checkpoint",
                file=sys.stderr,
            )

    def __exit__(self, *exc) -> None:
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

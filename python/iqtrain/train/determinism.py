"""``training.deterministic``: bit-exact CUDA training steps (docs/design.md "Device, precision,
compile").

A resumed CUDA attempt repeats its parent's steps bit for bit only if every kernel of a step
computes the same bits from the same inputs in every process. :func:`configure` asks torch for
that, process-wide, on CUDA:

- ``torch.use_deterministic_algorithms(True)``, strict (not ``warn_only``): an operation with
  no deterministic CUDA implementation raises instead of running, and those with one use it
  (flash and memory-efficient attention pick their deterministic backward only in strict mode;
  NCCL leaves out its NVLS reduction). Since torch 2.10 it also turns on Inductor's
  deterministic mode (``torch._inductor.config.deterministic``, set here too): compiled steps
  then choose reduction configs and matmul padding by heuristics instead of by timing them,
  so two processes (a straight run and its resume) compile the same kernels;
- ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:8`` (kept when it is ``:4096:8`` or ``:16:8``; any other
  value is a ``ConfigError``): cuBLAS's deterministic workspace, which strict mode requires
  of every CUDA matmul;
- cuDNN attention off (``enable_cudnn_sdp(False)``): its backward has no deterministic
  algorithm; cuDNN's own flags deterministic and not benchmarking;
- ``torch.utils.deterministic.fill_uninitialized_memory = False``: strict mode would otherwise
  fill every tensor from ``torch.empty`` with NaN, a kernel each, which the trainer never
  reads before writing.

**Call it first**: before anything of the process makes a CUDA matmul. torch reads
``CUBLAS_WORKSPACE_CONFIG`` once, when it creates the process's first cuBLAS handle (at the
first matmul), and sizes every later handle's workspace from that reading; its strict-mode
check reads the variable again at each matmul, so a late call raises nothing and would leave
the workspace the first matmul sized. The attempt calls it as the first thing of its preflight
(:func:`iqtrain.train.attempt._preflight`), before the seed, the model and the step touch the
device; the GPU stage's scripts call it before their first CUDA work. (Joining several ranks
sets the CUDA device and creates the NCCL communicator before that: neither calls cuBLAS.)

``configure(device, False)`` restores the settings the first ``configure(device, True)``
found (nothing else: off means torch's own behaviour, not a forced nondeterminism), so a
process may time the same step both ways. ``CUBLAS_WORKSPACE_CONFIG`` stays set: the first
matmul has read it already. On the CPU both are no-ops: the trainer's CPU kernels are
deterministic as they are (docs/design.md "Resume").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.deterministic

from iqtrain.config.sections import Device
from iqtrain.errors import ConfigError

__all__ = ["CUBLAS_DETERMINISTIC", "CUBLAS_WORKSPACE", "configure"]

#: What :func:`configure` sets ``CUBLAS_WORKSPACE_CONFIG`` to when it is not set: eight 4 MiB
#: buffers (torch's default size on Hopper anyway, so nothing gets slower for it).
CUBLAS_WORKSPACE = ":4096:8"
#: The values cuBLAS documents as deterministic, and torch's strict mode accepts.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
_CUBLAS_VAR = "CUBLAS_WORKSPACE_CONFIG"
#: ``torch.utils.deterministic``: its ``fill_uninitialized_memory`` is a property of the
#: module's class, which its type stubs do not show.
_UTILS: Any = torch.utils.deterministic


@dataclass(frozen=True)
class _Flags:
    """torch's process-wide switches that :func:`configure` sets."""

    algorithms: bool
    warn_only: bool
    inductor: bool
    fill_uninitialized: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    cudnn_sdp: bool

    @classmethod
    def read(cls) -> _Flags:
        import torch._inductor.config as inductor_config

        return cls(
            algorithms=torch.are_deterministic_algorithms_enabled(),
            warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            inductor=bool(inductor_config.deterministic),
            fill_uninitialized=_UTILS.fill_uninitialized_memory,
            cudnn_deterministic=torch.backends.cudnn.deterministic,
            cudnn_benchmark=torch.backends.cudnn.benchmark,
            cudnn_sdp=torch.backends.cuda.cudnn_sdp_enabled(),
        )

    def apply(self) -> None:
        import torch._inductor.config as inductor_config

        torch.use_deterministic_algorithms(self.algorithms, warn_only=self.warn_only)
        inductor_config.deterministic = self.inductor  # after: the call above sets it too
        _UTILS.fill_uninitialized_memory = self.fill_uninitialized
        torch.backends.cudnn.deterministic = self.cudnn_deterministic
        torch.backends.cudnn.benchmark = self.cudnn_benchmark
        torch.backends.cuda.enable_cudnn_sdp(self.cudnn_sdp)


_DETERMINISTIC = _Flags(
    algorithms=True,
    warn_only=False,
    inductor=True,
    fill_uninitialized=False,
    cudnn_deterministic=True,
    cudnn_benchmark=False,
    cudnn_sdp=False,
)
#: What the first ``configure(..., True)`` of the process found; None while it is off.
_before: _Flags | None = None


def configure(device: Device, deterministic: bool) -> None:
    """Make this process's CUDA steps bit-exact (``deterministic``) or give torch back its own
    settings; process-wide. Call it before the process's first CUDA matmul (module docstring).

    CPU: a no-op. ``ConfigError`` (naming ``training.deterministic``) when
    ``CUBLAS_WORKSPACE_CONFIG`` is set to a value cuBLAS does not make deterministic; nothing
    is changed then.
    """
    global _before
    if device != "cuda":
        return
    if not deterministic:
        if _before is not None:
            _before.apply()
            _before = None
        return
    value = os.environ.setdefault(_CUBLAS_VAR, CUBLAS_WORKSPACE)
    if value not in CUBLAS_DETERMINISTIC:
        raise ConfigError(
            f"training.deterministic: the environment sets {_CUBLAS_VAR}={value!r}, but "
            f"deterministic cuBLAS needs {' or '.join(map(repr, CUBLAS_DETERMINISTIC))}; "
            "unset it, or set training.deterministic = false"
        )
    if _before is None:
        _before = _Flags.read()
    _DETERMINISTIC.apply()

"""`.ci/dev gpu`: the venv's torch is a CUDA build that can use the GPU (one line otherwise)."""

from __future__ import annotations

import sys

import torch

if torch.version.cuda is None:
    sys.exit(
        f"iqtrain: error: gpu: torch {torch.__version__} in {sys.prefix} is a CPU-only"
        " build; install a CUDA build of torch there"
    )
if not torch.cuda.is_available():
    sys.exit(
        f"iqtrain: error: gpu: torch {torch.__version__} (CUDA {torch.version.cuda}) in"
        f" {sys.prefix} cannot use the GPU; is the driver too old for it?"
    )
print(
    f"   torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}",
    file=sys.stderr,
)

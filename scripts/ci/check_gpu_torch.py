"""`.ci/dev gpu`'s install stage, after the pack is installed: the versions, and one line where
this Python cannot run the GPU stages.

Checks that torch is a CUDA build that sees the GPU and is at least the version the installed
wheel requires (its ``Requires-Dist``: the pin of pyproject.toml), that ``iqtrain`` and its
extension import from the pack's target directory (``PYTHONPATH``), not from the checkout, and
records Python, torch, triton, numpy, CUDA, the driver, the device, its SM count and glibc as
one ``{"kind": "versions"}`` line in ``$IQTRAIN_GPU_SUMMARY`` (scripts/ci/gpu_summary.py).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib.metadata import requires, version
from pathlib import Path


def _first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    return (out.stdout.strip().splitlines() or ["unknown"])[0]


def _pin(dist: str, name: str) -> str | None:
    """The version specifier ``dist`` requires of ``name`` (``>=2.11``), if any."""
    from packaging.requirements import Requirement

    for line in requires(dist) or []:
        req = Requirement(line)
        if req.name == name and (req.marker is None or req.marker.evaluate()):
            return str(req.specifier) or None
    return None


def _check_torch(torch_version: str) -> None:
    import torch
    from packaging.specifiers import SpecifierSet

    if torch.version.cuda is None:
        sys.exit(
            f"iqtrain: error: gpu: torch {torch_version} in {sys.prefix} is a CPU-only"
            " build; run the stages with the Python that holds a CUDA build (IQTRAIN_GPU_PYTHON)"
        )
    if not torch.cuda.is_available():
        sys.exit(
            f"iqtrain: error: gpu: torch {torch_version} (CUDA {torch.version.cuda}) in"
            f" {sys.prefix} cannot use the GPU; is the driver too old for it?"
        )
    pin = _pin("iqtrain", "torch")
    base = torch_version.split("+")[0]
    if pin and not SpecifierSet(pin).contains(base, prereleases=True):
        sys.exit(f"iqtrain: error: gpu: torch {torch_version}, but iqtrain requires torch{pin}")


def _check_iqtrain() -> str:
    import iqtrain
    import iqtrain._native  # noqa: F401  (the abi3 extension loads on this Python)

    site = os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
    where = Path(iqtrain.__file__).resolve()
    if site and not where.is_relative_to(Path(site).resolve()):
        sys.exit(f"iqtrain: error: gpu: iqtrain imports from {where.parent}, not the pack's {site}")
    return str(where.parent)


def _nccl() -> str:
    import torch

    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError) as exc:
        return f"unknown ({exc})"
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


SMI_DRIVER = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]


def main() -> None:
    import numpy
    import torch
    import triton

    _check_torch(torch.__version__)
    where = _check_iqtrain()
    props = torch.cuda.get_device_properties(0)
    info = {
        "kind": "versions",
        "python": platform.python_version(),
        "executable": sys.executable,
        "torch": torch.__version__,
        "torch_pin": _pin("iqtrain", "torch"),
        "triton": triton.__version__,
        "numpy": numpy.__version__,
        "iqtrain": version("iqtrain"),
        "iqtrain_from": where,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": _nccl(),
        "driver": _first_line(SMI_DRIVER),
        "device": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "glibc": _first_line(["ldd", "--version"]),
        "cpus": os.cpu_count(),
    }
    summary = os.environ.get("IQTRAIN_GPU_SUMMARY")
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps(info) + "\n")
    print(
        f"   Python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}), triton "
        f"{info['triton']}, numpy {info['numpy']}; {info['device']}, {info['sm_count']} SMs, "
        f"driver {info['driver']}; {info['glibc']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

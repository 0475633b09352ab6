"""Checkpoints: the full mutable state of a run, written atomically and bound by hashes.

Layout of ``checkpoints/step_00000500/``::

    model.safetensors      model parameters and buffers (no compile prefix)
    optimizer.safetensors  every optimizer state tensor, as ``state.<param index>.<name>``
    state.json             schedule plan and position, loader cursor, loop counters, metric
                           cursor, optimizer hyperparameters, CPU/CUDA RNG states, config hash
    checkpoint.json        bytes and SHA-256 of each file above; written last

A checkpoint is written into a temporary sibling directory, every file fsynced, then renamed into
place and the parent directory fsynced: a crash leaves either the previous set of checkpoints or
the new one, never a half-written one under a real name. Non-finite model or optimizer tensors
are rejected before anything is written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from iqtrain.errors import CheckpointError, NonFiniteError

__all__ = [
    "CHECKPOINT_FILES",
    "checkpoint_name",
    "file_digest",
    "list_checkpoints",
    "load_checkpoint",
    "rng_state",
    "restore_rng_state",
    "save_checkpoint",
    "verify_checkpoint",
]

CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
_NAME = re.compile(r"^step_(\d{8})$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


def file_digest(path: Path) -> dict[str, Any]:
    """``{"bytes": n, "sha256": hex}`` of a file."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a fsynced temporary file and a rename."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


# ------------------------------------------------------------------------------- RNG state


def rng_state() -> dict[str, Any]:
    state = {"cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return state


def _bytes_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_bytes_tensor(state["cpu"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in state["cuda"]])


# ------------------------------------------------------------------------------- optimizer


def _split_optimizer(optim_sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Optimizer state dict -> (tensors for safetensors, JSON-able remainder)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, entry in optim_sd["state"].items():
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{key}"] = value
            else:
                scalars.setdefault(str(idx), {})[key] = value
    groups = []
    for group in optim_sd["param_groups"]:
        g = {}
        for key, value in group.items():
            if isinstance(value, torch.Tensor):
                # A tensor hyperparameter (the lr) stays a tensor on restore, with its dtype.
                g[key] = {"tensor": value.item(), "dtype": str(value.dtype).removeprefix("torch.")}
            elif isinstance(value, tuple):
                g[key] = {"tuple": list(value)}
            else:
                g[key] = value
        groups.append(g)
    return tensors, {"scalars": scalars, "param_groups": groups}


def _join_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = value
    for idx, entry in meta["scalars"].items():
        state.setdefault(int(idx), {}).update(entry)
    groups = []
    for g in meta["param_groups"]:
        group = {}
        for key, value in g.items():
            if isinstance(value, dict) and "tensor" in value:
                group[key] = torch.tensor(value["tensor"], dtype=getattr(torch, value["dtype"]))
            elif isinstance(value, dict) and "tuple" in value:
                group[key] = tuple(value["tuple"])
            else:
                group[key] = value
        groups.append(group)
    return {"state": state, "param_groups": groups}


# ------------------------------------------------------------------------------- save / load


def _check_finite(kind: str, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"checkpoint refused: {kind} tensor {name!r} is not finite")


def save_checkpoint(
    root: Path,
    step: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    state: dict[str, Any],
) -> Path:
    """Write checkpoint ``root/step_XXXXXXXX`` atomically; returns its path."""
    model_t = {k: v.detach().to("cpu").contiguous() for k, v in model_state.items()}
    optim_t, optim_meta = _split_optimizer(optimizer_state)
    optim_t = {k: v.detach().to("cpu").contiguous() for k, v in optim_t.items()}
    _check_finite("model", model_t)
    _check_finite("optimizer", optim_t)

    name = checkpoint_name(step)
    final = root / name
    if final.exists():
        raise CheckpointError(f"{final}: already exists; checkpoints are never overwritten")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_file(model_t, tmp / "model.safetensors")
        save_file(optim_t, tmp / "optimizer.safetensors")
        full_state = {**state, "optimizer": optim_meta}
        with open(tmp / "state.json", "w") as f:
            json.dump(full_state, f, indent=1, sort_keys=True, allow_nan=False)
            f.write("\n")
        files = {}
        for fname in CHECKPOINT_FILES:
            _fsync_file(tmp / fname)
            files[fname] = file_digest(tmp / fname)
        with open(tmp / "checkpoint.json", "w") as f:
            json.dump({"name": name, "step": step, "files": files}, f, indent=2, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        os.rename(tmp, final)
        fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def verify_checkpoint(path: Path) -> list[str]:
    """Re-hash every file ``checkpoint.json`` lists; returns the mismatches (empty = valid)."""
    index = path / "checkpoint.json"
    try:
        listing = json.loads(index.read_text())
        files = listing["files"]
    except FileNotFoundError:
        return [f"{index}: missing (checkpoint incomplete)"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{index}: unreadable: {exc}"]
    problems = []
    for fname in CHECKPOINT_FILES:
        if fname not in files:
            problems.append(f"{index}: does not list {fname}")
    for fname, want in files.items():
        p = path / fname
        if not p.is_file():
            problems.append(f"{p}: missing")
            continue
        got = file_digest(p)
        if got != want:
            problems.append(
                f"{p}: {got['bytes']} bytes sha256 {got['sha256'][:16]}… but checkpoint.json "
                f"records {want['bytes']} bytes sha256 {want['sha256'][:16]}…"
            )
    return problems


def load_checkpoint(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """Verify, then load ``(model_state, optimizer_state, state)`` from a checkpoint."""
    problems = verify_checkpoint(path)
    if problems:
        raise CheckpointError("; ".join(problems))
    try:
        model_state = load_file(path / "model.safetensors")
        optim_tensors = load_file(path / "optimizer.safetensors")
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: cannot load: {exc}") from None
    optim_meta = state.pop("optimizer")
    return model_state, _join_optimizer(optim_tensors, optim_meta), state


def list_checkpoints(root: Path) -> list[Path]:
    """Completed checkpoints (named ``step_NNNNNNNN``), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name)


def checkpoint_step(path: Path) -> int:
    m = _NAME.match(path.name)
    if not m:
        raise CheckpointError(f"{path}: not a checkpoint directory name")
    return int(m.group(1))

"""Checkpoints: the full mutable state of a run, written atomically and bound by hashes.

Layout of ``checkpoints/step_00000500/``::

    model.safetensors      model parameters and buffers (no compile prefix)
    optimizer.safetensors  every optimizer state tensor, as ``state.<param index>.<name>``
    state.json             schedule plan and position, loader cursor, loop counters, metric
                           cursor, optimizer hyperparameters, CPU/CUDA RNG states, config hash
    checkpoint.json        bytes and SHA-256 of each file above; written last

With ``training.parallel = "fsdp"`` the optimizer is not gathered: ``optimizer.safetensors`` is
replaced by ``dcp/``, the model and optimizer state as torch.distributed.checkpoint writes it
from every rank's shards (``.metadata`` plus one ``__<rank>_0.distcp`` per rank), which loads
and reshards at any world size. ``model.safetensors`` stays: the whole model, gathered, for
everything that reads a model. ``checkpoint.json`` then says ``"format": "dcp"`` and lists every
file of ``dcp/`` with its hash; a file there that it does not list fails verification.

A checkpoint is written into a temporary sibling directory, every file fsynced, then renamed into
place and the parent directory fsynced: a crash leaves either the previous set of checkpoints or
the new one, never a half-written one under a real name. Non-finite model or optimizer tensors
are rejected before anything is written. A write that fails (disk full, file too large, I/O
error) raises :class:`~iqtrain.errors.StorageError` naming the file, after removing the
temporary directory; the checkpoints already written are untouched.

Pruning is atomic too (:func:`remove_checkpoint`): a checkpoint leaves the listed namespace by a
rename to ``.pruned-step_XXXXXXXX-<pid>`` (parent fsynced) before it is deleted. Only complete
``step_XXXXXXXX`` directories are ever listed; what a crash can leave behind — ``.tmp-…``
checkpoint directories, ``.pruned-…`` directories, ``.NAME.tmp-<pid>`` JSON files — carries no
listed name and is found by :func:`crash_leftovers`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError

from iqtrain.checkpoint.optim_codec import join_optimizer_state, split_optimizer_state
from iqtrain.checkpoint.state import CheckpointState, recorded_step
from iqtrain.errors import CheckpointError, NonFiniteError, StorageError
from iqtrain.storage import (
    file_digest,
    fsync_dir,
    fsync_file,
    storage_error,
    write_file,
)

if TYPE_CHECKING:
    import torch

# torch (and safetensors.torch) are imported inside the functions that handle tensors: listing,
# verifying and pruning checkpoints — what ``verify`` and ``report`` need — import no torch.
__all__ = [
    "CHECKPOINT_FILES",
    "checkpoint_name",
    "checkpoint_step",
    "crash_leftovers",
    "list_checkpoints",
    "listed_sha256",
    "load_checkpoint",
    "remove_checkpoint",
    "save_checkpoint",
    "sharded_state_dir",
    "verify_checkpoint",
]

CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "state.json")
#: What a ``"format": "dcp"`` checkpoint must list (its shards are named by the writer).
SHARDED_FILES = ("model.safetensors", "state.json", "dcp/.metadata")
SHARDED_DIR = "dcp"
# The only names checkpoint.json may list: a forged listing cannot point outside the directory.
_LISTED = re.compile(r"^((model|optimizer)\.safetensors|state\.json|dcp/[\w.]+)$", re.ASCII)
_NAME = re.compile(r"^step_(\d{8})$")
# What a crash can leave in a checkpoints or attempt directory (never a listed name):
# a checkpoint being written, one being pruned, a JSON file being replaced.
_LEFTOVER = re.compile(r"^(\.tmp-step_\d{8}-\d+|\.pruned-step_\d{8}-\d+|\..+\.tmp-\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step_{step:08d}"


# ------------------------------------------------------------------------------- save / load


def _check_finite(kind: str, tensors: dict[str, torch.Tensor]) -> None:
    import torch

    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NonFiniteError(f"checkpoint refused: {kind} tensor {name!r} is not finite")


def save_checkpoint(
    root: Path,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    state: CheckpointState,
    *,
    sharded: Callable[[Path], None] | None = None,
) -> Path:
    """Write checkpoint ``root/step_XXXXXXXX`` (``state.step``) atomically; returns its path.

    ``sharded`` (with ``optimizer_state=None``) writes the ``dcp/`` directory it is given,
    together with the other ranks (a collective); the checkpoint then has format ``dcp``.

    Raises ``NonFiniteError`` (a non-finite tensor) before anything is written,
    ``CheckpointError`` if the checkpoint exists, and ``StorageError`` naming the file or
    directory whose write, fsync or rename failed (disk full, file too large, I/O error); the
    temporary directory is then removed and the existing checkpoints are untouched.
    """
    if (sharded is None) == (optimizer_state is None):
        raise ValueError("save_checkpoint: pass exactly one of optimizer_state and sharded")
    model_t = {k: v.detach().to("cpu").contiguous() for k, v in model_state.items()}
    _check_finite("model", model_t)
    optim_t: dict[str, torch.Tensor] = {}
    if optimizer_state is not None:
        optim_t, optim_meta = split_optimizer_state(optimizer_state)
        optim_t = {k: v.detach().to("cpu").contiguous() for k, v in optim_t.items()}
        _check_finite("optimizer", optim_t)
        state = dataclasses.replace(state, optimizer=optim_meta)
    state_bytes = state.encode()  # before anything is written: a bug, not a storage error

    name = checkpoint_name(state.step)
    final = root / name
    if final.exists():
        raise CheckpointError(f"{final}: already exists; checkpoints are never overwritten")
    tmp = root / f".tmp-{name}-{os.getpid()}"
    w = _Writing(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        if w.at(tmp).exists():  # left by a crashed process that had our pid
            shutil.rmtree(tmp)
        tmp.mkdir()
        files = _write_files(tmp, w, (model_t, optim_t), state_bytes, sharded)
        index: dict[str, Any] = {"name": name, "step": state.step, "files": files}
        if sharded is not None:
            index["format"] = SHARDED_DIR
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        write_file(w.at(tmp / "checkpoint.json"), text.encode())
        fsync_dir(w.at(tmp))
        os.rename(tmp, w.at(final))
        # From here the checkpoint is complete under its real name; only the rename's
        # durability is still at stake.
        fsync_dir(w.at(root))
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise storage_error(w.path, exc) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class _Writing:
    """The file or directory a save is writing: what its StorageError names."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def at(self, path: Path) -> Path:
        self.path = path
        return path


def _write_files(
    tmp: Path,
    w: _Writing,
    tensors: tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]],
    state_bytes: bytes,
    sharded: Callable[[Path], None] | None,
) -> dict[str, dict[str, Any]]:
    """Every file of a checkpoint into ``tmp`` (the shards: by every rank), fsynced; returns
    checkpoint.json's ``files`` (bytes and SHA-256 of each)."""
    from safetensors.torch import save_file

    model_t, optim_t = tensors
    save_file(model_t, w.at(tmp / "model.safetensors"))
    if sharded is None:
        save_file(optim_t, w.at(tmp / "optimizer.safetensors"))
        listed = list(CHECKPOINT_FILES)
    else:
        shards = w.at(tmp / SHARDED_DIR)
        sharded(shards)  # every rank writes its shards (fsynced by the writer)
        fsync_dir(shards)
        names = sorted(p.name for p in shards.iterdir())
        listed = ["model.safetensors", "state.json", *(f"{SHARDED_DIR}/{n}" for n in names)]
    write_file(w.at(tmp / "state.json"), state_bytes)
    files = {}
    for fname in listed:
        fsync_file(w.at(tmp / fname))
        files[fname] = file_digest(tmp / fname)
    return files


def remove_checkpoint(path: Path) -> None:
    """Delete checkpoint ``path`` atomically as far as any reader can tell.

    The directory is first renamed to ``.pruned-step_XXXXXXXX-<pid>`` in the same parent and the
    parent fsynced, so it leaves the listed namespace in one step; only then is it deleted. A
    crash at any point leaves either the complete checkpoint under its name or a ``.pruned-…``
    leftover (see :func:`crash_leftovers`), never a half-deleted ``step_XXXXXXXX``.

    Raises ``CheckpointError`` if ``path`` is not named like a checkpoint, ``StorageError``
    (naming ``path``) if the rename or the fsync fails. A failure while deleting the renamed
    directory is not raised: it only leaves a leftover, which verify reports as a note.
    """
    path = Path(path)
    checkpoint_step(path)
    doomed = path.parent / f".pruned-{path.name}-{os.getpid()}"
    try:
        if doomed.exists():  # left by a crashed process that had our pid
            shutil.rmtree(doomed)
        os.rename(path, doomed)
        fsync_dir(path.parent)
    except OSError as exc:
        raise StorageError(f"{path}: cannot prune: {exc.strerror or exc}") from exc
    shutil.rmtree(doomed, ignore_errors=True)


def crash_leftovers(root: Path) -> list[Path]:
    """What a crash left in ``root`` (a checkpoints or an attempt directory), sorted by name.

    Checkpoints being written (``.tmp-step_…``), being pruned (``.pruned-step_…``) and JSON files
    being replaced (``.NAME.tmp-<pid>``). None of them is ever listed or referenced; they are
    notes for verify, not failures. A missing or unreadable ``root`` has none.
    """
    try:
        found = [p for p in Path(root).iterdir() if _LEFTOVER.match(p.name)]
    except OSError:
        return []
    return sorted(found, key=lambda p: p.name)


def verify_checkpoint(path: Path) -> list[str]:
    """Everything wrong with checkpoint ``path`` (empty = valid); never raises.

    Re-hashes every file ``checkpoint.json`` lists and checks that the step agrees three ways:
    the directory name, ``checkpoint.json``'s ``step`` and ``state.json``'s ``step``.
    """
    path = Path(path)
    index = path / "checkpoint.json"
    try:
        listing = json.loads(index.read_text())
    except FileNotFoundError:
        return [f"{index}: missing (checkpoint incomplete)"]
    except (OSError, ValueError) as exc:
        return [f"{index}: unreadable: {exc}"]
    files = listing.get("files") if isinstance(listing, dict) else None
    if not isinstance(files, dict):
        return [f"{index}: unreadable: no 'files' table"]
    fmt = listing.get("format", "safetensors")
    if fmt not in ("safetensors", SHARDED_DIR):
        return [f"{index}: unknown format {fmt!r}"]
    problems = []
    for fname in CHECKPOINT_FILES if fmt == "safetensors" else SHARDED_FILES:
        if fname not in files:
            problems.append(f"{index}: does not list {fname}")
    problems.extend(_unlisted_shards(path, files))
    for fname, want in files.items():
        problem = _file_problem(path, index, str(fname), want)
        if problem is not None:
            problems.append(problem)
    problems.extend(_step_problems(path, listing))
    if fmt == SHARDED_DIR:
        problems.extend(_missing_shards(path, files))
    return problems


def _file_problem(path: Path, index: Path, fname: str, want: Any) -> str | None:
    """What is wrong with one file checkpoint.json lists (None: it is what it records)."""
    if not _LISTED.match(fname):
        return f"{index}: lists {fname!r}, which no checkpoint contains"
    p = path / fname
    if not p.is_file():
        return f"{p}: missing"
    try:
        got = file_digest(p)
    except OSError as exc:
        return f"{p}: unreadable: {exc.strerror or exc}"
    if got == want:
        return None
    if isinstance(want, dict):
        recorded = f"{want.get('bytes')} bytes sha256 {str(want.get('sha256'))[:16]}…"
    else:
        recorded = repr(want)
    found = f"{got['bytes']} bytes sha256 {got['sha256'][:16]}…"
    return f"{p}: {found} but checkpoint.json records {recorded}"


def _unlisted_shards(path: Path, files: dict[str, Any]) -> list[str]:
    """A file in ``dcp/`` that checkpoint.json does not list would be read by a load that
    nothing verified (an extra or substituted shard)."""
    shards = path / SHARDED_DIR
    if not shards.is_dir():
        return []
    try:
        names = sorted(p.name for p in shards.iterdir())
    except OSError as exc:
        return [f"{shards}: unreadable: {exc.strerror or exc}"]
    return [
        f"{shards / n}: not listed in {path / 'checkpoint.json'}"
        for n in names
        if f"{SHARDED_DIR}/{n}" not in files
    ]


def _missing_shards(path: Path, files: dict[str, Any]) -> list[str]:
    """Every rank writes one shard file, ``__<rank>_0.distcp``, and state.json records how many
    ranks there were (``rng.world_size``): a listing with fewer files could not load."""
    try:
        size = CheckpointState.read(path).world_size
    except CheckpointError as exc:
        return [f"{exc} (needed to check the shards in {SHARDED_DIR}/)"]
    names = (f"{SHARDED_DIR}/__{rank}_0.distcp" for rank in range(size))
    return [
        f"{path / n}: not listed ({size} ranks wrote one each)" for n in names if n not in files
    ]


def sharded_state_dir(path: Path) -> Path | None:
    """The ``dcp/`` directory of a verified checkpoint of format ``dcp``, else None."""
    try:
        listing = json.loads((Path(path) / "checkpoint.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path / 'checkpoint.json'}: unreadable: {exc}") from None
    return Path(path) / SHARDED_DIR if listing.get("format") == SHARDED_DIR else None


def _step_problems(path: Path, listing: dict[str, Any]) -> list[str]:
    """The step in the directory name, checkpoint.json and state.json must be one number."""
    m = _NAME.match(path.name)
    if not m:
        return [f"{path}: not a checkpoint directory name (step_NNNNNNNN)"]
    step = int(m.group(1))
    problems = []
    index = path / "checkpoint.json"
    recorded = listing.get("step")
    if type(recorded) is not int:
        problems.append(f"{index}: no integer 'step'")
    elif recorded != step:
        problems.append(f"{index}: records step {recorded}, but the directory is {path.name}")
    state_path = path / "state.json"
    if not state_path.is_file():
        return problems  # reported as missing above
    try:
        state_step = recorded_step(path)
    except CheckpointError as exc:
        return [*problems, str(exc)]
    if state_step != step:
        problems.append(
            f"{state_path}: records step {state_step}, but the directory is {path.name}"
        )
    return problems


def load_checkpoint(
    path: Path, *, optimizer: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None, CheckpointState]:
    """Verify, then load ``(model_state, optimizer_state, state)`` from a checkpoint.

    ``optimizer_state`` is None for a ``dcp`` checkpoint: its sharded state is loaded by the
    ranks together (:func:`sharded_state_dir`), into whatever layout they train with; and
    with ``optimizer=False`` (a model to use, or to start a new attempt from: every file is
    still verified, only the optimizer's tensors are not read).
    """
    from safetensors.torch import load_file

    problems = verify_checkpoint(path)
    if problems:
        raise CheckpointError("; ".join(problems))
    sharded = sharded_state_dir(path) is not None or not optimizer
    state = CheckpointState.read(path)
    try:
        model_state = load_file(path / "model.safetensors")
        optim_tensors = {} if sharded else load_file(path / "optimizer.safetensors")
    except (OSError, ValueError, SafetensorError) as exc:
        raise CheckpointError(f"{path}: cannot load: {exc}") from None
    if sharded:  # the optimizer is loaded with the ranks' shards, or not at all
        return model_state, None, state
    if state.optimizer is None:
        raise CheckpointError(f"{path / 'state.json'}: no 'optimizer' table")
    try:
        optimizer_state = join_optimizer_state(optim_tensors, state.optimizer)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(
            f"{path / 'state.json'}: optimizer: malformed ({type(exc).__name__}: {exc})"
        ) from None
    return model_state, optimizer_state, state


def listed_sha256(path: Path, fname: str = "model.safetensors") -> str:
    """The SHA-256 ``checkpoint.json`` of checkpoint ``path`` records for ``fname`` (read it
    after the checkpoint verified: then it is the file's). CheckpointError when it lists none."""
    index = path / "checkpoint.json"
    try:
        entry = json.loads(index.read_text())["files"][fname]
        digest = entry["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: no sha256 for {fname} ({exc})") from None
    if not isinstance(digest, str):
        raise CheckpointError(f"{index}: the sha256 of {fname} is {digest!r}, not a string")
    return digest


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoints named ``step_NNNNNNNN``, oldest first.

    A checkpoint gets that name only by the final rename of :func:`save_checkpoint` and loses it
    first thing in :func:`remove_checkpoint`, so these are the complete ones; temporaries and
    half-pruned directories (:func:`crash_leftovers`) are never listed.
    """
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: p.name)


def checkpoint_step(path: Path) -> int:
    m = _NAME.match(path.name)
    if not m:
        raise CheckpointError(f"{path}: not a checkpoint directory name")
    return int(m.group(1))

"""Lineage: attempt directories, parents, what a resume may change, and the manifest.

An attempt is claimed atomically (:func:`claim_attempt`), locked for its life, and ends with a
record of how it ended (:func:`finish_attempt`) and, on success, a manifest
(:func:`publish_manifest`). A resume names a parent (:class:`ParentRef`); :func:`load_parent`
verifies it completely before anything is written (see :mod:`iqtrain.evidence`), and
:func:`config_changes` refuses any change a resume may not make. Imports no torch at module
level (loading a checkpoint's tensors does).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from iqtrain.checkpoint import (
    checkpoint_name,
    checkpoint_step,
    file_digest,
    list_checkpoints,
    load_checkpoint,
    sharded_state_dir,
)
from iqtrain.config import Config, build_config, config_to_dict
from iqtrain.errors import CheckpointError, ConfigError, CursorMismatchError, StorageError
from iqtrain.evidence import AttemptLock, attempt_status, check_attempt, checkpoint_problems
from iqtrain.storage import fsync_dir, write_bytes_atomic, write_json_atomic

__all__ = [
    "RESUMABLE_KEYS",
    "STATE_VERSION",
    "Parent",
    "ParentRef",
    "check_digests",
    "claim_attempt",
    "config_changes",
    "finish_attempt",
    "load_parent",
    "publish_manifest",
    "utc_now",
]

# 2: checkpoints record the full-content digests of every recording ("data").
# 3: "rng" holds every rank's generators ({"world_size": W, "ranks": [...]}); a version 2
# checkpoint (one process's generators) is read as a world of one.
STATE_VERSION = 3
READABLE_STATE_VERSIONS = (2, 3)
_STATE_KEYS = ("step", "plan", "cursor", "fingerprints", "data", "loop", "metrics", "rng")
# Keys a resume may change. Anything else would make the child a different experiment than its
# parent's evidence describes; max_steps is the recorded plan change of DESIGN.md section 5.
RESUMABLE_KEYS = frozenset(
    {
        "training.max_steps",
        "training.compile",
        "training.log_every",
        "training.peak_tflops",
        "training.dist_timeout_s",
        "training.parallel",  # how ranks hold the same state; a checkpoint loads into either
        "training.early_stop_patience",
        "training.early_stop_min_delta",
        "probe.every",  # the probe reads the model and nothing else
        "probe.data",
        "probe.folds",
        "training.keep_last",
        "training.checkpoint_every",
        "training.eval_every",
        "data.prefetch",
    }
)


@dataclass(frozen=True)
class ParentRef:
    """The attempt to resume and which checkpoint: ``latest``, ``best`` or ``step_N``."""

    attempt: Path
    checkpoint: str = "latest"


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def claim_attempt(run_dir: Path, config_text: str, info: dict) -> tuple[Path, AttemptLock]:
    """Create the next attempt directory, complete with config.toml and attempt.json.

    Failing before the rename is a ConfigError on ``run.dir`` (no attempt exists: exit 2).
    The directory is filled under a temporary name, locked, and renamed to its number: the
    rename claims the number atomically (it fails if the number is taken, since a claimed
    attempt is never empty), so a crash at any point leaves either no attempt or one that
    has its config and its record. The lock travels with the directory.
    """
    attempts = run_dir / "attempts"
    tmp = attempts / f".tmp-{os.getpid()}-{time.monotonic_ns()}"
    try:
        attempts.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:  # nothing exists yet: a bad run.dir (exit 2)
        raise ConfigError(f"run.dir: cannot create {attempts}: {exc.strerror or exc}") from None
    lock = AttemptLock(tmp)
    try:
        try:
            lock.acquire()
        except OSError as exc:
            raise StorageError(f"{tmp / 'attempt.lock'}: cannot write: {exc.strerror}") from None
        write_bytes_atomic(tmp / "config.toml", config_text.encode())
        while True:
            taken = [int(p.name) for p in attempts.iterdir() if p.name.isdigit()]
            path = attempts / f"{max(taken, default=0) + 1:04d}"
            info["id"] = path.name
            write_json_atomic(tmp / "attempt.json", info)
            try:
                os.rename(tmp, path)
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    continue  # another run claimed this number between listing and rename
                raise StorageError(f"{path}: cannot create: {exc.strerror or exc}") from None
            fsync_dir(attempts)
            return path, lock
    except StorageError as exc:  # the attempt was never claimed: still before it exists
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        raise ConfigError(f"run.dir: {exc}") from None
    except BaseException:
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read_json(path: Path) -> dict:
    """A JSON object from ``path``; anything else is one CheckpointError line naming it."""
    try:
        obj = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable: {exc}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return obj


def _checked(ckpt: Path, skipped: list[dict] | None = None) -> Path | None:
    """``ckpt`` if it verifies; else None, with the reason appended to ``skipped``."""
    problems = checkpoint_problems(ckpt)
    if not problems:
        return ckpt
    if skipped is None:
        raise CheckpointError(f"{ckpt.name}: " + problems[0])
    skipped.append({"checkpoint": ckpt.name, "reason": problems[0]})
    return None


def _resolve_checkpoint(
    parent: Path, which: str, manifest: dict | None, skipped: list[dict]
) -> Path:
    """The checkpoint ``which`` names, verified; skipped ones (crashed parent) are recorded."""
    ckpts = parent / "checkpoints"
    if which == "latest":
        if manifest is not None:  # verified: latest is the newest, by hash and step
            return (parent / manifest["latest"]["path"]).resolve()
        # No manifest (crashed, failed or interrupted): the newest checkpoint that verifies.
        for path in reversed(list_checkpoints(ckpts)):
            if _checked(path, skipped) is not None:
                return path
        raise CheckpointError(f"{parent}: no verified checkpoint to resume from")
    if which == "best":
        if manifest is not None:
            if manifest["best"] is None:
                raise CheckpointError(
                    f"{parent}: no validation has run, so there is no best checkpoint"
                )
            return (parent / manifest["best"]["path"]).resolve()
        latest = _resolve_checkpoint(parent, "latest", None, skipped)
        try:
            best = _read_json(latest / "state.json")["loop"]["best_checkpoint"]
        except (KeyError, TypeError):
            raise CheckpointError(f"{latest / 'state.json'}: no loop.best_checkpoint") from None
        if best is None:
            raise CheckpointError(
                f"{parent}: no validation has run, so there is no best checkpoint"
            )
        # Stored relative to the run directory: the best may live in an ancestor attempt.
        path = parent.resolve().parent.parent / best
        if not path.is_dir():
            raise CheckpointError(f"{path}: the best checkpoint is missing")
        return _checked(path)
    if which.startswith("step_") and which[5:].isdigit():
        path = ckpts / checkpoint_name(int(which[5:]))
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such checkpoint")
        return _checked(path) if manifest is None else path
    raise ConfigError(f"--from: expected latest, best or step_N, got {which!r}")


@dataclass
class Parent:
    attempt: Path
    checkpoint: Path
    model_state: dict
    optimizer_state: dict | None  # None when the checkpoint is sharded (``sharded``)
    state: dict
    config_tables: dict
    skipped: list[dict]
    sharded: Path | None = None  # the dcp/ directory of a training.parallel = "fsdp" checkpoint


_STATE_SHAPE = {
    "step": int,
    "plan": dict,
    "cursor": dict,
    "fingerprints": dict,
    "data": dict,
    "loop": dict,
    "metrics": dict,
    "rng": dict,
}


def _check_state_shape(state: dict, path: Path) -> None:
    """Every key a restore reads, with the right JSON type: one CheckpointError line naming
    ``path`` and the key, never a traceback from deep inside the restore."""
    missing = sorted(k for k in _STATE_KEYS if k not in state)
    if missing:
        raise CheckpointError(f"{path}: missing keys {missing}")
    for key, kind in _STATE_SHAPE.items():
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise CheckpointError(f"{path}: {key} is {state[key]!r}, not a {kind.__name__}")
    for key in ("fingerprints", "data"):
        for part in ("train", "val"):
            want = str if key == "fingerprints" else dict
            if not isinstance(state[key].get(part), want):
                raise CheckpointError(f"{path}: {key}.{part} is missing or malformed")


def load_parent(ref: ParentRef) -> Parent:
    """Verify the parent completely; CheckpointError names the first thing that fails.

    With a manifest, every field of it is checked against the files (``check_attempt``) and
    any problem refuses the resume. Without one (the parent crashed, failed or was
    interrupted), the newest checkpoint that verifies is used, and each newer one skipped is
    reported with its reason.
    """
    import tomllib

    attempt = Path(ref.attempt)
    if not (attempt / "attempt.json").is_file() or not (attempt / "config.toml").is_file():
        raise CheckpointError(f"{attempt}: not an attempt directory (no attempt.json/config.toml)")
    manifest = None
    skipped: list[dict] = []
    status = attempt_status(attempt, _read_json(attempt / "attempt.json"))
    if status == "running":
        raise CheckpointError(f"{attempt}: still running (its lock is held); stop it first")
    if (attempt / "manifest.json").is_file() or status == "completed":
        problems = check_attempt(attempt).problems
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(f"parent failed verification: {problems[0]}{more}")
        manifest = _read_json(attempt / "manifest.json")
    ckpt = _resolve_checkpoint(attempt, ref.checkpoint, manifest, skipped)
    model_state, optimizer_state, state = load_checkpoint(ckpt)  # verifies hashes
    version = state.get("version")
    if isinstance(version, bool) or version not in READABLE_STATE_VERSIONS:
        raise CheckpointError(
            f"{ckpt / 'state.json'}: state version {version!r}; this iqtrain reads versions "
            f"{', '.join(map(str, READABLE_STATE_VERSIONS))}"
        )
    _check_state_shape(state, ckpt / "state.json")
    owner = ckpt.parent.parent  # the attempt that wrote this checkpoint
    try:
        config_tables = tomllib.loads((owner / "config.toml").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{owner / 'config.toml'}: unreadable: {exc}") from None
    return Parent(
        attempt=owner,
        checkpoint=ckpt,
        model_state=model_state,
        optimizer_state=optimizer_state,
        state=state,
        config_tables=config_tables,
        skipped=skipped,
        sharded=sharded_state_dir(ckpt),
    )


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(parent_tables: dict, config: Config) -> dict[str, tuple[Any, Any]]:
    # The parent's config as this version resolves it: a key added since (training.parallel)
    # has its default there, which is what the parent ran with.
    try:
        old = _flatten(config_to_dict(build_config(parent_tables)))
    except ConfigError as exc:
        raise CheckpointError(f"the parent's config.toml: {exc}") from None
    new = _flatten(config_to_dict(config))
    changes = {
        k: (old.get(k), new.get(k)) for k in old.keys() | new.keys() if old.get(k) != new.get(k)
    }
    # run.dir may be spelled differently (relative to another cwd): the child always goes
    # into the parent's run directory, whatever the config says.
    changes.pop("run.dir", None)
    illegal = sorted(k for k in changes if k not in RESUMABLE_KEYS)
    if illegal:
        raise ConfigError(
            f"{illegal[0]}: cannot change on resume ({changes[illegal[0]][0]!r} -> "
            f"{changes[illegal[0]][1]!r}); only {', '.join(sorted(RESUMABLE_KEYS))} may change"
        )
    return changes


def finish_attempt(attempt: Path, info: dict, status: str, step: int) -> None:
    """Record how the attempt ended. A failure here never hides the error that ended it."""
    in_flight = sys.exc_info()[1]
    info.update(status=status, finished=utc_now(), final_step=step)
    try:
        write_json_atomic(attempt / "attempt.json", info)
    except (OSError, StorageError) as exc:
        if in_flight is None:
            raise
        print(f"iqtrain: note: could not record the attempt's end: {exc}", file=sys.stderr)


def _ref(attempt: Path, path: Path, **extra: Any) -> dict[str, Any]:
    index = file_digest(path / "checkpoint.json")
    return {"path": os.path.relpath(path, attempt), "step": checkpoint_step(path), **index, **extra}


def publish_manifest(
    attempt: Path,
    *,
    config_sha: str,
    records: int,
    inherited: dict | None,
    checkpoints: list[Path],
    best: Path | None,
    best_val_loss: float | None,
    parent: dict | None,
    stopped_early: dict | None = None,
) -> None:
    """Freeze the evidence and bind it: config, metric stream, every checkpoint, latest, best,
    and why the attempt ended before its max_steps when early stopping ended it."""
    metrics_path = attempt / "metrics.jsonl"
    config_path = attempt / "config.toml"
    for p in (metrics_path, config_path):
        p.chmod(0o444)  # frozen: the evidence is read-only from here on
    cfg = file_digest(config_path)
    if cfg["sha256"] != config_sha:
        raise CheckpointError(f"{config_path}: changed during the attempt")
    manifest = {
        "version": 1,
        "attempt": attempt.name,
        "parent": parent,
        "config": {"path": "config.toml", **cfg},
        "metrics": {"path": "metrics.jsonl", "records": records, **file_digest(metrics_path)},
        "inherited_metrics": inherited,
        "latest": _ref(attempt, checkpoints[-1]),
        "best": None if best is None else _ref(attempt, best, val_loss=best_val_loss),
        "checkpoints": [_ref(attempt, p) for p in checkpoints],
        "stopped_early": stopped_early,
        "published": utc_now(),
    }
    write_json_atomic(attempt / "manifest.json", manifest)


def check_digests(parent: Parent, digests: dict[str, dict[str, str]]) -> None:
    """Refuse (exit 2) any change to any byte a window can read, naming the recording."""
    recorded = parent.state["data"]
    for key in [k for k in ("train", "val", "train_meta", "val_meta") if k in recorded]:
        old, new = recorded.get(key), digests[key]
        if not isinstance(old, dict):
            raise CheckpointError(
                f"{parent.checkpoint / 'state.json'}: data.{key}: no recorded digests"
            )
        key = key.removesuffix("_meta")
        for path in sorted(old.keys() | new.keys()):
            if path not in new:
                raise CursorMismatchError(
                    f"data.{key}: {path} was in the parent's dataset and is missing now"
                )
            if path not in old:
                raise CursorMismatchError(f"data.{key}: {path} is new since the parent")
            if old[path] != new[path]:
                raise CursorMismatchError(
                    f"data.{key}: {path} changed since the parent was written (content digest "
                    f"{new[path][:16]}… differs from the recorded {old[path][:16]}…)"
                )

"""One pretraining attempt: check everything, claim the attempt, train, publish the evidence.

``run_pretraining_attempt(config, parent=None)`` is the whole application. Everything a user
can get wrong (config, data, a tampered or mismatched parent, a missing GPU) is checked before
the attempt directory exists (:func:`_preflight`), so a bad input leaves nothing behind and is
exit 2. After the directory exists every failure is a training failure (exit 1): the loop
(:class:`~iqtrain.trainer.Trainer`) runs inside a guarded region that records how the attempt
ended, and the manifest is published inside it, so the status is "completed" only once the
manifest exists.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint import CheckpointManager, file_digest
from iqtrain.config import Config, config_to_dict, dumps_toml, expand_path
from iqtrain.console import Interrupted
from iqtrain.data import IQDataset, TrainStream
from iqtrain.errors import (
    CheckpointError,
    ConfigError,
    CursorMismatchError,
    IQTrainError,
    NonFiniteError,
    TrainingError,
    WindowTooLongError,
)
from iqtrain.evidence import verify_attempt
from iqtrain.lineage import (
    Parent,
    ParentRef,
    check_digests,
    claim_attempt,
    config_changes,
    finish_attempt,
    load_parent,
    publish_manifest,
    utc_now,
)
from iqtrain.metrics import MetricCursor, MetricWriter
from iqtrain.model import NextPatchModel
from iqtrain.schedule import Plan
from iqtrain.step import TrainStep
from iqtrain.trainer import (
    DataIdentity,
    LoopState,
    RNGState,
    Trainer,
    compute_digests,
    restore,
    spike_update,
    state_components,
)

__all__ = [
    "AttemptResult",
    "Interrupted",
    "ParentRef",
    "open_datasets",
    "run_pretraining_attempt",
    "spike_update",
    "verify_attempt",
]


@dataclass(frozen=True)
class AttemptResult:
    attempt: Path
    final_step: int
    final_val_loss: float | None
    best_val_loss: float | None
    best_checkpoint: str | None


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__}
    for pkg in ("iqtrain", "triton", "safetensors", "sigmf"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def _device_description(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} CPUs)"


def ensure_synthetic(config: Config) -> tuple[list[str], list[str]]:
    """Generate (once) the synthetic train/val recordings; return their glob patterns.

    The cache is keyed by the generator's arguments and written through a temporary directory
    and a rename, so concurrent first runs cannot see a half-written set. It lives outside any
    attempt because it is shared, immutable, content-addressed input, not evidence.
    """
    from iqtrain.synth import synthesize

    s = config.data.synthetic
    key = json.dumps(
        {
            "v": 1,
            "train": s.train_recordings,
            "val": s.val_recordings,
            "samples": s.samples,
            "datatype": s.datatype,
            "seed": s.seed,
        },
        sort_keys=True,
    )
    root = Path(expand_path(s.cache_dir)) / _sha256_bytes(key.encode())[:16]
    if not (root / "COMPLETE").is_file():
        root.parent.mkdir(parents=True, exist_ok=True)
        tmp = root.parent / f".tmp-{root.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        synthesize(
            tmp / "train",
            recordings=s.train_recordings,
            samples=s.samples,
            datatype=s.datatype,
            seed=s.seed,
        )
        # A distinct seed: validation recordings must not repeat training ones.
        synthesize(
            tmp / "val",
            recordings=s.val_recordings,
            samples=s.samples,
            datatype=s.datatype,
            seed=s.seed + 1_000_003,
        )
        (tmp / "COMPLETE").write_text(key + "\n")
        try:
            os.rename(tmp, root)
        except OSError:  # someone else finished first: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return [os.fspath(root / "train" / "*.sigmf-meta")], [os.fspath(root / "val" / "*.sigmf-meta")]


def open_datasets(config: Config) -> tuple[IQDataset, IQDataset]:
    """The train and validation datasets of ``config`` (synthetic when data.train is empty).

    The config's paths are absolute already (resolved when it was built).
    """
    d = config.data
    if d.is_synthetic and d.window > d.synthetic.samples:  # refuse before generating anything
        raise ConfigError(
            f"data.seq_patches: a window of {d.window} samples (seq_patches x patch_len) is "
            f"longer than every synthetic recording ({d.synthetic.samples} samples)"
        )
    train, val = ensure_synthetic(config) if d.is_synthetic else (d.train, d.val)
    out = []
    for key, paths in (("data.train", train), ("data.val", val)):
        try:
            ds = IQDataset(paths, window=d.window, stride=d.stride)
        except WindowTooLongError:
            raise ConfigError(
                f"data.seq_patches: a window of {d.window} samples "
                f"(seq_patches x patch_len) is longer than every recording in {key}"
            ) from None
        out.append(ds)
    return out[0], out[1]


def _report_skipped(key: str, ds: IQDataset, window: int) -> None:
    skipped = ds.skipped
    if skipped:
        names = [os.path.basename(p) for p, _ in skipped]
        shown = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        print(
            f"iqtrain: note: {key}: {len(names)} recording(s) yield no window of {window} "
            f"samples (too short, or every capture segment is), skipped: {shown}",
            file=sys.stderr,
        )


@dataclass
class _Ready:
    """Everything built and checked before the attempt exists."""

    parent: Parent | None
    changes: dict[str, tuple[Any, Any]]
    plan: Plan
    start_step: int
    stepper: TrainStep
    stream: TrainStream
    val: IQDataset
    identity: DataIdentity
    loop: LoopState


def _plan(config: Config, parent: Parent | None) -> tuple[Plan, int]:
    """The schedule plan and first step: a parent's plan, extended only as DESIGN.md allows."""
    t, o = config.training, config.optimizer
    if parent is None:
        return Plan.from_config(config.schedule, t.max_steps, o.lr, o.min_lr), 0
    start = parent.state["step"]
    try:
        plan = Plan.from_dict(parent.state["plan"])
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"{parent.checkpoint / 'state.json'}: plan: not a valid plan ({exc})"
        ) from None
    if t.max_steps != plan.max_steps:
        plan = plan.extend(t.max_steps, start)  # ConfigError past the decay start
    if start >= plan.max_steps:
        raise ConfigError(
            f"training.max_steps: the parent checkpoint is at step {start}, "
            f"already at max_steps {plan.max_steps}; raise it to continue"
        )
    return plan, start


def _check_run_dir(run_dir: Path | None) -> None:
    """run.dir can be created and written (checked before any data is generated)."""
    if run_dir is None:
        return
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"run.dir: {run_dir} cannot be created or written ({probe})")


def _check_parent_data(parent: Parent, train: IQDataset, val: IQDataset) -> dict:
    """Every byte first (naming the recording that changed), then metadata and lengths."""
    digests = compute_digests(train, val)  # reads everything, before the child exists
    check_digests(parent, digests)
    for key, ds in (("train", train), ("val", val)):
        if parent.state["fingerprints"][key] != ds.fingerprint:  # shape checked on load
            raise CursorMismatchError(
                f"data.{key}: the dataset's fingerprint {ds.fingerprint[:16]}… differs from "
                f"the parent's {parent.state['fingerprints'][key][:16]}… (data changed)"
            )
    return digests


def _preflight(config: Config, ref: ParentRef | None) -> _Ready:
    """Every check a user's input can fail, in an order that writes nothing on refusal."""
    parent = load_parent(ref) if ref is not None else None
    changes = config_changes(parent.config_tables, config) if parent is not None else {}
    config.check_world_size(1)
    t = config.training
    torch.manual_seed(config.run.seed)
    stepper = TrainStep(
        NextPatchModel(config.model),
        config.optimizer,
        device=t.device,
        precision=t.precision,
        compile=t.compile,
    )
    _check_run_dir(Path(expand_path(config.run.dir)) if ref is None else None)
    # Data last: the synthetic default is generated only once every other check has passed.
    train, val = open_datasets(config)
    digests = _check_parent_data(parent, train, val) if parent is not None else None
    plan, start_step = _plan(config, parent)
    for key, ds in (("data.train", train), ("data.val", val)):
        _report_skipped(key, ds, config.data.window)
    stream = TrainStream(
        train,
        batch_size=config.data.batch_size,
        seed=config.run.seed,
        prefetch=config.data.prefetch,
    )
    loop = LoopState()
    if parent is not None:  # before the child exists: a checkpoint that cannot load is exit 2
        restore(parent, stepper, state_components(stream, loop, RNGState()))
        loop.step = start_step
    for line in parent.skipped if parent is not None else []:
        print(
            f"iqtrain: note: skipped checkpoint {line['checkpoint']} of {ref.attempt}: "
            f"{line['reason']}",
            file=sys.stderr,
        )
    identity = DataIdentity(train, val, digests)
    return _Ready(parent, changes, plan, start_step, stepper, stream, val, identity, loop)


def _attempt_info(config: Config, run_dir: Path, ready: _Ready) -> dict[str, Any]:
    t = config.training
    info: dict[str, Any] = {
        "id": None,  # the attempt's number, set when it is claimed
        "run_dir": os.fspath(run_dir.resolve()),
        "parent": None,
        "versions": _versions(),
        "device": {
            "kind": t.device,
            "name": _device_description(t.device),
            "precision": t.precision,
            "compile": t.compile,
        },
        "started": utc_now(),
        "status": "running",
        "plan": ready.plan.to_dict(),
        "argv": sys.argv,
        "pid": os.getpid(),
    }
    p = ready.parent
    if p is not None:
        info["parent"] = {
            "attempt": os.fspath(p.attempt.resolve()),
            "checkpoint": p.checkpoint.name,
            "checkpoint_json_sha256": file_digest(p.checkpoint / "checkpoint.json")["sha256"],
            "step": ready.start_step,
            "skipped_checkpoints": p.skipped,
        }
        info["config_changes"] = {
            k: {"from": a, "to": b} for k, (a, b) in sorted(ready.changes.items())
        }
    return info


def run_pretraining_attempt(config: Config, parent: ParentRef | None = None) -> AttemptResult:
    """Run (or resume) one attempt of ``config``; creates exactly one attempt directory."""
    ready = _preflight(config, parent)
    run_dir = Path(expand_path(config.run.dir))
    if parent is not None:  # the child joins its parent, and its config.toml says so
        run_dir = Path(parent.attempt).resolve().parent.parent
        config = dataclasses.replace(
            config, run=dataclasses.replace(config.run, dir=os.fspath(run_dir))
        )
    config_text = dumps_toml(config_to_dict(config))
    info = _attempt_info(config, run_dir, ready)
    # The lock is held until the end: a "running" attempt whose lock is free has crashed.
    attempt, lock = claim_attempt(run_dir, config_text, info)
    status, trainer, metrics = "failed", None, None
    try:
        metrics = MetricWriter(
            attempt / "metrics.jsonl",
            inherit_from=None if ready.parent is None else ready.parent.attempt / "metrics.jsonl",
            cursor=None
            if ready.parent is None
            else MetricCursor.from_dict(ready.parent.state["metrics"]),
        )
        inherited = None if ready.parent is None else metrics.cursor().to_dict()
        t = config.training
        trainer = Trainer(
            config,
            attempt,
            stepper=ready.stepper,
            stream=ready.stream,
            val=ready.val,
            plan=ready.plan,
            metrics=metrics,
            checkpoints=CheckpointManager(
                attempt / "checkpoints", run_dir, every=t.checkpoint_every, keep_last=t.keep_last
            ),
            identity=ready.identity,
            config_sha=_sha256_bytes(config_text.encode()),
            loop=ready.loop,
        )
        ready.parent = None  # the parent's tensors are in the model and optimizer now
        trainer.train()
        metrics.close()
        loop = trainer.loop
        publish_manifest(
            attempt,
            config_sha=trainer.config_sha,
            records=metrics.records,
            inherited=inherited,
            checkpoints=trainer.checkpoints.saved,
            best=None if loop.best_checkpoint is None else run_dir / loop.best_checkpoint,
            best_val_loss=loop.best_val_loss,
            parent=info["parent"],
        )
        status = "completed"  # only once the manifest exists
    except Interrupted:
        status = "interrupted"
        raise
    except IQTrainError as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, TrainingError | NonFiniteError):
            raise
        # The attempt exists: any failure now is a failure of the run (exit 1), not bad input.
        raise TrainingError(f"{attempt}: {exc}") from exc
    except BaseException as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if metrics is not None:
            _close_quietly(metrics)
        finish_attempt(attempt, info, status, 0 if trainer is None else trainer.loop.step)
        lock.release()
    return AttemptResult(
        attempt=attempt,
        final_step=trainer.loop.step,
        final_val_loss=None if trainer.last_val is None else trainer.last_val["loss"],
        best_val_loss=trainer.loop.best_val_loss,
        best_checkpoint=trainer.loop.best_checkpoint,
    )


def _close_quietly(metrics: MetricWriter) -> None:
    """Close the metric stream; while another error propagates, a failure here is a note."""
    if sys.exc_info()[1] is None:
        metrics.close()
        return
    try:
        metrics.close()
    except IQTrainError as exc:
        print(f"iqtrain: note: {exc}", file=sys.stderr)

"""One pretraining attempt: the loop, validation, checkpoints, evidence and exact resume.

``run_pretraining_attempt(config, parent=None)`` is the whole application. Everything a user
can get wrong (config, data, a tampered or mismatched parent, a missing GPU) is checked before
the attempt directory exists, so a bad input leaves nothing behind. Then, for each global step:

1. read the next deterministic training batch (A microbatches of ``data.batch_size`` windows);
2. move it to ``training.device``;
3. normalise and patch it with ``prepare_iq_input``;
4. run the optimizer step (``TrainStep``) at the scheduled learning rate;
5. write the train record; run full validation when due and write the val record;
6. save a checkpoint at ``checkpoint_every`` boundaries, on a validation improvement (``best``)
   and at the final step.

The manifest is published last, and only on success.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import platform
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint import (
    checkpoint_name,
    checkpoint_step,
    file_digest,
    fsync_dir,
    list_checkpoints,
    load_checkpoint,
    remove_checkpoint,
    restore_rng_state,
    rng_state,
    save_checkpoint,
    write_json_atomic,
)
from iqtrain.config import Config, config_to_dict, dumps_toml, expand_path
from iqtrain.data import IQDataset, TrainStream
from iqtrain.errors import (
    CheckpointError,
    ConfigError,
    CursorMismatchError,
    DataError,
    NonFiniteError,
    StorageError,
    TrainingError,
    WindowTooLongError,
)
from iqtrain.lineage import (
    AttemptLock,
    attempt_status,
    check_attempt,
    checkpoint_problems,
    verify_attempt,
)
from iqtrain.metrics import MetricCursor, MetricWriter
from iqtrain.model import NextPatchModel
from iqtrain.prepare import prepare_iq_input
from iqtrain.schedule import Plan, lr_at
from iqtrain.step import TrainStep, format_ids

__all__ = [
    "AttemptResult",
    "Interrupted",
    "ParentRef",
    "open_datasets",
    "run_pretraining_attempt",
    "spike_update",
    "verify_attempt",
]

# 2: checkpoints record the full-content digests of every recording ("data").
STATE_VERSION = 2
_STATE_KEYS = ("step", "plan", "cursor", "fingerprints", "data", "loop", "metrics", "rng")
# Keys a resume may change. Anything else would make the child a different experiment than its
# parent's evidence describes; max_steps is the recorded plan change of DESIGN.md section 5.
RESUMABLE_KEYS = frozenset(
    {
        "training.max_steps",
        "training.compile",
        "training.log_every",
        "training.keep_last",
        "training.checkpoint_every",
        "training.eval_every",
        "data.prefetch",
    }
)
SPIKE_FACTOR = 3.0  # a train loss above 3x its running average is flagged as a spike
SPIKE_EMA = 0.9  # weight of the past in that running average


class Interrupted(Exception):  # noqa: N818 - it is a control-flow signal, not an error
    """SIGINT/SIGTERM arrived; a checkpoint was saved. ``exit_code`` is 130 or 143."""

    def __init__(self, signum: int, attempt: Path):
        self.signum = signum
        self.attempt = attempt
        self.exit_code = 128 + signum
        super().__init__(f"interrupted by signal {signum}")


@dataclass(frozen=True)
class ParentRef:
    """The attempt to resume and which checkpoint: ``latest``, ``best`` or ``step_N``."""

    attempt: Path
    checkpoint: str = "latest"


@dataclass(frozen=True)
class AttemptResult:
    attempt: Path
    final_step: int
    final_val_loss: float | None
    best_val_loss: float | None
    best_checkpoint: str | None


# ------------------------------------------------------------------------------------- helpers


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


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


def _claim_attempt(run_dir: Path, config_text: str, info: dict) -> tuple[Path, AttemptLock]:
    """Create the next attempt directory, complete with config.toml and attempt.json.

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
    except OSError as exc:
        raise StorageError(f"{attempts}: cannot create: {exc.strerror or exc}") from None
    lock = AttemptLock(tmp).acquire()
    try:
        _write_text_atomic(tmp / "config.toml", config_text)
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
    except BaseException:
        lock.release()
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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


# ------------------------------------------------------------------------------------ parents


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
class _Parent:
    attempt: Path
    checkpoint: Path
    model_state: dict
    optimizer_state: dict
    state: dict
    config_tables: dict
    skipped: list[dict]


def _load_parent(ref: ParentRef) -> _Parent:
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
    if state.get("version") != STATE_VERSION:
        raise CheckpointError(
            f"{ckpt / 'state.json'}: state version {state.get('version')!r}; this iqtrain "
            f"reads version {STATE_VERSION}"
        )
    missing = sorted(k for k in _STATE_KEYS if k not in state)
    if missing:
        raise CheckpointError(f"{ckpt / 'state.json'}: missing keys {missing}")
    owner = ckpt.parent.parent  # the attempt that wrote this checkpoint
    try:
        config_tables = tomllib.loads((owner / "config.toml").read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{owner / 'config.toml'}: unreadable: {exc}") from None
    return _Parent(
        attempt=owner,
        checkpoint=ckpt,
        model_state=model_state,
        optimizer_state=optimizer_state,
        state=state,
        config_tables=config_tables,
        skipped=skipped,
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


def _config_changes(parent_tables: dict, config: Config) -> dict[str, tuple[Any, Any]]:
    old = _flatten(parent_tables)
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


# ------------------------------------------------------------------------------------ the loop


class _SignalGuard:
    """Turn SIGINT/SIGTERM into a flag the loop checks after each completed step."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _SignalGuard:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second signal: the user insists
            raise KeyboardInterrupt
        self.signum = signum
        print(f"\nsignal {signum}: finishing this step, then saving a checkpoint", file=sys.stderr)

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class _Progress:
    """tqdm on a terminal; plain log lines every ``log_every`` steps otherwise."""

    def __init__(self, first: int, total: int, log_every: int):
        self.total, self.log_every, self.t0, self.first = (
            total,
            log_every,
            time.perf_counter(),
            first,
        )
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=first, unit="step", dynamic_ncols=True)

    def update(self, step: int, loss: float, lr: float, sps: float) -> None:
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
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _to_device(batch: np.ndarray, device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(batch)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def _prepare(
    raw: np.ndarray, stepper: TrainStep, config: Config
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loader batch -> device -> ``prepare_iq_input`` with the config's norm and precision."""
    d = config.data
    out_dtype = torch.bfloat16 if config.training.precision == "bf16" else torch.float32
    return prepare_iq_input(
        _to_device(raw, stepper.device),
        d.patch_len,
        norm=d.norm,
        prefix_patches=d.prefix_patches,
        out_dtype=out_dtype,
    )


def _validate(
    stepper: TrainStep, val: IQDataset, config: Config, step: int, baselines: bool
) -> dict:
    """Mean loss over every validation window (exact over the partial last batch).

    A non-finite batch loss raises NonFiniteError naming the step and that batch's window ids,
    before anything is recorded: the evidence never holds a non-finite number.
    """
    d = config.data
    loss_sum, count, samples = 0.0, 0, 0
    zero_sum, copy_sum = 0.0, 0.0
    for raw in val.val_batches(d.val_batch_size):
        patches, _ = _prepare(raw, stepper, config)
        s, c = stepper.eval_step(patches)
        if not math.isfinite(s):
            ids = np.arange(samples, samples + raw.shape[0])
            raise NonFiniteError(
                f"step {step}: validation loss is {s} in data.val windows {format_ids(ids)}"
            )
        loss_sum += s
        count += c
        samples += raw.shape[0]
        if baselines:
            x = patches.float()
            zero_sum += float(x[:, 1:].square().sum(dtype=torch.float64))
            copy_sum += float((x[:, 1:] - x[:, :-1]).square().sum(dtype=torch.float64))
    loss = loss_sum / count
    rec = {
        "kind": "val",
        "loss": loss,
        "pred_snr_db": -10.0 * math.log10(loss) if loss > 0 else float("inf"),
        "samples": samples,
        "patches": samples * (d.seq_patches - 1),
    }
    if baselines:
        rec["baseline_zero_loss"] = zero_sum / count
        rec["baseline_copy_last_loss"] = copy_sum / count
    if not all(math.isfinite(v) for v in rec.values() if isinstance(v, float)):
        raise NonFiniteError(f"step {step}: validation produced a non-finite value: {rec}")
    return rec


def spike_update(ema: float | None, loss: float) -> tuple[bool, float]:
    """``(spike, new_ema)``: a loss above SPIKE_FACTOR x its running average is a spike."""
    spike = ema is not None and loss > SPIKE_FACTOR * ema
    new = loss if ema is None else SPIKE_EMA * ema + (1 - SPIKE_EMA) * loss
    return spike, new


class _Digests:
    """Full-content digests of the train and val recordings (DESIGN.md section 1).

    A fresh run computes them in a background thread (the Rust digest releases the GIL), so
    the first step never waits for them; the first checkpoint does, because it records them.
    A resume passes the digests it already computed to compare with its parent's.
    """

    def __init__(self, train: IQDataset, val: IQDataset, known: dict | None = None):
        self._result = known
        self._error: BaseException | None = None
        self._thread = None
        if known is None:
            self._thread = threading.Thread(
                target=self._run, args=(train, val), name="iqtrain-digest", daemon=True
            )
            self._thread.start()

    def _run(self, train: IQDataset, val: IQDataset) -> None:
        try:
            self._result = compute_digests(train, val)
        except BaseException as exc:  # re-raised in the loop's thread by result()
            self._error = exc

    def result(self) -> dict:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


def compute_digests(train: IQDataset, val: IQDataset) -> dict[str, dict[str, str]]:
    return {"train": train.content_digests(), "val": val.content_digests()}


def _check_digests(parent_state: dict, digests: dict, ckpt: Path) -> None:
    """Refuse (exit 2) any change to any byte a window can read, naming the recording."""
    recorded = parent_state["data"]
    for key in ("train", "val"):
        old, new = recorded.get(key), digests[key]
        if not isinstance(old, dict):
            raise CheckpointError(f"{ckpt / 'state.json'}: data.{key}: no recorded digests")
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


def _report_skipped(key: str, ds: IQDataset, window: int) -> None:
    skipped = ds.skipped
    if skipped:
        names = [os.path.basename(p) for p, _ in skipped]
        shown = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        print(
            f"iqtrain: note: {key}: {len(names)} recording(s) shorter than one window of "
            f"{window} samples, skipped: {shown}",
            file=sys.stderr,
        )


def run_pretraining_attempt(config: Config, parent: ParentRef | None = None) -> AttemptResult:
    """Run (or resume) one attempt of ``config``; creates exactly one attempt directory."""
    # ---- everything that can be the user's fault, before anything is written -------------
    loaded = _load_parent(parent) if parent is not None else None
    changes: dict[str, tuple[Any, Any]] = {}
    if loaded is not None:
        changes = _config_changes(loaded.config_tables, config)
    config.check_world_size(1)
    t = config.training
    torch.manual_seed(config.run.seed)
    model = NextPatchModel(config.model)
    stepper = TrainStep(
        model, config.optimizer, device=t.device, precision=t.precision, compile=t.compile
    )
    # Data last: the synthetic default is generated only once every other check has passed.
    train_ds, val_ds = open_datasets(config)
    digests = None
    if loaded is not None:
        # Every byte, before the child exists; names the first recording that changed.
        digests = compute_digests(train_ds, val_ds)
        _check_digests(loaded.state, digests, loaded.checkpoint)
        for key, ds in (("train", train_ds), ("val", val_ds)):  # metadata and lengths
            if loaded.state["fingerprints"][key] != ds.fingerprint:
                raise CursorMismatchError(
                    f"data.{key}: the dataset's fingerprint {ds.fingerprint[:16]}… differs from "
                    f"the parent's {loaded.state['fingerprints'][key][:16]}… (data changed)"
                )
    plan = Plan.from_config(
        config.schedule, t.max_steps, config.optimizer.lr, config.optimizer.min_lr
    )
    start_step = 0
    if loaded is not None:
        start_step = loaded.state["step"]
        plan = Plan.from_dict(loaded.state["plan"])
        if t.max_steps != plan.max_steps:
            plan = plan.extend(t.max_steps, start_step)  # ConfigError past the decay start
        if start_step >= plan.max_steps:
            raise ConfigError(
                f"training.max_steps: the parent checkpoint is at step {start_step}, "
                f"already at max_steps {plan.max_steps}; raise it to continue"
            )
    for key, ds in (("data.train", train_ds), ("data.val", val_ds)):
        _report_skipped(key, ds, config.data.window)
    stream = TrainStream(
        train_ds,
        batch_size=config.data.batch_size,
        seed=config.run.seed,
        prefetch=config.data.prefetch,
    )
    if loaded is not None:
        for line in loaded.skipped:
            print(
                f"iqtrain: note: skipped checkpoint {line['checkpoint']} of {parent.attempt}: "
                f"{line['reason']}",
                file=sys.stderr,
            )

    # ---- the attempt namespace ------------------------------------------------------------
    run_dir = Path(expand_path(config.run.dir))
    if parent is not None:
        run_dir = Path(parent.attempt).resolve().parent.parent
    config_text = dumps_toml(config_to_dict(config))
    config_sha = _sha256_bytes(config_text.encode())
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
        "started": _now(),
        "status": "running",
        "plan": plan.to_dict(),
        "argv": sys.argv,
        "pid": os.getpid(),
    }
    if loaded is not None:
        info["parent"] = {
            "attempt": os.fspath(loaded.attempt.resolve()),
            "checkpoint": loaded.checkpoint.name,
            "checkpoint_json_sha256": file_digest(loaded.checkpoint / "checkpoint.json")["sha256"],
            "step": start_step,
            "skipped_checkpoints": loaded.skipped,
        }
        info["config_changes"] = {k: {"from": a, "to": b} for k, (a, b) in sorted(changes.items())}
    # held until the end: a "running" attempt whose lock is free has crashed
    attempt, lock = _claim_attempt(run_dir, config_text, info)
    metrics: MetricWriter | None = None
    progress: _Progress | None = None
    status, step = "failed", start_step
    loop = {
        "best_val_loss": None,
        "best_step": None,
        "best_checkpoint": None,
        "loss_ema": None,
        "validations": 0,
    }
    last_val: dict | None = None
    try:
        metrics = MetricWriter(
            attempt / "metrics.jsonl",
            inherit_from=None if loaded is None else loaded.attempt / "metrics.jsonl",
            cursor=None if loaded is None else MetricCursor.from_dict(loaded.state["metrics"]),
        )
        inherited = metrics.cursor() if loaded is not None else None
        data_identity = _Digests(train_ds, val_ds, known=digests)

        # ---- restore ---------------------------------------------------------------------
        if loaded is not None:
            stepper.load_model_state_dict(loaded.model_state)
            stepper.optimizer.load_state_dict(loaded.optimizer_state)
            stream.load_state_dict(loaded.state["cursor"])
            loop.update(loaded.state["loop"])
            restore_rng_state(loaded.state["rng"])
        del loaded  # the parent's tensors are in the model and optimizer now

        ckpt_root = attempt / "checkpoints"
        saved: list[Path] = []
        progress = _Progress(start_step, plan.max_steps, t.log_every)
        d = config.data

        def checkpoint() -> Path:
            state = {
                "version": STATE_VERSION,
                "step": step,
                "config_sha256": config_sha,
                "plan": plan.to_dict(),
                "cursor": stream.state_dict(),
                "fingerprints": {"train": train_ds.fingerprint, "val": val_ds.fingerprint},
                "data": data_identity.result(),
                "loop": dict(loop),
                "metrics": metrics.cursor().to_dict(),
                "rng": rng_state(),
            }
            metrics.sync()  # the cursor must never point past what is on disk
            path = save_checkpoint(
                ckpt_root, step, stepper.model_state_dict(), stepper.optimizer.state_dict(), state
            )
            saved.append(path)
            _prune(saved, loop, t.keep_last, run_dir)
            return path

        with _SignalGuard() as guard:
            while step < plan.max_steps:
                t0 = time.perf_counter()
                s = step  # 0-based index of the step being run
                lr = lr_at(s, plan)
                micro, ids = [], []
                for _ in range(t.grad_accum):
                    raw = next(stream)
                    ids.append(stream.last_ids())
                    patches, _ = _prepare(raw, stepper, config)
                    micro.append(patches)
                result = stepper.train_step(micro, lr, step=s + 1, window_ids=np.concatenate(ids))
                step = s + 1
                dt = time.perf_counter() - t0
                samples = d.batch_size * t.grad_accum
                spike, loop["loss_ema"] = spike_update(loop["loss_ema"], result.loss)
                metrics.write(
                    {
                        "kind": "train",
                        "step": step,
                        "loss": result.loss,
                        "lr": result.lr,
                        "grad_norm": result.grad_norm,
                        "clipped": result.clipped,
                        "samples": samples,
                        "patches": samples * (d.seq_patches - 1),
                        "step_time_s": dt,
                        "samples_per_s": samples / dt if dt > 0 else 0.0,
                        "spike": spike,
                    }
                )
                progress.update(step, result.loss, result.lr, samples / dt if dt > 0 else 0.0)
                final = step == plan.max_steps
                improved = False
                if step % t.eval_every == 0 or final:
                    v0 = time.perf_counter()
                    rec = _validate(
                        stepper, val_ds, config, step, baselines=loop["validations"] == 0
                    )
                    best = loop["best_val_loss"]
                    improved = best is None or rec["loss"] < best
                    if improved:
                        loop["best_val_loss"] = rec["loss"]
                        loop["best_step"] = step
                        # Relative to the run directory: the best may live in an ancestor.
                        loop["best_checkpoint"] = os.fspath(
                            Path("attempts") / attempt.name / "checkpoints" / checkpoint_name(step)
                        )
                    loop["validations"] += 1
                    rec = {
                        "kind": "val",
                        "step": step,
                        **{k: v for k, v in rec.items() if k != "kind"},
                        "best": improved,
                        "time_s": time.perf_counter() - v0,
                    }
                    metrics.write(rec)
                    last_val = rec
                    progress.note(
                        f"val step {step}: loss {rec['loss']:.5f} "
                        f"({rec['pred_snr_db']:.2f} dB){'  best' if improved else ''}"
                    )
                if step % t.checkpoint_every == 0 or improved or final:
                    checkpoint()
                if guard.signum is not None and not final:
                    if not saved or checkpoint_step(saved[-1]) != step:
                        checkpoint()
                    status = "interrupted"
                    raise Interrupted(guard.signum, attempt)
        metrics.close()
        _publish_manifest(
            attempt, config_sha, metrics, inherited, saved, loop, info["parent"], run_dir
        )
        status = "completed"  # only once the manifest exists
    except Interrupted:
        raise
    except (ConfigError, DataError, CheckpointError) as exc:
        # Inputs were all checked before the attempt existed; one of these now is a failure of
        # the run (exit 1), not a bad input (exit 2).
        info["error"] = f"{type(exc).__name__}: {exc}"
        raise TrainingError(f"{attempt}: {exc}") from exc
    except BaseException as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        _finish_attempt(attempt, info, status, step, progress, metrics)
        lock.release()
    return AttemptResult(
        attempt=attempt,
        final_step=step,
        final_val_loss=None if last_val is None else last_val["loss"],
        best_val_loss=loop["best_val_loss"],
        best_checkpoint=loop["best_checkpoint"],
    )


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StorageError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _finish_attempt(attempt, info, status, step, progress, metrics) -> None:
    """Record how the attempt ended. A failure here never hides the error that ended it."""
    in_flight = sys.exc_info()[1]
    info["status"] = status
    info["finished"] = _now()
    info["final_step"] = step
    try:
        if progress is not None:
            progress.close()
        if metrics is not None:
            metrics.close()
        write_json_atomic(attempt / "attempt.json", info)
    except (OSError, StorageError) as exc:
        if in_flight is None:
            raise
        print(f"iqtrain: note: could not record the attempt's end: {exc}", file=sys.stderr)


def _prune(saved: list[Path], loop: dict, keep_last: int, run_dir: Path) -> None:
    """Keep the newest ``keep_last`` checkpoints of this attempt, the latest and best always.

    Each pruned checkpoint leaves the listed namespace by a rename before it is deleted, so a
    crash mid-prune never leaves a half-deleted ``step_N`` under its real name.
    """
    if keep_last <= 0:
        return
    best = loop["best_checkpoint"]
    keep = set(saved[-keep_last:]) | {saved[-1]}
    for path in list(saved):
        if path in keep or (best is not None and path.resolve() == (run_dir / best).resolve()):
            continue
        remove_checkpoint(path)
        saved.remove(path)


def _ref(attempt: Path, path: Path, **extra) -> dict:
    index = file_digest(path / "checkpoint.json")
    return {"path": os.path.relpath(path, attempt), "step": checkpoint_step(path), **index, **extra}


def _publish_manifest(
    attempt, config_sha, metrics, inherited, saved, loop, parent, run_dir
) -> None:
    metrics_path = attempt / "metrics.jsonl"
    config_path = attempt / "config.toml"
    for p in (metrics_path, config_path):
        p.chmod(0o444)  # frozen: the evidence is read-only from here on
    cfg = file_digest(config_path)
    if cfg["sha256"] != config_sha:
        raise CheckpointError(f"{config_path}: changed during the attempt")
    best_path = run_dir / loop["best_checkpoint"] if loop["best_checkpoint"] else None
    manifest = {
        "version": 1,
        "attempt": attempt.name,
        "parent": parent,
        "config": {"path": "config.toml", **cfg},
        "metrics": {
            "path": "metrics.jsonl",
            "records": metrics.records,
            **file_digest(metrics_path),
        },
        "inherited_metrics": None if inherited is None else inherited.to_dict(),
        "latest": _ref(attempt, saved[-1]),
        "best": None
        if best_path is None
        else _ref(attempt, best_path, val_loss=loop["best_val_loss"]),
        "checkpoints": [_ref(attempt, p) for p in saved],
        "published": _now(),
    }
    write_json_atomic(attempt / "manifest.json", manifest)

"""One pretraining attempt: check everything, claim the attempt, train, publish the evidence.

``run_attempt(config, parent=None)`` is the whole application. Everything a user
can get wrong (config, data, a tampered or mismatched parent, a missing GPU) is checked before
the attempt directory exists (:func:`_preflight`), so a bad input leaves nothing behind and is
exit 2. After the directory exists every failure is a training failure (exit 1): the loop
(:class:`~iqtrain.train.loop.Trainer`) runs inside a guarded region that records how the attempt
ended, and the manifest is published inside it, so the status is "completed" only once the
manifest exists.

Under torchrun the ranks agree three times before rank 0 claims the attempt: on the config
(:func:`~iqtrain.distributed.world.join`), on the preflight (every rank's outcome, and the same
data fingerprints everywhere), and on the claim; a signal before the claim ends every rank with
nothing created (docs/design.md "Preflight agreement", "Signals and exits").

The preflight's first act is ``training.deterministic``
(:func:`~iqtrain.train.determinism.configure`), before anything of the attempt touches CUDA:
torch sizes cuBLAS's workspace from the environment at the process's first matmul.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from iqtrain.checkpoint.manager import CheckpointManager
from iqtrain.checkpoint.state import RATE_UNKNOWN
from iqtrain.config.schema import Config, config_to_dict, dumps_toml
from iqtrain.console import Interrupted, SignalLatch, StoppedBeforeStart, note
from iqtrain.data.dataset import IQDataset, TrainStream
from iqtrain.data.identity import (
    DataIdentity,
    DigestPlan,
    DigestShare,
    check_parent_data,
)
from iqtrain.data.sources import format_rate, open_datasets, open_labelled, report_dataset
from iqtrain.data.windows import LabelledSet
from iqtrain.distributed.world import PeerError, RankExit, World, agree, join
from iqtrain.errors import (
    EXIT_FAILURE,
    CheckpointError,
    ConfigError,
    DataError,
    IQTrainError,
    NonFiniteError,
    TrainingError,
    exit_code,
)
from iqtrain.evidence.attempts import claim_attempt, finish_attempt, utc_now
from iqtrain.evidence.data_record import data_record
from iqtrain.evidence.lineage import Parent, ParentRef, config_changes, load_parent
from iqtrain.evidence.lock import AttemptLock
from iqtrain.evidence.manifest import publish_manifest
from iqtrain.evidence.metrics import MetricCursor, MetricWriter
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.init import InitSource, load_init
from iqtrain.report.live import WANDB_RUN_ID, LiveLog, check_live, wandb_run_id
from iqtrain.storage import creatable_dir, file_digest
from iqtrain.train import determinism
from iqtrain.train.loop import LoopParts, LoopState, Trainer, restore, state_components
from iqtrain.train.probe import TrainingProbe
from iqtrain.train.rng import RNGState
from iqtrain.train.schedule import Plan
from iqtrain.train.sinks import LiveViews
from iqtrain.train.step import TrainStep

__all__ = [
    "AttemptResult",
    "run_attempt",
]

# How long a rank whose peer closed its connections before the attempt existed waits for its
# own signal (torchrun sends it a moment after the peer's) before calling the loss a failure.
PEER_SIGNAL_GRACE_S = 3.0


@dataclass(frozen=True)
class AttemptResult:
    attempt: Path
    final_step: int
    final_val_loss: float | None
    best_val_loss: float | None
    best_checkpoint: str | None
    rank: int = 0  # several ranks: every rank returns the same numbers; rank 0 reports them
    stopped_early: dict[str, Any] | None = None  # {step, best_step, reason} when it did
    # The NMSE of the last validation's predicted mean (== final_val_loss for "mse").
    final_val_nmse: float | None = None
    objective: str = "mse"
    probe: dict[str, Any] | None = None  # the last probe record (rank 0)
    # A labelled objective: the last validation's accuracy and the best one's.
    final_val_accuracy: float | None = None
    best_val_accuracy: float | None = None


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


@dataclass
class _Ready:
    """Everything built and checked before the attempt exists: the parent (a resume), the
    config changes it makes, and the loop's parts."""

    parent: Parent | None
    changes: dict[str, tuple[Any, Any]]
    start_step: int
    parts: LoopParts
    #: A resume: the shared data check's record for attempt.json (who read what, how long).
    data_check: dict[str, Any] | None = None
    #: Where the lineage's first weights came from (``[init] from``; a resume inherits its
    #: parent's record): attempt.json's and the manifest's ``init``.
    init: dict[str, Any] | None = None
    #: attempt.json's ``data``: the sample rate trained at and the inputs read past
    #: (:func:`~iqtrain.evidence.data_record.data_record`).
    data: dict[str, Any] | None = None


def _plan(config: Config, parent: Parent | None) -> tuple[Plan, int]:
    """The schedule plan and first step: a parent's plan, extended only as docs/design.md
    "Learning-rate schedule" allows."""
    t, o = config.training, config.optimizer
    if parent is None:
        return Plan.from_config(config.schedule, t.max_steps, o.lr, o.min_lr), 0
    start = parent.state.step
    try:
        plan = Plan.from_dict(parent.state.plan)
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


def _check_run_dir(run_dir: Path) -> None:
    """run.dir can be created and written (checked before any data is generated)."""
    why = creatable_dir(run_dir)
    if why is not None:
        raise ConfigError(f"run.dir: {run_dir} cannot be created or written ({why})")


@dataclass
class _Opened:
    """The first part of the preflight: the parent, the step and the datasets."""

    parent: Parent | None
    changes: dict[str, tuple[Any, Any]]
    stepper: TrainStep
    train: IQDataset
    val: IQDataset
    init: dict[str, Any] | None = None
    #: A labelled objective: the labelled windows (their datasets are ``train`` and ``val``).
    labelled: tuple[LabelledSet, LabelledSet] | None = None
    #: a resume's digest plan, built once: this rank's share reads it, rank 0 merges by it.
    digest_plan: DigestPlan | None = None
    #: The one sample rate of the recordings (``data.sample_rate``'s answer; None: none
    #: recorded, or several under "any").
    sample_rate: float | None = None


def _preflight(config: Config, ref: ParentRef | None, world: World) -> _Opened:
    """Every check a user's input can fail before the data is read in full, in an order that
    writes nothing on refusal.

    Every rank runs it (no collective inside: a rank that fails must not leave the others
    waiting in one); the ranks agree on the outcome afterwards (:func:`agree`).

    ``training.deterministic`` is configured first: before the seed, the model and the step
    touch the device, so before the process's first cuBLAS call (:mod:`.determinism`).
    """
    t = config.training
    determinism.configure(t.device, t.deterministic)
    if world.is_main:  # the live views are rank 0's: their packages must be there
        check_live(config.logging)
    parent = load_parent(ref) if ref is not None else None
    changes = config_changes(parent.config_tables, config) if parent is not None else {}
    labelled, classes = None, None
    if config.model.task.labelled:  # the classes size the head: data first
        if world.is_main and ref is None:
            _check_run_dir(Path(config.run.dir))
        labelled = open_labelled(config.data)
        classes = labelled[0].classes
        if parent is not None and parent.state.classes != list(classes):
            raise DataError(
                f"data.train: its classes {list(classes)} are not the parent's "
                f"{parent.state.classes}"
            )
    # A resume continues its parent's weights; only a new lineage starts from [init].
    source = load_init(config.init, config.model, classes) if parent is None else None
    torch.manual_seed(config.run.seed)  # the same initial weights on every rank
    model = IQTransformer(config.model, 0 if labelled is None else len(labelled[0].classes))
    if source is not None:
        source.load_into(model)
    stepper = TrainStep(
        model,
        config.optimizer,
        device=t.device,
        precision=t.precision,
        compile=t.compile,
        world=world,
        parallel=t.parallel,
    )
    if world.rank > 0:  # rank 0 continues the one-process stream; the others their own
        torch.manual_seed(config.run.seed + 1_000_003 * world.rank)
    if labelled is not None:
        train, val = labelled[0].dataset, labelled[1].dataset
        rate = labelled.sample_rate
    else:
        if world.is_main and ref is None:
            _check_run_dir(Path(config.run.dir))
        # Data last: the synthetic default is generated only once every other check passed.
        sets = open_datasets(config.data)
        (train, val), rate = sets, sets.sample_rate
    init = None if source is None else source.record
    if source is not None and world.is_main:
        _note_init_rate(source, rate)
    if parent is not None:  # a resume carries its lineage's record, from the parent's state
        init = parent.state.init
    return _Opened(parent, changes, stepper, train, val, init, labelled, sample_rate=rate)


def _note_init_rate(source: InitSource, rate: float | None) -> None:
    """A model trained at another sample rate than the data it continues on: a note naming
    both (a model sees samples, not seconds: the same signal looks otherwise), not a refusal.
    Nothing when either rate is unknown or not one."""
    if source.sample_rate is not None and rate is not None and source.sample_rate != rate:
        note(
            f"init.from: {source.checkpoint} was trained on recordings at "
            f"{format_rate(source.sample_rate)}, but data.train and data.val are at "
            f"{format_rate(rate)}"
        )


def _check_parent_rate(parent: Parent, rate: float | None) -> None:
    """A resume trains at its parent's sample rate: the data is the parent's (its digests were
    compared), so another rate is a parent state that does not describe it (exit 2). A parent
    written before states recorded one says nothing."""
    recorded = parent.state.sample_rate
    if recorded is not RATE_UNKNOWN and recorded != rate:
        raise DataError(
            f"data.train: the recordings are at {format_rate(rate)}, but the parent checkpoint "
            f"({parent.checkpoint}) records {format_rate(recorded)}"
        )


def _checked(
    config: Config,
    ref: ParentRef | None,
    opened: _Opened,
    shares: list[DigestShare],
    world: World,
) -> _Ready:
    """The rest of the preflight, once the shares are in (every rank, no collective inside):
    a resume's data compared with its parent's first (rank 0 merges the shares and names the
    recording that changed; every rank compares fingerprints), then the plan, the stream and
    the parent's state restored, and the loop's parts."""
    parent, train, val, stepper = opened.parent, opened.train, opened.val, opened.stepper
    digests = None
    if parent is not None:
        if world.is_main:
            assert opened.digest_plan is not None  # built by _read_share
            digests = opened.digest_plan.merge(shares)
        check_parent_data(parent.state, train, val, digests)
        _check_parent_rate(parent, opened.sample_rate)
    plan, start_step = _plan(config, parent)
    for key, ds in (("data.train", train), ("data.val", val)) if world.is_main else ():
        report_dataset(key, ds, config.data.window)
    stream = TrainStream(
        train,
        batch_size=config.data.batch_size,
        seed=config.run.seed,
        prefetch=config.data.prefetch,
        rank=world.rank,
        world_size=world.world_size,
    )
    loop = LoopState()
    if parent is not None:  # before the child exists: a checkpoint that cannot load is exit 2
        restore(parent, stepper, state_components(stream, loop, RNGState(world)))
        loop.step = start_step
    if parent is not None and ref is not None and world.is_main:
        for line in parent.skipped:
            note(f"skipped checkpoint {line['checkpoint']} of {ref.attempt}: {line['reason']}")
        for text in parent.notes:  # what verify notes of the parent (an [init] source gone)
            note(f"the parent: {text}")
    # A fresh run's digests are read in the background, every rank its share (DataIdentity);
    # a resume's were read and compared above.
    identity = DataIdentity(train, val, digests, world=world, checked=parent is not None)
    probe = None
    if world.is_main and config.probe.every:
        probe = TrainingProbe(
            config.probe, config.data, config.model, config.run.seed, opened.sample_rate
        )
    parts = LoopParts(
        stepper,
        stream,
        val,
        plan,
        loop,
        identity,
        probe,
        init=opened.init,
        sample_rate=opened.sample_rate,
    )
    if opened.labelled is not None:
        parts.train_labels = opened.labelled[0].labels
        parts.val_labels = opened.labelled[1].labels
        parts.classes = opened.labelled[0].classes
    # Every attempt records what it trains at and what it read past (a resume: its own list,
    # the data reopened).
    data = data_record(opened.sample_rate, {"data.train": train.refused, "data.val": val.refused})
    return _Ready(parent, opened.changes, start_step, parts, init=opened.init, data=data)


def _load_shards(stepper: TrainStep, directory: Path) -> IQTrainError | None:
    """A sharded parent's tensors, once the step is sharded (every rank together), still
    before the child exists: a failure is exit 2 on every rank, as in preflight."""
    try:
        stepper.load_sharded(directory)
    except IQTrainError as exc:
        return exc
    return None


def _attempt_info(config: Config, run_dir: Path, ready: _Ready, world: World) -> dict[str, Any]:
    t = config.training
    hosts = world.hosts()  # a collective: every rank builds the info, rank 0 writes it
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
            "deterministic": t.deterministic,
        },
        "started": utc_now(),
        "status": "running",
        "plan": ready.parts.plan.to_dict(),
        "argv": sys.argv,
        "pid": os.getpid(),
        "world": {
            "size": world.world_size,
            "backend": world.backend,
            "hosts": hosts,
            "parallel": t.parallel,
        },
        "init": ready.init,
        "data": ready.data,
    }
    if ready.parts.classes is not None:  # a labelled objective: what the head's outputs mean
        info["classes"] = list(ready.parts.classes)
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
        info["data_check"] = ready.data_check
    if world.is_main:  # chosen before the claim, so a resume of this attempt finds it
        run_id = wandb_run_id(config.logging, None if p is None else p.attempt)
        if run_id is not None:
            info[WANDB_RUN_ID] = run_id
    return info


def run_attempt(
    config: Config, parent: ParentRef | None = None, world: World | None = None
) -> AttemptResult:
    """Run (or resume) one attempt of ``config``; creates exactly one attempt directory.

    Under torchrun every rank calls this with its config (the CLI has joined the ranks with
    :func:`~iqtrain.distributed.world.join` already and passes the ``world``): the ranks run
    the same preflight and agree on its outcome, and rank 0 claims the attempt and writes
    everything. Without a ``world`` it joins them itself.
    """
    if world is None:
        world, config = join(lambda: config)
    result = _run(config, parent, world)
    world.close()  # only on success: after a failure a peer may be gone
    return result


def _run(config: Config, parent: ParentRef | None, world: World) -> AttemptResult:
    try:
        ready = _agreed_preflight(config, parent, world)
        run_dir = Path(config.run.dir)
        if parent is not None:  # the child joins its parent, and its config.toml says so
            run_dir = Path(parent.attempt).resolve().parent.parent
            config = dataclasses.replace(
                config, run=dataclasses.replace(config.run, dir=os.fspath(run_dir))
            )
        config_text = dumps_toml(config_to_dict(config))
        _agreed_hold(world)
        info = _attempt_info(config, run_dir, ready, world)
    except PeerError:
        # A peer that a signal ended before the attempt existed: the signal reaches this rank
        # too (torchrun forwards it to each worker in turn, so it may come a moment after the
        # peer has gone). Then this is the job's stop, not a failure. A peer that crashed,
        # with no signal here within the grace, is a failure.
        latch = SignalLatch.current()
        signum = None if latch is None else latch.pending_or_taken(grace=PEER_SIGNAL_GRACE_S)
        if signum is not None:
            world.ending()
            raise StoppedBeforeStart(signum, latch is not None and latch.after_peer) from None
        raise
    claimed = _agreed_claim(run_dir, config_text, info, world)
    if claimed is None:
        return _follow(config, claimed_path(world, None), run_dir, ready, config_text, world)
    attempt, lock = claimed
    return _lead(config, attempt, lock, run_dir, ready, config_text, info, world)


def _agreed_preflight(config: Config, parent: ParentRef | None, world: World) -> _Ready:
    """The preflight on every rank, agreed at each stage: any rank's refusal is every rank's.
    First the parent, the step and the datasets (the ranks must read the same data:
    fingerprints), so a cheap refusal never waits for the long read; then (a resume) every
    rank's share of the data check, carried to rank 0 by the agreement; then the data compared
    with the parent's, the plan and the restore. A sharded parent's tensors load once the step
    is sharded (every rank together), still before the child exists."""
    error: IQTrainError | None = None
    same = opened = None
    try:
        opened = _preflight(config, parent, world)
        same = {
            "data.train fingerprint": opened.train.fingerprint,
            "data.val fingerprint": opened.val.fingerprint,
            # every rank starts from the same verified weights
            "init model_sha256": (opened.init or {}).get("model_sha256"),
        }
    except IQTrainError as exc:
        error = exc
    agree(world, error, same=same)
    assert opened is not None  # agree raised otherwise
    shares: list[Any] = []
    started = time.monotonic()
    if opened.parent is not None:
        error, share = _read_share(opened, world)
        shares = agree(world, error, payload=share)
    try:
        ready = _checked(config, parent, opened, shares, world)
    except IQTrainError as exc:
        error = exc
    agree(world, error)
    if opened.parent is not None:  # a resume: who read what, rank 0's wall time
        ready.data_check = {
            "bytes": [s.bytes for s in shares],
            "rank_seconds": [round(s.seconds, 3) for s in shares],
            "seconds": round(time.monotonic() - started, 3),
        }
    ready.parts.stepper.data_parallel()
    if ready.parent is not None and ready.parent.sharded is not None:
        agree(world, _load_shards(ready.parts.stepper, ready.parent.sharded))
    return ready


def _read_share(opened: _Opened, world: World) -> tuple[IQTrainError | None, DigestShare | None]:
    """A resume's long read: this rank's 1/W of every data byte (:meth:`DigestPlan.share`, with
    progress notes on rank 0), as ``(error, share)``; the plan stays on ``opened`` for the
    merge."""
    progress = note if world.is_main else None
    try:
        opened.digest_plan = DigestPlan.of(opened.train, opened.val)
        share = opened.digest_plan.share(world.rank, world.world_size, progress)
    except IQTrainError as exc:
        return exc, None
    return None, share


def _agreed_hold(world: World) -> None:
    """From here a signal is a flag the loop acts on (the attempt is about to exist): every
    rank holds its signals, then the ranks agree whether one arrived before that, in which
    case every rank stops with nothing created."""
    latch = SignalLatch.current()
    if latch is not None:
        latch.hold()
    signals = world.all_gather_object(None if latch is None else latch.signum)
    signum = next((s for s in signals if s is not None), None)
    if signum is not None:
        world.ending()
        raise StoppedBeforeStart(signum)


def _agreed_claim(
    run_dir: Path, config_text: str, info: dict[str, Any], world: World
) -> tuple[Path, AttemptLock] | None:
    """Rank 0 claims the attempt (its path and lock; None on the other ranks), agreed: a claim
    that failed is every rank's refusal; a peer lost meanwhile fails the claimed attempt, as
    any failure once it exists does."""
    error: IQTrainError | None = None
    claimed = None
    if world.is_main:
        try:
            # The lock is held until the end: a "running" attempt whose lock is free crashed.
            claimed = claim_attempt(run_dir, config_text, info)
        except IQTrainError as exc:
            error = exc
    try:
        agree(world, error)
    except BaseException as exc:
        if claimed is not None:
            world.ending()
            info["error"] = f"{type(exc).__name__}: {exc}"
            finish_attempt(claimed[0], info, "failed", 0)
            claimed[1].release()
        raise
    return claimed


def claimed_path(world: World, attempt: Path | None) -> Path:
    """Rank 0's attempt directory, on every rank."""
    return Path(world.broadcast_object(None if attempt is None else os.fspath(attempt)))


def _lead(
    config: Config,
    attempt: Path,
    lock: AttemptLock,
    run_dir: Path,
    ready: _Ready,
    config_text: str,
    info: dict[str, Any],
    world: World,
) -> AttemptResult:
    """Rank 0 (or the one process): train, publish the manifest, and record how it ended."""
    status, trainer, metrics, live = "failed", None, None, None
    try:
        claimed_path(world, attempt)  # the other ranks learn where it is
        metrics = MetricWriter(
            attempt / "metrics.jsonl",
            inherit_from=None if ready.parent is None else ready.parent.attempt / "metrics.jsonl",
            cursor=None
            if ready.parent is None
            else MetricCursor.from_dict(ready.parent.state.metrics),
        )
        inherited = None if ready.parent is None else metrics.cursor().to_dict()
        live = LiveLog.open(
            config.logging,
            attempt,
            run_id=info.get(WANDB_RUN_ID),
            config=config_to_dict(config),
            inherited=None if ready.parent is None else attempt / "metrics.jsonl",
        )
        trainer = _trainer(config, attempt, run_dir, ready, metrics, config_text, live)
        trainer.train()
        metrics.close()
        loop = trainer.loop
        best = None
        if loop.best_checkpoint is not None and loop.best_val_loss is not None:
            best = (run_dir / loop.best_checkpoint, loop.best_val_loss, loop.best_val_accuracy)
        publish_manifest(
            attempt,
            config_sha=trainer.config_sha,
            records=metrics.records,
            inherited=inherited,
            checkpoints=trainer.checkpoints.saved,
            best=best,
            record=info,
            stopped_early=trainer.stopped_early,
        )
        status = "completed"  # only once the manifest exists
    except Interrupted:
        status = "interrupted"
        world.ending()  # the checkpoint is saved; finish the record before any SIGTERM
        raise
    except IQTrainError as exc:
        world.ending()
        info["error"] = f"{type(exc).__name__}: {exc}"
        if exc.exit_code == EXIT_FAILURE:
            raise
        # The attempt exists: any failure now is a failure of the run (exit 1), not bad input.
        raise TrainingError(f"{attempt}: {exc}") from exc
    except BaseException as exc:
        world.ending()
        info["error"] = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        if metrics is not None:
            _close_quietly(metrics)
        finish_attempt(attempt, info, status, 0 if trainer is None else trainer.loop.step)
        try:  # the live views last: what they still write (W&B's finish) is not the attempt's
            if live is not None:
                live.close(ok=status == "completed")
        finally:
            lock.release()
    return _result(trainer, attempt, world)


def _trainer(
    config: Config,
    attempt: Path,
    run_dir: Path,
    ready: _Ready,
    metrics: MetricWriter | None,
    config_text: str,
    live: LiveLog | None = None,
) -> Trainer:
    t = config.training
    if live is not None:  # rank 0's, opened once the attempt exists
        ready.parts.sinks.append(LiveViews(live))
    trainer = Trainer(
        t,
        config.data,
        attempt,
        ready.parts,
        checkpoints=CheckpointManager(
            attempt / "checkpoints",
            run_dir,
            every=t.checkpoint_every,
            keep_last=t.keep_last,
            world=ready.parts.stepper.world,
        ),
        metrics=metrics,
        config_sha=_sha256_bytes(config_text.encode()),
        probe_every=config.probe.every,
    )
    ready.parent = None  # the parent's tensors are in the model and optimizer now
    return trainer


def _follow(
    config: Config, attempt: Path, run_dir: Path, ready: _Ready, config_text: str, world: World
) -> AttemptResult:
    """A rank other than 0: the same loop, writing nothing. Failures every rank raises
    together (a non-finite step or validation, a signal) are reported by rank 0 alone."""
    trainer = _trainer(config, attempt, run_dir, ready, None, config_text)
    try:
        trainer.train()
    except BaseException as exc:
        world.ending()
        if isinstance(exc, Interrupted | NonFiniteError):
            raise RankExit(exit_code(exc), str(exc)) from None
        if isinstance(exc, IQTrainError) and exc.exit_code != EXIT_FAILURE:
            raise TrainingError(f"rank {world.rank}: {exc}") from exc
        raise
    return _result(trainer, attempt, world)


def _result(trainer: Trainer, attempt: Path, world: World) -> AttemptResult:
    last_val = trainer.last.get("val")
    return AttemptResult(
        attempt=attempt,
        final_step=trainer.loop.step,
        final_val_loss=None if last_val is None else last_val["loss"],
        best_val_loss=trainer.loop.best_val_loss,
        best_checkpoint=trainer.loop.best_checkpoint,
        rank=world.rank,
        stopped_early=trainer.stopped_early,
        final_val_nmse=None if last_val is None else last_val.get("nmse"),
        objective=trainer.stepper.model.config.objective,
        probe=trainer.last.get("probe"),
        final_val_accuracy=None if last_val is None else last_val.get("accuracy"),
        best_val_accuracy=trainer.loop.best_val_accuracy,
    )


def _close_quietly(metrics: MetricWriter) -> None:
    """Close the metric stream; while another error propagates, a failure here is a note."""
    if sys.exc_info()[1] is None:
        metrics.close()
        return
    try:
        metrics.close()
    except IQTrainError as exc:
        note(str(exc))

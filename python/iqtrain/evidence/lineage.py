"""Lineage: the parent a resume continues, and what a resume may change.

A resume names a parent (:class:`ParentRef`); :func:`load_parent` verifies it completely
before anything is written (every manifest field when it has one: :mod:`iqtrain.evidence.verify`;
otherwise the newest checkpoint that verifies, naming each one skipped), and
:func:`config_changes` refuses any change a resume may not make (docs/design.md "Resume").
Imports no torch at module level (loading a checkpoint's tensors does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from iqtrain.checkpoint.files import (
    checkpoint_name,
    list_checkpoints,
    load_checkpoint,
    sharded_state_dir,
)
from iqtrain.checkpoint.state import CheckpointState, read_json_object
from iqtrain.config.schema import Config, build_config, config_to_dict, flatten
from iqtrain.config.sections import STEP_NAME, check_which
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.lock import attempt_status
from iqtrain.evidence.manifest import checkpoint_problems
from iqtrain.evidence.verify import check_attempt

__all__ = [
    "RESUMABLE_KEYS",
    "RESUMABLE_SECTIONS",
    "Parent",
    "ParentRef",
    "config_changes",
    "load_parent",
    "resumable",
]

# Keys a resume may change. Anything else would make the child a different experiment than its
# parent's evidence describes; max_steps is the recorded plan change of docs/design.md
# "Learning-rate schedule".
RESUMABLE_KEYS = frozenset(
    {
        "training.max_steps",
        "training.compile",
        # how exactly CUDA repeats a step, not what it computes: a resume may trade it for speed
        "training.deterministic",
        "training.log_every",
        "training.peak_tflops",
        "training.dist_timeout_s",
        "training.parallel",  # how ranks hold the same state; a checkpoint loads into either
        "training.early_stop_patience",
        "training.early_stop_min_delta",
        "probe.every",  # the probe reads the model and nothing else
        "probe.data",
        "probe.folds",
        "probe.by",
        "probe.bins",
        "training.keep_last",
        "training.checkpoint_every",
        "training.eval_every",
        "data.prefetch",
        "training.profile_steps",  # a profiler trace of some steps: not evidence
    }
)
#: Sections a resume may change whole: how a run is watched (``[logging]``: TensorBoard, W&B)
#: is not part of the experiment, and nothing of it is evidence.
RESUMABLE_SECTIONS = ("logging",)


def resumable(key: str) -> bool:
    """Whether a resume may change the dotted config key ``key``."""
    return key in RESUMABLE_KEYS or key.split(".", 1)[0] in RESUMABLE_SECTIONS


@dataclass(frozen=True)
class ParentRef:
    """The attempt to resume and which checkpoint: ``latest``, ``best`` or ``step_N`` (a
    ValueError naming ``checkpoint`` otherwise)."""

    attempt: Path
    checkpoint: str = "latest"

    def __post_init__(self) -> None:
        check_which(self.checkpoint, "checkpoint", ValueError)


# Without ``skipped`` a checkpoint that does not verify raises: the result is never None.
@overload
def _checked(ckpt: Path, skipped: None = None) -> Path: ...
@overload
def _checked(ckpt: Path, skipped: list[dict]) -> Path | None: ...
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
        raise CheckpointError(f"{parent}: no checkpoint of it verifies (none to resume or load)")
    if which == "best":
        if manifest is not None:
            if manifest["best"] is None:
                raise CheckpointError(
                    f"{parent}: no validation has run, so there is no best checkpoint"
                )
            return (parent / manifest["best"]["path"]).resolve()
        latest = _resolve_checkpoint(parent, "latest", None, skipped)
        best = CheckpointState.read(latest).best_checkpoint
        if best is None:
            raise CheckpointError(
                f"{parent}: no validation has run, so there is no best checkpoint"
            )
        # Stored relative to the run directory: the best may live in an ancestor attempt.
        path = parent.resolve().parent.parent / best
        if not path.is_dir():
            raise CheckpointError(f"{path}: the best checkpoint is missing")
        return _checked(path)
    if STEP_NAME.fullmatch(which):  # ASCII digits: str.isdigit takes "step_١" too
        path = ckpts / checkpoint_name(int(which[5:]))
        if not path.is_dir():
            raise CheckpointError(f"{path}: no such checkpoint")
        return _checked(path) if manifest is None else path
    # A ParentRef checks its checkpoint when it is made: nothing else reaches here.
    raise ValueError(f"checkpoint: expected latest, best or step_N, got {which!r}")


@dataclass
class Parent:
    attempt: Path
    checkpoint: Path
    model_state: dict
    optimizer_state: dict | None  # None when the checkpoint is sharded (``sharded``)
    state: CheckpointState
    config_tables: dict
    skipped: list[dict]
    sharded: Path | None = None  # the dcp/ directory of a training.parallel = "fsdp" checkpoint
    #: What verifying it noted (a crash's leftovers, an ``[init]`` source gone): said on use.
    notes: list[str] = field(default_factory=list)


def load_parent(ref: ParentRef, *, optimizer: bool = True) -> Parent:
    """Verify the parent completely; CheckpointError names the first thing that fails.

    With a manifest, every field of it is checked against the files (``check_attempt``) and
    any problem refuses the resume. Without one (the parent crashed, failed or was
    interrupted), the newest checkpoint that verifies is used, and each newer one skipped is
    reported with its reason. ``optimizer=False`` (a model to use or to start from, not a
    resume) verifies the same and leaves the optimizer's tensors unread (``optimizer_state``
    None).
    """
    import tomllib

    attempt = Path(ref.attempt)
    if not (attempt / "attempt.json").is_file() or not (attempt / "config.toml").is_file():
        raise CheckpointError(f"{attempt}: not an attempt directory (no attempt.json/config.toml)")
    manifest = None
    skipped: list[dict] = []
    status = attempt_status(attempt, read_json_object(attempt / "attempt.json"))
    if status == "running":
        raise CheckpointError(f"{attempt}: still running (its lock is held); stop it first")
    notes: list[str] = []
    if (attempt / "manifest.json").is_file() or status == "completed":
        check = check_attempt(attempt)
        problems, notes = check.problems, check.notes
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise CheckpointError(f"{attempt}: failed verification: {problems[0]}{more}")
        manifest = read_json_object(attempt / "manifest.json")
    ckpt = _resolve_checkpoint(attempt, ref.checkpoint, manifest, skipped)
    model_state, optimizer_state, state = load_checkpoint(ckpt, optimizer=optimizer)  # hashes
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
        notes=notes,
    )


def config_changes(parent_tables: dict, config: Config) -> dict[str, tuple[Any, Any]]:
    # The parent's config as this version resolves it: a key added since (training.parallel)
    # has its default there, which is what the parent ran with.
    try:
        old = flatten(config_to_dict(build_config(parent_tables)))
    except ConfigError as exc:
        raise CheckpointError(f"the parent's config.toml: {exc}") from None
    new = flatten(config_to_dict(config))
    changes = {
        k: (old.get(k), new.get(k)) for k in old.keys() | new.keys() if old.get(k) != new.get(k)
    }
    # run.dir may be spelled differently (relative to another cwd): the child always goes
    # into the parent's run directory, whatever the config says.
    changes.pop("run.dir", None)
    illegal = sorted(k for k in changes if not resumable(k))
    if illegal:
        allowed = [*sorted(RESUMABLE_KEYS), *(f"{s}.*" for s in RESUMABLE_SECTIONS)]
        raise ConfigError(
            f"{illegal[0]}: cannot change on resume ({changes[illegal[0]][0]!r} -> "
            f"{changes[illegal[0]][1]!r}); only {', '.join(allowed)} may change"
        )
    return changes

"""Evidence: what an attempt directory records, its lock and status, and its verification.

A running attempt holds an exclusive ``flock`` on ``<attempt>/attempt.lock`` for its whole
life. The kernel drops the lock when the process dies, however it dies (kill -9 included), so
an attempt whose ``attempt.json`` still says ``running`` but whose lock is free has crashed.
This module imports no torch: ``verify`` and ``report`` use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from iqtrain import objectives
from iqtrain.checkpoint.files import crash_leftovers, list_checkpoints
from iqtrain.checkpoint.state import CheckpointState, classes_problem
from iqtrain.config.schema import read_toml
from iqtrain.data.identity import verify_data
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence.data_record import data_problems
from iqtrain.evidence.lock import attempt_status, read_attempt_info
from iqtrain.evidence.manifest import (
    ManifestError,
    checkpoint_problems,
    classes_problems,
    init_problems,
    verify_manifest,
)
from iqtrain.evidence.metrics import read_metric_stream
from iqtrain.evidence.package import expected_tensors, weights_problem

__all__ = [
    "AttemptCheck",
    "check_attempt",
    "verify_attempt",
    "verify_attempt_data",
]


# ------------------------------------------------------------------------------- verification


@dataclass
class AttemptCheck:
    """What ``iqtrain verify`` found: ``problems`` fail verification, ``notes`` do not."""

    attempt: Path
    status: str
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _verify_checkpoints_only(attempt: Path, check: AttemptCheck) -> None:
    """An attempt without a manifest: each checkpoint, the config and the metric prefix."""

    for ckpt in list_checkpoints(attempt / "checkpoints"):
        check.problems.extend(checkpoint_problems(ckpt))


def _note_torn_tail(attempt: Path, check: AttemptCheck) -> None:
    """A stream cut mid-record by a kill: a note (no checkpoint's cursor covers the tail)."""

    path = attempt / "metrics.jsonl"
    if not path.exists():
        return
    try:
        stream = read_metric_stream(path)
    except CheckpointError as exc:
        check.problems.append(str(exc))
        return
    if stream.torn:
        check.notes.append(
            f"{path}: ends in a torn record ({stream.torn_bytes} bytes, ignored by resume)"
        )


def check_attempt(attempt: Path) -> AttemptCheck:
    """Verify an attempt: its manifest (every field, against the files) or its checkpoints.

    Raises CheckpointError when ``attempt`` is not an attempt directory at all (a bad input);
    everything else found is a problem (verification fails) or a note (leftovers of a crash).
    """
    attempt = Path(attempt)
    if not (attempt / "attempt.json").is_file():
        raise CheckpointError(f"{attempt}: not an attempt directory (no attempt.json)")
    try:
        info = read_attempt_info(attempt)
        if not all(isinstance(info.get(k), str) for k in ("id", "status")):
            raise ValueError("not an attempt record (no 'id'/'status')")
        status = attempt_status(attempt, info)
    except (OSError, ValueError) as exc:
        check = AttemptCheck(attempt, "unknown")
        check.problems.append(f"{attempt / 'attempt.json'}: unreadable: {exc}")
        return check
    check = AttemptCheck(attempt, status)
    _check_layout(attempt, info, check)
    manifest_path = attempt / "manifest.json"
    if not manifest_path.is_file():
        if status == "completed":
            check.problems.append(f"{manifest_path}: missing, but attempt.json says completed")
        _verify_checkpoints_only(attempt, check)
        _note_torn_tail(attempt, check)
    else:
        _check_manifest(attempt, info, check)
    problems, notes = init_problems(attempt, info)
    check.problems += problems
    check.notes += notes
    check.problems += classes_problems(attempt, info)
    check.problems += data_problems(attempt, info)
    check.problems += _weights_problems(attempt, info)
    check.problems = list(dict.fromkeys(check.problems))  # one line per problem
    return check


def _weights_problems(attempt: Path, info: dict) -> list[str]:
    """Every checkpoint's weights load as the attempt's model (``weights_problem``: the tensors
    its config.toml's architecture has, each F32 of its shape, every value finite): a hash
    binds bytes, this checks what they are. Nothing when config.toml cannot be read (the config
    checks report it)."""
    classes = info.get("classes")
    n = len(classes) if isinstance(classes, list) else 0
    try:
        architecture = read_toml(attempt / "config.toml").get("model", {})
        labelled = objectives.get(architecture.get("objective", "mse")).labelled
        expected_tensors(architecture, n)
    except (OSError, ConfigError, ValueError, TypeError, AttributeError):
        return []
    if labelled != (classes is not None) or (labelled and classes_problem(classes)):
        return []  # the classes checks name what is wrong with them
    problems = []
    for ckpt in list_checkpoints(attempt / "checkpoints"):
        weights = ckpt / "model.safetensors"
        if weights.is_file() and (problem := weights_problem(weights, architecture, n)):
            problems.append(problem)
    return problems


def _check_layout(attempt: Path, info: dict, check: AttemptCheck) -> None:
    """The attempt's own record and files, and the notes a crash leaves."""

    if info["id"] != attempt.name:
        check.problems.append(f"attempt.json id: {info['id']!r} is not this attempt")
    if not (attempt / "config.toml").is_file():
        check.problems.append(f"{attempt / 'config.toml'}: missing")
    if not (attempt / "metrics.jsonl").is_file() and (attempt / "checkpoints").is_dir():
        check.problems.append(f"{attempt / 'metrics.jsonl'}: missing")
    for left in [*crash_leftovers(attempt), *crash_leftovers(attempt / "checkpoints")]:
        check.notes.append(f"{left}: leftover of an interrupted write or prune (ignored)")
    if check.status == "crashed":
        check.notes.append(
            f"{attempt}: crashed (attempt.json says running, but no process holds its lock); "
            "resume it from its newest verified checkpoint"
        )


def _check_manifest(attempt: Path, info: dict, check: AttemptCheck) -> None:
    """Every field of manifest.json against the files it binds."""
    manifest_path = attempt / "manifest.json"
    if check.status in ("failed", "interrupted"):  # a manifest is published only on success
        check.problems.append(f"attempt.json status: {check.status}, but manifest.json exists")
    elif check.status != "completed":  # killed between publishing and recording the end
        check.notes.append(f"{attempt}: manifest.json exists but attempt.json says {check.status}")
    try:
        manifest = json.loads(manifest_path.read_text())
        verify_manifest(attempt, manifest, info, check.problems)
    except (OSError, ValueError) as exc:
        check.problems.append(f"{manifest_path}: unreadable: {exc}")
    except ManifestError as exc:
        check.problems.append(str(exc))


def verify_attempt(attempt: Path) -> list[str]:
    """The problems :func:`check_attempt` finds (empty: the attempt verifies)."""
    return check_attempt(attempt).problems


def verify_attempt_data(attempt: Path) -> list[str]:
    """``verify --data``: every recording the attempt's newest verified checkpoint recorded,
    re-read and compared (:func:`iqtrain.data.identity.verify_data`). Reads every byte."""

    attempt = Path(attempt)
    checkpoints = reversed(list_checkpoints(attempt / "checkpoints"))
    ckpt = next((c for c in checkpoints if not checkpoint_problems(c)), None)
    if ckpt is None:
        return [f"{attempt}: no verified checkpoint records the data's digests"]
    try:
        state = CheckpointState.read(ckpt)
    except CheckpointError as exc:
        return [str(exc)]
    return verify_data(state, ckpt.name, _data_channel(attempt))


def _data_channel(attempt: Path) -> int | None:
    """The attempt's ``data.channel`` (the channel of multi-channel recordings it read)."""
    try:
        data = read_toml(attempt / "config.toml").get("data", {})
    except (OSError, ConfigError):
        return None
    channel = data.get("channel") if isinstance(data, dict) else None
    return channel if type(channel) is int else None

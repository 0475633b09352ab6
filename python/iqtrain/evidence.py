"""Evidence: what an attempt directory records, its lock and status, and its verification.

A running attempt holds an exclusive ``flock`` on ``<attempt>/attempt.lock`` for its whole
life. The kernel drops the lock when the process dies, however it dies (kill -9 included), so
an attempt whose ``attempt.json`` still says ``running`` but whose lock is free has crashed.
This module imports no torch: ``verify`` and ``report`` use it.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iqtrain.errors import CheckpointError

__all__ = [
    "LOCK_NAME",
    "AttemptCheck",
    "AttemptLock",
    "attempt_status",
    "check_attempt",
    "checkpoint_problems",
    "read_attempt_info",
    "verify_attempt",
]

LOCK_NAME = "attempt.lock"
STATUSES = ("running", "completed", "failed", "interrupted", "crashed")


class AttemptLock:
    """The exclusive lock a running attempt holds (released by the kernel if it dies)."""

    def __init__(self, attempt: Path):
        self.path = Path(attempt) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> AttemptLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _lock_held(attempt: Path) -> bool:
    """True if a live process holds the attempt's lock."""
    try:
        fd = os.open(Path(attempt) / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also drops the shared lock if we got it
    return False


def read_attempt_info(attempt: Path) -> dict:
    """``attempt.json`` as a dict; ValueError/OSError propagate to the caller."""
    info = json.loads((Path(attempt) / "attempt.json").read_text())
    if not isinstance(info, dict):
        raise ValueError("attempt.json is not a JSON object")
    return info


def attempt_status(attempt: Path, info: dict | None = None) -> str:
    """``running``, ``completed``, ``failed``, ``interrupted`` or ``crashed``.

    ``crashed``: attempt.json says running but no process holds the attempt's lock (the process
    was killed without a chance to record how it ended).
    """
    if info is None:
        info = read_attempt_info(attempt)
    status = info.get("status")
    if status == "running" and not _lock_held(Path(attempt)):
        return "crashed"
    return str(status)


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


def _sha256_file(path: Path) -> dict[str, Any]:
    from iqtrain.checkpoint import file_digest

    return file_digest(path)


def _count_lines(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
    return n


def _entry_mismatch(path: Path, entry: dict) -> str | None:
    """Why ``path`` does not match the manifest's ``{bytes, sha256}`` entry (None if it does)."""
    if not path.is_file():
        return f"{path}: missing"
    got = _sha256_file(path)
    if got["bytes"] != entry["bytes"] or got["sha256"] != entry["sha256"]:
        return f"{path}: does not match manifest.json (changed after publication)"
    return None


def _state_step(ckpt: Path) -> int:
    state = json.loads((ckpt / "state.json").read_text())
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step is {step!r}")
    return step


_MANIFEST_KEYS = frozenset(
    ("version", "attempt", "parent", "config", "metrics", "inherited_metrics")
    + ("latest", "best", "checkpoints", "published")
)


class _Bad(Exception):
    """A manifest field is missing or has the wrong type (reported as one problem line)."""


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise _Bad(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise _Bad(f"{where}.{key}: unexpected value {value!r}")
    return value


def _ckpt_ref(attempt: Path, entry: Any, where: str) -> tuple[Path, int]:
    path = _field(entry, "path", str, where)
    step = _field(entry, "step", int, where)
    _field(entry, "bytes", int, where)
    _field(entry, "sha256", str, where)
    return (attempt / path).resolve(), step


def _check_checkpoint_ref(attempt: Path, entry: dict, where: str, problems: list[str]) -> None:
    from iqtrain.checkpoint import checkpoint_name

    ckpt, step = _ckpt_ref(attempt, entry, where)
    if Path(entry["path"]).is_absolute():
        problems.append(f"manifest.json {where}.path: {entry['path']} is not relative")
        return
    if ckpt.name != checkpoint_name(step):
        problems.append(f"manifest.json {where}: step {step} but path {entry['path']}")
        return
    mismatch = _entry_mismatch(ckpt / "checkpoint.json", entry)
    if mismatch is not None:
        problems.append(mismatch)
        return
    # Its files, and the config and metric prefix of the attempt that wrote it, against the
    # hashes its state records: a forged config.toml or metrics.jsonl fails here even when
    # the manifest's own entries were rewritten to match.
    found = checkpoint_problems(ckpt)
    problems.extend(found)
    if found:
        return
    try:
        state_step = _state_step(ckpt)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problems.append(f"{ckpt / 'state.json'}: unreadable step: {exc}")
        return
    if state_step != step:
        problems.append(
            f"manifest.json {where}: step {step} but {ckpt.name}/state.json records {state_step}"
        )


def _check_files(attempt: Path, manifest: dict, info: dict, problems: list[str]) -> bool:
    """Identity, parent, config and metric stream entries; True if the stream matches."""
    if manifest.get("attempt") != attempt.name:
        problems.append(
            f"manifest.json attempt: {manifest.get('attempt')!r} is not this attempt "
            f"({attempt.name})"
        )
    if manifest.get("parent") != info.get("parent"):
        problems.append("manifest.json parent: differs from attempt.json's parent")
    for key, name in (("config", "config.toml"), ("metrics", "metrics.jsonl")):
        entry = _field(manifest, key, dict, "manifest.json")
        if _field(entry, "path", str, key) != name:
            problems.append(f"manifest.json {key}.path: {entry['path']!r}, expected {name!r}")
            continue
        _field(entry, "bytes", int, key)
        _field(entry, "sha256", str, key)
        mismatch = _entry_mismatch(attempt / name, entry)
        if mismatch is not None:
            problems.append(mismatch)
    metrics_ok = not any(str(attempt / "metrics.jsonl") in p for p in problems)
    records = _field(manifest["metrics"], "records", int, "metrics")
    if metrics_ok:
        lines = _count_lines(attempt / "metrics.jsonl")
        if records != lines:
            problems.append(
                f"manifest.json metrics.records: {records}, but metrics.jsonl has {lines} records"
            )
    return metrics_ok


def _check_checkpoints(attempt: Path, manifest: dict, problems: list[str]) -> int:
    """Every checkpoint named (latest and best too) by hash and step; latest is the newest and
    the listing is what is on disk. Returns latest's step."""
    from iqtrain.checkpoint import list_checkpoints

    listed = _field(manifest, "checkpoints", list, "manifest.json")
    latest = _field(manifest, "latest", dict, "manifest.json")
    best = manifest.get("best")
    if best is not None and not isinstance(best, dict):
        raise _Bad(f"manifest.json.best: unexpected value {best!r}")
    for where, entry in [
        *((f"checkpoints[{i}]", e) for i, e in enumerate(listed)),
        ("latest", latest),
        *([("best", best)] if best is not None else []),
    ]:
        _check_checkpoint_ref(attempt, entry, where, problems)
    own = [p.resolve() for p in list_checkpoints(attempt / "checkpoints")]
    listed_paths = {(attempt / e["path"]).resolve() for e in listed if isinstance(e, dict)}
    for p in own:
        if p not in listed_paths:
            problems.append(f"{p}: a checkpoint on disk that manifest.json does not list")
    for p in listed_paths:
        if p.parent != (attempt / "checkpoints").resolve():
            problems.append(f"manifest.json checkpoints: {p} is not in this attempt")
    latest_path, latest_step = _ckpt_ref(attempt, latest, "latest")
    if own and latest_path != own[-1]:
        problems.append(
            f"manifest.json latest: {latest['path']} is not the newest checkpoint ({own[-1].name})"
        )
    return latest_step


def _check_against_records(
    attempt: Path, manifest: dict, latest_step: int, problems: list[str]
) -> None:
    """latest is the last train step; best is the first minimum of the validation records."""
    from iqtrain.metrics import read_metrics

    try:
        recs = read_metrics(attempt / "metrics.jsonl")
    except (OSError, ValueError, CheckpointError) as exc:
        problems.append(f"{attempt / 'metrics.jsonl'}: unreadable: {exc}")
        return
    val = [r for r in recs if isinstance(r, dict) and r.get("kind") == "val"]
    train = [r for r in recs if isinstance(r, dict) and r.get("kind") == "train"]
    if train and train[-1].get("step") != latest_step:
        problems.append(
            f"manifest.json latest.step: {latest_step}, but the last train record is step "
            f"{train[-1].get('step')}"
        )
    want = None
    try:
        for r in val:
            if want is None or r["loss"] < want["loss"]:
                want = r
    except (KeyError, TypeError) as exc:
        raise _Bad(f"{attempt / 'metrics.jsonl'}: a val record lacks its loss: {exc}") from None
    best = manifest.get("best")
    if want is None and best is not None:
        problems.append("manifest.json best: set, but no validation record exists")
    elif want is not None and best is None:
        problems.append(f"manifest.json best: missing; validation step {want['step']} is best")
    elif want is not None and best is not None:
        _, best_step = _ckpt_ref(attempt, best, "best")
        if best_step != want["step"] or best.get("val_loss") != want["loss"]:
            problems.append(
                f"manifest.json best: step {best_step}, val_loss {best.get('val_loss')!r}, "
                f"but the best validation record is step {want['step']}, loss {want['loss']!r}"
            )


def _check_inherited(attempt: Path, manifest: dict, info: dict, problems: list[str]) -> None:
    from iqtrain.metrics import MetricCursor, verify_prefix

    inherited = manifest.get("inherited_metrics")
    if inherited is not None:
        try:
            verify_prefix(attempt / "metrics.jsonl", MetricCursor.from_dict(inherited))
        except (KeyError, TypeError, ValueError) as exc:
            problems.append(f"manifest.json inherited_metrics: unreadable: {exc}")
        except CheckpointError as exc:
            problems.append(str(exc))
    elif info.get("parent") is not None:
        problems.append("manifest.json inherited_metrics: missing for a resumed attempt")
    if inherited is not None and info.get("parent") is None:
        problems.append("manifest.json inherited_metrics: set, but the attempt has no parent")


def _check_record(attempt: Path, manifest: dict, info: dict, problems: list[str]) -> None:
    """attempt.json against the evidence: final step and plan against the latest checkpoint,
    the parent reference against the parent's checkpoint (when it is still there)."""
    latest = manifest.get("latest")
    if isinstance(latest, dict) and isinstance(latest.get("path"), str):
        try:
            state = json.loads((attempt / latest["path"] / "state.json").read_text())
            if info.get("final_step") != state["step"]:
                problems.append(
                    f"attempt.json final_step: {info.get('final_step')!r}, but the latest "
                    f"checkpoint is step {state['step']}"
                )
            if info.get("plan") != state["plan"]:
                problems.append("attempt.json plan: differs from the latest checkpoint's plan")
        except (OSError, ValueError, KeyError, TypeError):
            pass  # the checkpoint checks report it
    parent = info.get("parent")
    if not isinstance(parent, dict):
        return
    try:
        ckpt = Path(parent["attempt"]) / "checkpoints" / parent["checkpoint"]
        if not (ckpt / "checkpoint.json").is_file():
            return  # the parent's checkpoint is gone (pruned or moved): nothing to compare
        if _sha256_file(ckpt / "checkpoint.json")["sha256"] != parent["checkpoint_json_sha256"]:
            problems.append(f"attempt.json parent: {ckpt} is not the checkpoint it records")
        state = json.loads((ckpt / "state.json").read_text())
        if state["step"] != parent["step"]:
            problems.append(
                f"attempt.json parent.step: {parent['step']}, {ckpt} is {state['step']}"
            )
        if manifest.get("inherited_metrics") != state["metrics"]:
            problems.append("manifest.json inherited_metrics: not the parent checkpoint's cursor")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problems.append(f"attempt.json parent: unreadable: {exc}")


def _verify_manifest(attempt: Path, manifest: Any, info: dict, check: AttemptCheck) -> None:
    """Every manifest field against the files it describes (problems appended to ``check``)."""
    if not isinstance(manifest, dict):
        raise _Bad("manifest.json: not a JSON object")
    if set(manifest) != _MANIFEST_KEYS:
        extra, missing = set(manifest) - _MANIFEST_KEYS, _MANIFEST_KEYS - set(manifest)
        check.problems.append(
            f"manifest.json: unexpected keys {sorted(extra)}, missing keys {sorted(missing)}"
        )
    if manifest.get("version") != 1:
        check.problems.append(f"manifest.json version: {manifest.get('version')!r}, expected 1")
    paths = [e.get("path") for e in manifest.get("checkpoints") or [] if isinstance(e, dict)]
    if len(paths) != len(set(paths)):
        check.problems.append("manifest.json checkpoints: a checkpoint is listed twice")
    metrics_ok = _check_files(attempt, manifest, info, check.problems)
    latest_step = _check_checkpoints(attempt, manifest, check.problems)
    if metrics_ok:
        _check_against_records(attempt, manifest, latest_step, check.problems)
    _check_inherited(attempt, manifest, info, check.problems)
    _check_record(attempt, manifest, info, check.problems)


def checkpoint_problems(ckpt: Path) -> list[str]:
    """Why checkpoint ``ckpt`` cannot be trusted (empty: it can).

    Its files against checkpoint.json, its state's step against its name, and the config and
    metric prefix of the attempt that wrote it against the hashes its state records.
    """
    from iqtrain.checkpoint import verify_checkpoint
    from iqtrain.metrics import MetricCursor, verify_prefix

    found = verify_checkpoint(ckpt)
    if found:
        return found
    owner = ckpt.parent.parent
    try:
        state = json.loads((ckpt / "state.json").read_text())  # its step: verify_checkpoint
        config_sha = _sha256_file(owner / "config.toml")["sha256"]
        if state["config_sha256"] != config_sha:
            return [f"{owner / 'config.toml'}: does not match {ckpt.name}"]
        verify_prefix(owner / "metrics.jsonl", MetricCursor.from_dict(state["metrics"]))
    except FileNotFoundError as exc:
        return [f"{exc.filename}: missing"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{ckpt / 'state.json'}: unreadable: {type(exc).__name__}: {exc}"]
    except CheckpointError as exc:
        return [str(exc)]
    return []


def _verify_checkpoints_only(attempt: Path, check: AttemptCheck) -> None:
    """An attempt without a manifest: each checkpoint, the config and the metric prefix."""
    from iqtrain.checkpoint import list_checkpoints

    for ckpt in list_checkpoints(attempt / "checkpoints"):
        check.problems.extend(checkpoint_problems(ckpt))


def _note_torn_tail(attempt: Path, check: AttemptCheck) -> None:
    """A stream cut mid-record by a kill: a note (no checkpoint's cursor covers the tail)."""
    from iqtrain.metrics import read_metric_stream

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
    from iqtrain.checkpoint import crash_leftovers

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
    if info["id"] != attempt.name:
        check.problems.append(f"attempt.json id: {info['id']!r} is not this attempt")
    if not (attempt / "config.toml").is_file():
        check.problems.append(f"{attempt / 'config.toml'}: missing")
    if not (attempt / "metrics.jsonl").is_file() and (attempt / "checkpoints").is_dir():
        check.problems.append(f"{attempt / 'metrics.jsonl'}: missing")
    for left in [*crash_leftovers(attempt), *crash_leftovers(attempt / "checkpoints")]:
        check.notes.append(f"{left}: leftover of an interrupted write or prune (ignored)")
    if status == "crashed":
        check.notes.append(
            f"{attempt}: crashed (attempt.json says running, but no process holds its lock); "
            "resume it from its newest verified checkpoint"
        )
    manifest_path = attempt / "manifest.json"
    if not manifest_path.is_file():
        if status == "completed":
            check.problems.append(f"{manifest_path}: missing, but attempt.json says completed")
        _verify_checkpoints_only(attempt, check)
        _note_torn_tail(attempt, check)
        check.problems = list(dict.fromkeys(check.problems))
        return check
    if status in ("failed", "interrupted"):  # a manifest is published only on success
        check.problems.append(f"attempt.json status: {status}, but manifest.json exists")
    elif status != "completed":  # killed between publishing and recording the end
        check.notes.append(f"{attempt}: manifest.json exists but attempt.json says {status}")
    try:
        manifest = json.loads(manifest_path.read_text())
        _verify_manifest(attempt, manifest, info, check)
    except (OSError, ValueError) as exc:
        check.problems.append(f"{manifest_path}: unreadable: {exc}")
    except _Bad as exc:
        check.problems.append(str(exc))
    check.problems = list(dict.fromkeys(check.problems))  # one line per problem
    return check


def verify_attempt(attempt: Path) -> list[str]:
    """The problems :func:`check_attempt` finds (empty: the attempt verifies)."""
    return check_attempt(attempt).problems

"""Verification of an attempt's manifest: every field against the files it describes.

Every state.json is read through :mod:`iqtrain.checkpoint.state` (the one owner of its keys):
:class:`~iqtrain.checkpoint.state.CheckpointState` where a whole state is meant, its
``recorded_*`` readers for the fields verify binds before the rest is trusted (a state
malformed elsewhere is refused when it is restored, not skipped as untrusted). Torch-free
(``verify`` and ``report`` use it through :mod:`iqtrain.evidence.verify`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from iqtrain import objectives
from iqtrain.checkpoint.files import (
    checkpoint_name,
    checkpoint_step,
    list_checkpoints,
    verify_checkpoint,
)
from iqtrain.checkpoint.state import (
    CheckpointState,
    classes_problem,
    init_record_problem,
    recorded_bindings,
    recorded_classes,
    recorded_step,
)
from iqtrain.errors import CheckpointError
from iqtrain.evidence.attempts import utc_now
from iqtrain.evidence.data_record import data_binding, manifest_data_problems
from iqtrain.evidence.metrics import MetricCursor, read_metrics, verify_prefix
from iqtrain.objectives import Objective
from iqtrain.storage import file_digest, write_json_atomic

__all__ = [
    "ManifestError",
    "checkpoint_problems",
    "classes_problems",
    "init_problems",
    "publish_manifest",
    "verify_manifest",
]


def checkpoint_problems(ckpt: Path) -> list[str]:
    """Why checkpoint ``ckpt`` cannot be trusted (empty: it can).

    Its files against checkpoint.json, its state's step against its name, and the config and
    metric prefix of the attempt that wrote it against the hashes its state records.
    """

    found = verify_checkpoint(ckpt)
    if found:
        return found
    owner = ckpt.parent.parent
    try:
        config_sha256, cursor = recorded_bindings(ckpt)  # its step: verify_checkpoint
        config_sha = file_digest(owner / "config.toml")["sha256"]
        if config_sha256 != config_sha:
            return [f"{owner / 'config.toml'}: does not match {ckpt.name}"]
        verify_prefix(owner / "metrics.jsonl", MetricCursor.from_dict(cursor))
    except FileNotFoundError as exc:
        return [f"{exc.filename}: missing"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [f"{ckpt / 'state.json'}: unreadable: {type(exc).__name__}: {exc}"]
    except CheckpointError as exc:
        return [str(exc)]
    return []


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
    got = file_digest(path)
    if got["bytes"] != entry["bytes"] or got["sha256"] != entry["sha256"]:
        return f"{path}: does not match manifest.json (changed after publication)"
    return None


_MANIFEST_KEYS = frozenset(
    ("version", "attempt", "parent", "config", "metrics", "inherited_metrics")
    + ("latest", "best", "checkpoints", "published")
)


class ManifestError(Exception):
    """A manifest field is missing or has the wrong type (reported as one problem line)."""


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise ManifestError(f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise ManifestError(f"{where}.{key}: unexpected value {value!r}")
    return value


def _ckpt_ref(attempt: Path, entry: Any, where: str) -> tuple[Path, int]:
    path = _field(entry, "path", str, where)
    step = _field(entry, "step", int, where)
    _field(entry, "bytes", int, where)
    _field(entry, "sha256", str, where)
    return (attempt / path).resolve(), step


def _check_checkpoint_ref(attempt: Path, entry: dict, where: str, problems: list[str]) -> None:

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
        state_step = recorded_step(ckpt)
    except CheckpointError as exc:
        problems.append(str(exc))
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

    listed = _field(manifest, "checkpoints", list, "manifest.json")
    latest = _field(manifest, "latest", dict, "manifest.json")
    best = manifest.get("best")
    if best is not None and not isinstance(best, dict):
        raise ManifestError(f"manifest.json.best: unexpected value {best!r}")
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
    """latest is the last train step; best is the first of the best validation records by the
    objective's monitored field (:meth:`~iqtrain.objectives.Objective.best_record`)."""

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
    objective = _objective(attempt)
    try:
        want = (objective or objectives.get("mse")).best_record(val)
    except ValueError as exc:
        raise ManifestError(f"{attempt / 'metrics.jsonl'}: {exc}") from None
    _check_best(attempt, manifest.get("best"), want, objective, problems)


def _check_best(
    attempt: Path, best: Any, want: Any, objective: Objective | None, problems: list[str]
) -> None:
    """The manifest's ``best`` against the best validation record ``want``: its step and loss,
    and a labelled objective's accuracy (which no other objective records)."""
    labelled = objective is not None and objective.labelled
    if isinstance(best, dict) and objective is not None and not labelled and "val_accuracy" in best:
        problems.append(
            f"manifest.json best: records val_accuracy, but config.toml model.objective is "
            f"{objective.name!r}"
        )
    if want is None and best is not None:
        problems.append("manifest.json best: set, but no validation record exists")
    elif want is not None and best is None:
        problems.append(f"manifest.json best: missing; validation step {want['step']} is best")
    elif want is not None and best is not None and labelled:
        _, best_step = _ckpt_ref(attempt, best, "best")
        got = (best_step, best.get("val_accuracy"), best.get("val_loss"))
        if got != (want["step"], want["accuracy"], want.get("loss")):
            problems.append(
                f"manifest.json best: step {best_step}, val_accuracy "
                f"{best.get('val_accuracy')!r}, val_loss {best.get('val_loss')!r}, but the best "
                f"validation record (the first of the highest accuracy) is step {want['step']}, "
                f"accuracy {want['accuracy']!r}, loss {want.get('loss')!r}"
            )
    elif want is not None and best is not None:
        _, best_step = _ckpt_ref(attempt, best, "best")
        if best_step != want["step"] or best.get("val_loss") != want["loss"]:
            problems.append(
                f"manifest.json best: step {best_step}, val_loss {best.get('val_loss')!r}, "
                f"but the best validation record is step {want['step']}, loss {want['loss']!r}"
            )


def _objective(attempt: Path) -> Objective | None:
    """The objective of the attempt's config.toml ``model.objective`` (bound by its hash; "mse"
    when it names none); None when it cannot be read or names none iqtrain knows (the config
    checks report that, and the checks that depend on the objective keep to what they check
    for "mse")."""
    import tomllib

    try:
        model = tomllib.loads((attempt / "config.toml").read_text()).get("model", {})
        return objectives.get(model.get("objective", "mse"))
    except (OSError, ValueError, AttributeError):
        return None


def classes_problems(attempt: Path, info: dict) -> list[str]:
    """The class names of a labelled objective's attempt: attempt.json ``classes``
    is well formed (:func:`~iqtrain.checkpoint.state.classes_problem`) and equal to the
    ``classes`` of every checkpoint of the attempt (their state.json, bound by checkpoint.json
    and the manifest); any other objective records none in either. Nothing is checked when
    config.toml cannot be read (the config checks report it)."""
    objective = _objective(attempt)
    if objective is None:
        return []
    problems: list[str] = []
    wanted = info.get("classes")
    if not objective.labelled:
        if "classes" in info:
            problems.append(
                "attempt.json classes: recorded, but config.toml model.objective is "
                f"{objective.name!r}"
            )
        wanted = None
    elif wanted is None:
        return [
            f"attempt.json classes: missing, but config.toml model.objective is {objective.name!r}"
        ]
    elif (problem := classes_problem(wanted)) is not None:
        return [f"attempt.json {problem}"]
    for ckpt in list_checkpoints(attempt / "checkpoints"):
        got = _state_classes(ckpt)
        if got is not _UNREADABLE and got != wanted:
            problems.append(
                f"{ckpt / 'state.json'}: classes {got!r:.200} differ from attempt.json classes "
                f"{wanted!r:.200}"
            )
    return problems


def _state_classes(ckpt: Path) -> Any:
    """A checkpoint's recorded ``classes`` as written (None when absent), so a malformed one
    differs from attempt.json's; the checkpoint checks report a state.json that is not JSON."""
    try:
        return recorded_classes(ckpt)
    except CheckpointError:
        return _UNREADABLE


def _check_inherited(attempt: Path, manifest: dict, info: dict, problems: list[str]) -> None:

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
            state = CheckpointState.read(attempt / latest["path"])
        except CheckpointError:
            pass  # the checkpoint checks report it
        else:
            if info.get("final_step") != state.step:
                problems.append(
                    f"attempt.json final_step: {info.get('final_step')!r}, but the latest "
                    f"checkpoint is step {state.step}"
                )
            if info.get("plan") != state.plan:
                problems.append("attempt.json plan: differs from the latest checkpoint's plan")
    parent = info.get("parent")
    if not isinstance(parent, dict):
        return
    try:
        ckpt = Path(parent["attempt"]) / "checkpoints" / parent["checkpoint"]
        if not (ckpt / "checkpoint.json").is_file():
            return  # the parent's checkpoint is gone (pruned or moved): nothing to compare
        if file_digest(ckpt / "checkpoint.json")["sha256"] != parent["checkpoint_json_sha256"]:
            problems.append(f"attempt.json parent: {ckpt} is not the checkpoint it records")
        step, (_, cursor) = recorded_step(ckpt), recorded_bindings(ckpt)
        if step != parent["step"]:
            problems.append(f"attempt.json parent.step: {parent['step']}, {ckpt} is {step}")
        if manifest.get("inherited_metrics") != cursor:
            problems.append("manifest.json inherited_metrics: not the parent checkpoint's cursor")
    except (OSError, ValueError, KeyError, TypeError, CheckpointError) as exc:
        problems.append(f"attempt.json parent: unreadable: {exc}")


def _init_config(attempt: Path) -> tuple[str, str | None] | None:
    """``([init] from, which)`` of the attempt's config.toml (bound by its hash); None when it
    cannot be read (the config checks report that)."""
    import tomllib

    try:
        tables = tomllib.loads((attempt / "config.toml").read_text())
        init = tables.get("init", {})
        return str(init.get("from", "")), init.get("which")
    except (OSError, ValueError, AttributeError):
        return None


def _init_source(init: dict, named: str, which: str | None) -> str | None:
    """Whether the record names the checkpoint ``[init] from`` / ``which`` resolve to: the
    checkpoint directory named, or a checkpoint of the attempt named (``best`` may live in an
    ancestor: an attempt of the same run directory)."""
    if "package" in init:  # a model package: the directory named
        source = Path(named).expanduser().resolve()
        if Path(init["package"]) != source:
            return f"it records package {init['package']}, config.toml names {source}"
        return None
    source, recorded = Path(named).resolve(), Path(init["attempt"])
    if source.parent.name == "checkpoints" and re.fullmatch(r"step_[0-9]+", source.name):
        if (recorded, init["checkpoint"]) != (source.parent.parent, source.name):
            return f"it records {recorded}/{init['checkpoint']}, config.toml names {source}"
        return None
    if which is not None and which.startswith("step_"):
        wanted = f"step_{int(which[5:]):08d}"
        if (recorded, init["checkpoint"]) != (source, wanted):
            return f"it records {recorded}/{init['checkpoint']}, config.toml names {named} {which}"
    elif recorded != source and (which not in (None, "best") or recorded.parent != source.parent):
        return f"it records {recorded}, config.toml names {named} ({which or 'best'})"
    return None


def init_problems(attempt: Path, info: dict) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of attempt.json ``init`` (docs/design.md "What verify checks"): present
    exactly when config.toml's ``[init] from`` names a source, and then well formed, naming that
    source, equal to the ``init`` every checkpoint of the attempt binds in its state.json, and,
    along the whole chain of sources while each exists, its ``model.safetensors`` is the
    recorded ``model_sha256`` (:func:`_init_chain`; a source gone is a note)."""
    init, config = info.get("init"), _init_config(attempt)
    if config is None:
        return [], []
    named, which = config
    if init is None:
        missing = [f"attempt.json init: missing, but config.toml [init] from = {named!r}"]
        return (missing if named else []), []
    if not named:
        return ["attempt.json init: recorded, but config.toml has no [init] from"], []
    problem = init_record_problem(init) or _init_source(init, named, which)
    if problem is not None:
        return [f"attempt.json init: {problem}"], []
    problems = [
        f"{ckpt / 'state.json'}: init differs from attempt.json init"
        for ckpt in list_checkpoints(attempt / "checkpoints")
        if _state_init(ckpt) not in (init, _UNREADABLE)
    ]
    chain_problems, notes = _init_chain(init)
    return problems + chain_problems, notes


#: Links of an ``init`` chain followed at most (a longer chain, or a loop, is a problem).
MAX_INIT_CHAIN = 64


def _init_chain(init: dict) -> tuple[list[str], list[str]]:
    """``(problems, notes)`` of the whole ``init`` chain from ``init``: each source's weights
    are the ``model_sha256`` its child recorded, then that source's own ``init`` (an attempt's
    attempt.json; a package's lineage.json names its source without a path: the chain ends
    there). A source gone is a note and ends the chain; a changed one is a problem."""
    problems: list[str] = []
    seen: set[str] = set()
    link: Any = init
    for _ in range(MAX_INIT_CHAIN):
        if not isinstance(link, dict) or init_record_problem(link) is not None:
            return problems, []  # the chain's end (or a record the source's own verify names)
        weights = (
            Path(link["package"]) / "model.safetensors"
            if "package" in link
            else Path(link["attempt"]) / "checkpoints" / link["checkpoint"] / "model.safetensors"
        )
        if os.fspath(weights) in seen:
            return [*problems, f"attempt.json init: the chain loops at {weights}"], []
        seen.add(os.fspath(weights))
        if not weights.is_file():
            return problems, [f"{weights}: the init source is gone; its SHA-256 is recorded only"]
        try:
            got = file_digest(weights)["sha256"]
        except OSError as exc:
            return [*problems, f"{weights}: unreadable: {exc.strerror or exc}"], []
        if got != link["model_sha256"]:
            problems.append(
                f"attempt.json init: {weights} is not the weights it records (sha256 {got[:16]}…)"
            )
        if "package" in link:
            return problems, []
        try:
            link = json.loads((Path(link["attempt"]) / "attempt.json").read_text()).get("init")
        except (OSError, ValueError, AttributeError):
            return problems, []
    return [*problems, f"attempt.json init: a chain longer than {MAX_INIT_CHAIN} sources"], []


_UNREADABLE = object()


def _state_init(ckpt: Path) -> Any:
    """A checkpoint's recorded ``init`` (the checkpoint checks report one that cannot be read)."""
    try:
        return CheckpointState.read(ckpt).init
    except CheckpointError:
        return _UNREADABLE


def verify_manifest(attempt: Path, manifest: Any, info: dict, problems: list[str]) -> None:
    """Every manifest field against the files it describes (problems appended to
    ``problems``); :class:`ManifestError` when the manifest is not even shaped like one."""
    if not isinstance(manifest, dict):
        raise ManifestError("manifest.json: not a JSON object")
    # Optional: written since early stopping, [init] and the data record exist.
    keys = set(manifest) - {"stopped_early", "init", "data"}
    if keys != _MANIFEST_KEYS:
        extra, missing = keys - _MANIFEST_KEYS, _MANIFEST_KEYS - keys
        problems.append(
            f"manifest.json: unexpected keys {sorted(extra)}, missing keys {sorted(missing)}"
        )
    if manifest.get("version") != 1:
        problems.append(f"manifest.json version: {manifest.get('version')!r}, expected 1")
    paths = [e.get("path") for e in manifest.get("checkpoints") or [] if isinstance(e, dict)]
    if len(paths) != len(set(paths)):
        problems.append("manifest.json checkpoints: a checkpoint is listed twice")
    metrics_ok = _check_files(attempt, manifest, info, problems)
    latest_step = _check_checkpoints(attempt, manifest, problems)
    if metrics_ok:
        _check_against_records(attempt, manifest, latest_step, problems)
    _check_inherited(attempt, manifest, info, problems)
    _check_record(attempt, manifest, info, problems)
    if manifest.get("init") != info.get("init"):
        problems.append("manifest.json init: differs from attempt.json init")
    problems.extend(manifest_data_problems(manifest, info))
    _check_end(attempt, manifest, info, latest_step, problems)


def _early_stop_settings(attempt: Path) -> tuple[int, int, float]:
    """(early_stop_patience, eval_every, early_stop_min_delta) from the attempt's config.toml
    (bound by its hash)."""
    import tomllib

    try:
        training = tomllib.loads((attempt / "config.toml").read_text()).get("training", {})
        return (
            int(training.get("early_stop_patience", 0)),
            int(training.get("eval_every", 0)),
            float(training.get("early_stop_min_delta", 0.0)),
        )
    except (OSError, ValueError, TypeError, AttributeError):
        return 0, 0, 0.0  # the config checks report an unreadable config


def _check_end(
    attempt: Path, manifest: dict, info: dict, latest_step: int | None, problems: list[str]
) -> None:
    """A completed attempt ends at its plan's max_steps, or earlier with a ``stopped_early``
    entry that names its last step and its best step, written by an attempt whose config has
    early stopping on, at a validation step, whose latest state and validation records both
    count ``early_stop_patience`` validations without an improvement."""
    plan = info.get("plan")
    max_steps = plan.get("max_steps") if isinstance(plan, dict) else None
    stopped = manifest.get("stopped_early")
    if latest_step is None or not isinstance(max_steps, int):
        return
    if stopped is None:
        if latest_step != max_steps:
            problems.append(
                f"manifest.json latest: step {latest_step}, but the plan ends at step "
                f"{max_steps} and no stopped_early entry says why it ended there"
            )
        return
    problem = _stopped_early_entry(manifest, stopped, latest_step, max_steps)
    if problem is None:
        problem = _stopped_early_settings(attempt, latest_step)
    if problem is None:
        problem = _stopped_early_counts(attempt, manifest, info)
    if problem is not None:
        problems.append(f"manifest.json stopped_early: {problem}")


def _stopped_early_entry(
    manifest: dict, stopped: Any, latest_step: int, max_steps: int
) -> str | None:
    best = manifest.get("best")
    best_step = best.get("step") if isinstance(best, dict) else None
    if (
        not isinstance(stopped, dict)
        or set(stopped) != {"step", "best_step", "reason"}
        or not isinstance(stopped["reason"], str)
    ):
        return f"malformed: {stopped!r}"
    if stopped["step"] != latest_step or not latest_step < max_steps:
        return (
            f"step {stopped['step']!r}, but the latest checkpoint is step {latest_step} of a "
            f"plan of {max_steps}"
        )
    if stopped["best_step"] != best_step:
        return f"best_step {stopped['best_step']!r}, but best is step {best_step!r}"
    return None


def _stopped_early_settings(attempt: Path, latest_step: int) -> str | None:
    patience, eval_every, _ = _early_stop_settings(attempt)
    if patience <= 0:
        return "set, but config.toml has early stopping off (training.early_stop_patience = 0)"
    if eval_every <= 0 or latest_step % eval_every:
        return f"step {latest_step} is not a validation step (training.eval_every = {eval_every})"
    return None


def _stopped_early_counts(attempt: Path, manifest: dict, info: dict) -> str | None:
    """Early stopping ends an attempt when ``early_stop_patience`` validations in a row did not beat
    the reference by more than ``early_stop_min_delta`` (a lower loss; a higher accuracy for a
    labelled objective): the latest checkpoint's loop state must count that many, and so must the
    validation records this attempt wrote, replayed from the count its parent's checkpoint carried
    (:meth:`~iqtrain.objectives.Objective.beats`)."""

    patience, _, min_delta = _early_stop_settings(attempt)
    objective = _objective(attempt) or objectives.get("mse")
    try:
        state = CheckpointState.read(attempt / manifest["latest"]["path"])
        stale = state.stale_validations
        ref, count = None, 0
        parent = info.get("parent")
        if isinstance(parent, dict):
            owner = Path(parent["attempt"])
            ref, count = CheckpointState.read(
                owner / "checkpoints" / parent["checkpoint"]
            ).early_stop
        inherited = manifest.get("inherited_metrics") or {}
        records = read_metrics(attempt / "metrics.jsonl")[int(inherited.get("records", 0)) :]
    except (CheckpointError, OSError, KeyError, TypeError, ValueError) as exc:
        return f"cannot check its counts: {exc}"
    if stale != patience:
        return (
            f"the latest state counts {stale} validation(s) without an improvement, but "
            f"training.early_stop_patience is {patience}"
        )
    for record in records:
        if record.get("kind") != "val":
            continue
        value = objective.value_of(record)
        if value is None:
            return f"a validation record has no {objective.monitor}: {record!r}"
        if objective.beats(value, ref, min_delta):
            ref, count = value, 0
        else:
            count += 1
    if count != patience:
        return (
            f"the validation records count {count} in a row without an improvement larger "
            f"than {min_delta:g}, but training.early_stop_patience is {patience}"
        )
    return None


def _ref(attempt: Path, path: Path, **extra: Any) -> dict[str, Any]:
    index = file_digest(path / "checkpoint.json")
    return {"path": os.path.relpath(path, attempt), "step": checkpoint_step(path), **index, **extra}


def _best_ref(
    attempt: Path, path: Path, val_loss: float, val_accuracy: float | None = None
) -> dict[str, Any]:
    if val_accuracy is None:  # the other objectives' best is what it always was
        return _ref(attempt, path, val_loss=val_loss)
    return _ref(attempt, path, val_loss=val_loss, val_accuracy=val_accuracy)


def publish_manifest(
    attempt: Path,
    *,
    config_sha: str,
    records: int,
    inherited: dict | None,
    checkpoints: list[Path],
    best: tuple[Path, float] | tuple[Path, float, float | None] | None,
    record: dict,
    stopped_early: dict | None = None,
) -> None:
    """Freeze the evidence and bind it: config, metric stream, every checkpoint, latest, best
    (``(checkpoint, validation loss[, validation accuracy])``: the accuracy of a labelled
    objective's attempt, written as ``val_accuracy`` when it is not None), why the attempt ended
    before its max_steps when early stopping ended it, and, as ``record`` (attempt.json) states
    them, the parent a resume continues, the source of the lineage's first weights (``init``) and,
    by hash, the data record (``data``: the sample rate and the inputs read past,
    :func:`~iqtrain.evidence.data_record.data_binding`)."""
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
        "parent": record.get("parent"),
        "config": {"path": "config.toml", **cfg},
        "metrics": {"path": "metrics.jsonl", "records": records, **file_digest(metrics_path)},
        "inherited_metrics": inherited,
        "latest": _ref(attempt, checkpoints[-1]),
        "best": None if best is None else _best_ref(attempt, *best),
        "checkpoints": [_ref(attempt, p) for p in checkpoints],
        "stopped_early": stopped_early,
        "published": utc_now(),
    }
    if record.get("init") is not None:  # only then: a manifest without one keeps its shape
        manifest["init"] = record["init"]
    if record.get("data") is not None:  # every attempt since the record exists
        manifest["data"] = data_binding(record["data"])
    write_json_atomic(attempt / "manifest.json", manifest)

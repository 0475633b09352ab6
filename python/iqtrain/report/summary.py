"""``iqtrain report DIR``: a plain-text summary of an attempt and its metric stream.

Never a traceback: a directory that is not an attempt (no ``attempt.json``, unreadable JSON, not
an object, no ``id``/``status``) or a metric stream damaged before its last line raises
``CheckpointError`` with one line naming the file. Everything else is shown as far as it is
there: a torn trailing record (a writer killed mid-record) becomes a note, a crashed attempt is
shown as ``crashed``, and missing optional fields (device name, samples/s, baselines, …) are
left out. This module imports no torch.

The readers the plot and TensorBoard export share live here too: :func:`load_attempt` (the
attempt record, its status and its metric stream) and :func:`resume_points` (where each
ancestor of a resumed attempt was resumed, found by following ``attempt.json``'s ``parent``).
"""

from __future__ import annotations

import functools
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iqtrain import objectives
from iqtrain.checkpoint.files import list_checkpoints
from iqtrain.console import resume_command
from iqtrain.errors import CheckpointError
from iqtrain.evidence.lock import attempt_status, read_attempt_info
from iqtrain.evidence.metrics import MetricStream, read_metric_stream
from iqtrain.objectives import Objective

__all__ = [
    "AttemptView",
    "Lineage",
    "ResumePoint",
    "best_of",
    "load_attempt",
    "number",
    "report",
    "probe_summary",
    "resume_points",
]

REQUIRED_KEYS = ("id", "status")


def number(record: dict[str, Any], key: str) -> float | None:
    """``record[key]`` if it is a finite number (bools are not numbers here), else None."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def probe_summary(record: dict[str, Any]) -> str:
    """One probe record as one line: every accuracy with its standard error over annotations
    (``± -`` where the record has none: older records, or fewer than two annotations)."""

    def acc(key: str) -> str:
        value, se = number(record, key), number(record, f"{key}_se")
        return "-" if value is None else f"{value:.4f} ± " + ("-" if se is None else f"{se:.4f}")

    parts = [f"random-init {acc('random_init_accuracy')}"]
    parts.append(f"classical features {acc('classical_accuracy')}")
    if "combined_accuracy" in record:
        parts.append(f"classical + pretrained {acc('combined_accuracy')}")
    parts.append(f"chance {_fmt(number(record, 'chance'), '.4f')}")
    return f"accuracy {acc('accuracy')}; " + ", ".join(parts)


def _fmt(value: float | None, spec: str) -> str:
    return "?" if value is None else format(value, spec)


def _db(loss: float | None) -> str:
    """A normalised MSE as SNR in dB (``-10 log10 loss``); ``?`` when undefined."""
    return "?" if loss is None or loss <= 0 else f"{-10 * math.log10(loss):.2f} dB"


def _load_info(attempt: Path) -> dict[str, Any]:
    path = attempt / "attempt.json"
    if not attempt.is_dir():
        raise CheckpointError(f"{attempt}: not a directory")
    try:
        info = read_attempt_info(attempt)
    except FileNotFoundError:
        raise CheckpointError(f"{attempt}: not an attempt directory (no attempt.json)") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: unreadable: {exc.strerror or exc}") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, not an object
        raise CheckpointError(f"{path}: unreadable: {' '.join(str(exc).split())}") from None
    missing = [k for k in REQUIRED_KEYS if not isinstance(info.get(k), str)]
    if missing:
        raise CheckpointError(
            f"{path}: not an attempt record (no {', '.join(repr(k) for k in missing)})"
        )
    return info


def _header(attempt: Path, info: dict[str, Any], status: str) -> list[str]:
    device = info.get("device")
    device = device if isinstance(device, dict) else {}
    parts = [str(device[k]) for k in ("name", "precision") if device.get(k)]
    lines = [f"attempt {attempt} ({status})" + (f", device {', '.join(parts)}" if parts else "")]
    world = info.get("world")
    world = world if isinstance(world, dict) else {}
    size = world.get("size")
    if isinstance(size, int) and size > 1:  # under torchrun: how many, connected and held how
        how = [str(world[k]) for k in ("backend", "parallel") if isinstance(world.get(k), str)]
        lines[0] += f", {size} ranks" + (f" ({', '.join(how)})" if how else "")
    parent = info.get("parent")
    if isinstance(parent, dict):
        lines.append(
            f"  resumed from {parent.get('attempt', '?')} at step {parent.get('step', '?')}"
        )
    init = info.get("init")
    if isinstance(init, dict):  # [init] from: the lineage's first weights
        where = os.path.join(
            str(init.get("attempt", "?")), "checkpoints", str(init.get("checkpoint"))
        )
        lines.append(
            f"  initialised from {where} (step {init.get('step', '?')}, model.safetensors "
            f"sha256 {str(init.get('model_sha256', '?'))[:16]}…)"
        )
    times = [f"{k} {info[k]}" for k in ("started", "finished") if isinstance(info.get(k), str)]
    if times:
        lines.append("  " + ", ".join(times))
    if status == "crashed":
        lines.append(
            "  note: attempt.json says running but no process holds its lock: the process was "
            f"killed; {_how_to_resume(attempt, world)}"
        )
    if info.get("error"):
        lines.append(f"  error: {' '.join(str(info['error']).split())}")
    return lines


#: Refused inputs ``report`` shows (the rest are counted; attempt.json lists every one).
REFUSED_SHOWN = 3


def _data_lines(info: dict[str, Any]) -> list[str]:
    """The sample rate the attempt trained at and the inputs it read past (attempt.json
    ``data``: their count and the first :data:`REFUSED_SHOWN`); nothing for an attempt written
    before the record existed."""
    from iqtrain.data.sources import format_rate  # here only: report starts without it

    data = info.get("data")
    if not isinstance(data, dict):
        return []
    rate = data.get("sample_rate")
    if rate is None:
        line = "  data: no one sample rate (none recorded, or several: data.sample_rate = 'any')"
    else:
        value = number(data, "sample_rate")
        line = f"  data: {'?' if value is None else format_rate(value)}"
    refused = data.get("refused")
    refused = refused if isinstance(refused, dict) else {}
    entries = [
        (key, entry)
        for key, listed in refused.items()
        if isinstance(listed, list)
        for entry in listed
    ]
    if not entries:
        return [line]
    lines = [f"{line}; {len(entries)} input(s) skipped as unreadable (data.skip_invalid):"]
    for key, entry in entries[:REFUSED_SHOWN]:
        reason = entry.get("reason") if isinstance(entry, dict) else None
        lines.append(f"    {key}: {' '.join(str(reason).split())}")
    if len(entries) > REFUSED_SHOWN:
        lines.append(f"    … and {len(entries) - REFUSED_SHOWN} more (attempt.json data.refused)")
    return lines


def _how_to_resume(attempt: Path, world: Any) -> str:
    """The resume command of a crashed attempt, launched as it was (the ranks per node from its
    hosts); or why there is none (it wrote no checkpoint)."""
    if not list_checkpoints(attempt / "checkpoints"):
        return "it wrote no checkpoint, so there is nothing to resume: run its config again"
    size = world.get("size") if isinstance(world, dict) else None
    hosts = world.get("hosts") if isinstance(world, dict) else None
    size = size if isinstance(size, int) and not isinstance(size, bool) else 1
    per_node = None
    if isinstance(hosts, list) and hosts and size % len(set(map(str, hosts))) == 0:
        per_node = size // len(set(map(str, hosts)))
    return f"resume with: {resume_command(attempt, size, per_node)}"


def _train_lines(train: list[dict[str, Any]]) -> list[str]:
    if not train:
        return []
    last = train[-1]
    line = (
        f"  {len(train)} train steps, last step {last.get('step', '?')} "
        f"loss {_fmt(number(last, 'loss'), '.5f')}, "
        f"clipped {sum(r.get('clipped') is True for r in train)}, "
        f"spikes {sum(r.get('spike') is True for r in train)}"
    )
    # The first 10% are warm-up (compilation, caches): the median of the rest.
    sps = sorted(
        v for r in train[len(train) // 10 :] if (v := number(r, "samples_per_s")) is not None
    )
    if sps:
        line += f", median samples/s {sps[len(sps) // 2]:.0f}"
    return [line]


def best_of(objective: Objective, val: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best of the validation records that carry the objective's monitored value, by its
    rule (the first of the best: the record ``best`` marks, the one verify checks); None when
    no record has one."""
    usable = [r for r in val if (v := objective.value_of(r)) is not None and not math.isnan(v)]
    best = objective.best_record(usable)
    return None if best is None else dict(best)


def _class_accuracy(record: dict[str, Any]) -> str:
    """``name 0.XXXX, …`` of a record's ``class_accuracy`` (``-``: no validation window of
    that class)."""
    per = record.get("class_accuracy")
    per = per if isinstance(per, dict) else {}
    return ", ".join(
        f"{name} " + ("-" if value is None else _fmt(number(per, name), ".4f"))
        for name, value in per.items()
    )


def _labelled_lines(objective: Objective, val: list[dict[str, Any]]) -> list[str]:
    """The validations of a labelled objective's attempt: accuracy and loss (cross-entropy,
    nats per window), the majority-class baseline, the best (highest accuracy) and its
    classes."""
    lines = []
    base = next((r for r in val if "baseline_majority_accuracy" in r), None)
    if base:
        majority = _fmt(number(base, "baseline_majority_accuracy"), ".4f")
        lines.append(f"  baselines: majority class {majority}")
    for r in val:
        lines.append(
            f"  val step {str(r.get('step', '?')):>7}: loss {_fmt(number(r, 'loss'), '.5f')}, "
            f"accuracy {_fmt(number(r, 'accuracy'), '.4f')}"
            + ("  best" if r.get("best") is True else "")
        )
    best = best_of(objective, val)
    if best is not None:
        step = best.get("step", "?")
        lines.append(
            f"  best val accuracy {_fmt(number(best, 'accuracy'), '.4f')} at step {step} "
            f"(loss {_fmt(number(best, 'loss'), '.5f')})"
        )
        if isinstance(best.get("class_accuracy"), dict) and best["class_accuracy"]:
            lines.append(f"  class accuracy at step {step}: {_class_accuracy(best)}")
    return lines


def _val_lines(objective: Objective, val: list[dict[str, Any]]) -> list[str]:
    if objective.labelled:
        return _labelled_lines(objective, val)
    lines = []
    base = next((r for r in val if "baseline_zero_loss" in r), None)
    if base:
        lines.append(
            f"  baselines: zero-prediction {_fmt(number(base, 'baseline_zero_loss'), '.5f')}, "
            f"copy-last-patch {_fmt(number(base, 'baseline_copy_last_loss'), '.5f')}"
        )
    for r in val:
        snr = number(r, "pred_snr_db")
        # The NMSE of the predicted mean, when the objective's loss is another number (and
        # the dB are the NMSE's: records before objectives had only "loss").
        nmse = number(r, "nmse")
        extra = "" if nmse is None or nmse == number(r, "loss") else f", nmse {nmse:.5f}"
        lines.append(
            f"  val step {str(r.get('step', '?')):>7}: loss {_fmt(number(r, 'loss'), '.5f')}"
            + extra
            + ("" if snr is None else f" ({snr:.2f} dB)")
            + ("  best" if r.get("best") is True else "")
        )
    best = best_of(objective, val)
    if best is not None:
        loss, nmse = best["loss"], number(best, "nmse")
        db = _db(loss if nmse is None else nmse)
        lines.append(f"  best val loss {loss:.5f} at step {best.get('step', '?')} ({db})")
    return lines


@dataclass(frozen=True)
class AttemptView:
    """What an attempt directory shows: its record, its status and its metric stream.

    ``stream`` is None when ``metrics.jsonl`` was never created. ``status`` is
    :func:`~iqtrain.evidence.lock.attempt_status` (``crashed`` included), or
    ``"<status>? lock …"``
    when the lock file cannot be opened.
    """

    path: Path
    info: dict[str, Any]
    status: str
    stream: MetricStream | None

    def records(self, kind: str) -> list[dict[str, Any]]:
        """The complete records of ``kind`` (``train``, ``val``, ``probe``, …), in order."""
        return [r for r in self.stream.records if r.get("kind") == kind] if self.stream else []

    @functools.cached_property
    def objective(self) -> Objective:
        """The attempt's objective: config.toml's ``model.objective``; when that cannot be
        read, the one its validation records fit (a labelled objective's hold an accuracy)."""
        try:
            with open(self.path / "config.toml", "rb") as f:
                return objectives.get(tomllib.load(f).get("model", {}).get("objective", "mse"))
        except (OSError, ValueError, AttributeError):
            labelled = any("accuracy" in r for r in self.records("val"))
            return next(o for o in objectives.REGISTRY.values() if o.labelled == labelled)


def load_attempt(attempt: Path) -> AttemptView:
    """Read attempt directory ``attempt``; ``CheckpointError`` (one line naming the file) if it
    is not one or its metric stream is damaged before the last line (a torn last record is
    tolerated: ``stream.torn``)."""
    attempt = Path(attempt)
    info = _load_info(attempt)
    try:
        status = attempt_status(attempt, info)
    except OSError as exc:  # the lock file cannot be opened: say so, report the rest
        status = f"{info['status']}? lock {exc.strerror or exc}"
    metrics = attempt / "metrics.jsonl"
    stream = read_metric_stream(metrics) if metrics.exists() else None
    return AttemptView(attempt, info, status, stream)


@dataclass(frozen=True)
class ResumePoint:
    """An attempt of the lineage was resumed from ``parent`` (attempt id ``parent_id``) at
    ``step`` (None if its ``attempt.json`` does not say)."""

    step: int | None
    parent: Path
    parent_id: str


@dataclass
class Lineage:
    """The resume points of an attempt's lineage, oldest first, and why the walk stopped early
    (``notes``; empty when it reached the first attempt)."""

    points: list[ResumePoint] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _locate(child: Path, recorded: str) -> Path:
    """The parent directory ``recorded`` in the child's attempt.json; when that path is gone
    (the run directory was moved or copied), the sibling of the same name next to the child."""
    path = Path(recorded)
    sibling = child.parent / path.name
    return path if path.is_dir() or not sibling.is_dir() else sibling


def resume_points(attempt: Path, info: dict[str, Any]) -> Lineage:
    """Follow ``parent.attempt`` from ``attempt`` (whose attempt.json is ``info``) to the first
    attempt of its lineage, collecting where each one was resumed.

    A resumed attempt's metric stream begins with its parent's records up to the checkpoint it
    resumed from (which in turn begin with the grandparent's), so every point lies inside the
    stream of ``attempt``. An ancestor whose attempt.json is gone or unreadable ends the walk
    with a note; so does a cycle.
    """
    lineage = Lineage()
    child, seen = Path(attempt), {Path(attempt).resolve()}
    while isinstance(parent := info.get("parent"), dict):
        recorded = parent.get("attempt")
        if not isinstance(recorded, str) or not recorded:
            lineage.notes.append(f"{child / 'attempt.json'}: parent.attempt is not a path")
            break
        path = _locate(child, recorded)
        step = parent.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
        lineage.points.append(ResumePoint(step, path, path.name))
        if path.resolve() in seen:
            lineage.notes.append(f"{child / 'attempt.json'}: parent {path} repeats the lineage")
            break
        seen.add(path.resolve())
        try:
            info = read_attempt_info(path)
        except (OSError, ValueError) as exc:  # gone, unreadable, not JSON, not an object
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            lineage.notes.append(f"{path / 'attempt.json'}: {why}; earlier lineage not shown")
            break
        child = path
    lineage.points.reverse()
    return lineage


def report(attempt: Path) -> str:
    """The summary of attempt directory ``attempt``; ``CheckpointError`` if it is not one."""
    view = load_attempt(attempt)
    attempt, info, status, stream = view.path, view.info, view.status, view.stream
    lines = _header(attempt, info, status) + _data_lines(info)
    metrics = attempt / "metrics.jsonl"
    if stream is None:
        lines.append("  no metric records (metrics.jsonl was never created)")
        return "\n".join(lines)
    train, val = view.records("train"), view.records("val")
    if not stream.records:
        lines.append("  no metric records")
    lines += _train_lines(train)
    lines += _val_lines(view.objective, val)
    probes = view.records("probe")
    if probes:  # the last: the one a run ends on
        lines.append(f"  probe at step {probes[-1].get('step')}: {probe_summary(probes[-1])}")
    if stream.torn:
        why = (
            "a record still being written"
            if status == "running"
            else "the writer was stopped in the middle of a record"
        )
        lines.append(
            f"  note: {metrics} ends in a torn record ({stream.torn_bytes} bytes after the last "
            f"complete one, ignored): {why}"
        )
    return "\n".join(lines)

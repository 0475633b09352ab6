"""What an attempt records of its data beside the digests: the sample rate it trains at and the
inputs it read past (``data.skip_invalid``).

attempt.json ``data`` (:func:`data_record`, written on every attempt, fresh and resumed):
``{"sample_rate": Hz or null, "refused": {"data.train": [{"path", "reason"}, ...],
"data.val": [...]}}``. The rate is what ``data.sample_rate`` found (null: the recordings have
none, or several under ``"any"``); every checkpoint's state.json records the same
(``sample_rate``, :mod:`iqtrain.checkpoint.state`). The manifest binds the record by hash
(:func:`data_binding`): ``{"sample_rate", "refused": {list: count}, "sha256"}``, the SHA-256 of
the record's canonical JSON, so an input dropped from the list after publication fails
``verify``. An attempt written before the record existed has it nowhere (attempt.json,
manifest, state.json): it verifies as it did. Torch-free.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from iqtrain.checkpoint.files import list_checkpoints
from iqtrain.checkpoint.state import RATE_UNKNOWN, recorded_sample_rate, sample_rate_problem
from iqtrain.errors import CheckpointError

__all__ = [
    "DATA_LISTS",
    "data_binding",
    "data_problems",
    "data_record",
    "data_record_problem",
    "manifest_data_problems",
]

#: The data lists whose refused inputs the record keeps, in order.
DATA_LISTS = ("data.train", "data.val")
_RECORD_KEYS = {"sample_rate", "refused"}
_ENTRY_KEYS = {"path", "reason"}


def data_record(sample_rate: float | None, refused: dict[str, list[tuple[str, str]]]) -> dict:
    """attempt.json ``data``: ``sample_rate`` and, per data list, the ``(path, reason)`` of
    every input read past (each list present, empty when none was)."""
    return {
        "sample_rate": sample_rate,
        "refused": {
            key: [{"path": path, "reason": reason} for path, reason in refused.get(key, [])]
            for key in DATA_LISTS
        },
    }


def data_record_problem(data: Any) -> str | None:
    """What is wrong with an attempt.json ``data`` record (None: nothing): exactly
    ``sample_rate`` (null or a positive rate) and ``refused`` (each data list, a list of
    ``{path, reason}`` strings)."""
    if not isinstance(data, dict) or set(data) != _RECORD_KEYS:
        return f"expected an object with {sorted(_RECORD_KEYS)}, got {data!r:.200}"
    problem = sample_rate_problem(data["sample_rate"])
    if problem is not None:
        return problem
    refused = data["refused"]
    if not isinstance(refused, dict) or set(refused) != set(DATA_LISTS):
        return f"refused is {refused!r:.200}, not an object with {list(DATA_LISTS)}"
    for key in DATA_LISTS:
        entries = refused[key]
        if not isinstance(entries, list):
            return f"refused.{key} is {entries!r:.100}, not a list"
        for i, entry in enumerate(entries):
            if (
                not isinstance(entry, dict)
                or set(entry) != _ENTRY_KEYS
                or not all(isinstance(entry[k], str) for k in _ENTRY_KEYS)
            ):
                return f"refused.{key}[{i}] is {entry!r:.200}, not {{path, reason}} strings"
    return None


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def data_binding(data: dict) -> dict:
    """The manifest's ``data`` for a well-formed record (:func:`data_record_problem`): its
    sample rate, how many inputs each data list refused, and the SHA-256 of the record's
    canonical JSON (sorted keys, no spaces)."""
    return {
        "sample_rate": data["sample_rate"],
        "refused": {key: len(data["refused"][key]) for key in DATA_LISTS},
        "sha256": hashlib.sha256(_canonical(data)).hexdigest(),
    }


def manifest_data_problems(manifest: dict, info: dict) -> list[str]:
    """The manifest's ``data`` against attempt.json's: both absent (an attempt written before
    the record existed), or the binding of the record (:func:`data_binding`). A malformed
    record is :func:`data_problems`' to report."""
    data, bound = info.get("data"), manifest.get("data")
    if data is None:
        if bound is None:
            return []
        return ["manifest.json data: set, but attempt.json records no data"]
    if data_record_problem(data) is not None:
        return []
    if bound is None:
        return ["manifest.json data: missing, but attempt.json records data"]
    if bound != data_binding(data):
        return [
            "manifest.json data: does not match attempt.json data (its sample rate or refused "
            "inputs changed after publication)"
        ]
    return []


_UNREADABLE = object()


def _state_rate(ckpt: Path) -> Any:
    """A checkpoint's recorded ``sample_rate`` as written (the checkpoint checks report a
    state.json that is not JSON)."""
    try:
        return recorded_sample_rate(ckpt)
    except CheckpointError:
        return _UNREADABLE


def _shown(rate: Any) -> str:
    return "absent" if rate is RATE_UNKNOWN else repr(rate)


def data_problems(attempt: Path, info: dict) -> list[str]:
    """attempt.json ``data`` is well formed and its ``sample_rate`` is the ``sample_rate`` of
    every checkpoint of the attempt (their state.json, bound by checkpoint.json and the
    manifest); an attempt without the record (written before it existed) has none in any
    state either."""
    data = info.get("data")
    if "data" in info:
        problem = data_record_problem(data)
        if problem is not None:
            return [f"attempt.json data: {problem}"]
    wanted = RATE_UNKNOWN if data is None else data["sample_rate"]
    problems = []
    for ckpt in list_checkpoints(attempt / "checkpoints"):
        got = _state_rate(ckpt)
        if got is _UNREADABLE or _same_rate(got, wanted):
            continue
        problems.append(
            f"{ckpt / 'state.json'}: sample_rate {_shown(got)} differs from attempt.json "
            f"data.sample_rate ({_shown(wanted)})"
        )
    return problems


def _same_rate(got: Any, wanted: Any) -> bool:
    if got is RATE_UNKNOWN or wanted is RATE_UNKNOWN:
        return got is wanted
    return sample_rate_problem(got) is None and got == wanted

"""state.json: everything of a checkpoint that is not a tensor, with one owner.

:class:`CheckpointState` is the only code that spells state.json's keys: the trainer builds
one, :func:`~iqtrain.checkpoint.files.save_checkpoint` encodes it, and every reader (resume,
``verify``, ``verify --data``, the probe, the manifest checks) gets one back from
:meth:`CheckpointState.read`, validated: a wrong version, a missing key or a value of the wrong
JSON type is one :class:`~iqtrain.errors.CheckpointError` line naming the file and the key.

The components' own states (``cursor``: the training stream, ``loop``: the loop's counters,
``rng``: every rank's generators) are opaque here: each component validates its own in
``load_state_dict``; the keys and JSON types of ``loop`` are spelled here once
(:data:`LOOP_FIELDS`, :func:`loop_field_problem`), for the loop's ``LoopState`` and for the
readers. The few fields of the components that torch-free readers need (the best checkpoint,
the stale-validation count, the best validation accuracy of a classifier's lineage, the world
size that wrote the shards) have typed accessors below, checked when they are read. Format:
docs/design.md "state.json". Imports no torch.

``sample_rate`` (the rate the lineage's data was recorded at, Hz; null when the recordings have
none, or several with ``data.sample_rate = "any"``) is written in every state since it was
recorded; a state written before has none, read as :data:`RATE_UNKNOWN`.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iqtrain.errors import CheckpointError

__all__ = [
    "COMPONENTS",
    "INIT_KEYS",
    "PACKAGE_INIT_KEYS",
    "LOOP_DEFAULTS",
    "LOOP_FIELDS",
    "RATE_UNKNOWN",
    "STATE_VERSION",
    "CheckpointState",
    "UnknownRate",
    "classes_problem",
    "sort_classes",
    "init_record_problem",
    "loop_field_problem",
    "read_json_object",
    "recorded_bindings",
    "recorded_classes",
    "recorded_sample_rate",
    "recorded_step",
    "sample_rate_problem",
]

#: The only version this iqtrain writes and reads. 3: ``rng`` holds every rank's generators
#: (``{"world_size": W, "ranks": [...]}``) and ``loop`` carries early stopping's counters.
#: No release wrote an earlier one, so an earlier one is refused, naming it.
STATE_VERSION = 3
#: The loop components whose ``state_dict()`` a checkpoint stores, by their state.json key.
COMPONENTS = ("cursor", "loop", "rng")
_OPTIONAL = (type(None),)
#: ``loop``: the loop's counters (``LoopState``, every field but ``step``, which is the
#: top-level ``step``) and their JSON types. Every key is required, but ``best_val_accuracy``
#: (absent in states written before the classifier existed: read as None, what every
#: objective but a labelled one keeps there).
LOOP_FIELDS: dict[str, tuple[type, ...]] = {
    "best_val_loss": (float, *_OPTIONAL),
    "best_val_accuracy": (float, *_OPTIONAL),
    "best_step": (int, *_OPTIONAL),
    "best_checkpoint": (str, *_OPTIONAL),
    "loss_ema": (float, *_OPTIONAL),
    "validations": (int,),
    "early_stop_ref": (float, *_OPTIONAL),
    "stale_validations": (int,),
}
#: The loop fields an older state may lack, and the value they read as.
LOOP_DEFAULTS: dict[str, Any] = {"best_val_accuracy": None}
_DATA_GROUPS = ("train", "val", "train_meta", "val_meta")
#: Where a lineage's first weights came from (``[init] from``, docs/design.md "attempt.json"): the
#: same object in state.json, attempt.json and the manifest, and its JSON types.
INIT_KEYS = {"attempt": str, "checkpoint": str, "step": int, "model_sha256": str}
#: The ``init`` record of a source that is a model package (``iqtrain export --out``).
PACKAGE_INIT_KEYS = {"package": str, "step": int, "model_sha256": str}
_CHECKPOINT = re.compile(r"step_[0-9]{8}")


class UnknownRate(enum.Enum):
    """The sample rate of a state.json written before states recorded one."""

    RATE = "unknown"


#: :attr:`CheckpointState.sample_rate` of a state written before the key was: unknown (not
#: null, which says the recordings have no one rate).
RATE_UNKNOWN = UnknownRate.RATE
_SHA256 = re.compile(r"[0-9a-f]{64}")


def init_record_problem(init: Any) -> str | None:
    """What is wrong with an ``init`` record (None: nothing): exactly the keys of
    :data:`INIT_KEYS` with their types, an absolute ``attempt``, ``checkpoint`` the
    ``step_%08d`` of ``step`` >= 0, ``model_sha256`` 64 lowercase hex digits; or, for a source
    that is a model package, the keys of :data:`PACKAGE_INIT_KEYS` (an absolute ``package``)."""
    if isinstance(init, dict) and set(init) == set(PACKAGE_INIT_KEYS):
        for key, kind in PACKAGE_INIT_KEYS.items():
            if isinstance(init[key], bool) or not isinstance(init[key], kind):
                return f"init.{key} is {init[key]!r:.100}, not a {kind.__name__}"
        if not Path(init["package"]).is_absolute() or init["step"] < 0:
            return f"init.package is {init['package']!r:.100}, not an absolute path"
        if not _SHA256.fullmatch(init["model_sha256"]):
            return f"init.model_sha256 {init['model_sha256']!r:.80} is not a SHA-256"
        return None
    if not isinstance(init, dict) or set(init) != set(INIT_KEYS):
        return f"expected an object with {sorted(INIT_KEYS)}, got {init!r:.200}"
    for key, kind in INIT_KEYS.items():
        if isinstance(init[key], bool) or not isinstance(init[key], kind):
            return f"init.{key} is {init[key]!r:.100}, not a {kind.__name__}"
    if not Path(init["attempt"]).is_absolute():
        return f"init.attempt is {init['attempt']!r:.100}, not an absolute path"
    step, name = init["step"], init["checkpoint"]
    if step < 0 or not _CHECKPOINT.fullmatch(name) or int(name[5:]) != step:
        return f"init.checkpoint {name!r:.40} is not the checkpoint of step {step}"
    if not _SHA256.fullmatch(init["model_sha256"]):
        return f"init.model_sha256 {init['model_sha256']!r:.80} is not a SHA-256"
    return None


def sample_rate_problem(rate: Any) -> str | None:
    """What is wrong with a recorded ``sample_rate`` (None: nothing): null, or a positive
    finite number of Hz (a bool is not a number)."""
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        return f"sample_rate is {rate!r:.100}, not a number or null"
    try:
        value = float(rate)
    except OverflowError:  # an integer too large for a float is no rate either
        value = math.inf
    if not 0 < value < math.inf:
        return f"sample_rate is {rate!r:.100}, not a positive finite rate in Hz"
    return None


def loop_field_problem(key: str, value: Any) -> str | None:
    """What is wrong with ``loop.<key> = value`` (None: nothing): a key of :data:`LOOP_FIELDS`
    holding a value of its JSON type (a bool is not a number)."""
    if isinstance(value, bool) or not isinstance(value, LOOP_FIELDS[key]):
        return f"loop.{key} is {value!r}"
    return None


_INTEGER = re.compile(r"-?(0|[1-9][0-9]*)")


def sort_classes(names: Iterable[str]) -> list[str]:
    """Class names in the order a classifier's outputs take them (docs/data.md, labels):
    numerically when every name is an integer's decimal digits (``5`` before ``10``), else as
    strings."""
    unique = set(names)
    if unique and all(_INTEGER.fullmatch(n) for n in unique):
        return sorted(unique, key=int)
    return sorted(unique)


def classes_problem(classes: Any) -> str | None:
    """What is wrong with a ``classes`` record of a labelled objective's attempt
    (None: nothing): a non-empty list of distinct non-empty strings in :func:`sort_classes`
    order (or sorted as strings, as integer classes were before), the same list in
    attempt.json and in every checkpoint's state.json."""
    if (
        not isinstance(classes, list)
        or not classes
        or not all(isinstance(c, str) and c for c in classes)
    ):
        return f"classes is {classes!r:.200}, not a list of non-empty class names"
    if classes != sort_classes(classes) and classes != sorted(set(classes)):
        return f"classes is {classes!r:.200}, not sorted and distinct"
    return None


def _want(obj: dict[str, Any], key: str, kind: type, path: Path, where: str = "") -> Any:
    value = obj.get(key)
    if key not in obj:
        raise CheckpointError(f"{path}: missing key {where}{key}")
    if isinstance(value, bool) or not isinstance(value, kind):
        raise CheckpointError(f"{path}: {where}{key} is {value!r}, not a {kind.__name__}")
    return value


@dataclass(frozen=True, kw_only=True)
class CheckpointState:
    """One checkpoint's state.json (format: docs/design.md "state.json").

    ``fingerprints``: the sampled fingerprint of the train and val datasets; ``data``: the
    full-content digests (``train``, ``val``: data file -> BLAKE3) and metadata digests
    (``train_meta``, ``val_meta``: ``.sigmf-meta`` -> SHA-256); ``metrics``: the metric
    stream's cursor; ``components``: ``cursor``/``loop``/``rng`` states; ``optimizer``: the
    JSON half of the optimizer codec (None for a ``dcp`` checkpoint, whose optimizer state is
    in its shards).
    """

    step: int
    config_sha256: str
    plan: dict[str, Any]
    fingerprints: dict[str, str]
    data: dict[str, dict[str, str]]
    metrics: dict[str, Any]
    components: dict[str, dict[str, Any]]
    optimizer: dict[str, Any] | None = None
    #: Where the lineage's first weights came from (``[init] from``); None: random init.
    init: dict[str, Any] | None = None
    #: A labelled objective: the sorted class names, the head's output order;
    #: None for the other objectives.
    classes: list[str] | None = None
    #: The sample rate (Hz) of the recordings the lineage trains on (``data.sample_rate``'s
    #: answer, docs/design.md "Recordings, capture segments, windows"); None: none recorded, or
    #: several (``"any"``); :data:`RATE_UNKNOWN`: a state written before states recorded it (no
    #: key).
    sample_rate: float | None | UnknownRate = RATE_UNKNOWN

    # ------------------------------------------------------------------ encoding

    def to_json(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "version": STATE_VERSION,
            "step": self.step,
            "config_sha256": self.config_sha256,
            "plan": self.plan,
            "fingerprints": self.fingerprints,
            "data": self.data,
            "metrics": self.metrics,
            **{name: self.components[name] for name in COMPONENTS},
        }
        if self.optimizer is not None:
            obj["optimizer"] = self.optimizer
        if self.init is not None:  # only then: a state without one is what it always was
            obj["init"] = self.init
        if self.classes is not None:  # a labelled objective only
            obj["classes"] = self.classes
        if self.sample_rate is not RATE_UNKNOWN:  # null is written: it says something
            obj["sample_rate"] = self.sample_rate
        return obj

    def encode(self) -> bytes:
        """The bytes of state.json. Encoded before anything is written: a state that is not
        JSON (a non-finite float) is a bug, raised as ValueError, never a storage error."""
        text = json.dumps(self.to_json(), indent=1, sort_keys=True, allow_nan=False)
        return (text + "\n").encode()

    # ------------------------------------------------------------------ decoding

    @classmethod
    def from_json(cls, obj: Any, path: Path) -> CheckpointState:
        """Validate a decoded state.json (``path`` names it in every error)."""
        if not isinstance(obj, dict):
            raise CheckpointError(f"{path}: not a JSON object")
        version = obj.get("version")
        if isinstance(version, bool) or version != STATE_VERSION:
            raise CheckpointError(
                f"{path}: state version {version!r}; this iqtrain reads version {STATE_VERSION}"
            )
        step = _want(obj, "step", int, path)
        fingerprints = _want(obj, "fingerprints", dict, path)
        data = _want(obj, "data", dict, path)
        for part in ("train", "val"):
            _want(fingerprints, part, str, path, "fingerprints.")
        for part in _DATA_GROUPS:
            _want(data, part, dict, path, "data.")
        optimizer = obj.get("optimizer")
        if optimizer is not None and not isinstance(optimizer, dict):
            raise CheckpointError(f"{path}: optimizer is {optimizer!r}, not a dict")
        init = obj.get("init")
        problem = None if init is None else init_record_problem(init)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}")
        classes = obj.get("classes")
        problem = None if classes is None else classes_problem(classes)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}")
        rate = obj.get("sample_rate", RATE_UNKNOWN)
        problem = None if rate is RATE_UNKNOWN else sample_rate_problem(rate)
        if problem is not None:
            raise CheckpointError(f"{path}: {problem}")
        return cls(
            step=step,
            config_sha256=_want(obj, "config_sha256", str, path),
            plan=_want(obj, "plan", dict, path),
            fingerprints=fingerprints,
            data=data,
            metrics=_want(obj, "metrics", dict, path),
            components={name: _want(obj, name, dict, path) for name in COMPONENTS},
            optimizer=optimizer,
            init=init,
            classes=classes,
            sample_rate=rate if rate is RATE_UNKNOWN or rate is None else float(rate),
        )

    @classmethod
    def read(cls, checkpoint: Path) -> CheckpointState:
        """The validated state.json of checkpoint directory ``checkpoint``."""
        path = Path(checkpoint) / "state.json"
        return cls.from_json(read_json_object(path), path)

    # --------------------------------------------- component fields torch-free readers need

    def _loop(self, key: str) -> Any:
        value = {**LOOP_DEFAULTS, **self.components["loop"]}.get(key)
        problem = loop_field_problem(key, value)
        if problem is not None:
            raise CheckpointError(f"state.json of step {self.step}: {problem}")
        return value

    @property
    def best_checkpoint(self) -> str | None:
        """The best checkpoint so far, relative to the run directory (it may live in an
        ancestor attempt); None before the first validation."""
        return self._loop("best_checkpoint")

    @property
    def stale_validations(self) -> int:
        """Validations in a row without an improvement early stopping counts."""
        return self._loop("stale_validations")

    @property
    def early_stop(self) -> tuple[float | None, int]:
        """Early stopping's (reference value, validations since it was beaten): the value is
        the monitored field of the best validation (loss; a classifier's accuracy)."""
        return self._loop("early_stop_ref"), self.stale_validations

    @property
    def best_val_accuracy(self) -> float | None:
        """The accuracy of the best validation of a classifier's lineage; None for the other
        objectives, before the first validation, and in states written before the key was."""
        return self._loop("best_val_accuracy")

    @property
    def known_rate(self) -> float | None:
        """The recorded sample rate in Hz; None when there is none (null) or it is unknown (a
        state written before states recorded it)."""
        return None if self.sample_rate is RATE_UNKNOWN else self.sample_rate

    @property
    def world_size(self) -> int:
        """How many ranks wrote the checkpoint (one RNG state and, sharded, one shard each)."""
        size = self.components["rng"].get("world_size")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise CheckpointError(f"state.json of step {self.step}: rng.world_size is {size!r}")
        return size


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from an evidence file; anything else is one CheckpointError line naming
    it (missing, unreadable, not JSON, not an object)."""
    try:
        obj = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable: {exc}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return obj


def recorded_step(checkpoint: Path) -> int:
    """The step a checkpoint's state.json records, whatever else it holds (``verify`` compares
    it with the directory name before anything else is trusted)."""
    path = Path(checkpoint) / "state.json"
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable: {exc}") from None
    step = obj.get("step") if isinstance(obj, dict) else None
    if isinstance(step, bool) or not isinstance(step, int):
        raise CheckpointError(f"{path}: no integer 'step'")
    return step


def recorded_bindings(checkpoint: Path) -> tuple[str, dict[str, Any]]:
    """``(config_sha256, metrics)`` of a checkpoint's state.json, whatever else it holds:
    ``verify`` binds the writing attempt's config.toml and metric prefix with them before the
    rest is trusted (a state malformed elsewhere is refused when it is restored, by
    :meth:`CheckpointState.read`). CheckpointError naming the file and the key otherwise."""
    path = Path(checkpoint) / "state.json"
    obj = read_json_object(path)
    return _want(obj, "config_sha256", str, path), _want(obj, "metrics", dict, path)


def recorded_classes(checkpoint: Path) -> Any:
    """The ``classes`` a checkpoint's state.json records, as written (None when absent), so
    ``verify`` can compare a malformed one with attempt.json's; CheckpointError when the file
    is not a JSON object."""
    return read_json_object(Path(checkpoint) / "state.json").get("classes")


def recorded_sample_rate(checkpoint: Path) -> Any:
    """The ``sample_rate`` a checkpoint's state.json records, as written (:data:`RATE_UNKNOWN`
    when absent), so ``verify`` can compare a malformed one with attempt.json's;
    CheckpointError when the file is not a JSON object."""
    return read_json_object(Path(checkpoint) / "state.json").get("sample_rate", RATE_UNKNOWN)

"""The run configuration: one ``kw_only`` dataclass per TOML table, validated on construction.

Sections validate their own values in ``__post_init__`` and name the dotted key in every error;
:func:`build_config` rejects unknown keys and wrong shapes, and :class:`Config` checks the plan
across sections. The resolved config (every default filled in) is what an attempt writes and
hashes, so ``config.toml`` in an attempt is the complete record of what ran.

This module imports no torch (nor numpy): the sections, the shared validators and the closed
sets of names live in :mod:`iqtrain.config.sections`, so reading, checking and writing a
config, and the commands that only do that, never pay for torch.

Paths (``run.dir``, ``data.train``, ``data.val``, ``data.synthetic.cache_dir``) are resolved when
a section is built: ``~`` is expanded, then a relative path is taken relative to the current
working directory at that moment (glob characters are kept as they are). The resolved config
therefore holds absolute paths only, and an attempt names the same files whatever directory it
is later resumed, verified or inspected from.

Offers :func:`load_config` (a TOML file and ``--set`` overrides), :func:`build_config` (tables),
:func:`config_to_dict` and :func:`dumps_toml` (back to TOML), :class:`Config`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iqtrain import objectives
from iqtrain.config.sections import (
    ARCHITECTURE_KEYS,
    TRUNK_KEYS,
    DataConfig,
    InitConfig,
    LoggingConfig,
    ModelConfig,
    OptimizerConfig,
    ProbeConfig,
    RunConfig,
    ScheduleConfig,
    SynthConfig,
    TrainingConfig,
    WandbConfig,
)
from iqtrain.errors import ConfigError

__all__ = [
    "Config",
    "apply_overrides",
    "build_config",
    "config_to_dict",
    "dumps_toml",
    "expand_path",
    "flatten",
    "load_config",
    "read_toml",
]


@dataclass(kw_only=True)
class Config:
    """The whole run. Cross-section rules (the plan, model/data agreement) are checked here."""

    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # None: defaults, sized to data.patch_len/seq_patches by __post_init__, so every reader
    # sees a ModelConfig.
    model: ModelConfig = None  # type: ignore[assignment]
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    init: InitConfig = field(default_factory=InitConfig)

    def __post_init__(self) -> None:
        if self.model is None:
            self.model = ModelConfig(
                patch_len=self.data.patch_len, max_patches=self.data.seq_patches
            )
        if self.model.patch_len != self.data.patch_len:
            raise ConfigError(
                f"model.patch_len: must equal data.patch_len ({self.data.patch_len}), "
                f"got {self.model.patch_len}"
            )
        if self.model.max_patches < self.data.seq_patches:
            raise ConfigError(
                f"model.max_patches: must be >= data.seq_patches ({self.data.seq_patches}), "
                f"got {self.model.max_patches}"
            )
        # The keys only some objectives read (the probe judges a pretraining model's features;
        # a fine-tune's head, its trunk's lr and its labels), refused where they would do nothing.
        for section in ("data", "optimizer", "probe"):
            objectives.check_keys(self.model.task, section, getattr(self, section))
        if self.optimizer.trunk_lr_scale != 1.0 and self.model.freeze_trunk:
            raise ConfigError(
                "optimizer.trunk_lr_scale: model.freeze_trunk = true trains no trunk weight "
                "(leave the scale at 1.0)"
            )
        s = self.schedule
        steps = self.training.max_steps
        # decay_steps belongs to wsd only: cosine and constant ignore it (and its default).
        if s.kind == "wsd" and s.warmup_steps + s.decay_steps > steps:
            raise ConfigError(
                f"schedule.decay_steps: warmup_steps ({s.warmup_steps}) + decay_steps "
                f"({s.decay_steps}) exceeds training.max_steps ({steps})"
            )
        if s.kind == "constant" and s.warmup_steps > steps:
            raise ConfigError(
                f"schedule.warmup_steps: {s.warmup_steps} exceeds training.max_steps ({steps})"
            )
        if s.kind == "cosine" and s.warmup_steps >= steps:
            raise ConfigError(
                f"schedule.warmup_steps: the cosine schedule needs steps after warmup "
                f"({s.warmup_steps} >= training.max_steps {steps})"
            )

    def check_world_size(self, world_size: int) -> None:
        """data.batch_size is the global microbatch: every rank reads an equal slice of it.
        (Validation is sharded by whole batches, so val_batch_size needs no such check.)"""
        value = self.data.batch_size
        if value % world_size:
            raise ConfigError(
                f"data.batch_size: {value} is not divisible by the world size {world_size}"
            )


# ---------------------------------------------------------------------------------------------
# Building from TOML tables

_SECTIONS: dict[str, type] = {
    "run": RunConfig,
    "data": DataConfig,
    "model": ModelConfig,
    "optimizer": OptimizerConfig,
    "schedule": ScheduleConfig,
    "training": TrainingConfig,
    "probe": ProbeConfig,
    "logging": LoggingConfig,
    "init": InitConfig,
}
_NESTED: dict[tuple[type, str], type] = {
    (DataConfig, "synthetic"): SynthConfig,
    (LoggingConfig, "wandb"): WandbConfig,
}


def _toml_key(f: dataclasses.Field) -> str:
    """A field's key in TOML: its name, or ``metadata["toml"]`` where the name is a Python
    keyword (``init.from`` is the field ``from_``)."""
    return f.metadata.get("toml", f.name)


def _fields_by_key(cls: type) -> dict[str, str]:
    """TOML key -> field name of a section."""
    return {_toml_key(f): f.name for f in dataclasses.fields(cls)}


def _build_section(cls: type, table: Any, prefix: str) -> Any:
    if not isinstance(table, dict):
        raise ConfigError(f"{prefix}: must be a table, got {table!r}")
    names = _fields_by_key(cls)
    for key in table:
        if key not in names:
            hint = _closest(key, set(names))
            raise ConfigError(
                f"{prefix}.{key}: unknown key"
                + (f" (did you mean {prefix}.{hint}?)" if hint else "")
            )
    kwargs = {}
    for key, value in table.items():
        nested = _NESTED.get((cls, key))
        kwargs[names[key]] = _build_section(nested, value, f"{prefix}.{key}") if nested else value
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a wrong type that reached arithmetic inside a validator
        raise ConfigError(f"{prefix}: {exc}") from None


def _closest(key: str, names: set[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(key, sorted(names), n=1, cutoff=0.75)
    return match[0] if match else None


def build_config(tables: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from parsed TOML tables."""
    for key in tables:
        if key not in _SECTIONS:
            hint = _closest(key, set(_SECTIONS))
            raise ConfigError(
                f"{key}: unknown section" + (f" (did you mean {hint}?)" if hint else "")
            )
    data = _build_section(DataConfig, tables.get("data", {}), "data")
    model_table = (
        dict(tables.get("model", {})) if isinstance(tables.get("model", {}), dict) else None
    )
    if model_table is None:
        raise ConfigError("model: must be a table")
    # The model's patch geometry follows [data] unless the file states it (then it must agree).
    model_table.setdefault("patch_len", data.patch_len)
    model_table.setdefault("max_patches", data.seq_patches)
    return Config(
        run=_build_section(RunConfig, tables.get("run", {}), "run"),
        data=data,
        model=_build_section(ModelConfig, model_table, "model"),
        optimizer=_build_section(OptimizerConfig, tables.get("optimizer", {}), "optimizer"),
        schedule=_build_section(ScheduleConfig, tables.get("schedule", {}), "schedule"),
        training=_build_section(TrainingConfig, tables.get("training", {}), "training"),
        probe=_build_section(ProbeConfig, tables.get("probe", {}), "probe"),
        logging=_build_section(LoggingConfig, tables.get("logging", {}), "logging"),
        init=_build_section(InitConfig, tables.get("init", {}), "init"),
    )


def _parse_value(text: str) -> Any:
    """A ``--set`` value: TOML syntax (``3``, ``1e-3``, ``true``, ``[0.9, 0.95]``, ``"x"``);
    anything that is not valid TOML is taken as a bare string (``training.device=cuda``)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _known_key(dotted: str) -> None:
    parts = dotted.split(".")
    cls = _SECTIONS.get(parts[0])
    if cls is None or len(parts) < 2:
        raise ConfigError(f"{dotted}: unknown key")
    for i, part in enumerate(parts[1:], start=1):
        if part not in _fields_by_key(cls):
            raise ConfigError(f"{dotted}: unknown key")
        nested = _NESTED.get((cls, part))
        if nested is None:
            if i != len(parts) - 1:
                raise ConfigError(f"{dotted}: unknown key")
            return
        cls = nested
    raise ConfigError(f"{dotted}: is a table, set one of its keys")


def apply_overrides(tables: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``dotted.key=value`` overrides to parsed tables (a new dict is returned).
    ``init.from=`` (empty) clears the whole ``[init]`` table, ``which`` included: the random
    initialisation of the same config, from the command line."""
    import copy

    out = copy.deepcopy(tables)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected dotted.key=value")
        dotted, text = item.split("=", 1)
        dotted = dotted.strip()
        _known_key(dotted)
        node = out
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{dotted}: parent is not a table")
        node[parts[-1]] = _parse_value(text.strip())
        if dotted == "init.from" and node[parts[-1]] == "":
            out["init"] = {}
    return out


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def load_config(path: str | os.PathLike, overrides: list[str] | None = None) -> Config:
    """Read a TOML config file, apply ``--set`` overrides, take the architecture an ``[init]``
    source has for every key the config does not give (:func:`inherit_architecture`) and
    validate everything."""
    return build_config(inherit_architecture(apply_overrides(read_toml(path), overrides or [])))


def _source_model(source: str) -> dict[str, Any] | None:
    """The resolved ``[model]`` table of the checkpoint ``[init] from`` names: a package's
    ``config.json`` architecture, or the ``config.toml`` of the attempt (or of the checkpoint
    directory's attempt); None when it cannot be read (``load_init`` then names the source)."""
    path = Path(source).expanduser()
    try:
        if (path / "lineage.json").is_file():
            import json

            model = json.loads((path / "config.json").read_text())["architecture"]
        else:
            attempt = path.parent.parent if path.parent.name == "checkpoints" else path
            model = read_toml(attempt / "config.toml")["model"]
    except (OSError, ValueError, KeyError, TypeError, ConfigError):
        return None
    return model if isinstance(model, dict) else None


def inherit_architecture(tables: dict[str, Any]) -> dict[str, Any]:
    """``tables`` with each architecture key (:data:`~iqtrain.config.sections.ARCHITECTURE_KEYS`)
    that ``[model]`` does not give taken from the ``[init] from`` source (a fine-tune, whose
    ``model.objective`` differs from its source's, takes the trunk's keys alone), and
    ``data.patch_len`` with ``model.patch_len`` when neither is given. A key the config gives
    stays as given: ``load_init`` refuses it when it differs from the source's. Without a
    readable source, ``tables`` as they are."""
    init = tables.get("init")
    source = _source_model(init["from"]) if isinstance(init, dict) and init.get("from") else None
    model = tables.get("model", {})
    if source is None or not isinstance(model, dict):
        return tables
    objective = model.get("objective", source.get("objective", "mse"))
    keys = ARCHITECTURE_KEYS if objective == source.get("objective", "mse") else TRUNK_KEYS
    taken = {k: source[k] for k in keys if k not in model and k in source}
    out = {**tables, "model": {**model, **taken}}
    data = tables.get("data", {})
    if "patch_len" in taken and isinstance(data, dict) and "patch_len" not in data:
        out["data"] = {**data, "patch_len": taken["patch_len"]}
    return out


# ---------------------------------------------------------------------------------------------
# The resolved config, as TOML


def config_to_dict(config: Config) -> dict[str, Any]:
    """Every field of every section, defaults resolved (``None`` fields are omitted)."""

    def convert(obj: Any) -> Any:
        if dataclasses.is_dataclass(obj):
            return {
                _toml_key(f): convert(getattr(obj, f.name))
                for f in dataclasses.fields(obj)
                if getattr(obj, f.name) is not None
            }
        if isinstance(obj, tuple):
            return [convert(v) for v in obj]
        if isinstance(obj, list):
            return [convert(v) for v in obj]
        return obj

    return convert(config)


def _toml_value(value: Any, key: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"{key}: cannot write non-finite {value!r}")
        return repr(value)  # repr round-trips exactly; TOML accepts 1e-05 and 0.001 alike
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v, key) for v in value) + "]"
    raise ConfigError(f"{key}: cannot write {type(value).__name__} to TOML")


def dumps_toml(tables: dict[str, Any]) -> str:
    """Serialise nested tables to TOML (enough for configs: scalars, arrays, sub-tables)."""
    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        subtables = {k: v for k, v in body.items() if isinstance(v, dict)}
        if name:
            lines.append(f"[{name}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_toml_value(v, f'{name}.{k}' if name else k)}")
        lines.append("")
        for k, v in subtables.items():
            table(f"{name}.{k}" if name else k, v)

    table("", tables)
    while lines and lines[0] == "":
        lines.pop(0)
    return "\n".join(lines).rstrip("\n") + "\n"


def expand_path(text: str, base: Path | None = None) -> str:
    """``~`` and relative paths: relative to ``base`` if given.

    A built :class:`Config` already holds absolute paths, for which this is the identity.
    """
    path = Path(os.path.expanduser(text))
    if base is not None and not path.is_absolute():
        path = base / path
    return os.fspath(path)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables -> ``{"section.key": value}`` (nested sections dotted further)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out

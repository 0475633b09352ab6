"""A model package: a trained model as a folder that leaves iqtrain (docs/design.md "Model
package").

``iqtrain export ATTEMPT --out DIR`` writes four files, the layout of a Hugging Face Hub model
repository (``huggingface-cli upload`` publishes the folder as it is):

- ``model.safetensors``: the checkpoint's weights file, byte for byte (the exact tensors);
- ``config.json``: the architecture (the resolved ``[model]`` table), the objective, the input
  (window, patch length, normalisation, dtypes), the classes in output order, the label key,
  the sample rate, the weights' SHA-256 and the iqtrain version;
- ``README.md``: the model card;
- ``lineage.json``: where it came from (the source attempt's run and id, checkpoint, step, the
  manifest's and checkpoint.json's SHA-256, the ``init`` chain) and the SHA-256 of every other
  file of the package.

This module reads and checks a package without torch (``iqtrain verify DIR``): every listed
file against ``lineage.json``, ``config.json`` against its schema and the weights' hash, the
safetensors header against the tensors the architecture has (names, shapes, fp32, offsets that
tile the data exactly), and every weight finite. Hidden entries (a Hub download's ``.cache``,
``.gitattributes``) are not the package's and are ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iqtrain import objectives
from iqtrain.errors import CheckpointError, ConfigError

__all__ = [
    "CONFIG",
    "FILES",
    "FORMAT",
    "FORMAT_VERSION",
    "LINEAGE",
    "WEIGHTS",
    "Package",
    "expected_tensors",
    "is_package",
    "read_package",
    "safetensors_header",
    "weights_problem",
]

FORMAT = "iqtrain-model"
#: The package format this version writes and the newest it reads.
FORMAT_VERSION = 1
WEIGHTS, CONFIG, CARD, LINEAGE = "model.safetensors", "config.json", "README.md", "lineage.json"
#: The files ``lineage.json`` lists with their SHA-256 (itself the fourth).
FILES = (WEIGHTS, CONFIG, CARD)
#: The keys ``config.json`` must hold.
CONFIG_KEYS = (
    "format",
    "format_version",
    "iqtrain_version",
    "objective",
    "architecture",
    "input",
    "classes",
    "label_key",
    "sample_rate",
    "seed",
    "trained_precision",
    "step",
    "model_sha256",
)
INPUT_KEYS = ("window", "patch_len", "seq_patches", "norm", "prefix_patches")


def is_package(path: Path) -> bool:
    """Whether directory ``path`` holds a package (its ``lineage.json`` names the format)."""
    try:
        doc = json.loads((Path(path) / LINEAGE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def expected_tensors(architecture: dict[str, Any], classes: int) -> dict[str, list[int]]:
    """The name and shape of every tensor of a model of ``architecture`` (a resolved
    ``[model]`` table) with ``classes`` outputs (0 for a next-patch objective): what
    ``IQTransformer.state_dict()`` holds (docs/design.md "Architecture")."""
    from iqtrain.config.sections import ModelConfig

    cfg = ModelConfig(**architecture)
    d, w, h = cfg.dim, 2 * cfg.patch_len, cfg.mlp_hidden
    assert h is not None
    out: dict[str, list[int]] = {"patch_embed.weight": [d, w], "patch_embed.bias": [d]}
    for i in range(cfg.layers):
        b = f"blocks.{i}."
        out |= {
            b + "attn_norm.weight": [d],
            b + "attn.qkv.weight": [3 * d, d],
            b + "attn.proj.weight": [d, d],
            b + "mlp_norm.weight": [d],
            b + "mlp.gate_up.weight": [2 * h, d],
            b + "mlp.down.weight": [d, h],
        }
    out["norm.weight"] = [d]
    task = cfg.task
    if task.labelled and cfg.pool == "attention":
        out["pool.query"] = [d]
    width = task.head_width(cfg, classes)
    out |= {"head.weight": [width, d], "head.bias": [width]}
    return out


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header of safetensors file ``path`` and the offset of its data; ValueError saying
    what is wrong (a short file, a header that is no JSON object, tensors whose byte ranges do
    not tile the data exactly)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{size} bytes: too short for a safetensors header")
        (n,) = struct.unpack("<Q", head)
        if n > size - 8:
            raise ValueError(f"a header of {n} bytes in a file of {size}")
        header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = info["data_offsets"]
            spans.append((int(lo), int(hi), name))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"tensor {name!r}: no data_offsets") from None
    spans.sort()
    at = 0
    for lo, hi, name in spans:
        if lo != at or hi < lo:
            raise ValueError(f"tensor {name!r}: bytes [{lo}, {hi}) do not follow {at}")
        at = hi
    if 8 + n + at != size:
        raise ValueError(f"the tensors hold {at} bytes, the file {size - 8 - n} after its header")
    return header, 8 + n


@dataclass(frozen=True)
class Package:
    """A package that verified: its directory, ``config.json`` and ``lineage.json``."""

    path: Path
    config: dict[str, Any]
    lineage: dict[str, Any]

    @property
    def classes(self) -> list[str] | None:
        return self.config["classes"]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable: {exc}") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return doc


def _check_version(path: Path, doc: dict[str, Any]) -> None:
    if doc.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {doc.get('format')!r}, not {FORMAT!r}")
    version = doc.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise CheckpointError(f"{path}: format_version {version!r} is not a version")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: package format {version}, written by a newer iqtrain (this one reads "
            f"up to {FORMAT_VERSION}); upgrade iqtrain to load it"
        )


def _check_files(path: Path, lineage: dict[str, Any]) -> None:
    files = lineage.get("files")
    if not isinstance(files, dict) or set(files) != set(FILES):
        raise CheckpointError(f"{path / LINEAGE}: files must list {', '.join(FILES)}")
    for name in FILES:
        file = path / name
        if file.is_symlink() or not file.is_file():
            raise CheckpointError(f"{file}: missing or not a regular file")
        want = files[name].get("sha256") if isinstance(files[name], dict) else None
        if sha256_file(file) != want:
            raise CheckpointError(f"{file}: its SHA-256 is not the one lineage.json lists")


def _check_config(path: Path, config: dict[str, Any], lineage: dict[str, Any]) -> int:
    """config.json against its schema; the number of classes (0: none)."""
    where = path / CONFIG
    _check_version(where, config)
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}")
    if config["model_sha256"] != lineage["files"][WEIGHTS]["sha256"]:
        raise CheckpointError(f"{where}: model_sha256 is not the weights' SHA-256")
    arch, inp = config["architecture"], config["input"]
    if not isinstance(arch, dict) or not isinstance(inp, dict):
        raise CheckpointError(f"{where}: architecture and input must be objects")
    try:
        objective = objectives.get(config["objective"])
        if arch.get("objective") != objective.name:
            raise ValueError(f"architecture.objective {arch.get('objective')!r} differs")
        expected_tensors(arch, 0 if not objective.labelled else 2)  # the architecture builds
    except (ConfigError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{where}: {exc}") from None
    if [k for k in INPUT_KEYS if k not in inp]:
        raise CheckpointError(f"{where}: input must hold {', '.join(INPUT_KEYS)}")
    if inp["patch_len"] != arch["patch_len"] or inp["window"] != (
        inp["patch_len"] * inp["seq_patches"]
    ):
        raise CheckpointError(f"{where}: input.window is not input.patch_len x seq_patches")
    classes = config["classes"]
    if objective.labelled != isinstance(classes, list) or (
        isinstance(classes, list)
        and (len(classes) < 2 or len(set(map(str, classes))) != len(classes))
    ):
        raise CheckpointError(
            f"{where}: classes {classes!r} do not fit model.objective {objective.name!r}"
        )
    return len(classes) if isinstance(classes, list) else 0


def weights_problem(file: Path, architecture: dict[str, Any], classes: int) -> str | None:
    """What is wrong with weights file ``file`` for a model of ``architecture`` with
    ``classes`` outputs (None: nothing): a header that does not tile its data, other tensors
    than the architecture's, a tensor not F32 of its shape, a non-finite value. Reads every
    value (memory-mapped)."""
    import numpy as np

    try:
        header, start = safetensors_header(file)
    except (OSError, ValueError) as exc:
        return f"{file}: not a safetensors file: {exc}"
    want = expected_tensors(architecture, classes)
    got = {k: v.get("shape") for k, v in header.items() if k != "__metadata__"}
    if set(got) != set(want):
        extra, gone = sorted(set(got) - set(want)), sorted(set(want) - set(got))
        return (
            f"{file}: its tensors do not fit the architecture (extra {extra[:3]}, missing "
            f"{gone[:3]})"
        )
    data = np.memmap(file, dtype=np.uint8, mode="r") if file.stat().st_size else None
    for name, shape in want.items():
        info = header[name]
        if info.get("dtype") != "F32" or got[name] != shape:
            return (
                f"{file}: tensor {name} is {info.get('dtype')} {got[name]}, the architecture's "
                f"is F32 {shape}"
            )
        lo, hi = info["data_offsets"]
        if hi - lo != 4 * math.prod(shape):
            return f"{file}: tensor {name} holds {hi - lo} bytes, not {shape}"
        if data is not None and not np.isfinite(data[start + lo : start + hi].view("<f4")).all():
            return f"{file}: tensor {name} holds non-finite values"
    return None


def _check_weights(path: Path, config: dict[str, Any], classes: int) -> None:
    problem = weights_problem(path / WEIGHTS, config["architecture"], classes)
    if problem is not None:
        raise CheckpointError(problem)


def read_package(path: str | Path) -> Package:
    """Read and check package directory ``path`` completely (the module docstring); a
    CheckpointError names the first file that fails."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a directory")
    lineage = _read_json(path / LINEAGE)
    _check_version(path / LINEAGE, lineage)
    _check_files(path, lineage)
    config = _read_json(path / CONFIG)
    classes = _check_config(path, config, lineage)
    _check_weights(path, config, classes)
    return Package(path, config, lineage)

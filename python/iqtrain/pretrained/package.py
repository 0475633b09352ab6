"""``iqtrain export ATTEMPT --out DIR``: a trained model as a package that leaves iqtrain, and
the package loaded back as a :class:`~iqtrain.pretrained.load.Pretrained` (docs/design.md
"Model package"; the format and its checks: :mod:`iqtrain.evidence.package`).

A package is written from a checkpoint that verified as :func:`load_pretrained` verifies it,
into a temporary sibling of ``DIR`` that is renamed into place when every file is written and
fsynced: an error leaves nothing behind, and an existing ``DIR`` is replaced (``force``) only
when it is itself a package. Every file is a function of the checkpoint and its attempt alone
(sorted JSON keys, no time of export): the same checkpoint exports to the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import torch

from iqtrain.config.schema import Config, build_config, config_to_dict
from iqtrain.errors import CheckpointError, ConfigError
from iqtrain.evidence import package as fmt
from iqtrain.evidence.lineage import Parent, ParentRef, load_parent
from iqtrain.evidence.metrics import read_metrics
from iqtrain.model.transformer import IQTransformer
from iqtrain.storage import check_output_parent, file_digest, fsync_dir, fsync_file

__all__ = ["check_package_target", "export_package", "package_config", "package_model"]


def _version() -> str:
    from iqtrain import __version__

    return __version__


def check_package_target(out: Path, force: bool) -> None:
    """Refuse ``--out`` before any work (ConfigError naming it): a symbolic link, anything but
    a directory, a directory that is not a package (``--force`` replaces only a package), a
    package without ``force``, a path inside an attempt directory (its files are evidence), a
    parent that is not a writable directory."""
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(f"--out: {out}: {exc.strerror or exc}") from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise ConfigError(f"--out: {out} is a symbolic link; name a directory")
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"--out: {out} is not a directory")
        if not fmt.is_package(out):
            raise ConfigError(
                f"--out: {out} exists and is not an iqtrain package (--force replaces only a "
                "package)"
            )
        if not force:
            raise ConfigError(f"--out: {out} exists; pass --force to replace it")
    check_output_parent(out, "--out")


def _source_config(parent: Parent) -> Config:
    from iqtrain.pretrained.load import source_config

    return source_config(parent)


def _records_to(parent: Parent) -> list[dict[str, Any]]:
    """The metric records of the checkpoint's lineage up to its step (empty when unreadable:
    the card then says less)."""
    try:
        records = read_metrics(parent.attempt / "metrics.jsonl")
    except (OSError, ValueError, CheckpointError):
        return []
    return [r for r in records if isinstance(r.get("step"), int) and r["step"] <= parent.state.step]


def _config_json(parent: Parent, config: Config, weights_sha: str) -> dict[str, Any]:
    d, m = config.data, config_to_dict(config)["model"]
    classes = parent.state.classes
    return {
        "format": fmt.FORMAT,
        "format_version": fmt.FORMAT_VERSION,
        "iqtrain_version": _version(),
        "objective": config.model.objective,
        "architecture": m,
        "input": {
            "window": d.window,
            "patch_len": d.patch_len,
            "seq_patches": d.seq_patches,
            "norm": d.norm,
            "prefix_patches": d.prefix_patches,
            "layout": "[N, window, 2] I/Q (int8, int16, float32, float64) or complex [N, window]",
        },
        "classes": None if classes is None else list(classes),
        "label_key": d.label_key if config.model.task.labelled else None,
        "sample_rate": parent.state.known_rate,
        "seed": config.run.seed,
        "trained_precision": config.training.precision,
        "step": parent.state.step,
        "model_sha256": weights_sha,
    }


def _lineage(parent: Parent, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    attempt = parent.attempt
    info = json.loads((attempt / "attempt.json").read_text())
    manifest = attempt / "manifest.json"
    init = info.get("init")
    return {
        "format": fmt.FORMAT,
        "format_version": fmt.FORMAT_VERSION,
        "source": {
            "run": attempt.parent.parent.name,
            "attempt": attempt.name,
            "checkpoint": parent.checkpoint.name,
            "step": parent.state.step,
            "checkpoint_sha256": file_digest(parent.checkpoint / "checkpoint.json")["sha256"],
            "manifest_sha256": file_digest(manifest)["sha256"] if manifest.is_file() else None,
            "config_sha256": parent.state.config_sha256,
            "data": dict(parent.state.fingerprints),
        },
        # Where the lineage's first weights came from, without the machine's paths.
        "init": None
        if not isinstance(init, dict)
        else {k: init.get(k) for k in ("checkpoint", "step", "model_sha256")},
        "files": files,
    }


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _results(config: Config, records: list[dict[str, Any]]) -> list[str]:
    objective = config.model.task
    val = [r for r in records if r.get("kind") == "val"]
    lines: list[str] = []
    if val:
        last = val[-1]
        lines.append(
            f"- validation at step {last['step']}: loss {_fmt(last.get('loss'), '.5f')} "
            f"({objective.loss_unit}) over {last.get('samples', '?')} windows"
        )
        if objective.labelled:
            n, acc = last.get("samples"), last.get("accuracy")
            se = (
                (acc * (1 - acc) / n) ** 0.5
                if isinstance(n, int) and n and acc is not None
                else None
            )
            lines.append(
                f"- validation accuracy {_fmt(acc, '.4f')} ± {_fmt(se, '.4f')} (binomial "
                f"standard error over windows); majority class "
                f"{_fmt(val[0].get('baseline_majority_accuracy'), '.4f')}"
            )
        best = objective.best_record([r for r in val if objective.value_of(r) is not None])
        if best is not None:
            lines.append(
                f"- best validation {objective.monitor} {best[objective.monitor]:.5g} at step "
                f"{best['step']}"
            )
    probes = [r for r in records if r.get("kind") == "probe"]
    if probes:
        p = probes[-1]

        def acc(key: str) -> str:
            return f"{_fmt(p.get(key), '.4f')} ± {_fmt(p.get(f'{key}_se'), '.4f')}"

        lines.append(
            f"- linear probe at step {p['step']} (standard errors over annotations): accuracy "
            f"{acc('accuracy')}; random-init {acc('random_init_accuracy')}, classical "
            f"features {acc('classical_accuracy')}, chance {_fmt(p.get('chance'), '.4f')}"
        )
    return lines or ["- no validation record up to this checkpoint"]


def _card(parent: Parent, config: Config, doc: dict[str, Any], model: IQTransformer) -> str:
    """The model card: what it was trained on, how it did, what it takes, how to load it."""
    state, d = parent.state, config.data
    objective = config.model.task
    windows = state.components.get("cursor", {}).get("samples_consumed")
    flops = (
        None
        if not isinstance(windows, int)
        else windows * model.train_flops_per_window(d.seq_patches)
    )
    data = state.data if isinstance(state.data, dict) else {}
    rate = doc["sample_rate"]
    uses = ", ".join(u for u in ("embed", "score", "predict") if u in objective.uses)
    classes = doc["classes"]
    lines = [
        "---",
        "library_name: iqtrain",
        f"tags: [iqtrain, radio, iq, {objective.name}]",
        "---",
        "",
        f"# iqtrain model: {doc['source_name']}",
        "",
        f"A {config.model.layers}-layer, {config.model.dim}-wide causal transformer over "
        f"patches of {d.patch_len} complex samples, model.objective = {objective.name!r} "
        f"({'a classifier of windows' if objective.labelled else 'next-patch prediction'}); "
        f"checkpoint {parent.checkpoint.name}, step {state.step}. It gives: {uses}.",
        "",
        "## Trained on",
        "",
        f"- data identity (sampled fingerprint): train {state.fingerprints.get('train')}, "
        f"validation {state.fingerprints.get('val')}",
        f"- recordings: {len(data.get('train', {}))} train, {len(data.get('val', {}))} validation",
        f"- sample rate: {'not recorded' if rate is None else f'{rate:g} Hz'}",
        f"- steps: {state.step}; windows seen: {_fmt(windows, ',')}; training model FLOPs: "
        f"{_fmt(None if flops is None else float(flops), '.3e')}",
        "",
        "## Results (the source attempt's records up to this checkpoint)",
        "",
        *_results(config, _records_to(parent)),
        "",
        "## Input",
        "",
        f"Windows of {d.window} complex samples: `[N, {d.window}, 2]` I/Q (int8, int16, "
        f"float32, float64) or complex `[N, {d.window}]`, each window divided by the root mean "
        f"power of {'itself' if d.norm == 'window' else f'its first {d.prefix_patches} patches'}"
        f" (data.norm = {d.norm!r}) inside the model's input path.",
    ]
    if classes is not None:
        lines += [
            "",
            f"Classes, in output order: {', '.join(map(str, classes))} "
            f"(label key {doc['label_key']!r}).",
        ]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "import iqtrain",
        "",
        'model = iqtrain.load_pretrained("PATH/TO/THIS/FOLDER")  # verifies every file',
        *([f"out = model.{u}(iq)" for u in ("embed", "score", "predict") if u in objective.uses]),
        "```",
        "",
        "`iqtrain verify PATH/TO/THIS/FOLDER` checks the folder without loading torch; "
        "`lineage.json` names the source attempt, its checkpoint and manifest hashes and the "
        "SHA-256 of every file here.",
        "",
    ]
    return "\n".join(lines)


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def _write(path: Path, data: bytes) -> None:
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def export_package(ref: ParentRef, out: Path, *, force: bool = False) -> Path:
    """Write the package of checkpoint ``ref`` to directory ``out`` (see the module docstring)
    and return ``out``. CheckpointError when the checkpoint does not verify; ConfigError for a
    bad ``--out`` (checked by :func:`check_package_target` before and after the work) or a write
    that fails (no space, read-only): nothing is left behind."""
    out = Path(out)
    check_package_target(out, force)
    parent = load_parent(ref, optimizer=False)
    config = _source_config(parent)
    model = package_model(config, parent.state.classes, parent.model_state, parent.checkpoint)
    weights = parent.checkpoint / fmt.WEIGHTS
    data = weights.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    doc = _config_json(parent, config, sha)
    card_doc = {
        **doc,
        "source_name": f"{parent.attempt.parent.parent.name} attempt {parent.attempt.name}",
    }
    files = {
        fmt.WEIGHTS: data,
        fmt.CONFIG: _dump(doc),
        fmt.CARD: _card(parent, config, card_doc, model).encode(),
    }
    digests = {
        name: {"bytes": len(b), "sha256": hashlib.sha256(b).hexdigest()}
        for name, b in files.items()
    }
    files[fmt.LINEAGE] = _dump(_lineage(parent, digests))
    check_package_target(out, force)  # again: the work may have taken long
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    try:
        tmp.mkdir()
        for name, b in files.items():
            _write(tmp / name, b)
        fsync_dir(tmp)
        if out.exists():
            os.rename(out, old)
        os.rename(tmp, out)
        fsync_dir(out.parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not out.exists():
            os.rename(old, out)
        raise ConfigError(f"--out: cannot write {out}: {exc.strerror or exc}") from None
    shutil.rmtree(old, ignore_errors=True)
    for name in files:
        fsync_file(out / name)
    return out


def package_config(doc: dict[str, Any]) -> Config:
    """The resolved config a package's model runs with: its architecture, its input's window
    and normalisation, its label key and seed; every other key at its default."""
    inp = doc["input"]
    data = {k: inp[k] for k in ("patch_len", "seq_patches", "norm", "prefix_patches")}
    if doc["label_key"] is not None:
        data["label_key"] = doc["label_key"]
    tables = {"run": {"seed": doc["seed"]}, "model": doc["architecture"], "data": data}
    try:
        return build_config(tables)
    except ConfigError as exc:
        raise CheckpointError(f"config.json: {exc}") from None


def package_model(
    config: Config, classes: list[str] | None, state: dict[str, torch.Tensor], where: Path
) -> IQTransformer:
    """The model of ``config`` with every weight from ``state`` (strictly: CheckpointError
    naming ``where`` for a tensor that does not fit), in eval mode on the CPU."""
    from iqtrain.pretrained.load import load_weights, random_init_model

    if config.model.task.labelled != (classes is not None):
        raise CheckpointError(
            f"{where}: classes {classes!r} do not fit model.objective {config.model.objective!r}"
        )
    model = random_init_model(config.model, config.run.seed, len(classes or ()))
    load_weights(model, state, where / fmt.WEIGHTS if where.is_dir() else where)
    if not all(bool(torch.isfinite(p).all()) for p in model.state_dict().values()):
        raise CheckpointError(f"{where}: the weights hold non-finite values")
    return model.eval()


def load_package_state(path: Path) -> tuple[fmt.Package, Config, dict[str, torch.Tensor]]:
    """Read and verify package ``path`` (:func:`iqtrain.evidence.package.read_package`), its
    config and its tensors."""
    from safetensors.torch import load

    package = fmt.read_package(path)
    config = package_config(package.config)
    data = (package.path / fmt.WEIGHTS).read_bytes()
    if hashlib.sha256(data).hexdigest() != package.config["model_sha256"]:
        raise CheckpointError(f"{package.path / fmt.WEIGHTS}: changed while it was read")
    state = load(data)
    return package, config, state

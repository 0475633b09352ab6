"""``iqtrain export ATTEMPT --onnx FILE``: a trained model as one ONNX graph that takes raw
windows (docs/design.md "ONNX export").

The graph's input is ``iq``: ``[N, window, 2]`` I/Q as they come off a radio, float32, int16 or
int8 (``input_dtype``), with a dynamic batch dimension ``N``. Normalise-and-patch runs inside it
(:func:`~iqtrain.model.prepare.prepare_iq_input_reference`, the specification every path of
iqtrain matches), then the model, then one head:

- ``embed``: the hidden states of ``layer`` (:meth:`Pretrained.embed`'s numbering), mean-pooled
  over patches (``[N, dim]``) or every patch's (``pool=None``: ``[N, patches, dim]``);
- ``score``: each window's mean next-patch loss under the objective (``[N]``, as
  :meth:`Pretrained.score`);
- ``predict``: each window's log-probability of each class (``[N, classes]``, as
  :meth:`Pretrained.predict`; the default for a classifier, ``embed`` otherwise).

It is exported by torch's ONNX exporter (``torch.onnx.export(dynamo=True)``), the opset it
chose recorded; the model's metadata properties carry what ``config.json`` of a package
carries (:data:`METADATA`). With ``check`` (the default) ONNX Runtime runs the file on
:data:`CHECK_WINDOWS` seeded windows and its outputs must equal the model's within
:data:`CHECK_RTOL` of their largest magnitude, or the export fails and leaves nothing. The file
is written to a temporary sibling and renamed.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from iqtrain.errors import ConfigError, IQTrainError
from iqtrain.model.prepare import prepare_iq_input_reference
from iqtrain.objectives import Use
from iqtrain.pretrained.load import Pretrained, parse_layer

__all__ = [
    "CHECK_RTOL",
    "CHECK_WINDOWS",
    "INPUT_DTYPES",
    "METADATA",
    "OnnxExport",
    "check_onnx_target",
    "export_onnx",
]

InputDtype = Literal["float32", "int16", "int8"]
INPUT_DTYPES: tuple[InputDtype, ...] = get_args(InputDtype)
CHECK_WINDOWS = 16
CHECK_RTOL = 1e-4
ONNX_FORMAT = "iqtrain-onnx"
#: The metadata properties every exported file carries (values are strings; lists as JSON).
METADATA = (
    "format",
    "format_version",
    "iqtrain_version",
    "objective",
    "head",
    "layer",
    "pool",
    "classes",
    "window",
    "patch_len",
    "norm",
    "prefix_patches",
    "sample_rate",
    "input_dtype",
    "model_sha256",
    "source",
    "opset",
)


class _Graph(nn.Module):
    """``iq [N, window, 2] -> head output``: what the ONNX file holds."""

    def __init__(self, pre: Pretrained, head: Use, layer: int, pool: str | None) -> None:
        super().__init__()
        self.model = pre.model
        self.data = pre.config.data
        self.head, self.layer, self.pool = head, layer, pool

    def forward(self, iq: torch.Tensor) -> torch.Tensor:
        d = self.data
        patches, _ = prepare_iq_input_reference(
            iq, d.patch_len, norm=d.norm, prefix_patches=d.prefix_patches
        )
        if self.head == "embed":
            states = self.model.layer_states(patches)[self.layer].float()
            return states.mean(dim=1) if self.pool == "mean" else states
        out = self.model(patches)
        if self.head == "score":
            return self.model.objective.window_losses(out, patches, self.model.config)
        return out.float().log_softmax(dim=1)


@dataclass(frozen=True)
class OnnxExport:
    """What an export wrote: the file, its head, opset, and the check's largest relative
    difference (None: not checked)."""

    path: Path
    head: Use
    opset: int
    max_rel_diff: float | None


def check_onnx_target(path: Path, force: bool) -> None:
    """``--onnx`` refused before any work, by the rules of ``embed --out`` (a directory, a
    symbolic link, a FIFO or device, an existing file without ``force``, a path inside an
    attempt directory, a parent that is not writable)."""
    from iqtrain.pretrained.recordings import check_output

    try:
        check_output(path, force)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("--out:", "--onnx:", 1)) from None


def _windows(window: int, dtype: InputDtype, n: int = CHECK_WINDOWS) -> np.ndarray:
    """Seeded check windows of ``dtype``: Gaussian I/Q (integers: scaled to a quarter of full
    scale), with two windows at very different powers."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, window, 2))
    x[1] *= 1e-3
    x[2] *= 30.0
    if dtype == "float32":
        return x.astype(np.float32)
    full = np.iinfo(dtype).max
    return np.clip(np.round(x * full / 4), -full, full).astype(dtype)


def _reference(pre: Pretrained, head: Use, x: np.ndarray, layer: int, pool: str | None) -> Any:
    if head == "embed":
        return pre.embed(x, layer=layer, pool=pool)  # type: ignore[arg-type]
    if head == "score":
        return pre.score(x)
    return pre.predict(x)


def _metadata(pre: Pretrained, head: Use, layer: int, pool: str | None, dtype: str, opset: int):
    from iqtrain import __version__

    d = pre.config.data
    return {
        "format": ONNX_FORMAT,
        "format_version": "1",
        "iqtrain_version": __version__,
        "objective": pre.objective.name,
        "head": head,
        "layer": str(layer) if head == "embed" else "",
        "pool": str(pool) if head == "embed" else "",
        "classes": json.dumps(None if pre.classes is None else list(pre.classes)),
        "window": str(d.window),
        "patch_len": str(d.patch_len),
        "norm": d.norm,
        "prefix_patches": str(d.prefix_patches),
        "sample_rate": "" if pre.sample_rate is None else repr(pre.sample_rate),
        "input_dtype": dtype,
        "model_sha256": pre.model_sha256,
        "source": f"{pre.attempt.name}/{pre.checkpoint.name}",
        "opset": str(opset),
    }


def _export(graph: _Graph, window: int, dtype: InputDtype, tmp: Path) -> int:
    """Export ``graph`` to ``tmp``; the opset the exporter chose."""
    example = torch.from_numpy(_windows(window, dtype, 4))
    batch = torch.export.Dim("N")
    # The exporter reports its progress on stdout and warns of packages it does not need
    # (torchvision): kept out of the command's output.
    quiet = logging.getLogger("torch.onnx")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.ExitStack() as stack:
        stack.callback(quiet.setLevel, level)
        program = torch.onnx.export(
            graph,
            (example,),
            dynamo=True,
            input_names=["iq"],
            output_names=["output"],
            dynamic_shapes=({0: batch},),
            verbose=False,
        )
    assert program is not None
    model = program.model_proto
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    import onnx

    onnx.save_model(model, os.fspath(tmp))
    return opset


def export_onnx(
    pre: Pretrained,
    path: str | os.PathLike,
    *,
    head: Use | None = None,
    layer: int | None = None,
    pool: Literal["mean"] | None = "mean",
    input_dtype: InputDtype = "float32",
    check: bool = True,
    force: bool = False,
) -> OnnxExport:
    """Write model ``pre`` as an ONNX file at ``path`` (the module docstring). ObjectiveError for
    a head the objective does not give; ConfigError for a bad path; IQTrainError (nothing
    written) when ONNX Runtime's outputs differ from the model's."""
    import onnx

    out = Path(path)
    head = head or ("predict" if "predict" in pre.objective.uses else "embed")
    pre.objective.require(head, pre.attempt)
    if input_dtype not in INPUT_DTYPES:
        raise ValueError(f"input_dtype: expected one of {INPUT_DTYPES}, got {input_dtype!r}")
    if pool not in ("mean", None):
        raise ValueError(f"pool: expected 'mean' or None, got {pool!r}")
    k = parse_layer(layer, pre.config.model.layers, name="layer")
    if k == "all":
        raise ValueError("layer: an export takes one layer (an integer), not 'all'")
    check_onnx_target(out, force)
    graph = _Graph(pre, head, int(k), pool).eval()
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        with torch.no_grad():
            opset = _export(graph, pre.window, input_dtype, tmp)
        model = onnx.load_model(os.fspath(tmp))
        for key, value in _metadata(pre, head, int(k), pool, input_dtype, opset).items():
            model.metadata_props.add(key=key, value=value)
        model.doc_string = f"iqtrain {pre.objective.name} model, head {head}"
        onnx.save_model(model, os.fspath(tmp))
        diff = _check(tmp, pre, head, int(k), pool, input_dtype) if check else None
        check_onnx_target(out, force)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return OnnxExport(out, head, opset, diff)


def _check(
    file: Path, pre: Pretrained, head: Use, layer: int, pool: str | None, dtype: InputDtype
) -> float:
    """ONNX Runtime's outputs on the check windows against the model's; the largest difference
    relative to the largest magnitude (IQTrainError above :data:`CHECK_RTOL`)."""
    import onnxruntime as ort

    x = _windows(pre.window, dtype)
    session = ort.InferenceSession(os.fspath(file), providers=["CPUExecutionProvider"])
    got = session.run(None, {"iq": x})[0]
    want = np.asarray(_reference(pre, head, x, layer, pool), dtype=np.float64)
    scale = max(float(np.abs(want).max()), 1e-30)
    rel = float(np.abs(got.astype(np.float64) - want).max()) / scale
    if got.shape != want.shape or not rel <= CHECK_RTOL:
        raise IQTrainError(
            f"--onnx: ONNX Runtime's {head} outputs differ from the model's by {rel:.3g} of "
            f"their largest magnitude (shape {got.shape} vs {want.shape}; allowed "
            f"{CHECK_RTOL:g}); nothing written"
        )
    return rel

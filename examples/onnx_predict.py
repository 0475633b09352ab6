"""Run a model exported by ``iqtrain export ATTEMPT --onnx model.onnx`` on a recording, with
numpy and onnxruntime alone (no torch, no iqtrain).

    python onnx_predict.py model.onnx capture.sigmf-meta
    python onnx_predict.py model.onnx capture.cs16 --datatype ci16_le [--offset BYTES]

Reads the recording's samples (a SigMF recording: its ``core:datatype``; a raw file: the
``--datatype`` given), cuts them into the model's windows (the ``window`` metadata property;
non-overlapping, the tail shorter than a window dropped), converts them to the graph's input
dtype and prints one line per window: the predicted class and its probability for a classifier
(``head`` = predict), each window's score (``score``), or the embedding's norm (``embed``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

#: SigMF complex datatypes: (component dtype, byte order) by name.
COMPONENTS = {
    "f64": "f8",
    "f32": "f4",
    "i32": "i4",
    "i16": "i2",
    "i8": "i1",
    "u32": "u4",
    "u16": "u2",
    "u8": "u1",
}


def component_dtype(datatype: str) -> np.dtype:
    """The numpy dtype of one component of SigMF complex ``datatype`` (``ci16_le``, ``cf32``)."""
    name, _, order = datatype.partition("_")
    if not name.startswith("c") or name[1:] not in COMPONENTS:
        sys.exit(f"onnx_predict: {datatype!r} is not a complex SigMF datatype this reads")
    return np.dtype((">" if order == "be" else "<") + COMPONENTS[name[1:]])


def read_iq(path: Path, datatype: str | None, offset: int) -> np.ndarray:
    """``[samples, 2]`` I/Q of a SigMF recording (``.sigmf-meta``) or a raw file."""
    if path.suffix == ".sigmf-meta":
        meta = json.loads(path.read_text())
        datatype = meta["global"]["core:datatype"]
        offset = int(meta["global"].get("core:header_bytes", 0)) + offset
        path = path.with_suffix(".sigmf-data")
    if datatype is None:
        sys.exit("onnx_predict: a raw file needs --datatype (for example ci16_le)")
    values = np.fromfile(path, dtype=component_dtype(datatype), offset=offset)
    return values[: len(values) // 2 * 2].reshape(-1, 2)


def as_input(windows: np.ndarray, dtype: str) -> np.ndarray:
    """Windows in the graph's input dtype: integers kept (a wider integer type is refused),
    floats as float32; unsigned components centred as SigMF's unsigned types are."""
    if windows.dtype.kind == "u":
        half = 1 << (8 * windows.dtype.itemsize - 1)
        windows = windows.astype(np.int64) - half
    if dtype == "float32":
        return np.ascontiguousarray(windows, dtype=np.float32)
    info = np.iinfo(dtype)
    if windows.dtype.kind == "f" or windows.min() < info.min or windows.max() > info.max:
        sys.exit(f"onnx_predict: the graph takes {dtype}; export it with --input-dtype float32")
    return np.ascontiguousarray(windows, dtype=dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("recording", type=Path)
    ap.add_argument("--datatype", help="a raw file's SigMF datatype (ci16_le, cf32_le, ...)")
    ap.add_argument("--offset", type=int, default=0, help="bytes to skip before the samples")
    ap.add_argument("--limit", type=int, default=20, help="windows to print (default 20)")
    args = ap.parse_args()

    session = ort.InferenceSession(str(args.model), providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    window, head = int(meta["window"]), meta["head"]
    iq = read_iq(args.recording, args.datatype, args.offset)
    n = len(iq) // window
    if n == 0:
        sys.exit(f"onnx_predict: {len(iq)} samples, fewer than one window of {window}")
    x = as_input(iq[: n * window].reshape(n, window, 2), meta["input_dtype"])
    out = session.run(None, {"iq": x})[0]
    print(f"{args.recording}: {n} windows of {window} samples, head {head}")
    classes = json.loads(meta["classes"])
    for i in range(min(n, args.limit)):
        if head == "predict":
            k = int(out[i].argmax())
            print(f"  window {i}: {classes[k]} (p = {float(np.exp(out[i, k])):.3f})")
        elif head == "score":
            print(f"  window {i}: score {float(out[i]):.5f}")
        else:
            print(
                f"  window {i}: embedding of {out.shape[-1]} values, norm "
                f"{float(np.linalg.norm(out[i])):.4f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

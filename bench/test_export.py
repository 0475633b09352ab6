"""Windows per second of an exported model under ONNX Runtime against the same model through
``Pretrained``, eager and compiled: the bench's loop model (bench_helpers: dim 128, 4 layers,
512-sample windows) fine-tuned for a few steps on the synthetic labelled set, one batch of
:data:`BATCH` windows, same run, CPU, fp32.

(a) ``Pretrained.predict`` eager (the peer); (b) the same with the model compiled
(``torch.compile``); (c) the ONNX file of ``--head predict`` under ONNX Runtime (CPU execution
provider, its default threads); and for ``embed``: (d) ``Pretrained.embed`` eager, (e) compiled,
(f) the ONNX file of ``--head embed``. The summary prints each as windows/s and as a ratio to
its eager peer.

    pytest bench/test_export.py --benchmark-only
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch
from bench_helpers import DIM, HEADS, LAYERS, PATCH_LEN, SEQ_PATCHES, median
from helpers import cli_tables

from iqtrain.config.schema import build_config
from iqtrain.pretrained.load import load_pretrained
from iqtrain.pretrained.onnx_export import export_onnx
from iqtrain.train.attempt import run_attempt

BATCH = 64
_rates: dict[str, float] = {}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench-export")
    tables = cli_tables(root / "run", root / "cache", max_steps=4)
    tables["training"].update(eval_every=4, checkpoint_every=4, compile=False)
    tables["data"].update(patch_len=PATCH_LEN, seq_patches=SEQ_PATCHES, batch_size=8)
    tables["data"]["synthetic"].update(samples=1 << 15)
    tables["model"].update(dim=DIM, layers=LAYERS, heads=HEADS, objective="classify")
    tables["model"]["max_patches"] = SEQ_PATCHES
    pre = load_pretrained(run_attempt(build_config(tables)).attempt)
    files = {}
    for head in ("predict", "embed"):
        files[head] = root / f"{head}.onnx"
        export_onnx(pre, files[head], head=head)
    x = np.random.default_rng(0).standard_normal((BATCH, pre.window, 2)).astype(np.float32)
    return pre, files, x


def _compiled(pre):
    compiled = torch.compile(pre.model)
    return dataclasses.replace(pre, model=compiled)


def _session(path):
    import onnxruntime as ort

    return ort.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("way", ["eager", "compiled", "onnx"])
@pytest.mark.parametrize("head", ["predict", "embed"])
def test_windows_per_second(benchmark, model, head, way, bench_summary):
    pre, files, x = model
    if way == "onnx":
        session = _session(files[head])

        def run():
            return session.run(None, {"iq": x})[0]
    else:
        user = _compiled(pre) if way == "compiled" else pre
        if way == "compiled" and head == "embed":
            # layer_states is the compiled module's method, not its forward: compile it too
            user.model.layer_states = torch.compile(pre.model.layer_states)

        def run():
            return getattr(user, head)(x, batch_size=BATCH)

    run()  # warm-up: compile, session start
    benchmark.pedantic(run, rounds=15, warmup_rounds=2)
    seconds = median(benchmark)
    if seconds is None:
        return
    _rates[f"{head}-{way}"] = BATCH / seconds
    if way == "onnx":
        base = {w: _rates.get(f"{head}-{w}") for w in ("eager", "compiled", "onnx")}
        bench_summary(
            f"{head}: "
            + ", ".join(
                f"{w} {r:,.0f} windows/s ({r / base['eager']:.2f}x eager)"
                for w, r in base.items()
                if r is not None and base["eager"]
            )
        )

"""The determinism stage of ``bash .ci/dev gpu`` (scripts/ci/gpu_determinism.py) on the CPU: its
``--tiny`` run end to end (the workers at once, the repeats, the comparison across processes,
the cost, one summary line), and its verdict on results that differ or workers that fail.

On the CPU ``training.deterministic`` changes nothing, so this tests the script, not CUDA:
whether a CUDA step is bit-exact (eager and compiled, restored and repeated, the same in two
processes with their own compile caches), which attention kernels it runs and what the mode
costs is what the stage itself reports on the GPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

import iqtrain

SCRIPT = REPO / "scripts" / "ci" / "gpu_determinism.py"
PYTHONPATH = os.pathsep.join(
    p for p in (os.fspath(Path(iqtrain.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p
)


def _load():
    spec = importlib.util.spec_from_file_location("gpu_determinism", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gd = _load()


def _without_caches(env) -> dict[str, str]:
    """The environment without compile-cache locations: the script then puts the shared caches
    under its output folder. (Inductor sets TORCHINDUCTOR_CACHE_DIR in its own process's
    environment at its first compile, so a test process that compiled earlier would pass its
    default cache on.)"""
    return {
        k: v for k, v in env.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
    }


def _tiny(tmp_path, *args):
    summary = tmp_path / "summary.jsonl"
    summary.write_text('{"kind": "stage", "stage": "smoke"}\n')  # appended to, not replaced
    proc = subprocess.run(
        [sys.executable, SCRIPT, summary, "--tiny", *args],
        capture_output=True,
        text=True,
        env={**_without_caches(os.environ), "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1"},
        timeout=600,
    )
    lines = summary.read_text().splitlines()
    assert len(lines) == 2, lines
    return proc, json.loads(lines[1])


def torch_version():
    import torch

    return torch.__version__


def _workers(rec):
    return {w["name"]: w for w in rec["workers"]}


def test_the_tiny_run_repeats_compares_and_appends_one_summary_line(tmp_path):
    proc, rec = _tiny(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("determinism: bit-exact: eager at 8 and 16 patches, 2 steps"), last
    assert rec["kind"] == "determinism" and rec["ok"] is True and rec["verdict"] == "bit-exact"
    assert "error" not in rec and last == f"determinism: {rec['line']}"
    workers = _workers(rec)
    assert sorted(workers) == ["A16", "A8", "B16", "B8"]  # no C: nothing compiled
    for w in workers.values():
        assert w["modes"]["eager"]["equal"] is True and "losses" not in w["modes"]["eager"]
    for p in (8, 16):
        assert (
            workers[f"A{p}"]["modes"]["eager"]["sha256"]
            == workers[f"B{p}"]["modes"]["eager"]["sha256"]
        )
    assert workers["A8"]["modes"]["eager"]["sha256"] != workers["A16"]["modes"]["eager"]["sha256"]
    ops = workers["A8"]["modes"]["eager"]["attention"]["ops"]
    assert "aten::scaled_dot_product_attention" in ops, ops
    assert workers["A8"]["sdpa"] in {"MATH", "FLASH_ATTENTION"}  # the CPU's choices
    ms = rec["cost"]["ms_per_step"]
    assert list(ms) == ["eager"] and ms["eager"]["on"] > 0 and ms["eager"]["off"] > 0
    assert (rec["torch"], rec["device"], rec["patches"]) == (torch_version(), "cpu", [8, 16])
    # each worker's full result (the losses too) and its log stay beside the summary
    full = json.loads((tmp_path / "determinism" / "B16.json").read_text())
    first, second = full["modes"]["eager"]["losses"]
    assert first == second and len(first) == 2


@pytest.mark.slow
def test_the_tiny_run_compiles_too_and_warms_the_shared_cache(tmp_path):
    # Compiled on the CPU: five processes compile at once (~70 s on two cores).
    proc, rec = _tiny(tmp_path, "--modes", "eager,compiled")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert rec["ok"] is True and rec["modes"] == ["eager", "compiled"]
    workers = _workers(rec)
    assert workers["C8"]["warm_s"] > 0 and "modes" not in workers["C8"]
    for p in (8, 16):
        a, b = workers[f"A{p}"]["modes"], workers[f"B{p}"]["modes"]
        assert a["compiled"]["equal"] and b["compiled"]["equal"]
        assert a["compiled"]["sha256"] == b["compiled"]["sha256"] != a["eager"]["sha256"]
    assert set(rec["cost"]["ms_per_step"]) == {"eager", "compiled"}
    # B compiled into caches of its own; A and C into the shared ones
    assert any((tmp_path / "determinism" / "cold-cache-B8" / "inductor").iterdir())
    assert any((tmp_path / "determinism" / "shared-cache" / "inductor").iterdir())


def _result(name, sha="s", equal=True, unequal=(), modes=("eager",)):
    att = {"ops": [], "fwd": ["flash_fwd_kernel<x>(p)"], "bwd": ["flash_bwd_kernel<x>(p)"]}
    mode = {"equal": equal, "unequal": list(unequal), "sha256": sha, "attention": att}
    return {
        "name": name,
        "patches": int(name[1:]),
        "sdpa": "FLASH_ATTENTION",
        "torch": "2.11.0",
        "modes": {m: dict(mode, first_run_s=1.0) for m in modes},
    }


COST = {"name": "cost", "patches": 8, "ms_per_step": {"eager": {"on": 11.0, "off": 10.0}}}


def _record(results, cost=COST):
    return gd.record(results, cost, gd.TINY, ["eager"], 1.0)


def test_equal_results_are_bit_exact_with_the_kernels_and_the_cost_in_the_line():
    rec = _record([_result("A8"), _result("B8"), _result("A16"), _result("B16")])
    assert rec["ok"] is True and rec["verdict"] == "bit-exact" and "error" not in rec
    assert (
        "attention at 8 patches: FLASH_ATTENTION, eager fwd flash_fwd_kernel, bwd " in (rec["line"])
    )
    assert rec["line"].endswith("eager 10.00 -> 11.00 ms/step (1.10x)")


def test_other_weights_in_another_process_are_not_bit_exact():
    rec = _record([_result("A8"), _result("B8", sha="t"), _result("A16"), _result("B16")])
    assert rec["ok"] is False
    assert (
        rec["verdict"] == "NOT bit-exact: 8 patches eager: processes A and B end with other weights"
    )
    assert rec["error"] == "8 patches eager: processes A and B end with other weights"


def test_a_repeat_that_differs_is_named_with_its_parameters():
    differs = _result("B16", equal=False, unequal=["head.weight", "blocks.0.attn.qkv.weight"])
    rec = _record([_result("A8"), _result("B8"), _result("A16"), differs])
    assert rec["verdict"] == (
        "NOT bit-exact: B16 eager: restored and repeated, head.weight, blocks.0.attn.qkv.weight "
        "differ"
    )
    losses_only = [_result("A8", equal=False), _result("B8"), _result("A16"), _result("B16")]
    assert _record(losses_only)["error"] == "A8 eager: restored and repeated, the losses differ"


def test_a_worker_that_failed_or_is_missing_fails_the_stage():
    failed = {"name": "B8", "patches": 8, "error": "RuntimeError: no CUDA", "log_tail": ["x"]}
    rec = _record([_result("A8"), failed, _result("A16")])
    assert rec["ok"] is False
    assert rec["verdict"] == "failed: B8: RuntimeError: no CUDA (and 1 more)"
    assert rec["error"] == "B8: RuntimeError: no CUDA; A16 and B16: not both ran"
    # a cost that could not be measured fails it too, and says why in the line
    rec = _record(
        [_result("A8"), _result("B8"), _result("A16"), _result("B16")],
        {"name": "cost", "patches": 8, "error": "did not finish in time"},
    )
    assert rec["verdict"] == "failed: cost: did not finish in time"
    assert rec["line"].endswith("; cost not measured (did not finish in time)")


def test_attention_names_are_split_into_operators_and_forward_and_backward_kernels():
    names = {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::mm",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<32, 128, 128, 4> >"
        "(pytorch_flash::Flash_fwd_params)",
        "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Traits>"
        "(pytorch_flash::Flash_bwd_params)",
        "fmha_cutlassB_bf16_aligned_64x64_k32_sm80(PyTorchMemEffAttention::AttentionBackward"
        "Kernel<cutlass::arch::Sm80, cutlass::bfloat16_t, true, false, true, 64, 64, 32>::Params)",
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<"
        "cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
        "triton_poi_fused__scaled_dot_product_flash_attention_0",
        "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn",
    }
    got = gd.split_names(names)
    assert got["ops"] == [
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::scaled_dot_product_attention",
    ]
    assert [gd._base(k) for k in got["fwd"]] == [
        "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
        "pytorch_flash::flash_fwd_kernel",
    ]
    assert [gd._base(k) for k in got["bwd"]] == [
        "fmha_cutlassB_bf16_aligned_64x64_k32_sm80",
        "pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel",
    ]
    assert all(len(k) <= 90 for k in got["fwd"] + got["bwd"])

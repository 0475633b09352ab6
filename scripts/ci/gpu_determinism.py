"""The determinism stage of ``bash .ci/dev gpu``: under ``training.deterministic = true``, is a CUDA
training step bit-exact, in one process and across processes? (docs/design.md "Device, precision,
compile")

    python scripts/ci/gpu_determinism.py SUMMARY.jsonl [--out DIR] [--tiny] [--modes M,...]

The quickstart's model (categorical over 64 bins, dim 192, 4 layers) with dropout 0.1, in bf16,
at batch 256, on fixed batches of noise. Worker processes run at once: A and B at 32 and at
256 patches, and C. Each calls :func:`iqtrain.train.determinism.configure` before its first
CUDA work. A and B, for each mode (eager, then compiled):

- build the step from the seed, keep its state (weights, AdamW, the CPU and CUDA generators),
  run 3 steps, restore the state as a resume does, run the same 3 steps again and compare
  every parameter with ``torch.equal`` (and the losses);
- hash the final parameters (sha256): A and B must agree. B compiles into caches of its own,
  cold; A into the stage's shared ones (``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``),
  so the two compile apart and must choose the same kernels;
- name the attention one more step ran: ``torch._fused_sdp_choice``'s backend, and the
  profiler's operators and kernels matching flash, fmha, efficient, cudnn or attention,
  forward and backward.

C compiles the step at 32 patches with the mode off into the shared caches meanwhile. Last,
alone on the GPU and with those caches warm, one process times eager and compiled steps at 32
patches with the mode on, then off (ms/step after warm-up); the bench stage reuses the caches.

Prints the verdict and appends one ``{"kind": "determinism", ...}`` JSON line to SUMMARY
(gpu_summary.py shows its ``verdict`` and ``line``, and ``error`` when not ``ok``); exits 0 when
every comparison is equal and every worker finished. The workers' logs and full results are in
DIR (default: ``determinism/`` beside SUMMARY). Needs only torch, triton, numpy and iqtrain,
and no network. ``--tiny`` runs the same at a tiny size on the CPU, eager only unless
``--modes`` says otherwise: CI's test of this script, in seconds (on the CPU ``configure``
changes nothing, so it tests the machinery, not CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart.toml"
DATA_SEED = 1234
LR = 2e-3
DROPOUT = 0.1
#: Attention in a profiler's operator or kernel name; Inductor's own kernels (triton_*) are
#: not attention even when an input's name says so.
ATTENTION = re.compile(r"flash|fmha|efficient|cudnn|attention|sdpa", re.IGNORECASE)
BACKWARD = re.compile(r"bwd|backward|cutlassB|dgrad", re.IGNORECASE)
BUDGET_S = 80.0  # the stage's limit is 85 s
TINY_BUDGET_S = 540.0  # --tiny on shared CPUs, compiling (--modes) in five processes at once
COST_RESERVE_S = 15.0  # of the budget, kept for the cost measurement


@dataclass(frozen=True)
class Shape:
    """What the workers train: the device and the sizes."""

    device: str
    precision: str
    patches: tuple[int, ...]
    batch: int
    steps: int
    model: tuple[str, ...]  # --set overrides of the quickstart's [model]
    timed: int  # steps timed per cost row (after `warmup`)
    warmup: int


GPU = Shape("cuda", "bf16", (32, 256), 256, 3, (), timed=20, warmup=3)
TINY = Shape(
    "cpu", "fp32", (8, 16), 4, 2, ("model.dim=16", "model.layers=1", "model.heads=2"), 2, 1
)


# ----------------------------------------------------------------------------- the workers


def _config(shape: Shape, patches: int, deterministic: bool) -> Any:
    from iqtrain.config.schema import load_config

    sets = [
        f"training.device={shape.device}",
        f"training.precision={shape.precision}",
        f"training.deterministic={'true' if deterministic else 'false'}",
        f"model.dropout={DROPOUT}",
        f"data.seq_patches={patches}",
        f"data.batch_size={shape.batch}",
        *shape.model,
    ]
    return load_config(QUICKSTART, sets)


def _batches(config: Any, count: int) -> list[Any]:
    """``count`` loader batches of Gaussian noise, int16 ``[B, L, 2]``, the same everywhere."""
    import numpy as np

    d = config.data
    rng = np.random.default_rng(DATA_SEED + d.seq_patches)
    shape = (d.batch_size, d.seq_patches * d.patch_len, 2)
    return [(rng.standard_normal(shape) * 3000).astype(np.int16) for _ in range(count)]


def _step(config: Any, compiled: bool) -> Any:
    import torch

    from iqtrain.model.transformer import IQTransformer
    from iqtrain.train.step import TrainStep

    torch.manual_seed(config.run.seed)
    t = config.training
    model = IQTransformer(config.model)
    return TrainStep(
        model, config.optimizer, device=t.device, precision=t.precision, compile=compiled
    )


def _run(step: Any, config: Any, batches: list[Any]) -> list[float]:
    d = config.data
    losses = []
    for raw in batches:
        patches, _ = step.prepare(raw, d.patch_len, norm=d.norm, prefix_patches=d.prefix_patches)
        losses.append(step.train_step([patches], LR).loss)
    return losses


def _params(step: Any) -> dict[str, Any]:
    return {n: p.detach().clone() for n, p in step.model.named_parameters()}


def _sha256(params: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def repeat(config: Any, batches: list[Any], compiled: bool) -> dict[str, Any]:
    """The steps, then the state restored and the same steps again: equal to the bit?"""
    import torch

    from iqtrain.train.rng import restore_rng_state, rng_state

    step = _step(config, compiled)
    saved, generators = copy.deepcopy(step.state_dict()), rng_state()
    start = time.perf_counter()
    first = _run(step, config, batches)
    first_s = time.perf_counter() - start
    before = _params(step)
    step.load_state_dict(copy.deepcopy(saved))
    restore_rng_state(generators)
    second = _run(step, config, batches)
    after = _params(step)
    unequal = [n for n in before if not torch.equal(before[n], after[n])]
    return {
        "equal": not unequal and first == second,
        "unequal": unequal[:5],
        "losses": [first, second],
        "sha256": _sha256(after),
        "first_run_s": round(first_s, 2),
        "attention": attention_kernels(step, config, batches[:1]),
    }


def _short(name: str) -> str:
    name = name.removeprefix("void ")
    return name if len(name) <= 90 else name[:87] + "..."


def split_names(names: set[str]) -> dict[str, list[str]]:
    """The attention operators (``aten::...``) and kernels, forward and backward, among a
    profile's event names."""
    hits = {n for n in names if ATTENTION.search(n) and not n.startswith("triton_")}
    ops = sorted(n for n in hits if n.startswith("aten::"))
    kernels = sorted(hits - set(ops))
    return {
        "ops": ops,
        "fwd": [_short(k) for k in kernels if not BACKWARD.search(k)],
        "bwd": [_short(k) for k in kernels if BACKWARD.search(k)],
    }


def attention_kernels(step: Any, config: Any, batches: list[Any]) -> dict[str, Any]:
    """What attention ran in one more step: the profiler's names, or why there are none."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if step.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    try:
        with profile(activities=activities) as prof:
            _run(step, config, batches)
        return split_names({e.key for e in prof.key_averages()})
    except RuntimeError as exc:  # a profiler that cannot start is a note, not a verdict
        return {"error": f"profiler: {exc}"}


def sdpa_choice(config: Any) -> str:
    """The backend ``scaled_dot_product_attention`` picks for the model's training call."""
    import torch
    from torch.nn.attention import SDPBackend

    m, t, d = config.model, config.training, config.data
    dtype = torch.bfloat16 if t.precision == "bf16" else torch.float32
    shape = (d.batch_size, m.heads, d.seq_patches, m.dim // m.heads)
    q = torch.zeros(shape, device=t.device, dtype=dtype, requires_grad=True)
    choice = torch._fused_sdp_choice(q, q, q, dropout_p=m.dropout, is_causal=True)
    names = {v.value: k for k, v in SDPBackend.__members__.items()}
    return names.get(choice, str(choice))


def _versions(device: str) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "device": "cpu"}
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    if device == "cuda":
        out["device"] = torch.cuda.get_device_name()
    return out


def _setup(spec: dict[str, Any], deterministic: bool) -> tuple[Shape, Any]:
    """A worker's shape and config, ``training.deterministic`` configured: the worker's first
    use of torch, before any CUDA work (torch reads the cuBLAS workspace at the first matmul)."""
    fields = spec["shape"]
    shape = Shape(
        **{**fields, "patches": tuple(fields["patches"]), "model": tuple(fields["model"])}
    )
    config = _config(shape, spec["patches"], deterministic)
    from iqtrain.train.determinism import configure

    configure(config.training.device, config.training.deterministic)
    import torch

    if shape.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA device")
    return shape, config


def check(spec: dict[str, Any]) -> dict[str, Any]:
    """A or B: the repeats of each mode at ``spec["patches"]``, with the mode on."""
    shape, config = _setup(spec, True)
    batches = _batches(config, shape.steps)
    out: dict[str, Any] = {**_versions(shape.device), "sdpa": sdpa_choice(config), "modes": {}}
    for mode in spec["modes"]:
        out["modes"][mode] = repeat(config, batches, mode == "compiled")
    return out


def warm(spec: dict[str, Any]) -> dict[str, Any]:
    """C: the compiled step with the mode off, into the shared caches (the cost measurement
    and the bench stage find it there)."""
    _, config = _setup(spec, False)
    start = time.perf_counter()
    _run(_step(config, compiled=True), config, _batches(config, 2))
    return {"warm_s": round(time.perf_counter() - start, 1)}


def _time(step: Any, config: Any, batches: list[Any], shape: Shape) -> float:
    """ms per step after ``shape.warmup`` steps (each step ends in a host sync)."""
    _run(step, config, batches[: shape.warmup])
    runs = (batches * shape.timed)[: shape.timed]
    start = time.perf_counter()
    _run(step, config, runs)
    return 1e3 * (time.perf_counter() - start) / shape.timed


def cost(spec: dict[str, Any]) -> dict[str, Any]:
    """ms/step at ``spec["patches"]`` with the mode on, then off, for each mode."""
    shape, config = _setup(spec, True)
    from iqtrain.train.determinism import configure

    batches = _batches(config, max(shape.warmup, 1))
    rows: dict[str, Any] = {}
    for mode in spec["modes"]:
        rows[mode] = {}
        for on in (True, False):
            configure(config.training.device, on)
            step = _step(config, mode == "compiled")
            rows[mode]["on" if on else "off"] = round(_time(step, config, batches, shape), 3)
    return {"patches": spec["patches"], "ms_per_step": rows}


def worker(spec_json: str) -> int:
    """``--worker SPEC``: ``check``, ``warm`` or ``cost``; its result (or its error, the
    traceback in its log) as JSON in ``spec["result"]``."""
    spec = json.loads(spec_json)
    result: dict[str, Any] = {"name": spec["name"], "patches": spec["patches"]}
    roles = {"check": check, "warm": warm, "cost": cost}
    try:
        result.update(roles[spec["role"]](spec))
    except Exception as exc:  # the orchestrator reports it, with the log's tail
        traceback.print_exc()
        result["error"] = f"{type(exc).__name__}: {exc}"
    Path(spec["result"]).write_text(json.dumps(result))
    return 1 if "error" in result else 0


# ----------------------------------------------------------------------------- the stage


@dataclass
class Job:
    name: str
    spec: dict[str, Any]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None


def _caches(out: Path, name: str | None) -> dict[str, str]:
    """The compile caches: the stage's shared ones (``name`` None; under ``out`` when the
    environment names none), or cold ones of ``name``'s own."""
    if name is None:
        shared = out / "shared-cache"
        return {
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get(
                "TORCHINDUCTOR_CACHE_DIR", str(shared / "inductor")
            ),
            "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR", str(shared / "triton")),
        }
    own = out / f"cold-cache-{name}"
    shutil.rmtree(own, ignore_errors=True)
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(own / "inductor"),
        "TRITON_CACHE_DIR": str(own / "triton"),
    }


def _job(out: Path, shape: Shape, modes: list[str], role: str, name: str, patches: int) -> Job:
    spec = {
        "role": role,
        "name": name,
        "patches": patches,
        "shape": asdict(shape),
        "modes": modes,
        "result": str(out / f"{name}.json"),
    }
    return Job(name, spec, {}, out / f"{name}.log")


def check_jobs(out: Path, shape: Shape, modes: list[str]) -> list[Job]:
    """A and B at each patch count, A in the shared caches and B in cold ones of its own; with
    compiled steps also C, compiling the step with the mode off into the shared caches at the
    same time, so that the cost measurement after them compiles nothing."""
    jobs = []
    for p in shape.patches:
        for who in "AB":
            job = _job(out, shape, modes, "check", f"{who}{p}", p)
            job.env = _caches(out, None if who == "A" else job.name)
            jobs.append(job)
    if "compiled" in modes:
        first = shape.patches[0]
        jobs.append(_job(out, shape, modes, "warm", f"C{first}", first))
        jobs[-1].env = _caches(out, None)
    threads = str(max(1, (os.cpu_count() or 1) // len(jobs)))
    for job in jobs:  # the CPUs shared among the compilers
        job.env["TORCHINDUCTOR_COMPILE_THREADS"] = threads
    return jobs


def cost_job(out: Path, shape: Shape, modes: list[str]) -> Job:
    job = _job(out, shape, modes, "cost", "cost", shape.patches[0])
    job.env = _caches(out, None)
    return job


def _start(job: Job) -> None:
    argv = [sys.executable, __file__, "--worker", json.dumps(job.spec)]
    job.log.parent.mkdir(parents=True, exist_ok=True)
    Path(job.spec["result"]).unlink(missing_ok=True)
    with open(job.log, "wb") as log:
        job.proc = subprocess.Popen(
            argv, stdout=log, stderr=log, env={**os.environ, **job.env}, start_new_session=True
        )


def _collect(job: Job, deadline: float) -> dict[str, Any]:
    """The job's result once it ends; killed, with its compile workers, at ``deadline``."""
    assert job.proc is not None
    result: dict[str, Any] = {"name": job.name, "patches": job.spec["patches"]}
    try:
        job.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.proc.pid, signal.SIGKILL)
        job.proc.wait()
        result["error"] = "did not finish in time"
    path = Path(job.spec["result"])
    if "error" not in result:
        if path.is_file():
            result = json.loads(path.read_text())
        else:
            result["error"] = f"exit {job.proc.returncode} without a result"
    if "error" in result:
        result["log_tail"] = job.log.read_text(errors="replace").strip().splitlines()[-12:]
    return result


def run_jobs(jobs: list[Job], deadline: float) -> list[dict[str, Any]]:
    """Every job at once; their results, in order."""
    for job in jobs:
        _start(job)
    return [_collect(job, deadline) for job in jobs]


# ----------------------------------------------------------------------------- the verdict


def verdict(
    results: list[dict[str, Any]], patches: tuple[int, ...], modes: list[str]
) -> tuple[list[str], list[str]]:
    """``(differences, failures)`` in words: what differed that must be equal, and which
    worker failed; neither: bit-exact."""
    by_name = {r["name"]: r for r in results}
    failures = [f"{r['name']}: {r['error']}" for r in results if "error" in r]
    differences = []
    for p in patches:
        pair = [by_name.get(f"{who}{p}") for who in "AB"]
        if any(r is None for r in pair):
            failures.append(f"A{p} and B{p}: not both ran")
        a, b = pair
        if a is None or b is None or "error" in a or "error" in b:
            continue
        for mode in modes:
            for r in (a, b):
                m = r["modes"][mode]
                if not m["equal"]:
                    what = ", ".join(m["unequal"]) or "the losses"
                    differences.append(f"{r['name']} {mode}: restored and repeated, {what} differ")
            if a["modes"][mode]["sha256"] != b["modes"][mode]["sha256"]:
                differences.append(f"{p} patches {mode}: processes A and B end with other weights")
    return differences, failures


def verdict_text(differences: list[str], failures: list[str]) -> str:
    """``bit-exact``, ``NOT bit-exact: ...`` or ``failed: ...`` (the first problem)."""
    problems = differences or failures
    if not problems:
        return "bit-exact"
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{'NOT bit-exact' if differences else 'failed'}: {problems[0]}{more}"


def _base(name: str) -> str:
    """A kernel's name without its template arguments and signature."""
    return re.split(r"[<(]", name.removeprefix("void "), maxsplit=1)[0].strip()


def attention_text(result: dict[str, Any], modes: list[str]) -> str:
    """What attention ran in each mode: kernels (forward, backward), or else operators."""
    parts = []
    for mode in modes:
        att = result["modes"][mode]["attention"]
        if "error" in att:
            text = att["error"]
        elif att["fwd"] or att["bwd"]:
            fwd = " + ".join(sorted({_base(k) for k in att["fwd"]})) or "none"
            bwd = " + ".join(sorted({_base(k) for k in att["bwd"]})) or "none"
            text = f"fwd {fwd}, bwd {bwd}"
        elif att["ops"]:
            text = "ops " + " + ".join(o.removeprefix("aten::") for o in att["ops"])
        else:  # Inductor on the CPU writes attention out as matmuls
            text = "no attention operator or kernel of its own"
        parts.append(f"{mode} {text}")
    return "; ".join(parts)


def cost_text(cost: dict[str, Any]) -> str:
    if "error" in cost:
        return f"cost not measured ({cost['error']})"
    rows = []
    for mode, ms in cost["ms_per_step"].items():
        ratio = ms["on"] / ms["off"] if ms["off"] > 0 else float("nan")
        rows.append(f"{mode} {ms['off']:.2f} -> {ms['on']:.2f} ms/step ({ratio:.2f}x)")
    return f"the mode off -> on at {cost['patches']} patches: " + ", ".join(rows)


def summary_line(
    verdict_: str,
    results: list[dict[str, Any]],
    cost: dict[str, Any],
    shape: Shape,
    modes: list[str],
) -> str:
    """The stage's line: the verdict, the attention kernels, the cost."""
    text = verdict_
    if verdict_ == "bit-exact":
        checks = sum(r["name"][0] in "AB" for r in results)
        text += (
            f": {' and '.join(modes)} at {' and '.join(map(str, shape.patches))} patches, "
            f"{shape.steps} steps restored and repeated equal in {checks} processes, the same "
            "weights (sha256) in A and B"
        )
    for r in results:
        if r["name"].startswith("A") and "error" not in r:
            text += (
                f"; attention at {r['patches']} patches: {r['sdpa']}, {attention_text(r, modes)}"
            )
    return f"{text}; {cost_text(cost)}"


def _compact(result: dict[str, Any]) -> dict[str, Any]:
    """A worker's result for the summary line (the losses stay in its own file)."""
    out = {k: v for k, v in result.items() if k not in ("modes", "torch", "triton", "device")}
    if "modes" in result:
        out["modes"] = {
            mode: {k: v for k, v in m.items() if k != "losses"}
            for mode, m in result["modes"].items()
        }
    return out


def record(
    results: list[dict[str, Any]],
    cost: dict[str, Any],
    shape: Shape,
    modes: list[str],
    wall_s: float,
) -> dict[str, Any]:
    """The summary's JSON line: ``kind`` determinism, ``ok``, ``verdict``, ``line``, the
    versions, each worker's figures, the cost; ``error`` when not ok."""
    differences, failures = verdict(results, shape.patches, modes)
    if "error" in cost:
        failures.append(f"cost: {cost['error']}")
    text = verdict_text(differences, failures)
    first = next((r for r in results if "torch" in r), {})
    rec: dict[str, Any] = {
        "kind": "determinism",
        "ok": text == "bit-exact",
        "verdict": text,
        "line": summary_line(text, results, cost, shape, modes),
        **{k: first.get(k) for k in ("torch", "triton", "device")},
        "patches": list(shape.patches),
        "modes": modes,
        "steps": shape.steps,
        "wall_s": round(wall_s, 1),
        "workers": [_compact(r) for r in results],
        "cost": _compact(cost),
    }
    if differences or failures:
        rec["error"] = "; ".join(differences + failures)
    return rec


def _print(rec: dict[str, Any]) -> None:
    for r in [*rec["workers"], rec["cost"]]:
        if "error" in r:
            print(f"   {r['name']}: {r['error']}", *r.get("log_tail", []), sep="\n     ")
        for mode, m in r.get("modes", {}).items():
            print(
                f"   {r['name']} {mode}: {'equal' if m['equal'] else 'DIFFERENT'} when repeated,"
                f" sha256 {m['sha256'][:16]}, first run {m['first_run_s']} s"
            )
    print(f"determinism: {rec['line']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker(argv[1])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path, help="the JSON-lines file the verdict is appended to")
    p.add_argument("--out", type=Path, help="workers' logs and caches (default: beside SUMMARY)")
    p.add_argument("--tiny", action="store_true", help="a tiny CPU run (CI's test of it)")
    p.add_argument("--modes", help="eager,compiled (the default; --tiny: eager)")
    p.add_argument("--budget-s", type=float, help=f"the whole run's limit ({BUDGET_S:.0f} s)")
    args = p.parse_args(argv)
    shape = TINY if args.tiny else GPU
    modes = (args.modes or ("eager" if args.tiny else "eager,compiled")).split(",")
    if not set(modes) <= {"eager", "compiled"} or len(set(modes)) != len(modes):
        p.error(f"--modes: eager and/or compiled, got {args.modes!r}")
    out = (args.out or args.summary.parent / "determinism").resolve()
    start = time.monotonic()
    deadline = start + (args.budget_s or (TINY_BUDGET_S if args.tiny else BUDGET_S))
    results = run_jobs(check_jobs(out, shape, modes), deadline - COST_RESERVE_S)
    cost = run_jobs([cost_job(out, shape, modes)], deadline)[0]  # alone on the device
    rec = record(results, cost, shape, modes, time.monotonic() - start)
    _print(rec)
    with open(args.summary, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return 0 if rec["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""`.ci/dev gpu`'s last step: one Markdown block from the run's summary lines.

    python scripts/ci/gpu_summary.py SUMMARY.jsonl --stages install,smoke,... [--only S,...]
        [--stopped STAGE]

Every stage appends JSON lines to SUMMARY (``$IQTRAIN_GPU_SUMMARY``): ``.ci/dev`` one
``{"kind": "stage"}`` per stage (limit, wall time, result), check_gpu_torch.py the versions,
gpu_smoke.py the pytest counts and the benchmarks, gpu_determinism.py its verdict,
resume_check.py and gpu_study.py their figures. This prints the versions, a table of the
stages (a stage without a line did not run), the failures, then each stage's figures, ready
to paste into ``bench/results/gpu_h200_<date>.md``. Where ``$OUT`` is set (the GPU machine's
folder that comes back) the block is also written to ``$OUT/gpu_summary.md``, beside copies of
the summary lines (``gpu_summary.jsonl``) and the benchmark JSON (``gpu_bench.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

Record = dict[str, Any]


def read(path: Path) -> tuple[list[Record], list[str]]:
    """The summary's records, and a note for each line that is not a JSON object."""
    records: list[Record] = []
    bad: list[str] = []
    if not path.is_file():
        return records, [f"no summary file {path}"]
    for i, text in enumerate(path.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            rec = json.loads(text)
        except ValueError:
            bad.append(f"line {i} is not JSON: {text[:120]!r}")
            continue
        if isinstance(rec, dict):
            records.append(rec)
        else:
            bad.append(f"line {i} is not a JSON object: {text[:120]!r}")
    return records, bad


def _of(records: list[Record], kind: str, stage: str | None = None) -> list[Record]:
    return [
        r for r in records if r.get("kind") == kind and (stage is None or r.get("stage") == stage)
    ]


def _compact(value: Any, limit: int = 300) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def versions_line(records: list[Record]) -> str:
    found = _of(records, "versions")
    if not found:
        return "Versions: not recorded (the install stage did not finish)."
    v = found[-1]
    return (
        f"Versions: Python {v.get('python')}, torch {v.get('torch')} (iqtrain requires "
        f"torch{v.get('torch_pin') or ' (no pin)'}), triton {v.get('triton')}, numpy "
        f"{v.get('numpy')}, CUDA {v.get('cuda')}, cuDNN {v.get('cudnn')}, NCCL {v.get('nccl')}, "
        f"driver {v.get('driver')}; {v.get('device')} ({v.get('sm_count')} SMs, "
        f"{v.get('memory_gib')} GiB), {v.get('cpus')} CPUs; {v.get('glibc')}."
    )


def _pytest_figures(rec: Record) -> str:
    text = (
        f"{rec.get('passed', 0)} passed, {rec.get('failed', 0)} failed, "
        f"{rec.get('errors', 0)} errors, {rec.get('skipped', 0)} skipped"
    )
    reasons = rec.get("skip_reasons") or {}
    if reasons:
        text += " (" + "; ".join(f"{n} {why}" for why, n in reasons.items()) + ")"
    slowest = rec.get("slowest") or []
    if slowest:
        name, seconds = slowest[0]
        text += f"; slowest {name.rsplit('::', 1)[-1]} {seconds} s"
    return text


def _own_figure(rec: Record) -> str:
    """A stage script's line, short enough for the table."""
    kind = rec.get("kind")
    if rec.get("error"):
        return "error: " + _compact(rec["error"], 120)
    if kind == "resume" and "steps" in rec:
        return (
            f"{rec['steps']} steps; SIGTERM + resume and resume --from step_"
            f"{rec.get('resumed_from')} identical; {rec.get('verified')} attempts verified"
        )
    if kind == "study" and "steps" in rec:
        return (
            f"{rec['steps']} steps at {1e3 * rec.get('step_s', 0):.1f} ms/step, val loss "
            f"{rec.get('val_loss', float('nan')):.4f}"
        )
    for key in ("verdict", "line", "result"):
        if key in rec:
            return _compact(rec[key], 120)
    return ""


def _figures(records: list[Record], stage: str) -> str:
    """The table's short figure for ``stage``."""
    if stage == "install":
        v = _of(records, "versions")
        return f"torch {v[-1].get('torch')} on {v[-1].get('device')}" if v else ""
    pytest_lines = _of(records, "pytest", stage)
    if pytest_lines:
        return _pytest_figures(pytest_lines[-1])
    own = [r for r in records if r.get("kind") == stage]
    return _own_figure(own[-1]) if own else ""


def stage_table(records: list[Record], stages: list[str], only: set[str] | None) -> list[str]:
    rows = ["| stage | limit | wall | result | figures |", "|---|---|---|---|---|"]
    limit_sum = wall_sum = 0
    for name in stages:
        ran = _of(records, "stage", name)
        if not ran:
            why = "not selected (--only)" if only is not None and name not in only else "not run"
            rows.append(f"| {name} | | | {why} | |")
            continue
        rec = ran[-1]
        limit_sum += int(rec.get("limit_s", 0))
        wall_sum += int(rec.get("wall_s", 0))
        rows.append(
            f"| {name} | {rec.get('limit_s')} s | {rec.get('wall_s')} s | {rec.get('result')} | "
            f"{_figures(records, name)} |"
        )
    rows.append(f"| all | {limit_sum} s | {wall_sum} s | | |")
    return rows


def failures(records: list[Record]) -> list[str]:
    out = []
    for rec in _of(records, "pytest"):
        for f in rec.get("failures", []):
            out.append(f"- {rec.get('stage')}: `{f.get('test')}`: {f.get('last_line')}")
    for rec in records:
        if rec.get("kind") not in ("stage", "pytest") and rec.get("error"):
            out.append(f"- {rec.get('kind')}: {_compact(rec['error'])}")
    return out


def _bench(records: list[Record]) -> list[dict[str, Any]]:
    found = _of(records, "pytest", "bench")
    return list(found[-1].get("benchmarks", [])) if found else []


def bench_lines(records: list[Record]) -> list[str]:
    """The prepare kernel's bandwidth and the steps' ms/step, from the benchmarks' extra_info."""
    out = []
    for b in _bench(records):
        info = b.get("extra_info", {})
        name = b.get("name", "?")
        if "GB_per_s" in info:
            text = f"- `{name}`: {info['GB_per_s']:.0f} GB/s"
            if "fraction_of_copy_bandwidth" in info:
                text += f", {100 * info['fraction_of_copy_bandwidth']:.0f}% of a copy's"
            for key in ("speedup_vs_eager", "speedup_vs_compiled"):
                if key in info:
                    text += f", {info[key]:.2f}x {key.removeprefix('speedup_vs_')}"
            out.append(text + f" ({info.get('MB_per_op', 0):.0f} MB per op)")
        elif "ms_per_step" in info:
            text = f"- `{name}`: {info['ms_per_step']:.2f} ms/step"
            if "fraction_of_matmul" in info:
                text += f", {100 * info['fraction_of_matmul']:.1f}% of the bf16 matmul"
            if "first_step_s" in info:
                text += f", first step (with any compile) {info['first_step_s']:.1f} s"
            out.append(text)
        elif "gflop_per_s" in info:
            out.append(f"- `{name}`: {info['gflop_per_s'] / 1e3:.0f} TFLOP/s")
    return out


def figure_lines(records: list[Record]) -> list[str]:
    """Each stage's own line(s): determinism, resume, study, and any other kind, compactly."""
    out = []
    known = {"stage", "versions", "pytest"}
    for rec in records:
        kind = rec.get("kind", "?")
        if kind in known:
            continue
        if "line" in rec:
            out.append(f"- {kind}: {rec['line']}")
            continue
        fields = {k: v for k, v in rec.items() if k != "kind"}
        out.append(f"- {kind}: " + "; ".join(f"{k} {_compact(v, 200)}" for k, v in fields.items()))
    return out


def render(
    records: list[Record],
    bad: list[str],
    stages: list[str],
    only: set[str] | None,
    stopped: str | None,
) -> str:
    lines = ["### `bash .ci/dev gpu`", "", versions_line(records), ""]
    lines += stage_table(records, stages, only)
    if stopped:
        lines += ["", f"{stopped} failed: the stages after it did not run."]
    fails = failures(records)
    if fails:
        lines += ["", "Failures:", *fails]
    bench = bench_lines(records)
    if bench:
        lines += ["", "Benchmarks (median):", *bench]
    figures = figure_lines(records)
    if figures:
        lines += ["", "Figures:", *figures]
    if bad:
        lines += ["", "Unreadable summary lines:", *(f"- {b}" for b in bad)]
    return "\n".join(lines) + "\n"


def copy_out(text: str, summary: Path) -> None:
    out = os.environ.get("OUT")
    if not out or not Path(out).is_dir():
        return
    Path(out, "gpu_summary.md").write_text(text)
    if summary.is_file():
        shutil.copyfile(summary, Path(out, "gpu_summary.jsonl"))
    bench = summary.parent / "bench.json"
    if bench.is_file():
        shutil.copyfile(bench, Path(out, "gpu_bench.json"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("summary", type=Path)
    p.add_argument("--stages", required=True, help="every stage, in order, comma-separated")
    p.add_argument("--only", help="the stages --only selected (the others are not missing)")
    p.add_argument("--stopped", help="the stage whose failure stopped the run")
    args = p.parse_args()
    records, bad = read(args.summary)
    only = None if args.only is None else {"install", *args.only.split(",")}
    text = render(records, bad, args.stages.split(","), only, args.stopped)
    print(text, end="", flush=True)
    copy_out(text, args.summary)


if __name__ == "__main__":
    main()

"""What live logging (``[logging]``) costs the training loop per metric record.

The loop writes one train record per optimizer step (plus one per validation and probe); with
``[logging]`` rank 0 also hands that record to its :class:`~iqtrain.report.live.LiveLog` at
the same place, never inside the step. ``LiveLog.record`` only queues it; a writer thread
encodes and writes it. Each round here is one loop iteration as the loop's thread sees it: a
2 ms step that releases the GIL (``time.sleep``, as a step waiting on its device or in torch
kernels does) and then the record:

(a) ``MetricWriter.write`` alone (the JSON line, ``pwrite``, the running SHA-256): the peer;
(b) (a) + ``LiveLog.record`` with ``tensorboard = true``;
(c) (a) + ``LiveLog.record`` with W&B in offline mode (skipped without wandb);

and, without the step, what the writer thread itself spends per record (record + ``wait``):
(d) TensorBoard (the scalars, one event through tensorboard's protos and its pure-Python
CRC-32C, a flush, an ``fstat``), (e) W&B offline (``run.log``).

The summary prints (b) - (a) and (c) - (a) per record, and the median of the
``LiveLog.record`` calls alone: the cost on the loop's thread.

    pytest bench/test_live.py --benchmark-only
"""

from __future__ import annotations

import statistics
import time

import pytest
from bench_helpers import median
from helpers import train_record

from iqtrain.config.sections import LoggingConfig, WandbConfig
from iqtrain.evidence.metrics import MetricWriter
from iqtrain.report.live import LiveLog

STEP_S = 0.002  # one simulated optimizer step
ROUNDS = 300
TB = LoggingConfig(tensorboard=True)
WANDB = LoggingConfig(wandb=WandbConfig(project="iqtrain-bench"))

_medians: dict[str, float] = {}
_calls: dict[str, list[float]] = {}  # each LiveLog.record call, timed on its own


def _writer(tmp_path, logging: LoggingConfig | None, *, step: bool, sync: bool, calls: list):
    attempt = tmp_path / "run" / "attempts" / "0001"
    attempt.mkdir(parents=True)
    metrics = MetricWriter(attempt / "metrics.jsonl")
    live = None if logging is None else LiveLog.open(logging, attempt, run_id="benchrun")
    steps = iter(range(1, 10**9))

    def iteration() -> None:
        if step:
            time.sleep(STEP_S)
        record = train_record(next(steps), tflops=0.01, peak_rss_bytes=1 << 30)
        metrics.write(record)
        if live is not None:
            t0 = time.perf_counter()
            live.record(record)
            calls.append(time.perf_counter() - t0)
            if sync:
                live.wait()

    return iteration, metrics, live


def _run(benchmark, tmp_path, name, logging, *, step=True, sync=False) -> None:
    calls = _calls.setdefault(name, [])
    iteration, metrics, live = _writer(tmp_path, logging, step=step, sync=sync, calls=calls)
    try:
        benchmark.pedantic(iteration, rounds=ROUNDS, warmup_rounds=10)
    finally:
        if live is not None:
            live.close(ok=True)
            assert live.views == [], "closed"
        metrics.close()
    seconds = median(benchmark)
    if seconds is not None:
        _medians[name] = seconds


def _summary(bench_summary, name: str, what: str) -> None:
    if {"alone", name} <= _medians.keys():
        alone, live = _medians["alone"] * 1e6, _medians[name] * 1e6
        call = statistics.median(_calls[name]) * 1e6
        bench_summary(
            f"{what}: a loop iteration {live:.1f} us against {alone:.1f} us with the record "
            f"alone ({live - alone:+.1f} us); LiveLog.record on the loop's thread: median "
            f"{call:.1f} us"
        )


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="needs wandb, the optional iqtrain[wandb] extra")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")


def test_record_alone(benchmark, tmp_path):
    _run(benchmark, tmp_path, "alone", None)


def test_record_with_live_tensorboard(benchmark, tmp_path, bench_summary):
    _run(benchmark, tmp_path, "tensorboard", TB)
    _summary(bench_summary, "tensorboard", "live tensorboard")


@pytest.mark.usefixtures("offline_wandb")
def test_record_with_live_wandb(benchmark, tmp_path, bench_summary):
    _run(benchmark, tmp_path, "wandb", WANDB)
    _summary(bench_summary, "wandb", "live wandb (offline)")


def test_writer_thread_per_tensorboard_record(benchmark, tmp_path, bench_summary):
    _run(benchmark, tmp_path, "tensorboard_sync", TB, step=False, sync=True)
    if "tensorboard_sync" in _medians:
        cost = _medians["tensorboard_sync"] * 1e6
        bench_summary(f"tensorboard writer thread: {cost:.1f} us per record (record + wait)")


@pytest.mark.usefixtures("offline_wandb")
def test_writer_thread_per_wandb_record(benchmark, tmp_path, bench_summary):
    _run(benchmark, tmp_path, "wandb_sync", WANDB, step=False, sync=True)
    if "wandb_sync" in _medians:
        cost = _medians["wandb_sync"] * 1e6
        bench_summary(f"wandb writer thread (offline): {cost:.1f} us per record (record + wait)")

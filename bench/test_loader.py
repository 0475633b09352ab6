"""Loader throughput: TrainStream.next() (and next_slot() into a caller-owned ring) against its
peers, in one run.

Windows of 2048 samples, batch 256, shuffled ids over a 16384-window recording held in the page
cache (128 MiB of ci16; 64 MiB of ci8, 256 MiB of cf32), for each of ci16_le, ci8 and cf32_le.
Peers of each kind: (a) a memcpy of the same batch bytes (a cache-hot ceiling: 2 MiB source),
(b) numpy fancy-index gather from a memmap, (c) the same TrainStream reading with pread only
(``map_min_bytes=2**64-1``, the reader before the guarded map). For ci16 also (d) a torch
DataLoader with 2 workers over the same memmap, and (e) the ceiling: a batch's bytes of
consecutive rows copied out of the same mapping by torch on all its threads. Targets (ci16):
>= 1.5x numpy gather and >= 0.4x memcpy; for ci8 and cf32 no loss (>= 1x the pread reader).
Ratios are printed in the run's summary; the measured figures (three idle runs) are in
docs/design.md section 2.3.1.

    pytest bench/test_loader.py --benchmark-only
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
from bench_helpers import median

from iqtrain.data.dataset import IQDataset, TrainStream

WINDOW = 2048
BATCH = 256
NUM_WINDOWS = 16384  # 64-256 MiB: larger than any CPU cache
KINDS = {"ci16_le": np.int16, "ci8": np.int8, "cf32_le": np.float32}
PREAD_ONLY = 2**64 - 1  # map_min_bytes that maps nothing

_medians: dict[str, float] = {}


def _batch_bytes(kind: str) -> int:
    return BATCH * WINDOW * 2 * np.dtype(KINDS[kind]).itemsize


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    d = tmp_path_factory.mktemp("loader")
    rng = np.random.default_rng(0)
    out = {}
    for kind, dtype in KINDS.items():
        lim = 100 if dtype == np.int8 else 2000
        data = rng.integers(-lim, lim, size=(NUM_WINDOWS, WINDOW, 2)).astype(dtype)
        stem = d / kind
        data.tofile(stem.with_suffix(".sigmf-data"))
        meta = {
            "global": {"core:datatype": kind, "core:version": "1.2.0", "core:sample_rate": 1e6},
            "captures": [{"core:sample_start": 0}],
            "annotations": [],
        }
        stem.with_suffix(".sigmf-meta").write_text(json.dumps(meta))
        out[kind] = (stem.with_suffix(".sigmf-meta"), stem.with_suffix(".sigmf-data"))
    return out


@pytest.fixture(scope="module")
def batches_of_ids():
    rng = np.random.default_rng(1)
    perm = rng.permutation(NUM_WINDOWS)
    return perm.reshape(-1, BATCH)


@pytest.mark.parametrize("read", ["mmap", "pread"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_trainstream_next(benchmark, bench_summary, recordings, kind, read):
    ds = IQDataset(
        [recordings[kind][0]], window=WINDOW, map_min_bytes=None if read == "mmap" else PREAD_ONLY
    )
    assert ds._native.mapped_recordings == (1 if read == "mmap" else 0)
    stream = TrainStream(ds, batch_size=BATCH, seed=0, prefetch=2)
    for _ in range(8):
        next(stream)  # page cache and buffer pool warm, prefetch filled
    out = benchmark(stream.next)
    assert out.shape == (BATCH, WINDOW, 2) and out.dtype == KINDS[kind]
    np.testing.assert_array_equal(out, ds.windows(stream.last_ids()))
    _medians[f"{kind}/trainstream_{read}"] = median(benchmark)
    _report(bench_summary)


def _ring_bench(benchmark, recording, buffers, key):
    ds = IQDataset([recording[0]], window=WINDOW)
    stream = TrainStream(ds, batch_size=BATCH, seed=0, prefetch=2)
    stream.use_ring(buffers)
    held = [stream.next_slot()]

    def step():  # the trainer's pattern: take the next batch, release the one before it
        slot = stream.next_slot()
        stream.release(held.pop())
        held.append(slot)
        return buffers[slot]

    for _ in range(8):
        step()  # page cache warm, prefetch filled
    out = benchmark(step)
    assert out.shape == (BATCH, WINDOW, 2) and out.dtype == np.int16
    np.testing.assert_array_equal(out, ds.windows(stream.last_ids()))
    _medians[key] = median(benchmark)


def test_trainstream_ring_torch(benchmark, bench_summary, recordings):
    # Caller-owned buffers as the trainer allocates them: torch tensors' numpy views (64-byte
    # aligned on CPU; pinned, page-aligned, on CUDA). prefetch 2 + 1 held + 1 spare.
    tensors = [torch.empty((BATCH, WINDOW, 2), dtype=torch.int16) for _ in range(4)]
    _ring_bench(benchmark, recordings["ci16_le"], [t.numpy() for t in tensors], "ring_torch")
    _report(bench_summary)


def _skewed_buffer(skew: int) -> np.ndarray:
    """A numpy batch buffer starting ``skew`` bytes past a page boundary."""
    nbytes = BATCH * WINDOW * 2 * 2
    raw = np.empty(nbytes + 4096, np.uint8)
    at = (skew - raw.ctypes.data) % 4096
    return raw[at : at + nbytes].view(np.int16).reshape(BATCH, WINDOW, 2)


def test_trainstream_ring_numpy(benchmark, bench_summary, recordings):
    # Plain numpy buffers 16 bytes past a page boundary, where malloc puts a fresh 2 MiB block:
    # glibc's rep movsb copies rows from the page-aligned mapping 4-5x slower there unless the
    # copy avoids it (aligned.rs copy_bytes). Placed explicitly: where malloc puts them depends
    # on what the process allocated before.
    buffers = [_skewed_buffer(16) for _ in range(4)]
    assert all(b.ctypes.data % 4096 == 16 for b in buffers)
    _ring_bench(benchmark, recordings["ci16_le"], buffers, "ring_numpy")
    _report(bench_summary)


@pytest.mark.parametrize("kind", list(KINDS))
def test_memcpy_peer(benchmark, bench_summary, kind):
    src = np.random.default_rng(2).integers(0, 100, _batch_bytes(kind), dtype=np.uint8)
    dst = np.empty_like(src)
    benchmark(np.copyto, dst, src)
    np.testing.assert_array_equal(dst, src)
    _medians[f"{kind}/memcpy"] = median(benchmark)
    _report(bench_summary)


def test_mapped_copy_ceiling_peer(benchmark, bench_summary, recordings):
    # Not a target: the fastest the batch's bytes can leave the same mapping on this machine's
    # threads. The same number of bytes as a batch, but consecutive rows (no gather), copied by
    # torch's copy_ on all its intra-op threads (2 here) into a torch tensor. The memcpy peer
    # copies a 2 MiB source that stays in cache; this one reads DRAM, as any loader must.
    shape = (NUM_WINDOWS, WINDOW, 2)
    # Copy-on-write ("c"): writable for torch.from_numpy, and reading copies nothing.
    mm = np.memmap(recordings["ci16_le"][1], dtype=np.int16, mode="c", shape=shape)
    src = torch.from_numpy(np.asarray(mm))
    out = torch.empty((BATCH, WINDOW, 2), dtype=torch.int16)
    state = {"k": 0}

    def copy():
        at = (state["k"] % (NUM_WINDOWS // BATCH)) * BATCH
        state["k"] += 1
        out.copy_(src[at : at + BATCH])

    for _ in range(NUM_WINDOWS // BATCH):
        copy()  # every page of the mapping touched once
    benchmark(copy)
    _medians["mapped_copy"] = median(benchmark)
    _medians["mapped_copy_threads"] = float(torch.get_num_threads())
    _report(bench_summary)


@pytest.mark.parametrize("kind", list(KINDS))
def test_numpy_memmap_gather_peer(benchmark, bench_summary, recordings, kind, batches_of_ids):
    shape = (NUM_WINDOWS, WINDOW, 2)
    mm = np.memmap(recordings[kind][1], dtype=KINDS[kind], mode="r", shape=shape)
    state = {"k": 0}

    def gather():
        ids = batches_of_ids[state["k"] % len(batches_of_ids)]
        state["k"] += 1
        return mm[ids]

    for _ in range(8):
        gather()
    out = benchmark(gather)
    assert out.shape == (BATCH, WINDOW, 2)
    _medians[f"{kind}/numpy_gather"] = median(benchmark)
    _report(bench_summary)


class _MemmapWindows(torch.utils.data.Dataset):
    def __init__(self, path):
        self.path = path
        self.mm = None

    def __len__(self):
        return NUM_WINDOWS

    def __getitem__(self, i):
        if self.mm is None:  # opened in each worker
            self.mm = np.memmap(self.path, dtype=np.int16, mode="r", shape=(NUM_WINDOWS, WINDOW, 2))
        return torch.from_numpy(np.array(self.mm[i]))


def test_torch_dataloader_peer(benchmark, bench_summary, recordings):
    loader = torch.utils.data.DataLoader(
        _MemmapWindows(recordings["ci16_le"][1]),
        batch_size=BATCH,
        sampler=torch.utils.data.RandomSampler(
            range(NUM_WINDOWS),
            replacement=True,
            num_samples=10**9,
            generator=torch.Generator().manual_seed(0),
        ),
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=2,
    )
    it = iter(loader)
    for _ in range(8):
        next(it)
    out = benchmark(next, it)
    assert out.shape == (BATCH, WINDOW, 2)
    _medians["dataloader"] = median(benchmark)
    _report(bench_summary)
    del it


SMALL_FILES = 2048  # 8 windows each: 64 KiB of ci16, below map_min_bytes (pread)
SMALL_HELD = 64  # descriptors the pooled dataset may hold: 1 in 32 files


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("small")
    rng = np.random.default_rng(3)
    meta = {
        "global": {"core:datatype": "ci16_le", "core:version": "1.2.0"},
        "captures": [{"core:sample_start": 0}],
        "annotations": [],
    }
    for i in range(SMALL_FILES):
        rng.integers(-2000, 2000, size=(8, WINDOW, 2)).astype(np.int16).tofile(
            d / f"s{i:04d}.sigmf-data"
        )
        (d / f"s{i:04d}.sigmf-meta").write_text(json.dumps(meta))
    return str(d / "*.sigmf-meta")


@pytest.mark.parametrize("held", ["all", "pooled"])
def test_many_small_files(benchmark, bench_summary, small_files, held):
    """The cost of the open-file pool (docs/design.md 2.3): 2048 small recordings read in
    shuffled order with every file open, against a dataset that may hold 64 of them (nearly
    every row opens its file again: stat, open, fstat, and a close)."""
    cap = None if held == "all" else SMALL_HELD
    ds = IQDataset(small_files, window=WINDOW, max_open_files=cap)
    assert ds._native.open_files[1] == (SMALL_FILES if cap is None else cap)
    stream = TrainStream(ds, batch_size=BATCH, seed=0, prefetch=2)
    for _ in range(8):
        next(stream)
    out = benchmark(stream.next)
    np.testing.assert_array_equal(out, ds.windows(stream.last_ids()))
    _medians[f"small/{held}"] = median(benchmark)
    if all(_medians.get(f"small/{k}") is not None for k in ("all", "pooled")):
        rate = {
            k: _batch_bytes("ci16_le") / _medians[f"small/{k}"] / 1e9 for k in ("all", "pooled")
        }
        bench_summary(
            f"loader {SMALL_FILES} small files: all open {rate['all']:.2f} GB/s, {SMALL_HELD} held "
            f"{rate['pooled']:.2f} GB/s ({rate['pooled'] / rate['all']:.2f}x)"
        )


def test_open_billion_window_dataset(benchmark, tmp_path):
    # Opening is O(recordings): a sparse 2 GB ci8 file of 10^9 one-sample windows.
    with open(tmp_path / "big.sigmf-data", "wb") as f:
        f.truncate(2 * 10**9)
    meta = {
        "global": {"core:datatype": "ci8", "core:version": "1.2.0"},
        "captures": [{"core:sample_start": 0}],
        "annotations": [],
    }
    (tmp_path / "big.sigmf-meta").write_text(json.dumps(meta))

    def open_and_first_batch():
        ds = IQDataset([tmp_path / "big.sigmf-meta"], window=1)
        return next(TrainStream(ds, batch_size=256, seed=0))

    t0 = time.perf_counter()
    open_and_first_batch()
    first = time.perf_counter() - t0
    benchmark.pedantic(open_and_first_batch, rounds=5, iterations=1)
    benchmark.extra_info["first_call_s"] = first
    print(f"\n    open 10^9 windows + first batch: first call {first * 1e3:.1f} ms")


def _report(add) -> None:
    # Called by each peer test; prints once every median of the run is in.
    per_kind = ("trainstream_mmap", "trainstream_pread", "numpy_gather", "memcpy")
    needed = [f"{k}/{what}" for k in KINDS for what in per_kind]
    needed += ["ring_torch", "ring_numpy", "dataloader", "mapped_copy"]
    if any(_medians.get(k) is None for k in needed) or _medians.get("reported"):
        return
    _medians["reported"] = 1.0

    def gbps(key: str, kind: str = "ci16_le") -> float:
        return _batch_bytes(kind) / _medians[key] / 1e9

    for kind in KINDS:
        for what in per_kind:
            key = f"{kind}/{what}"
            ms, rate = _medians[key] * 1e3, gbps(key, kind)
            add(f"loader {key:>26}: {ms:7.3f} ms/batch  {rate:6.2f} GB/s")
    for key in ("ring_torch", "ring_numpy", "dataloader", "mapped_copy"):
        add(f"loader {key:>26}: {_medians[key] * 1e3:7.3f} ms/batch  {gbps(key):6.2f} GB/s")
    for kind in KINDS:
        tn = gbps(f"{kind}/trainstream_mmap", kind)
        aims = (" (target >= 1.5x)", " (target >= 0.4x)") if kind == "ci16_le" else ("", "")
        peers = (("numpy gather", "numpy_gather", aims[0]), ("memcpy", "memcpy", aims[1]))
        peers += (("pread reader", "trainstream_pread", " (no loss: >= 1x)"),)
        for name, key, aim in peers:
            add(f"loader {kind} TrainStream / {name}: {tn / gbps(f'{kind}/{key}', kind):.2f}x{aim}")
    tn = gbps("ci16_le/trainstream_mmap")
    add(f"loader ci16_le TrainStream / DataLoader:   {tn / gbps('dataloader'):.2f}x")
    threads = int(_medians["mapped_copy_threads"])
    add(
        f"loader ci16_le TrainStream / {threads}-thread copy of consecutive rows from the mapping"
        f" (the ceiling): {tn / gbps('mapped_copy'):.2f}x; that copy / memcpy:"
        f" {gbps('mapped_copy') / gbps('ci16_le/memcpy'):.2f}x"
    )
    for k in ("ring_torch", "ring_numpy"):
        add(f"loader {k} / TrainStream.next: {gbps(k) / tn:.2f}x (same bytes, caller buffers)")

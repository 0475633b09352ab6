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
docs/design.md "Loader throughput".

The SigMF forms, beside those rows (docs/design.md "Loader throughput"): ``TrainStream.next``
(mapped) over each of the other 11 complex datatypes, the same values stored as each stores them,
against the row above of the same batch dtype (ci8, ci16_le or cf32_le) and that row measured again
just before it; and the ci16 recording's bytes read from a ``.sigmf`` archive (the tar's data
member) and as a non-conforming dataset (a raw ``.ci16`` file with a 44-byte header and trailing
bytes), mapped and with ``pread``, each against a loose copy read beside it, the three with the same
page-cache history (target: >= 0.9x). The bench asserts values, never speed.

    pytest bench/test_loader.py --benchmark-only
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from bench_helpers import median

from iqtrain.config.sections import SIGMF_DATATYPES
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
        _sync(stem.with_suffix(".sigmf-data"))
        meta = {
            "global": {"core:datatype": kind, "core:version": "1.2.0", "core:sample_rate": 1e6},
            "captures": [{"core:sample_start": 0}],
            "annotations": [],
        }
        stem.with_suffix(".sigmf-meta").write_text(json.dumps(meta))
        out[kind] = (stem.with_suffix(".sigmf-meta"), stem.with_suffix(".sigmf-data"))
    return out


def _sync(path: Path) -> None:
    """Writes ``path``'s dirty pages back now, so the kernel's writeback of a freshly written
    recording does not run during a later measurement (the pages stay in the page cache)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
    """The cost of the open-file pool (docs/design.md "Recordings, capture segments,
    windows", descriptors): 2048 small recordings read in
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


# --------------------------------------------------------------------------------- SigMF forms

#: The row of each batch dtype above: what a datatype's batch is compared with.
FAMILY = {"int8": "ci8", "int16": "ci16_le", "float32": "cf32_le"}
#: The complex datatypes without a row above: each read through TrainStream.next (mapped).
OTHER_DATATYPES = [d for d in SIGMF_DATATYPES if d not in KINDS]
NCD_HEADER = 44  # a WAV header's length: rows 44 bytes past the page, as a raw capture has them
NCD_TRAILING = 100
FORMS = ("loose", "archive", "ncd")


def _source_kind(datatype: str) -> str:
    """The recording whose values ``datatype``'s file holds: ci8's for the 8-bit types (their
    batch is int8), ci16_le's (integers in [-2000, 2000)) for every wider one."""
    return "ci8" if SIGMF_DATATYPES[datatype].storage == "int8" else "ci16_le"


def _stored(values: np.ndarray, datatype: str) -> np.ndarray:
    """``values`` as ``datatype`` stores them, by value: its component dtype (byte order
    included), unsigned types offset binary (``v + 2**(bits - 1)``)."""
    comp = np.dtype(SIGMF_DATATYPES[datatype].component)
    if comp.kind == "u":
        return (values.astype(np.int64) + (1 << (8 * comp.itemsize - 1))).astype(comp)
    return values.astype(comp)


def _meta(datatype: str, global_: dict | None = None, capture: dict | None = None) -> str:
    return json.dumps(
        {
            "global": {"core:datatype": datatype, "core:version": "1.2.0", "core:sample_rate": 1e6}
            | (global_ or {}),
            "captures": [{"core:sample_start": 0} | (capture or {})],
            "annotations": [],
        }
    )


def _write_datatype(directory: Path, datatype: str, source: Path, source_dtype) -> Path:
    """The source recording's values written as ``datatype``, 1024 windows at a time."""
    src = np.memmap(source, dtype=source_dtype, mode="r", shape=(NUM_WINDOWS, WINDOW, 2))
    data = directory / f"{datatype}.sigmf-data"
    with open(data, "wb") as f:
        for at in range(0, NUM_WINDOWS, 1024):
            f.write(_stored(src[at : at + 1024], datatype).tobytes())
    _sync(data)
    meta = directory / f"{datatype}.sigmf-meta"
    meta.write_text(_meta(datatype))
    assert data.stat().st_size == NUM_WINDOWS * WINDOW * SIGMF_DATATYPES[datatype].bytes_per_sample
    return meta


def _stream(path: Path, read: str) -> tuple[IQDataset, TrainStream]:
    ds = IQDataset([path], window=WINDOW, map_min_bytes=None if read == "mmap" else PREAD_ONLY)
    assert ds.num_windows == NUM_WINDOWS
    assert ds._native.mapped_recordings == (1 if read == "mmap" else 0)
    # The data file (an archive: all of it) read through first, so that every page is in the
    # cache: a machine running DAMON reclaim pages out memory untouched for about a minute,
    # and a recording written at the start of the run may be gone by its row here.
    fd = os.open(ds.recordings[0].data_path, os.O_RDONLY)
    try:
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)
    stream = TrainStream(ds, batch_size=BATCH, seed=0, prefetch=2)
    for _ in range(8):
        next(stream)  # page cache and buffer pool warm, prefetch filled
    return ds, stream


@pytest.fixture(scope="module")
def datatype_file(tmp_path_factory, recordings):
    """``get(datatype)``: its recording, written on first use (the same values as the ci8 or
    ci16_le recording); the one written before it is removed (the 11 hold 2.75 GiB)."""
    d = tmp_path_factory.mktemp("datatypes")
    held: dict[str, Path] = {}

    def get(datatype: str) -> Path:
        if datatype not in held:
            for p in d.iterdir():
                p.unlink()
            held.clear()
            source = recordings[_source_kind(datatype)][1]
            held[datatype] = _write_datatype(d, datatype, source, KINDS[_source_kind(datatype)])
        return held[datatype]

    yield get
    for p in d.iterdir():
        p.unlink()


@pytest.mark.parametrize("row", ["beside", "datatype"])
@pytest.mark.parametrize("datatype", OTHER_DATATYPES)
def test_datatype_next(benchmark, bench_summary, recordings, datatype_file, datatype, row):
    """A datatype's recording through TrainStream.next (mapped), and just before it ("beside")
    the row of the same batch dtype (ci8, ci16_le or cf32_le) measured again: a ratio of
    two rows one after the other, beside the ratio to the rows at the start of the run."""
    family = FAMILY[SIGMF_DATATYPES[datatype].storage]
    path = recordings[family][0] if row == "beside" else datatype_file(datatype)
    ds, stream = _stream(path, "mmap")
    out = benchmark(stream.next)
    want = np.dtype(SIGMF_DATATYPES[datatype].storage)
    assert out.shape == (BATCH, WINDOW, 2) and out.dtype == want
    source = family if row == "beside" else _source_kind(datatype)
    values = np.memmap(recordings[source][1], dtype=KINDS[source], mode="r")
    values = values.reshape(NUM_WINDOWS, WINDOW, 2)
    np.testing.assert_array_equal(out, values[stream.last_ids()].astype(want))
    key = "beside" if row == "beside" else "trainstream_mmap"
    _medians[f"{datatype}/{key}"] = median(benchmark)
    _report_forms(bench_summary)


def _read_back(path: Path) -> None:
    """Evicts ``path``'s pages and reads it through in order: its page cache then holds what
    reading it from disk leaves (readahead's folio sizes), whatever wrote it. The size of the
    writes that filled the cache sets them otherwise: a copy in 16 KiB writes (tarfile's) left
    no 2 MiB pages, and its rows read with pread at 0.6-0.7x the same bytes written at once."""
    _sync(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def forms(tmp_path_factory, recordings):
    """The ci16_le recording's bytes as three forms with the same page-cache history: a loose
    copy of the pair, a ``.sigmf`` archive holding that pair (an uncompressed tar, as Python's
    tarfile writes it), and a non-conforming dataset (a raw file with a header and trailing
    bytes, and its metadata)."""
    d = tmp_path_factory.mktemp("forms")
    meta, data = recordings["ci16_le"]
    (d / "loose").mkdir()
    loose = d / "loose" / "rec.sigmf-meta"
    shutil.copyfile(meta, loose)
    shutil.copyfile(data, loose.with_suffix(".sigmf-data"))
    archive = d / "rec.sigmf"
    with tarfile.open(archive, "w") as tar:
        tar.add(meta, arcname="rec/rec.sigmf-meta")
        tar.add(data, arcname="rec/rec.sigmf-data")
    with tarfile.open(archive) as tar:
        offset = tar.getmember("rec/rec.sigmf-data").offset_data
    raw = d / "capture.ci16"
    with open(raw, "wb") as f, open(data, "rb") as src:
        f.write(b"RIFF" * (NCD_HEADER // 4))
        shutil.copyfileobj(src, f)
        f.write(b"\xee" * NCD_TRAILING)
    ncd = d / "capture.sigmf-meta"
    ncd.write_text(
        _meta(
            "ci16_le",
            {"core:dataset": raw.name, "core:trailing_bytes": NCD_TRAILING},
            {"core:header_bytes": NCD_HEADER},
        )
    )
    for path in (loose.with_suffix(".sigmf-data"), archive, raw):
        _read_back(path)
    _medians["archive_offset"] = float(offset)
    return {"loose": loose, "archive": archive, "ncd": ncd}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("read", ["mmap", "pread"])
def test_form_next(benchmark, bench_summary, recordings, forms, form, read):
    """The same bytes loose, in an archive and as an NCD, measured one after the other: each
    form's rate against the loose row beside it (target >= 0.9x)."""
    ds, stream = _stream(forms[form], read)
    out = benchmark(stream.next)
    assert out.shape == (BATCH, WINDOW, 2) and out.dtype == np.int16
    values = np.memmap(recordings["ci16_le"][1], dtype=np.int16, mode="r")
    np.testing.assert_array_equal(out, values.reshape(NUM_WINDOWS, WINDOW, 2)[stream.last_ids()])
    _medians[f"{form}/{read}"] = median(benchmark)
    _report_forms(bench_summary)


def _report_forms(add) -> None:
    # Prints once, when every row of this section and the three kinds' mapped and pread rows are in.
    needed = [f"{k}/trainstream_{r}" for k in KINDS for r in ("mmap", "pread")]
    needed += [f"{d}/{r}" for d in OTHER_DATATYPES for r in ("trainstream_mmap", "beside")]
    needed += [f"{f}/{r}" for f in FORMS for r in ("mmap", "pread")]
    if any(_medians.get(k) is None for k in needed) or _medians.get("forms_reported"):
        return
    _medians["forms_reported"] = 1.0
    base = _medians["ci16_le/trainstream_mmap"]
    for dt in OTHER_DATATYPES:
        t = _medians[f"{dt}/trainstream_mmap"]
        fam = FAMILY[SIGMF_DATATYPES[dt].storage]
        gb = BATCH * WINDOW * SIGMF_DATATYPES[dt].bytes_per_sample / t / 1e9
        fam_mmap, fam_pread = (_medians[f"{fam}/trainstream_{r}"] for r in ("mmap", "pread"))
        beside = _medians[f"{dt}/beside"]
        above = "" if fam == "ci16_le" else f"ci16_le mmap {base / t:.2f}x, "
        add(
            f"loader {dt:>8} TrainStream mmap: {t * 1e3:7.3f} ms/batch {gb:6.2f} GB/s of file;"
            f" batches a second / {fam} beside it {beside / t:.2f}x ({beside * 1e3:.3f} ms);"
            f" / the rows above: {above}{fam} mmap {fam_mmap / t:.2f}x,"
            f" {fam} pread {fam_pread / t:.2f}x"
        )
    for read in ("mmap", "pread"):
        loose = _medians[f"loose/{read}"]
        add(
            f"loader ci16_le {read} loose beside the forms: {loose * 1e3:.3f} ms/batch"
            f" (the {read} row above: {_medians[f'ci16_le/trainstream_{read}'] * 1e3:.3f} ms)"
        )
        for form in ("archive", "ncd"):
            t = _medians[f"{form}/{read}"]
            add(
                f"loader ci16_le {read} {form} / loose: {loose / t:.2f}x (target >= 0.9x;"
                f" {t * 1e3:.3f} ms/batch)"
            )
    add(
        f"loader forms: archive data member at byte {int(_medians['archive_offset'])}, NCD rows"
        f" {NCD_HEADER} bytes past the page"
    )

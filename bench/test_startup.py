"""Start-up against the number of recordings: 1k, 10k and 100k tiny recordings, and the slope.

Each set is written straight as minimal SigMF pairs shaped like the synthetic ones (a global
with an extension and core:sha512, one capture, two labelled annotations; 1024 ci16 samples,
4 KiB of data), not with ``iqtrain synth``: synth spends ~5 ms per recording on waveforms, which
is 8 minutes for 100k. The files live in a temporary directory on the local disk, written once
per run (the page cache holds them, as it does for a second run of the same job) and deleted
afterwards. In the same run, per size:

- ``metadata``: everything Python does per recording when a dataset opens: the glob, resolving
  the paths, reading and parsing each ``.sigmf-meta``, the SigMF schema check and iqtrain's own,
  stat of the data file and the sampled fingerprint read (``expand`` and ``_read_one``);
- ``open``: ``IQDataset`` (the above plus the native open of every data file);
- ``run``: ``iqtrain run`` (``cli.main`` in a fresh interpreter, with timers around its phases)
  of a 3-step tiny model (``data.train`` = the set, a fixed 16-recording ``data.val``), the
  whole process: interpreter, torch import and model build (the constant), opening both
  datasets, 3 steps, validation, the checkpoint (which waits for the background BLAKE3 of
  every data file) and the manifest; the summary gives each phase of the fastest round;
- peer: the SigMF schema check of every file by jsonschema (the validator built once, the state
  before the compiled check) against the compiled check, same parsed metadata.

Times are the fastest of 3 rounds (1 at 100k): the shared cores' other work only ever adds.
The slope is (t(10k) - t(1k)) / 9000 per recording, and (t(100k) - t(10k)) / 90000. Only the
sizes selected are written and reported (``-k "not 100000"``: 1k and 10k, one slope). Where the
open-file limit cannot hold a descriptor per recording (a hard limit of 20,000, say), the 100k
dataset holds half the free descriptors and opens the rest again when it reads them (docs/design.md
"Recordings, capture segments, windows", descriptors); the summary says how many it held.

    pytest bench/test_startup.py --benchmark-only -s
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from bench_helpers import median

from iqtrain.config.schema import dumps_toml
from iqtrain.data import dataset as dataset_module
from iqtrain.data.dataset import IQDataset
from iqtrain.data.sigmf import expand
from iqtrain.data.sigmf import schema as sigmf_schema

SIZES = (1_000, 10_000, 100_000)
VAL = 16
SAMPLES = 1024
WINDOW = 8 * 32  # patch_len x seq_patches of the run below: 4 windows per recording

_times: dict[tuple[str, int], float] = {}
_sizes: list[int] = []  # the sizes this session selected


def _write_set(directory: Path, n: int, seed: int) -> str:
    """``n`` recordings named in generation order; returns their glob."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    width = len(str(n - 1))
    for i in range(n):
        data = rng.integers(-2000, 2000, 2 * SAMPLES, dtype=np.int16).tobytes()
        meta = {
            "global": {
                "core:datatype": "ci16_le",
                "core:version": "1.2.0",
                "core:sample_rate": 1e6,
                "core:description": f"startup bench recording {i}",
                "core:sha512": hashlib.sha512(data).hexdigest(),
                "core:extensions": [{"name": "iqtrain", "version": "1.0.0", "optional": True}],
            },
            "captures": [{"core:sample_start": 0, "core:frequency": 915e6}],
            "annotations": [
                {"core:sample_start": 0, "core:sample_count": 512, "core:label": "QPSK"},
                {"core:sample_start": 512, "core:sample_count": 512, "core:label": "BPSK"},
            ],
        }
        base = directory / f"r_{i:0{width}d}"
        base.with_suffix(".sigmf-data").write_bytes(data)
        base.with_suffix(".sigmf-meta").write_text(json.dumps(meta, indent=4))
    return os.fspath(directory / "*.sigmf-meta")


@pytest.fixture(scope="module")
def sets(request, tmp_path_factory):
    # The sizes of this module's selected tests (and 10k for the schema peer's own set).
    mine = [it for it in request.session.items if it.path == request.path]
    params = [getattr(it, "callspec", None) for it in mine]
    _sizes[:] = sorted({c.params["n"] for c in params if c is not None and "n" in c.params})
    peer = any(it.name == "test_schema_check_peer" for it in mine)
    root = tmp_path_factory.mktemp("startup")
    t0 = time.perf_counter()
    globs = {
        n: _write_set(root / f"n{n}", n, seed=n)
        for n in sorted({*_sizes, *([10_000] if peer else [])})
    }
    globs[0] = _write_set(root / "val", VAL, seed=0)
    print(f"\n    wrote {sum(globs) + VAL} recordings in {time.perf_counter() - t0:.0f} s")
    yield globs
    shutil.rmtree(root, ignore_errors=True)


def _metadata_phase(pattern: str) -> int:
    h = hashlib.sha256()
    count = 0
    for source in expand(pattern).sources:
        _, piece = dataset_module._read_one(source, None)
        h.update(piece)
        count += 1
    return count


@pytest.mark.parametrize("n", SIZES)
def test_metadata(benchmark, bench_summary, sets, n):
    sigmf_schema._compiled_check()  # built once per process, as the first open builds it
    rounds = 3 if n < 100_000 else 1
    assert benchmark.pedantic(_metadata_phase, args=(sets[n],), rounds=rounds) == n
    _times["metadata", n] = _least(benchmark)
    _report(bench_summary)


@pytest.mark.parametrize("n", SIZES)
def test_open(benchmark, bench_summary, sets, n):
    held: list[tuple[int, int]] = []

    def open_count() -> int:  # the dataset is dropped before the next round opens another
        ds = IQDataset(sets[n], window=WINDOW)
        held.append(ds._native.open_files)
        return len(ds.recordings)

    assert benchmark.pedantic(open_count, rounds=3 if n < 100_000 else 1) == n
    _times["open", n] = _least(benchmark)
    now, cap = held[-1]
    bench_summary(f"startup open {n // 1000:>3}k: {now} data files held open (at most {cap})")
    _report(bench_summary)


def _config(tmp_path: Path, sets: dict, n: int) -> Path:
    tables = {
        "run": {"dir": os.fspath(tmp_path / f"run{n}"), "seed": 0},
        "data": {
            "train": [sets[n]],
            "val": [sets[0]],
            "patch_len": 8,
            "seq_patches": 32,
            "batch_size": 8,
        },
        "model": {"dim": 32, "layers": 1, "heads": 2},
        "schedule": {"warmup_steps": 1, "decay_steps": 1},
        "training": {"max_steps": 3, "eval_every": 3, "checkpoint_every": 3, "log_every": 1},
    }
    path = tmp_path / f"run{n}.toml"
    path.write_text(dumps_toml(tables))
    return path


# ``iqtrain run`` with timers around its phases (``iqtrain.cli.main.main``, as ``-m iqtrain``
# runs it): seconds since the interpreter started, printed as one JSON line at the end.
_DRIVER = """
import functools, json, sys, time
t0 = time.perf_counter()
import iqtrain.cli.main as cli, iqtrain.data.identity as identity
import iqtrain.train.attempt as attempt, iqtrain.train.loop as loop
at = {"imported": time.perf_counter() - t0}
def timed(owner, name, key):
    f = getattr(owner, name)
    @functools.wraps(f)
    def g(*a, **k):
        start = time.perf_counter() - t0
        at.setdefault(key + " start", start)
        try:
            return f(*a, **k)
        finally:
            at[key] = at.get(key, 0.0) + time.perf_counter() - t0 - start
    setattr(owner, name, g)
timed(attempt, "TrainStep", "model")
timed(attempt, "open_datasets", "open_datasets")
timed(identity.DataIdentity, "digests", "digests wait")
timed(loop.Trainer, "_step", "steps")
code = cli.main(["run", sys.argv[1]])
at["end"] = time.perf_counter() - t0
print(json.dumps(at))
sys.exit(code)
"""
_phases: dict[int, dict[str, float]] = {}


@pytest.mark.parametrize("n", SIZES)
def test_run(benchmark, bench_summary, sets, tmp_path, n):
    cfg = _config(tmp_path, sets, n)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    seen: list[dict[str, float]] = []

    def run():
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER, os.fspath(cfg)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1200,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        seen.append(json.loads(proc.stdout.strip().splitlines()[-1]))

    benchmark.pedantic(run, rounds=3 if n < 100_000 else 1, iterations=1)
    _times["run", n] = _least(benchmark)
    _phases[n] = min(seen, key=lambda at: at["end"])  # the round the load disturbed least
    _report(bench_summary)


def test_schema_check_peer(benchmark, bench_summary, sets):
    """jsonschema's best match over every file of the 10k set against the compiled check."""
    import jsonschema

    metas = [s.meta for s in expand(sets[10_000]).sources]
    parsed = [json.loads(m.read_bytes()) for m in metas]
    validator = sigmf_schema._schema_validator()
    fast = sigmf_schema._compiled_check()
    assert fast is not None

    def jsonschema_all():
        for md in parsed:
            assert jsonschema.exceptions.best_match(validator.iter_errors(md)) is None

    t0 = time.perf_counter()
    assert all(fast(md) for md in parsed)
    compiled = time.perf_counter() - t0
    benchmark.pedantic(jsonschema_all, rounds=1, iterations=1)
    peer = median(benchmark) or 0.0
    n = len(parsed)
    bench_summary(
        f"startup schema check per file: compiled {compiled / n * 1e6:.1f} us, jsonschema "
        f"{peer / n * 1e6:.1f} us ({peer / compiled:.0f}x)"
    )


def _least(benchmark) -> float:
    """The fastest round: the shared cores' other work only ever adds to a start-up."""
    stats = getattr(benchmark, "stats", None)
    return float("nan") if stats is None else stats.stats.min


def _report(add) -> None:
    # Called by each size's test; prints once every time of the run is in.
    keys = [(kind, n) for kind in ("metadata", "open", "run") for n in _sizes]
    if any(k not in _times for k in keys) or _times.get(("reported", 0)):
        return
    _times["reported", 0] = 1.0
    for kind in ("metadata", "open", "run"):
        t = [_times[kind, n] for n in _sizes]
        cells = "  ".join(f"{n // 1000:>3}k {s:7.2f} s" for n, s in zip(_sizes, t, strict=True))
        slopes = ", ".join(
            f"{_sizes[i - 1] // 1000}k-{_sizes[i] // 1000}k "
            f"{(t[i] - t[i - 1]) / (_sizes[i] - _sizes[i - 1]) * 1e3:.3f} ms/recording"
            for i in range(1, len(_sizes))
        )
        add(f"startup {kind:>8}: {cells}   slope {slopes or '(one size)'}")
    for n, at in sorted(_phases.items()):
        first = at.get("steps start", float("nan"))
        add(
            f"startup run {n // 1000:>3}k: imports {at['imported']:.2f} s, model "
            f"{at.get('model', 0):.2f} s, open_datasets {at.get('open_datasets', 0):.2f} s, "
            f"first step at {first:.2f} s, 3 steps {at.get('steps', 0):.2f} s, waiting for the "
            f"digests {at.get('digests wait', 0):.2f} s, end {at['end']:.2f} s"
        )

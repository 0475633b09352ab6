"""What the tests share: recordings on disk, tiny configs, hand-made attempts.

One module instead of test files importing each other (``tests`` is on ``sys.path``: see
``[tool.pytest.ini_options] pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np

#: The tests folder (on sys.path for the tests; child processes need it on PYTHONPATH).
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

# numpy dtype of one component, per SigMF complex datatype (all 14 of the specification)
COMPONENT_DTYPES = {
    "ci8": np.dtype("i1"),
    "cu8": np.dtype("u1"),
    "ci16_le": np.dtype("<i2"),
    "ci16_be": np.dtype(">i2"),
    "cf32_le": np.dtype("<f4"),
    "cf32_be": np.dtype(">f4"),
    "cu16_le": np.dtype("<u2"),
    "cu16_be": np.dtype(">u2"),
    "ci32_le": np.dtype("<i4"),
    "ci32_be": np.dtype(">i4"),
    "cu32_le": np.dtype("<u4"),
    "cu32_be": np.dtype(">u4"),
    "cf64_le": np.dtype("<f8"),
    "cf64_be": np.dtype(">f8"),
}


def as_read(iq: np.ndarray, datatype: str) -> np.ndarray:
    """What iqtrain reads of components ``iq`` of ``datatype``, by value (docs/design.md "Datatypes
    and the metadata verdict"): unsigned ones less half their range, 32-bit integers and cf64 as
    float32 rounded to nearest, the rest as they are."""
    dt = COMPONENT_DTYPES[datatype]
    if dt.kind == "u":
        signed = iq.astype(np.int64) - (1 << (8 * dt.itemsize - 1))
        return signed.astype(np.float32) if dt.itemsize == 4 else signed.astype(f"i{dt.itemsize}")
    if dt.itemsize == 8 or (dt.kind == "i" and dt.itemsize == 4):
        return iq.astype(np.float32)
    return iq.astype(dt.newbyteorder("="))


def write_sigmf(directory: Path, name: str, iq: np.ndarray, datatype: str, **global_fields) -> Path:
    """Write ``iq`` ([n, 2] components) as a SigMF recording with the sigmf package."""
    from sigmf import SigMFFile

    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{name}.sigmf-data"
    np.ascontiguousarray(iq, dtype=COMPONENT_DTYPES[datatype]).tofile(data_path)
    meta = SigMFFile(
        data_file=data_path,
        global_info={"core:datatype": datatype, "core:sample_rate": 1e6, **global_fields},
    )
    meta.add_capture(0, metadata={"core:frequency": 915e6})
    meta.tofile(directory / f"{name}.sigmf-meta")
    return directory / f"{name}.sigmf-meta"


def rated_recordings(directory: Path, rates: dict, samples: int = 4096, seed: int = 0) -> str:
    """One ci16_le recording of noise in ``directory`` per ``{name: core:sample_rate}`` (None:
    no ``core:sample_rate`` at all); returns the glob naming them."""
    rng = np.random.default_rng(seed)
    for name, rate in rates.items():
        meta = write_sigmf(directory, name, random_iq(rng, samples, "ci16_le"), "ci16_le")
        doc = json.loads(meta.read_text())
        if rate is None:
            del doc["global"]["core:sample_rate"]
        else:
            doc["global"]["core:sample_rate"] = rate
        meta.write_text(json.dumps(doc))
    return os.fspath(Path(directory) / "*.sigmf-meta")


def write_annotated(directory, name, iq, datatype, annotations, captures=(0,)) -> Path:
    """A SigMF recording with ``annotations``: ``(start, count or None, label or None)``."""
    from sigmf import SigMFFile

    directory.mkdir(parents=True, exist_ok=True)
    data_path = directory / f"{name}.sigmf-data"
    np.ascontiguousarray(iq, dtype=COMPONENT_DTYPES[datatype]).tofile(data_path)
    meta = SigMFFile(data_file=data_path, global_info={"core:datatype": datatype})
    for k, start in enumerate(captures):
        # Each tuned elsewhere: captures that differ only in their start are one segment.
        meta.add_capture(start, metadata={"core:frequency": 915e6 + 1e6 * k})
    for start, count, label in annotations:
        meta.add_annotation(start, count, metadata={"core:label": label} if label else {})
    meta.tofile(directory / f"{name}.sigmf-meta")
    return directory / f"{name}.sigmf-meta"


def random_iq(rng: np.random.Generator, n: int, datatype: str) -> np.ndarray:
    dt = COMPONENT_DTYPES[datatype]
    if dt.kind == "f":
        return rng.standard_normal((n, 2)).astype(dt)
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max, size=(n, 2), endpoint=True).astype(dt)


def tiny_tables(run_dir: Path, cache: Path, **training) -> dict:
    return {
        "run": {"dir": os.fspath(run_dir), "seed": 3},
        "data": {
            "patch_len": 8,
            "seq_patches": 16,
            "batch_size": 8,
            "val_batch_size": 24,
            "synthetic": {
                "train_recordings": 2,
                "val_recordings": 1,
                "samples": 4096,
                "cache_dir": os.fspath(cache),
            },
        },
        "model": {"dim": 32, "layers": 2, "heads": 2},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_steps": 4},
        "training": {
            "max_steps": 12,
            "eval_every": 4,
            "checkpoint_every": 5,
            "keep_last": 1,
            "log_every": 4,
            **training,
        },
    }


def cli_tables(run_dir: Path, cache: Path, **training):
    return {
        "run": {"dir": os.fspath(run_dir)},
        "data": {
            "patch_len": 8,
            "seq_patches": 8,
            "batch_size": 4,
            "synthetic": {
                "train_recordings": 1,
                "val_recordings": 1,
                "samples": 2048,
                "cache_dir": os.fspath(cache),
            },
        },
        "model": {"dim": 16, "layers": 1, "heads": 2},
        "schedule": {"warmup_steps": 1, "decay_steps": 1},
        "training": {"max_steps": 3, "eval_every": 2, "checkpoint_every": 2, **training},
    }


@contextlib.contextmanager
def misuse(
    match: str, kind: type[Exception] | tuple[type[Exception], ...] = ValueError
) -> Iterator:
    """A Python caller's mistake is refused as ``kind`` (ValueError, TypeError) matching
    ``match`` (which names the argument), never as an iqtrain error: a ConfigError is a bad
    config value or flag."""
    import pytest

    from iqtrain.errors import IQTrainError

    with pytest.raises(kind, match=match) as info:
        yield info
    assert not isinstance(info.value, IQTrainError), repr(info.value)


def refused_in_one_line(capsys, argv, *names) -> str:
    """``iqtrain argv`` (in process) exits 2 with exactly one ``iqtrain: error:`` line on stderr
    naming each of ``names``; returns that line."""
    from iqtrain.cli.main import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("iqtrain: error: "), err
    for name in names:
        assert name in err[0], err[0]
    return err[0]


def train_record(step, **extra):
    return {
        "kind": "train",
        "step": step,
        "loss": 1.0 / step,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "clipped": step == 2,
        "samples": 4,
        "patches": 28,
        "step_time_s": 0.01,
        "samples_per_s": 400.0 + step,
        "spike": False,
        **extra,
    }


def val_record(step, loss, best, **extra):
    return {
        "kind": "val",
        "step": step,
        "loss": loss,
        "pred_snr_db": 3.0,
        "samples": 8,
        "patches": 56,
        "best": best,
        "time_s": 0.1,
        **extra,
    }


RECORDS = [
    train_record(1),
    train_record(2),
    val_record(2, 0.5, True, baseline_zero_loss=1.0, baseline_copy_last_loss=2.0),
    train_record(3),
    val_record(3, 0.25, True),
]


def report_lines(text: str) -> list[str]:
    """``iqtrain report``'s lines with runs of spaces read as one and no indent: what a line
    says, whatever its column widths."""
    return [" ".join(line.split()) for line in text.splitlines()]


def write_attempt(run_dir, number="0001", status="completed", records=RECORDS, tail=b"", **info):
    """``run_dir/attempts/<number>/`` with attempt.json (``info`` overrides) and metrics.jsonl,
    as the evidence readers see them (no config, checkpoints or manifest)."""
    att = run_dir / "attempts" / number
    att.mkdir(parents=True)
    info = {
        "id": number,
        "status": status,
        "parent": None,
        "device": {"kind": "cpu", "name": "test-cpu", "precision": "fp32"},
        "started": "2025-01-01T00:00:00+00:00",
        **info,
    }
    (att / "attempt.json").write_text(json.dumps(info))
    lines = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    (att / "metrics.jsonl").write_bytes(lines + tail)
    return att


def write_lineage(run_dir, steps=(4, 7), records=RECORDS):
    """Attempts 0001 .. 000N of ``run_dir``, each resumed from the one before at ``steps[i]``;
    every one holds ``records``. Returns the attempt directories, oldest first."""
    atts = [write_attempt(run_dir, "0001", records=records)]
    for i, step in enumerate(steps, start=2):
        parent = {"attempt": str(atts[-1].resolve()), "checkpoint": "x", "step": step}
        atts.append(write_attempt(run_dir, f"{i:04d}", records=records, parent=parent))
    return atts


def checkpoint_state(step: int, **fields):
    """A valid CheckpointState for hand-made checkpoints (no data, loop or stream needed)."""
    from iqtrain.checkpoint.state import CheckpointState

    components = {
        "cursor": {},
        "loop": {"best_checkpoint": None, "stale_validations": 0},
        "rng": {"world_size": 1, "ranks": []},
    }
    components.update(fields.pop("components", {}))
    empty = {k: {} for k in ("train", "val", "train_meta", "val_meta")}
    values = {
        "step": step,
        "config_sha256": "0" * 64,
        "plan": {},
        "fingerprints": {"train": "t", "val": "v"},
        "data": empty,
        "metrics": {"records": 0, "bytes": 0, "sha256": "0" * 64},
        "components": components,
        **fields,
    }
    return CheckpointState(**values)


def manifest_weights(attempt: Path, which: str = "latest"):
    """(model, optimizer) tensors of the checkpoint an attempt's manifest names ``which``."""
    from safetensors.torch import load_file

    manifest = json.loads((attempt / "manifest.json").read_text())
    ckpt = (attempt / manifest[which]["path"]).resolve()
    return load_file(ckpt / "model.safetensors"), load_file(ckpt / "optimizer.safetensors")


def assert_same_tensors(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def skip_gpu_tests_without_cuda(items: list) -> None:
    """Mark every collected ``gpu`` test skipped on a machine without CUDA (tests and bench
    conftests call it from ``pytest_collection_modifyitems``)."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def h5py_or_skip():
    """h5py, the optional ``iqtrain[radioml]`` extra (``.ci/dev setup`` installs it), or a skip
    saying so: without it only the radioml2018 converter's tests cannot run."""
    import pytest

    return pytest.importorskip(
        "h5py", reason="needs h5py, the optional iqtrain[radioml] extra (.ci/dev setup installs it)"
    )


def tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``directory`` as TensorBoard's own reader loads them:
    ``{tag: [(step, value), …]}``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.fspath(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _wandb_records(path: Path) -> list:
    """The ``wandb_internal_pb2.Record`` protos of one offline ``run-<id>.wandb`` file.

    A LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then 32 KiB
    blocks of chunks (crc32 u32, length u16, type u8: 1 full, 2 first, 3 middle, 4 last) that
    join into records."""
    import struct

    from wandb.proto import wandb_internal_pb2

    block = 32768
    data = path.read_bytes()
    if data[:7] != b":W&B\xe1\xbe\x00":
        return []  # not even the header yet
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_offline_runs(wandb_dir: Path, timeout: float = 60.0) -> dict[Path, dict]:
    """The finished offline W&B runs under ``wandb_dir`` (``WANDB_DIR``), read from the
    ``run-<id>.wandb`` files wandb writes: ``{run directory: {"id", "history": [{key: value},
    …]}}``, oldest first. wandb-core writes a file after ``finish()`` has returned (and after
    the process that logged it has exited), so this waits until every file holds its run's
    ``exit`` record, up to ``timeout`` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        runs, done = {}, True
        for path in sorted(Path(wandb_dir).glob("wandb/offline-run-*/run-*.wandb")):
            records = _wandb_records(path)
            kinds = [r.WhichOneof("record_type") for r in records]
            done = done and "exit" in kinds
            run_id = next(
                (r.run.run_id for r, k in zip(records, kinds, strict=True) if k == "run"), None
            )
            history = [
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for r, k in zip(records, kinds, strict=True)
                if k == "history"
            ]
            runs[path.parent] = {"id": run_id, "history": history}
        if done or time.monotonic() > deadline:
            return runs
        time.sleep(0.05)


def deep_key_pickle(depth: int) -> bytes:
    """A RadioML 2016 pickle (protocol 2) of one float32 [1, 2, 128] array whose key is
    ``("BPSK", 0)`` inside ``depth`` 1-tuples (TUPLE1 opcodes): repr and hash of such a key
    recurse once per level (a RecursionError at thousands, a C stack overflow at 10**5 and
    more)."""
    import pickle

    key = pickle.dumps(("BPSK", 0), 2)[2:-1]  # without PROTO and STOP
    value = pickle.dumps(np.zeros((1, 2, 128), np.float32), 2)[2:-1]
    return b"\x80\x02}" + key + b"\x85" * depth + value + b"s."


def write_bursts(directory, name, labels, window, *, windows_per=2, fields=None, seed=0) -> Path:
    """One ci8 recording of back-to-back annotations of ``windows_per`` windows of ``window``
    samples (noise), annotation i labelled ``labels[i]`` and carrying ``fields[i]`` (a dict of
    extra annotation fields, e.g. an SNR) when given: a labelled set whose layout a test picks."""
    burst = windows_per * window
    iq = random_iq(np.random.default_rng(seed), burst * len(labels), "ci8")
    spans = [(i * burst, burst, label) for i, label in enumerate(labels)]
    meta = write_annotated(Path(directory), name, iq, "ci8", spans)
    if fields is not None:
        doc = json.loads(meta.read_text())
        for ann, extra in zip(doc["annotations"], fields, strict=True):
            ann.update(extra)
        meta.write_text(json.dumps(doc))
    return meta


def kill_after_checkpoints(argv: list[str], env: dict, checkpoints: Path, count: int) -> None:
    """Start ``argv``, SIGKILL it once ``checkpoints`` (an attempt's checkpoints directory)
    lists ``count`` checkpoints, and check that the kill is what ended it."""
    import signal
    import subprocess
    import time

    from iqtrain.checkpoint.files import list_checkpoints

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if len(list_checkpoints(checkpoints)) >= count:
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err.decode()


class Forged:
    """Pickles as a call of ``fn(*args)``: what a forged file hides in a value (unpickling it
    runs that call unless the reader refuses the global)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def set_sample_rate(meta: Path, rate: float | None = 1e6) -> Path:
    """Give recording ``meta`` (a ``.sigmf-meta`` file) the global ``core:sample_rate`` ``rate``
    (None: none at all), e.g. the 1 MHz of the synthetic sets a tiny attempt trains on, so a
    model trained on them reads it without ``--any-rate``; returns ``meta``."""
    doc = json.loads(Path(meta).read_text())
    doc["global"].pop("core:sample_rate", None)
    if rate is not None:
        doc["global"]["core:sample_rate"] = rate
    Path(meta).write_text(json.dumps(doc))
    return Path(meta)


def fsdp_step(*, dim: int, layers: int):
    """A one-process ``parallel = "fsdp"`` TrainStep (CPU, fp32, eager, lr 1e-3) of a tiny
    model seeded with 0; not yet stepped."""
    import torch

    from iqtrain.config.sections import ModelConfig, OptimizerConfig
    from iqtrain.model.transformer import IQTransformer
    from iqtrain.train.step import TrainStep

    torch.manual_seed(0)
    config = ModelConfig(dim=dim, layers=layers, heads=2, patch_len=4, max_patches=8)
    return TrainStep(
        IQTransformer(config),
        OptimizerConfig(lr=1e-3),
        device="cpu",
        precision="fp32",
        compile=False,
        parallel="fsdp",
    )


def subprocess_env() -> dict[str, str]:
    """This process's environment for an ``iqtrain`` or torchrun child: one thread per process
    and none of torchrun's per-rank variables, so a child started here is a fresh job, not a
    rank of this one."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root``: its kind, and a file's length, mtime and SHA-256, a link's
    target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st_ = os.lstat(path)
            if stat.S_ISLNK(st_.st_mode):
                out[path] = ("link", os.readlink(path))
            elif stat.S_ISREG(st_.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[path] = ("file", st_.st_size, st_.st_mtime_ns, digest)
            else:
                out[path] = ("other", stat.S_IFMT(st_.st_mode), st_.st_mtime_ns)
    return out


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

"""Data-parallel training under torchrun: real processes, 2 CPU ranks on gloo, one thread each.

Every run here is ``python -m torch.distributed.run --standalone --nproc-per-node N -m iqtrain``
(exactly what the README tells a user to type, with torchrun spelled as its module), on a tiny
model, eager except in the compile tests. The World's unit tests (no processes) are in
tests/unit/distributed/test_world.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import iqtrain
from iqtrain.checkpoint.files import load_checkpoint
from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing

MAX_STEPS = 12
TIMEOUT = 300  # a hang fails the test instead of the CI job

pytestmark = pytest.mark.distributed


def tables(run_dir: Path, cache: Path, **training) -> dict:
    return {
        "run": {"dir": os.fspath(run_dir), "seed": 5},
        "data": {
            "patch_len": 8,
            "seq_patches": 16,
            "batch_size": 8,
            "val_batch_size": 7,  # 4 batches, the last partial: sharded unevenly over 2 ranks
            "synthetic": {
                "train_recordings": 2,
                "val_recordings": 1,
                "samples": 1800,
                "cache_dir": os.fspath(cache),
            },
        },
        "model": {"dim": 32, "layers": 2, "heads": 2},
        "optimizer": {"lr": 3e-3, "min_lr": 3e-4},
        "schedule": {"kind": "wsd", "warmup_steps": 2, "decay_steps": 4},
        "training": {
            "max_steps": MAX_STEPS,
            "eval_every": 4,
            "checkpoint_every": 5,
            "keep_last": 0,
            "log_every": 4,
            **training,
        },
    }


def _env(extra: dict | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(extra or {})}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def torchrun(nproc: int, *args, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "-m", "iqtrain", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(env), timeout=TIMEOUT)


def single(*args) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "iqtrain", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=TIMEOUT)


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def write_config(path: Path, run_dir: Path, cache: Path, **training) -> Path:
    path.write_text(dumps_toml(tables(run_dir, cache, **training)))
    return path


def records(attempt: Path) -> list[dict]:
    return read_metrics(attempt / "metrics.jsonl")


def model_at(attempt: Path, step: int) -> dict[str, torch.Tensor]:
    return load_checkpoint(attempt / "checkpoints" / f"step_{step:08d}")[0]


def state_at(attempt: Path, step: int) -> dict:
    return json.loads((attempt / "checkpoints" / f"step_{step:08d}" / "state.json").read_text())


def close(a: list[dict], b: list[dict], rel: float) -> None:
    """Same records, numbers equal to ``rel`` (summation order differs across world sizes)."""
    assert [(r["kind"], r["step"]) for r in a] == [(r["kind"], r["step"]) for r in b]
    for ra, rb in zip(a, b, strict=True):
        for key in ("loss", "grad_norm", "lr"):
            if key in ra:
                assert ra[key] == pytest.approx(rb[key], rel=rel), (ra, rb)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 2-rank attempt and one 1-process attempt of the same config."""
    root = tmp_path_factory.mktemp("dist")
    cache = root / "cache"
    two = write_config(root / "two.toml", root / "two", cache)
    one = write_config(root / "one.toml", root / "one", cache)
    ok(torchrun(2, "run", two))
    ok(single("run", one))
    return {
        "root": root,
        "two": root / "two" / "attempts" / "0001",
        "one": root / "one" / "attempts" / "0001",
    }


def test_two_ranks_write_one_attempt_that_matches_one_process(runs):
    two, one = runs["two"], runs["one"]
    assert sorted(p.name for p in two.parent.iterdir()) == ["0001"]  # one attempt, one stream
    assert len(list(two.parent.parent.rglob("metrics.jsonl"))) == 1
    ok(single("verify", two))
    info = json.loads((two / "attempt.json").read_text())
    assert info["world"]["size"] == 2 and info["world"]["backend"] == "gloo"
    assert info["world"]["parallel"] == "ddp"
    assert len(info["world"]["hosts"]) == 2
    assert json.loads((one / "attempt.json").read_text())["world"]["size"] == 1
    a, b = records(two), records(one)
    # The first step is the same global batch from the same weights: the same loss and norm
    # up to the order of the float sums (here they agree to every printed digit).
    assert a[0]["loss"] == pytest.approx(b[0]["loss"], rel=1e-6)
    assert a[0]["grad_norm"] == pytest.approx(b[0]["grad_norm"], rel=1e-6)
    assert a[0]["samples"] == b[0]["samples"] == 8
    # Each rank read its share of the content digests; merged, they are one process's digests.
    assert state_at(two, MAX_STEPS)["data"] == state_at(one, MAX_STEPS)["data"]
    close(a, b, rel=1e-4)
    assert state_at(two, MAX_STEPS)["cursor"] == state_at(one, MAX_STEPS)["cursor"]
    assert len(state_at(two, MAX_STEPS)["rng"]["ranks"]) == 2


def test_a_two_rank_resume_is_bit_exact(runs):
    two = runs["two"]
    ok(torchrun(2, "resume", "--attempt", two, "--from", "step_5"))
    child = two.parent / "0002"
    assert strip_timing(records(child)) == strip_timing(records(two))
    got, want = model_at(child, MAX_STEPS), model_at(two, MAX_STEPS)
    assert all(torch.equal(got[k], want[k]) for k in want)
    ok(single("verify", child))
    # The data check was shared: each rank read part of the bytes, together all of them.
    check = json.loads((child / "attempt.json").read_text())["data_check"]
    state = state_at(two, MAX_STEPS)["data"]
    total = sum(os.path.getsize(p) for key in ("train", "val") for p in state[key])
    assert len(check["bytes"]) == 2 and all(b > 0 for b in check["bytes"]), check
    assert sum(check["bytes"]) == total and check["seconds"] >= max(check["rank_seconds"])


def test_a_two_rank_checkpoint_resumes_on_one_process_and_back(runs, tmp_path):
    two, one = runs["two"], runs["one"]
    ok(single("resume", "--attempt", two, "--from", "step_5"))
    child = sorted(two.parent.iterdir())[-1]
    assert json.loads((child / "attempt.json").read_text())["world"]["size"] == 1
    # The same global batches from step 6 on (the cursor is a global sample count).
    close(records(child), records(two), rel=1e-4)
    assert state_at(child, MAX_STEPS)["cursor"] == state_at(two, MAX_STEPS)["cursor"]
    assert len(state_at(child, MAX_STEPS)["rng"]["ranks"]) == 1
    # ... and a 1-process checkpoint continues on 2 ranks.
    ok(torchrun(2, "resume", "--attempt", one, "--from", "step_10"))
    back = sorted(one.parent.iterdir())[-1]
    close(records(back), records(one), rel=1e-4)
    assert state_at(back, MAX_STEPS)["cursor"] == state_at(one, MAX_STEPS)["cursor"]
    ok(single("verify", back))


def on_rank(tmp_path: Path, rank: int, body: str) -> dict:
    """The environment for a torchrun whose rank ``rank`` runs ``body`` at start-up (a
    sitecustomize module, which every Python imports first): how a test makes one rank fail."""
    inject = tmp_path / "inject"
    inject.mkdir()
    lines = ["import os", f"if os.environ.get('RANK') == '{rank}':"]
    lines += ["    " + line for line in body.strip().splitlines()]
    (inject / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {"PYTHONPATH": f"{inject}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def slow_on_rank(tmp_path: Path, rank: int, module: str, attr: str, seconds: float) -> dict:
    """:func:`on_rank` making ``module``'s ``attr`` (``Class.method`` too) sleep ``seconds``
    before it runs."""
    return on_rank(
        tmp_path,
        rank,
        f"""
import importlib, time
*path, name = "{attr}".split(".")
owner = importlib.import_module("{module}")
for part in path:
    owner = getattr(owner, part)
orig = getattr(owner, name)
def slow(*a, **k):
    time.sleep({seconds})
    return orig(*a, **k)
setattr(owner, name, slow)
""",
    )


def recording_exits(tmp_path: Path, rank0_body: str = "") -> tuple[dict, Callable[[], dict]]:
    """The environment for a torchrun whose workers record the code they leave with (torchrun,
    itself stopped by a signal, prints no summary of its workers') and their pids (in
    ``tmp_path/pids/RANK``), rank 0 running ``rank0_body`` at start-up; and a function
    returning ``{rank: code}`` (a worker killed by a signal records none)."""
    exits = tmp_path / "exits"
    exits.mkdir()
    inject = tmp_path / "inject"
    inject.mkdir()
    (tmp_path / "pids").mkdir()
    lines = [
        "import os, pathlib",
        "if os.environ.get('RANK') is not None:",
        f"    pathlib.Path({os.fspath(tmp_path / 'pids')!r}, os.environ['RANK'])"
        ".write_text(str(os.getpid()))",
        "    _exit = os._exit",
        "    def recorded_exit(code):",
        f"        pathlib.Path({os.fspath(exits)!r}, os.environ['RANK']).write_text(str(code))",
        "        _exit(code)",
        "    os._exit = recorded_exit",
        "if os.environ.get('RANK') == '0':",
        *("    " + line for line in (rank0_body.strip().splitlines() or ["pass"])),
    ]
    (inject / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    env = {"PYTHONPATH": f"{inject}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return env, lambda: {int(p.name): int(p.read_text()) for p in exits.iterdir()}


def torchrun_until(marker: Path, *args, env: dict, signum: int = signal.SIGTERM) -> str:
    """Start torchrun, send it ``signum`` once ``marker`` exists (and a second more), and
    return its stderr."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", "-m", "iqtrain", *map(str, args)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(env), text=True
    )
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1)
    proc.send_signal(signum)  # torchrun forwards it to every worker
    return proc.communicate(timeout=TIMEOUT)[1]


@pytest.mark.exit_path
def test_a_rank_that_raises_ends_the_job_with_exit_1(tmp_path):
    env = on_rank(  # rank 1 raises in its third step
        tmp_path,
        1,
        """
import iqtrain.train.step as s
orig = s.TrainStep.train_step
def boom(self, *a, step=None, **k):
    if step == 3:
        raise RuntimeError('injected failure on rank 1')
    return orig(self, *a, step=step, **k)
s.TrainStep.train_step = boom
""",
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    t0 = time.monotonic()
    proc = torchrun(2, "run", cfg, env=env)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert time.monotonic() - t0 < TIMEOUT / 2
    assert "injected failure on rank 1" in proc.stderr
    # Rank 0 ends with one line naming the cause, and its attempt records the failure.
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "rank 0:" in lines[0], proc.stderr[-4000:]
    info = json.loads((tmp_path / "run" / "attempts" / "0001" / "attempt.json").read_text())
    assert info["status"] == "failed" and info["error"].startswith("PeerError")
    assert info["final_step"] == 2
    ok(single("verify", tmp_path / "run" / "attempts" / "0001"))


@pytest.mark.exit_path
def test_a_rank_that_refuses_its_input_stops_every_rank_before_anything_exists(tmp_path):
    # Rank 1 alone cannot open its data (as if its node lacked the files): every rank exits 2,
    # rank 0 prints the one line naming rank 1, and no attempt directory is created.
    env = on_rank(
        tmp_path,
        1,
        """
import iqtrain.train.attempt as a
from iqtrain.errors import DataError
def refuse(config):
    raise DataError('/data/x.sigmf-data: no such file')
a.open_datasets = refuse
""",
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    proc = torchrun(2, "run", cfg, env=env)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert lines == ["iqtrain: error: rank 1: /data/x.sigmf-data: no such file"], proc.stderr
    assert proc.stderr.count("exitcode  : 2") == 2
    assert not (tmp_path / "run" / "attempts").exists()


@pytest.mark.exit_path
def test_a_non_finite_loss_on_one_rank_stops_every_rank_naming_the_global_batch(tmp_path):
    import numpy as np
    from helpers import write_sigmf

    rng = np.random.default_rng(0)
    window = 128  # seq_patches 16 x patch_len 8
    train = rng.standard_normal((40 * window, 2)).astype(np.float32)
    train[17 * window + 5] = np.nan  # window 17: in one rank's half of its global batch
    write_sigmf(tmp_path / "d", "train", train, "cf32_le")
    write_sigmf(tmp_path / "d", "val", rng.standard_normal((8 * window, 2)), "cf32_le")
    tabs = tables(tmp_path / "run", tmp_path / "cache")
    tabs["data"]["train"] = [os.fspath(tmp_path / "d" / "train.sigmf-meta")]
    tabs["data"]["val"] = [os.fspath(tmp_path / "d" / "val.sigmf-meta")]
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tabs))
    proc = torchrun(2, "run", cfg)
    assert proc.returncode == 1 and proc.stderr.count("exitcode  : 1") == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "non-finite loss" in lines[0], proc.stderr[-3000:]
    ids = json.loads(lines[0].split("window ids ")[1].split(";")[0])
    assert len(ids) == 8 and 17 in ids  # both ranks' rows, in global batch order
    info = json.loads((tmp_path / "run" / "attempts" / "0001" / "attempt.json").read_text())
    assert info["status"] == "failed" and "17" in info["error"]


def test_work_rank_0_does_alone_is_not_bounded_by_the_collective_timeout(tmp_path):
    from iqtrain.data.synth import synthesize

    synthesize(tmp_path / "labelled", recordings=2, samples=16384, datatype="ci16_le", seed=9)
    # Rank 0's probe takes 15 s, three times training.dist_timeout_s: the other rank waits for
    # it at the long-timeout barrier, not in the loop's next collective.
    env = slow_on_rank(tmp_path, 0, "iqtrain.train.probe", "TrainingProbe.record", 15)
    tabs = tables(tmp_path / "run", tmp_path / "cache", dist_timeout_s=5, max_steps=8)
    tabs["probe"] = {"every": 2, "data": [os.fspath(tmp_path / "labelled" / "*.sigmf-meta")]}
    tabs["probe"]["folds"] = 2
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tabs))
    ok(torchrun(2, "run", cfg, env=env))
    recs = records(tmp_path / "run" / "attempts" / "0001")
    assert [r["step"] for r in recs if r["kind"] == "probe"] == [8]


@pytest.mark.exit_path
def test_a_batch_size_that_does_not_divide_is_exit_2_on_every_rank(tmp_path):
    tabs = tables(tmp_path / "run", tmp_path / "cache")
    tabs["data"]["batch_size"] = 5
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tabs))
    proc = torchrun(2, "run", cfg)
    # torchrun turns any failed worker into its own exit 1; each worker's code is in its
    # summary. The ranks agree before either reports: one line for the job.
    assert proc.returncode != 0
    assert proc.stderr.count("data.batch_size: 5 is not divisible by the world size 2") == 1
    assert proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-4000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


@pytest.mark.exit_path
def test_a_worker_still_starting_when_its_peer_refuses_the_config_exits_2_as_well(tmp_path):
    # Rank 0 is slow to read its config: rank 1 refuses it and exits first.
    env = slow_on_rank(tmp_path, 0, "iqtrain.config.schema", "load_config", 5)
    tabs = tables(tmp_path / "run", tmp_path / "cache")
    tabs["training"]["max_stepz"] = 3
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tabs))
    proc = torchrun(2, "run", cfg, env=env)
    # Rank 1 waits for rank 0 to join before either reports: the same refusal on both, printed
    # once (by rank 0), and each worker exits 2 itself.
    assert proc.stderr.count("training.max_stepz") == 1, proc.stderr[-4000:]
    assert proc.stderr.count("exitcode  : 2") == 2, proc.stderr[-4000:]
    assert not (tmp_path / "run").exists()


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]


def exit_codes(proc: subprocess.CompletedProcess) -> list[int]:
    """Every worker's exit code from torchrun's summary (a signal shows as negative)."""
    return sorted(
        int(ln.split(":", 1)[1].split()[0])
        for ln in proc.stderr.splitlines()
        if ln.strip().startswith("exitcode  :")
    )


@pytest.mark.exit_path
@pytest.mark.parametrize(
    "how",
    ["misspelled key", "missing config file", "unknown option", "cuda without a GPU"],
)
def test_a_refusal_before_the_ranks_join_is_exit_2_on_every_rank_printed_once(tmp_path, how):
    # Each worker refuses before it has joined the group; they join anyway, agree, and only
    # rank 0 prints. Without that one worker died of torchrun's SIGTERM (-15) or of a gloo
    # thread's abort at exit (-6) in some runs, and every rank printed the line.
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    args = {
        "misspelled key": ("run", cfg, "--set", "training.max_stepz=3"),
        "missing config file": ("run", tmp_path / "nope.toml"),
        "unknown option": ("run", cfg, "--sett", "x=1"),
        "cuda without a GPU": ("run", cfg, "--set", "training.device='cuda'"),
    }[how]
    # The workers see no GPU, on a machine with one too (training.device = 'cuda' is refused).
    proc = torchrun(2, *args, env={"CUDA_VISIBLE_DEVICES": ""})
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    assert len(error_lines(proc)) == 1, proc.stderr[-4000:]
    assert not (tmp_path / "run").exists()


def in_every_worker(tmp_path: Path, body: str) -> dict:
    """The environment for a torchrun whose every worker (not torchrun itself) runs ``body``
    at start-up, ``RANK`` set (a sitecustomize module, as :func:`on_rank`)."""
    inject = tmp_path / "inject"
    inject.mkdir()
    lines = ["import os", "if os.environ.get('RANK') is not None:"]
    lines += ["    " + line for line in body.strip().splitlines()]
    (inject / "sitecustomize.py").write_text("\n".join(lines) + "\n")
    return {"PYTHONPATH": f"{inject}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


@pytest.mark.exit_path
def test_a_rank_without_a_gpu_of_its_own_stops_every_rank_before_any_process_group(tmp_path):
    # training.device = "cuda": rank 0 believes it has a GPU, rank 1 sees none. Once rank 0
    # made an NCCL group while rank 1 joined on gloo to report its refusal: a job that hung
    # for training.dist_timeout_s (here 10 minutes). Now the ranks agree through the
    # rendezvous store before either makes a group: exit 2 on both, one line, no group at all.
    log = tmp_path / "groups"
    env = in_every_worker(
        tmp_path,
        f"""
import torch
import torch.distributed as dist
real = dist.init_process_group
def init_process_group(backend=None, **kwargs):  # logged, then made on gloo (no GPU here)
    with open({os.fspath(log)!r}, "a") as f:
        f.write(os.environ["RANK"] + " " + str(backend) + "\\n")
    kwargs.pop("device_id", None)
    return real(backend="gloo", **kwargs)
dist.init_process_group = init_process_group
if os.environ["RANK"] == "0":
    torch.cuda.device_count = lambda: 1
    torch.cuda.set_device = lambda device: None
""",
    )
    cfg = write_config(
        tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache", device="cuda", dist_timeout_s=600
    )
    start = time.monotonic()
    proc = torchrun(2, "run", cfg, env={**env, "CUDA_VISIBLE_DEVICES": ""})
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    assert error_lines(proc) == [
        "iqtrain: error: rank 1: training.device: local rank 1 has no GPU of its own (0 visible)"
    ], proc.stderr[-4000:]
    assert not log.exists(), log.read_text()  # no rank made a process group
    assert time.monotonic() - start < 60
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
def test_a_data_glob_that_matches_nothing_is_exit_2_on_every_rank(tmp_path):
    # The refusal of the preflight agreement: each worker leaves without interpreter
    # finalization (a gloo thread tearing down the agreement's work aborted it: SIGABRT).
    tabs = tables(tmp_path / "run", tmp_path / "cache")
    tabs["data"]["train"] = [os.fspath(tmp_path / "none" / "*.sigmf-meta")]
    tabs["data"]["val"] = [os.fspath(tmp_path / "none" / "*.sigmf-meta")]
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tabs))
    proc = torchrun(2, "run", cfg)
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    assert len(error_lines(proc)) == 1 and "no recordings match" in error_lines(proc)[0]


@pytest.mark.exit_path
@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (  # a node with its own edited copy of the config
            "c.optimizer = dataclasses.replace(c.optimizer, lr=c.optimizer.lr * 2)",
            "rank 1 has optimizer.lr = 0.006, rank 0 has 0.003",
        ),
        (  # another step budget: once a hang for dist_timeout_s
            "c.training = dataclasses.replace(c.training, max_steps=c.training.max_steps + 1)",
            "rank 1 has training.max_steps = 13, rank 0 has 12",
        ),
    ],
    ids=["lr", "max_steps"],
)
def test_ranks_that_do_not_run_the_same_config_are_refused(tmp_path, body, expect):
    env = on_rank(
        tmp_path,
        1,
        f"""
import dataclasses
import iqtrain.config.schema as schema
orig = schema.load_config
def load_config(*a, **k):
    c = orig(*a, **k)
    {body}
    return c
schema.load_config = load_config
""",
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    proc = torchrun(2, "run", cfg, env=env)
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    assert error_lines(proc) == [f"iqtrain: error: the ranks must run the same thing: {expect}"]
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
def test_ranks_that_do_not_read_the_same_data_are_refused(tmp_path):
    # Rank 1's node generated other synthetic recordings under the same config.
    env = on_rank(
        tmp_path,
        1,
        """
import dataclasses
import iqtrain.data.sources as sources
orig = sources.ensure_synthetic
sources.ensure_synthetic = lambda s: orig(dataclasses.replace(s, seed=s.seed + 1))
""",
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    proc = torchrun(2, "run", cfg, env=env)
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    (line,) = error_lines(proc)
    assert "the ranks must run the same thing: rank 1 has data.train fingerprint" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
def test_a_changed_recording_refuses_a_two_rank_resume_naming_it(tmp_path):
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    ok(torchrun(2, "run", cfg))
    parent = tmp_path / "run" / "attempts" / "0001"
    # The last train recording: rank 1's share of the bytes reads it, rank 0 names it.
    victim = Path(sorted(state_at(parent, MAX_STEPS)["data"]["train"])[-1])
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2 + 1] ^= 1  # same length, one bit: only the content digest sees it
    victim.write_bytes(bytes(blob))
    proc = torchrun(2, "resume", "--attempt", parent, "--from", "step_5")
    assert exit_codes(proc) == [2, 2], proc.stderr[-4000:]
    (line,) = error_lines(proc)
    assert f"data.train: {victim} changed since the parent was written (content digest" in line
    assert sorted(p.name for p in parent.parent.iterdir()) == ["0001"]


def _resume_stalled_in_its_data_check(tmp_path: Path) -> tuple[Path, Path, dict, Callable]:
    """A two-rank run's attempt, and the environment of a resume whose rank 0 stalls in its
    share of the data check (every rank reads its share of every byte before the child
    exists; here rank 0 sleeps a minute, in C as far as its main thread goes, after touching
    the marker): ``(parent, marker, env, exits)`` (``exits``: :func:`recording_exits`)."""
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    ok(torchrun(2, "run", cfg))
    marker = tmp_path / "digesting"
    env, exits = recording_exits(
        tmp_path,
        f"""
import pathlib, time
from iqtrain.data.identity import DigestPlan
def share(*a, **k):
    pathlib.Path({os.fspath(marker)!r}).touch()
    time.sleep(60)
DigestPlan.share = share
""",
    )
    return tmp_path / "run" / "attempts" / "0001", marker, env, exits


@pytest.mark.exit_path
def test_sigterm_during_a_resume_data_check_stops_every_rank_with_nothing_created(tmp_path):
    parent, marker, env, exits = _resume_stalled_in_its_data_check(tmp_path)
    err = torchrun_until(marker, "resume", "--attempt", parent, "--from", "step_5", env=env)
    assert exits() == {0: 143, 1: 143}, err[-4000:]
    assert err.count("stopped by signal 15 before the attempt existed") == 1, err[-4000:]
    assert sorted(p.name for p in parent.parent.iterdir()) == ["0001"]


@pytest.mark.exit_path
def test_a_rank_whose_signal_comes_after_its_peer_has_gone_is_stopped_by_it_too(tmp_path):
    # torchrun forwards a signal to its workers one after the other: rank 0 can be gone, and
    # rank 1 see its connection close, before rank 1 has its own copy (here: a second later).
    parent, marker, env, exits = _resume_stalled_in_its_data_check(tmp_path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", "-m", "iqtrain", "resume", "--attempt", os.fspath(parent), "--from", "step_5"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(env), text=True
    )
    deadline = time.monotonic() + TIMEOUT
    while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(1)  # rank 1 has read its share and waits for rank 0 in the agreement
    pid = {r: int((tmp_path / "pids" / str(r)).read_text()) for r in (0, 1)}
    os.kill(pid[0], signal.SIGTERM)
    time.sleep(1)  # rank 1 sees rank 0's connections close first
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid[1], signal.SIGTERM)
    err = proc.communicate(timeout=TIMEOUT)[1]
    assert exits() == {0: 143, 1: 143}, err[-4000:]
    assert err.count("stopped by signal 15 before the attempt existed") == 1, err[-4000:]
    assert sorted(p.name for p in parent.parent.iterdir()) == ["0001"]


@pytest.mark.exit_path
def test_sigterm_while_the_attempt_is_claimed_gives_an_interrupted_attempt(tmp_path):
    # A signal that arrives once the ranks hold their signals (just before the claim) is the
    # loop's to act on: one step, a checkpoint, "interrupted", 143 on every rank (it once
    # recorded the attempt as failed).
    marker = tmp_path / "claiming"
    env, exits = recording_exits(
        tmp_path,
        f"""
import pathlib, time
import iqtrain.train.attempt as attempt
orig = attempt.claim_attempt
def claim_attempt(*a, **k):
    pathlib.Path({os.fspath(marker)!r}).touch()
    time.sleep(3)
    return orig(*a, **k)
attempt.claim_attempt = claim_attempt
""",
    )
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    err = torchrun_until(marker, "run", cfg, env=env)
    assert exits() == {0: 143, 1: 143}, err[-4000:]
    attempt = tmp_path / "run" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "interrupted" and info["final_step"] == 1, err[-4000:]
    assert [p.name for p in (attempt / "checkpoints").iterdir()] == ["step_00000001"]
    assert err.count("checkpoint saved. Resume with:") == 1
    ok(single("verify", attempt))


@pytest.mark.exit_path
def test_sigterm_stops_every_rank_at_one_step_and_resumes_exactly(tmp_path):
    # The signal's latency (the poll below, torchrun's forwarding, a loaded machine) has no
    # bound, and a step here takes about 20 ms: a stop once landed at step 22, after the first
    # validation. So the run is long enough that the signal comes well before its end (about
    # 2.3 s of steps after the 5th), and the assertions hold wherever the stop lands.
    steps = 120
    settings = {"max_steps": steps, "eval_every": 20, "checkpoint_every": 100}
    cfg = write_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache", **settings)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
    cmd += ["2", "-m", "iqtrain", "run", os.fspath(cfg)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), text=True
    )
    metrics = tmp_path / "run" / "attempts" / "0001" / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().count('"train"') >= 5:
            proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every worker
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=TIMEOUT)
    attempt = metrics.parent
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "interrupted", err[-4000:]
    stopped = info["final_step"]
    assert 5 <= stopped < steps
    # The signal's checkpoint, and the best ones of the validations before it, if any (every
    # 20 steps; checkpoint_every is past the end).
    names = sorted(p.name for p in (attempt / "checkpoints").iterdir())
    validated = {r["step"] for r in records(attempt) if r["kind"] == "val"}
    assert names[-1] == f"step_{stopped:08d}", names
    assert {int(n.removeprefix("step_")) for n in names[:-1]} <= validated, (names, validated)
    assert err.count("checkpoint saved. Resume with:") == 1  # rank 0 alone reports
    ok(torchrun(2, "resume", "--attempt", attempt))
    child = attempt.parent / "0002"
    ref = write_config(tmp_path / "r.toml", tmp_path / "ref", tmp_path / "cache", **settings)
    ok(torchrun(2, "run", ref))
    want = tmp_path / "ref" / "attempts" / "0001"
    assert strip_timing(records(child)) == strip_timing(records(want))
    got, exp = model_at(child, steps), model_at(want, steps)
    assert all(torch.equal(got[k], exp[k]) for k in exp)


def test_compiled_ddp_matches_eager_ddp(tmp_path):
    eager = write_config(tmp_path / "e.toml", tmp_path / "e", tmp_path / "cache", max_steps=6)
    comp = write_config(
        tmp_path / "c.toml", tmp_path / "c", tmp_path / "cache", max_steps=6, compile=True
    )
    ok(torchrun(2, "run", eager))
    ok(torchrun(2, "run", comp))
    a = records(tmp_path / "c" / "attempts" / "0001")
    b = records(tmp_path / "e" / "attempts" / "0001")
    close(a, b, rel=1e-4)


# -------------------------------------------------------------- FSDP2 (training.parallel = fsdp)


def fsdp_config(path: Path, run_dir: Path, cache: Path, **training) -> Path:
    """The runs' config, sharded; 3 validation batches, so one rank has a batch fewer."""
    tabs = tables(run_dir, cache, parallel="fsdp", **training)
    tabs["data"]["val_batch_size"] = 5
    path.write_text(dumps_toml(tabs))
    return path


def ckpt(attempt: Path, step: int) -> Path:
    return attempt / "checkpoints" / f"step_{step:08d}"


def training_records(attempt: Path) -> list[dict]:
    return [r for r in records(attempt) if r["kind"] in ("train", "val")]


@pytest.fixture(scope="module")
def fsdp(runs):
    """A 2-rank FSDP2 attempt of the config of runs["two"] (DDP)."""
    root = runs["root"]
    ok(torchrun(2, "run", fsdp_config(root / "fsdp.toml", root / "fsdp", root / "cache")))
    return root / "fsdp" / "attempts" / "0001"


def test_fsdp_trains_as_ddp_does_and_writes_sharded_checkpoints(fsdp, runs):
    ok(single("verify", fsdp))
    assert json.loads((fsdp / "attempt.json").read_text())["world"]["parallel"] == "fsdp"
    assert sorted(p.name for p in fsdp.parent.iterdir()) == ["0001"]
    a, b = records(fsdp), records(runs["two"])
    # The same first step: FSDP2 averages the gradients as DDP does (eager FSDP2 and DDP
    # parameters are bit-identical); the norm is summed shard by shard, so only close.
    assert a[0]["loss"] == b[0]["loss"]
    assert a[0]["grad_norm"] == pytest.approx(b[0]["grad_norm"], rel=1e-6)
    close(a, b, rel=1e-4)
    for path in sorted((fsdp / "checkpoints").iterdir()):
        assert sorted(p.name for p in path.iterdir()) == [
            "checkpoint.json",
            "dcp",
            "model.safetensors",
            "state.json",
        ]
        shards = sorted(p.name for p in (path / "dcp").iterdir())
        assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # model.safetensors holds the whole model (gathered), as a DDP checkpoint does.
    got, want = model_at(fsdp, MAX_STEPS), model_at(runs["two"], MAX_STEPS)
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-3, atol=1e-5)


def test_an_fsdp_resume_at_the_same_world_size_is_bit_exact(fsdp):
    ok(torchrun(2, "resume", "--attempt", fsdp, "--from", "step_5"))
    child = sorted(fsdp.parent.iterdir())[-1]
    assert strip_timing(records(child)) == strip_timing(records(fsdp))
    got, want = model_at(child, MAX_STEPS), model_at(fsdp, MAX_STEPS)
    assert all(torch.equal(got[k], want[k]) for k in want)
    ok(single("verify", child))


def test_an_fsdp_checkpoint_reshards_to_one_process_and_back(fsdp):
    ok(single("resume", "--attempt", fsdp, "--from", "step_5"))
    one = sorted(fsdp.parent.iterdir())[-1]
    assert json.loads((one / "attempt.json").read_text())["world"]["size"] == 1
    close(records(one), records(fsdp), rel=1e-4)
    assert state_at(one, MAX_STEPS)["cursor"] == state_at(fsdp, MAX_STEPS)["cursor"]
    # One process writes one shard; two ranks read it, each its own half.
    assert sorted(p.name for p in (ckpt(one, 10) / "dcp").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
    ]
    ok(torchrun(2, "resume", "--attempt", one, "--from", "step_10"))
    back = sorted(fsdp.parent.iterdir())[-1]
    close(records(back), records(fsdp), rel=1e-4)
    assert state_at(back, MAX_STEPS)["cursor"] == state_at(fsdp, MAX_STEPS)["cursor"]
    ok(single("verify", back))


def test_parallel_changes_on_resume_both_ways(fsdp, runs):
    ddp = runs["two"]
    ok(
        torchrun(
            2, "resume", "--attempt", ddp, "--from", "step_5", "--set", "training.parallel=fsdp"
        )
    )
    sharded = sorted(ddp.parent.iterdir())[-1]
    assert (ckpt(sharded, 10) / "dcp" / "__1_0.distcp").is_file()
    info = json.loads((sharded / "attempt.json").read_text())
    assert info["config_changes"] == {"training.parallel": {"from": "ddp", "to": "fsdp"}}
    close(records(sharded), records(ddp), rel=1e-4)
    ok(
        single(
            "resume", "--attempt", sharded, "--from", "step_10", "--set", "training.parallel=ddp"
        )
    )
    back = sorted(ddp.parent.iterdir())[-1]
    assert (ckpt(back, MAX_STEPS) / "optimizer.safetensors").is_file()
    close(records(back), records(ddp), rel=1e-4)
    for attempt in (sharded, back):
        ok(single("verify", attempt))


def test_a_changed_shard_refuses_the_resume_before_anything_exists(fsdp):
    shard = ckpt(fsdp, 10) / "dcp" / "__1_0.distcp"
    good = shard.read_bytes()
    bad = bytearray(good)
    bad[100] ^= 0xFF
    before = sorted(p.name for p in fsdp.parent.iterdir())
    try:
        shard.write_bytes(bytes(bad))
        proc = torchrun(2, "resume", "--attempt", fsdp, "--from", "step_10")
        assert single("verify", fsdp).returncode != 0
    finally:
        shard.write_bytes(good)
    # Exit 2 on both ranks, one line from rank 0 naming the shard, no child attempt.
    assert proc.returncode != 0 and "exitcode  : 2" in proc.stderr
    assert "exitcode  : 1" not in proc.stderr and "exitcode  : -" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "__1_0.distcp" in lines[0], proc.stderr[-3000:]
    assert sorted(p.name for p in fsdp.parent.iterdir()) == before


@pytest.mark.exit_path
@pytest.mark.parametrize(
    ("body", "expect"),
    [
        (  # rank 1's disk is full
            "raise OSError(28, 'No space left on device (injected)')",
            "cannot write the sharded state on rank(s) [1]: [Errno 28] No space left on device",
        ),
        ("os._exit(3)", "rank 0: writing the sharded checkpoint failed"),  # rank 1 dies
    ],
)
def test_a_failed_shard_write_ends_every_rank_and_loses_nothing(tmp_path, body, expect):
    env = on_rank(  # on rank 1, when the first checkpoint is written
        tmp_path,
        1,
        f"""
import torch.distributed.checkpoint.filesystem as fs
def fail(self, *a, **k):
    {body}
fs.FileSystemWriter.write_data = fail
""",
    )
    cfg = fsdp_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    proc = torchrun(2, "run", cfg, env=env)
    assert proc.returncode == 1, proc.stderr[-4000:]
    # No worker traceback (torchrun prints its own, of the launcher, on any failed worker).
    assert f'File "{Path(iqtrain.__file__).parent}' not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and expect in lines[0], proc.stderr[-4000:]
    attempt = tmp_path / "run" / "attempts" / "0001"
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "failed" and info["final_step"] == 4
    assert list((attempt / "checkpoints").iterdir()) == []  # no torn checkpoint, no leftover
    ok(single("verify", attempt))


@pytest.mark.exit_path
def test_a_rank_lost_in_a_sharded_validation_ends_the_job_in_one_line(tmp_path):
    env = on_rank(  # rank 1 dies at its first validation batch: rank 0 is in a forward
        tmp_path,
        1,
        """
import os
import iqtrain.train.step as s
s.TrainStep.eval_sums = lambda *a, **k: os._exit(3)
""",
    )
    cfg = fsdp_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache")
    proc = torchrun(2, "run", cfg, env=env)
    assert f'File "{Path(iqtrain.__file__).parent}' not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("iqtrain: error:")]
    assert len(lines) == 1 and "rank 0: a forward of the sharded model failed" in lines[0]
    info = json.loads((tmp_path / "run" / "attempts" / "0001" / "attempt.json").read_text())
    assert info["status"] == "failed" and info["final_step"] == 4


def test_rank_0_writing_the_whole_model_alone_is_not_bounded_by_the_collective_timeout(
    tmp_path,
):
    # model.safetensors takes three times training.dist_timeout_s to write.
    env = slow_on_rank(tmp_path, 0, "safetensors.torch", "save_file", 15)
    cfg = fsdp_config(
        tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache", dist_timeout_s=5, max_steps=6
    )
    ok(torchrun(2, "run", cfg, env=env))
    ok(single("verify", tmp_path / "run" / "attempts" / "0001"))


def test_compiled_fsdp_matches_eager_fsdp_and_probes_the_whole_model(fsdp, tmp_path):
    from iqtrain.data.synth import synthesize

    synthesize(tmp_path / "labelled", recordings=2, samples=16384, datatype="ci16_le", seed=9)
    labelled = os.fspath(tmp_path / "labelled" / "*.sigmf-meta")
    cfg = fsdp_config(tmp_path / "c.toml", tmp_path / "run", tmp_path / "cache", compile=True)
    tabs = __import__("tomllib").loads(cfg.read_text())
    tabs["probe"] = {"every": 3, "data": [labelled], "folds": 2}
    cfg.write_text(dumps_toml(tabs))
    ok(torchrun(2, "run", cfg))
    attempt = tmp_path / "run" / "attempts" / "0001"
    close(training_records(attempt), training_records(fsdp), rel=1e-4)
    (probe,) = [r for r in records(attempt) if r["kind"] == "probe"]
    # Rank 0 probed the model gathered from both ranks' shards: the same model as the
    # checkpoint's model.safetensors, so the same accuracy as `iqtrain probe` finds there.
    proc = single("probe", attempt, "--data", labelled, "--folds", "2", "--json")
    ok(proc)
    offline = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["step"] == MAX_STEPS
    assert probe["accuracy"] == offline["pretrained"]["accuracy"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_categorical_objective_trains_alike_on_two_ranks_and_one(tmp_path, parallel):
    def config(name: str) -> Path:
        t = tables(tmp_path / name, tmp_path / "cache", max_steps=8, parallel=parallel)
        t["model"].update(objective="categorical", bins=16)
        path = tmp_path / f"{name}.toml"
        path.write_text(dumps_toml(t))
        return path

    ok(torchrun(2, "run", config("two")))
    ok(single("run", config("one")))
    two, one = (tmp_path / n / "attempts" / "0001" for n in ("two", "one"))
    a, b = records(two), records(one)
    close(a, b, rel=1e-4)
    for ra, rb in zip(a, b, strict=True):
        if ra["kind"] == "val":  # both numbers, sharded over ranks like any validation
            assert ra["nmse"] == pytest.approx(rb["nmse"], rel=1e-4) and ra["nmse"] != ra["loss"]
    ok(single("verify", two))

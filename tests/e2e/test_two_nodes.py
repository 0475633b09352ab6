"""Two torchrun agents on this machine as two nodes (``--nnodes 2``, a c10d rendezvous on
127.0.0.1, one process each): the run equals the two-rank ``--standalone`` run, record for
record and bit for bit, and matches one process as two ranks do; SIGTERM to one node's agent
stops both nodes at one step with a checkpoint, and a resume on one node with two processes
equals the straight run; the batch script of docs/distributed.md, warned of its time limit
(SIGUSR1), stops both nodes at one step and its rerun ends as a straight run. What a cluster's
multi-node job does, without a cluster."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import cli_tables, free_port, random_iq, snapshot, subprocess_env, write_sigmf

from iqtrain.checkpoint.files import load_checkpoint
from iqtrain.config.schema import dumps_toml
from iqtrain.evidence.metrics import read_metrics, strip_timing

TIMEOUT = 300
DOCS = Path(__file__).resolve().parents[2] / "docs" / "distributed.md"

pytestmark = pytest.mark.distributed


def _config(root: Path, name: str, **training) -> Path:
    tables = cli_tables(root / name, root / "cache", max_steps=12)
    tables["data"].update(batch_size=8, val_batch_size=7, seq_patches=16)
    tables["data"]["synthetic"].update(train_recordings=2, samples=4096)
    tables["model"].update(dim=32, layers=2, heads=2)
    tables["training"].update(
        {"eval_every": 4, "checkpoint_every": 6, "compile": False, "keep_last": 0, **training}
    )
    path = root / f"{name}.toml"
    path.write_text(dumps_toml(tables))
    return path


def _nodes(*args, node1: tuple | None = None) -> list[subprocess.Popen]:
    """Two agents, node ranks 0 and 1, one worker each, meeting at a c10d rendezvous (node 1
    runs ``node1`` instead of ``args`` where given)."""
    port = free_port()
    procs = []
    for node in (0, 1):
        if node == 1 and node1 is not None:
            args = node1
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        cmd += ["--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"iqtrain-{port}"]
        cmd += ["-m", "iqtrain", *map(str, args)]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env()
            )
        )
    return procs


def _wait(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    return [(p.wait(timeout=TIMEOUT), p.communicate(timeout=TIMEOUT)[1]) for p in procs]


def _standalone(nproc: int, *args) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    cmd += ["--nproc-per-node", str(nproc), "-m", "iqtrain", *map(str, args)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=subprocess_env(), timeout=TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def _records(attempt: Path) -> list[dict]:
    return strip_timing(read_metrics(attempt / "metrics.jsonl"))


def _weights(attempt: Path, step: int) -> dict[str, torch.Tensor]:
    return load_checkpoint(attempt / "checkpoints" / f"step_{step:08d}")[0]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_two_nodes_train_as_two_ranks_do(tmp_path):
    results = _wait(_nodes("run", _config(tmp_path, "nodes")))
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    _standalone(2, "run", _config(tmp_path, "ranks"))
    nodes = tmp_path / "nodes" / "attempts" / "0001"
    ranks = tmp_path / "ranks" / "attempts" / "0001"
    assert sorted(p.name for p in nodes.parent.iterdir()) == ["0001"]  # one attempt in all
    assert _records(nodes) == _records(ranks)
    assert _same(_weights(nodes, 12), _weights(ranks, 12))
    info = json.loads((nodes / "attempt.json").read_text())
    assert info["world"]["size"] == 2
    # and one process: the same steps, the numbers up to the order of the float sums
    one_cfg = _config(tmp_path, "one")
    proc = subprocess.run(
        [sys.executable, "-m", "iqtrain", "run", os.fspath(one_cfg)],
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = _records(tmp_path / "one" / "attempts" / "0001")
    got = _records(nodes)
    assert [(r["kind"], r["step"]) for r in got] == [(r["kind"], r["step"]) for r in one]
    for a, b in zip(got, one, strict=True):
        for key in ("loss", "grad_norm", "lr"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-4), (a, b)


@pytest.mark.exit_path
def test_sigterm_to_one_node_stops_both_at_one_step_and_a_resume_equals_the_straight_run(
    tmp_path,
):
    steps = 120
    settings = {"max_steps": steps, "eval_every": 20, "checkpoint_every": 100}
    cfg = _config(tmp_path, "run", **settings)
    procs = _nodes("run", cfg)
    metrics = tmp_path / "run" / "attempts" / "0001" / "metrics.jsonl"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        if metrics.is_file() and metrics.read_text().count('"train"') >= 5:
            procs[1].send_signal(signal.SIGTERM)  # node 1's agent alone
            break
        time.sleep(0.05)
    results = _wait(procs)
    attempt = metrics.parent
    info = json.loads((attempt / "attempt.json").read_text())
    both = results[0][1][-3000:] + results[1][1][-3000:]
    assert info["status"] == "interrupted", both
    stopped = info["final_step"]
    assert 5 <= stopped < steps, both
    names = sorted(p.name for p in (attempt / "checkpoints").iterdir())
    assert names[-1] == f"step_{stopped:08d}", names
    assert sum(err.count("checkpoint saved. Resume with:") for _, err in results) == 1
    _standalone(2, "resume", "--attempt", attempt)
    _standalone(2, "run", _config(tmp_path, "ref", **settings))
    want = tmp_path / "ref" / "attempts" / "0001"
    child = attempt.parent / "0002"
    assert _records(child) == _records(want)
    assert _same(_weights(child, steps), _weights(want, steps))


@pytest.mark.exit_path
@pytest.mark.parametrize("key", ["optimizer.lr=0.002", "data.synthetic.seed=7"])
def test_nodes_that_disagree_stop_with_exit_2_before_anything_exists(tmp_path, key):
    """Node 1 with another config (a hyperparameter, or the data it would read): every worker
    exits 2, rank 0 names the key in one line, and no attempt exists. (Two nodes of one
    machine reading one resolved config read the same files: other data under an equal
    config is the data agreement's case, tested on ranks in test_distributed.py.)"""
    mine = _config(tmp_path, "run")
    other = tmp_path / "other.toml"
    other.write_text(mine.read_text())
    results = _wait(_nodes("run", mine, node1=("run", other, "--set", key)))
    both = results[0][1][-3000:] + results[1][1][-3000:]
    assert all(code != 0 for code, _ in results), both
    errors = [line for _, err in results for line in err.splitlines() if "iqtrain: error:" in line]
    assert len(errors) == 1, both
    assert key.split("=")[0] in errors[0], errors
    assert "exitcode  : 2" in both or "exit code 2" in both or "exitcode: 2" in both, both
    assert not (tmp_path / "run" / "attempts").exists() or not list(
        (tmp_path / "run" / "attempts").iterdir()
    )


def _doc_batch_script() -> str:
    """The batch script of docs/distributed.md (the sh block with SLURM's USR1 warning)."""
    blocks = [b.split("```")[0] for b in DOCS.read_text().split("```sh")[1:]]
    return next(b for b in blocks if "--signal=B:USR1" in b)


def _batch_script_line(port: int, config: Path) -> str:
    """The launch line of docs/distributed.md's batch script, as a shell command for one node
    here: ``srun`` (and its option) and the ``&`` dropped, ``iqtrain`` as this interpreter's
    module (``exec``, so the agent is the process a signal is sent to), one process per node,
    the rendezvous port ``port``, and ``config`` for cfg.toml. Each replacement must match
    once: a script that changes breaks this test rather than escaping it."""
    script = _doc_batch_script().replace("\\\n", " ")
    (line,) = [ln.strip() for ln in script.splitlines() if ln.strip().startswith("srun ")]
    assert line.endswith("&"), line
    line = line[: -len("&")].strip()
    for old, new in (
        (
            'srun --cpus-per-task="$SLURM_CPUS_ON_NODE" iqtrain launch ',
            f"exec {shlex.quote(sys.executable)} -m iqtrain launch ",
        ),
        ("--nproc-per-node 8", "--nproc-per-node 1"),
        (":29500", f":{port}"),
        (" cfg.toml ", f" {shlex.quote(os.fspath(config))} "),
    ):
        assert line.count(old) == 1, (old, line)
        line = line.replace(old, new)
    return line


def _batch_job(port: int, config: Path) -> list[subprocess.Popen]:
    """The batch script's launch line on two "nodes" of this machine, as ``srun`` would start
    it on each: the head is 127.0.0.1."""
    env = {**subprocess_env(), "head": "127.0.0.1", "SLURM_NNODES": "2", "SLURM_JOB_ID": "4242"}
    line = _batch_script_line(port, config)
    return [
        subprocess.Popen(
            ["bash", "-c", line], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]


@pytest.mark.exit_path
def test_the_batch_script_survives_its_time_limit_and_ends_as_a_straight_run(tmp_path):
    steps = 120
    settings = {"max_steps": steps, "eval_every": 20, "checkpoint_every": 100}
    cfg = _config(tmp_path, "run", **settings)
    procs = _batch_job(free_port(), cfg)
    attempt = tmp_path / "run" / "attempts" / "0001"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and all(p.poll() is None for p in procs):
        metrics = attempt / "metrics.jsonl"
        if metrics.is_file() and metrics.read_text().count('"train"') >= 5:
            for p in procs:  # the script's trap: srun passes SIGUSR1 to every node's agent
                p.send_signal(signal.SIGUSR1)
            break
        time.sleep(0.05)
    results = _wait(procs)
    both = results[0][1][-3000:] + results[1][1][-3000:]
    assert [code for code, _ in results] == [138, 138], both  # the workers' code, passed on
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "interrupted", both
    stopped = info["final_step"]
    assert 5 <= stopped < steps, both
    assert sorted(p.name for p in (attempt / "checkpoints").iterdir())[-1] == f"step_{stopped:08d}"
    assert sum(err.count("interrupted (signal 10); checkpoint saved") for _, err in results) == 1
    # The requeued job reruns the same line.
    results = _wait(_batch_job(free_port(), cfg))
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    _standalone(2, "run", _config(tmp_path, "ref", **settings))
    want = tmp_path / "ref" / "attempts" / "0001"
    child = attempt.parent / "0002"
    assert _records(child) == _records(want)
    assert _same(_weights(child, steps), _weights(want, steps))
    # And once more, after the run completed: one line, exit 0 on both nodes, no file changed.
    before = snapshot(tmp_path / "run")
    procs = _batch_job(free_port(), cfg)
    outs = [(p.wait(timeout=TIMEOUT), p.communicate(timeout=TIMEOUT)[0]) for p in procs]
    assert [code for code, _ in outs] == [0, 0], outs
    said = "".join(out for _, out in outs)
    assert said == f"{child}: completed at step {steps}; nothing to resume\n"
    assert snapshot(tmp_path / "run") == before


def _private_mounts() -> bool:
    """Whether this machine gives a process a mount namespace of its own (``unshare -m``:
    root or CAP_SYS_ADMIN), so one "node" can see other files at the same path."""
    try:
        probe = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "true"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.exit_path
@pytest.mark.skipif(
    not _private_mounts(),
    reason="needs unshare -m (root or CAP_SYS_ADMIN) to show one node other files at one path",
)
def test_nodes_that_read_other_data_under_one_config_stop_with_exit_2(tmp_path):
    rng = np.random.default_rng(0)
    for root in ("data", "other"):  # the same names and lengths, other samples
        for split in ("train", "val"):
            write_sigmf(tmp_path / root / split, "rec", random_iq(rng, 4096, "cf32_le"), "cf32_le")
    tables = cli_tables(tmp_path / "run", tmp_path / "cache", max_steps=4)
    del tables["data"]["synthetic"]
    tables["data"].update(
        train=[os.fspath(tmp_path / "data" / "train" / "*.sigmf-meta")],
        val=[os.fspath(tmp_path / "data" / "val" / "*.sigmf-meta")],
    )
    tables["training"]["compile"] = False
    cfg = tmp_path / "c.toml"
    cfg.write_text(dumps_toml(tables))
    port = free_port()
    procs = []
    for node in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
        cmd += ["--node-rank", str(node), "--nproc-per-node", "1", "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"iqtrain-{port}"]
        cmd += ["-m", "iqtrain", "run", os.fspath(cfg)]
        if node == 1:  # its own view of the files: `other` mounted over `data`
            mount = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c", mount, "sh"] + [
                os.fspath(tmp_path / "other"),
                os.fspath(tmp_path / "data"),
                *cmd,
            ]
        procs.append(
            subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env()
            )
        )
    results = _wait(procs)
    both = results[0][1][-3000:] + results[1][1][-3000:]
    assert all(code != 0 for code, _ in results), both
    lines = [ln for _, err in results for ln in err.splitlines() if ln.startswith("iqtrain: error")]
    assert len(lines) == 1, both
    assert "the ranks must run the same thing: rank 1 has data.train fingerprint" in lines[0]
    assert sum(err.count("exitcode  : 2") for _, err in results) == 2, both  # both workers
    assert not (tmp_path / "run").exists()


def _batch_script(port: int, config: Path, bin_dir: Path) -> Path:
    """docs/distributed.md's whole batch script for one node of this machine: one process,
    the rendezvous port ``port``, ``config`` for cfg.toml; ``srun``, ``scontrol`` and
    ``iqtrain`` are stubs in ``bin_dir`` (srun runs its task in its own place, as one task;
    ``scontrol requeue`` appends the job id to ``bin_dir/requeued``)."""
    script = _doc_batch_script()
    for old, new in (
        ("--nproc-per-node 8", "--nproc-per-node 1"),
        (":29500", f":{port}"),
        (" cfg.toml ", f" {shlex.quote(os.fspath(config))} "),
    ):
        assert script.count(old) == 1, (old, script)
        script = script.replace(old, new)
    stubs = {
        "srun": 'shift  # --cpus-per-task\nexec "$@"\n',
        "iqtrain": f'exec {shlex.quote(sys.executable)} -m iqtrain "$@"\n',
        "scontrol": (
            'case "$1" in\n  show) echo 127.0.0.1 ;;\n'
            f'  requeue) echo "$2" >> {shlex.quote(os.fspath(bin_dir / "requeued"))} ;;\nesac\n'
        ),
    }
    bin_dir.mkdir()
    for name, body in stubs.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    path = bin_dir / "job.sbatch"
    path.write_text(script.lstrip())
    return path


@pytest.mark.exit_path
def test_the_batch_script_requeues_itself_at_its_time_limit_and_not_once_done(tmp_path):
    steps = 120
    cfg = _config(tmp_path, "run", max_steps=steps, eval_every=20, checkpoint_every=100)
    bin_dir = tmp_path / "bin"
    job = _batch_script(free_port(), cfg, bin_dir)
    env = {
        **subprocess_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
        "SLURM_CPUS_ON_NODE": "2",
    }
    proc = subprocess.Popen(["bash", job], stderr=subprocess.PIPE, text=True, env=env)
    attempt = tmp_path / "run" / "attempts" / "0001"
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = attempt / "metrics.jsonl"
        if metrics.is_file() and metrics.read_text().count('"train"') >= 5:
            proc.send_signal(signal.SIGUSR1)  # SLURM's --signal=B:USR1@120, to the script
            break
        time.sleep(0.05)
    err = proc.communicate(timeout=TIMEOUT)[1]
    info = json.loads((attempt / "attempt.json").read_text())
    assert info["status"] == "interrupted" and 5 <= info["final_step"] < steps, err[-3000:]
    assert (bin_dir / "requeued").read_text() == "4242\n", err[-3000:]  # requeued once
    # The requeued job: the same script, no signal this time; it ends and requeues nothing.
    again = subprocess.run(["bash", job], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert again.returncode == 0, again.stderr[-3000:]
    child = json.loads((attempt.parent / "0002" / "attempt.json").read_text())
    assert child["status"] == "completed" and child["final_step"] == steps
    assert (bin_dir / "requeued").read_text() == "4242\n"

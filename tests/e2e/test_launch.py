"""``iqtrain launch``: torchrun's agent with one line where torchrun prints a page, and the
workers' exit code where torchrun gives 1. A node that never joins and an endpoint nothing
listens on end within the config's ``training.dist_timeout_s``; a refused config is the
workers' exit 2; a worker killed by a signal is named; a signal before the workers start ends
the launch at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import cli_tables, free_port, subprocess_env

from iqtrain.config.schema import dumps_toml

pytestmark = pytest.mark.distributed

TIMEOUT = 300


def _config(root: Path, **training) -> Path:
    tables = cli_tables(root / "run", root / "cache", max_steps=4)
    tables["training"].update({"compile": False, **training})
    path = root / "c.toml"
    path.write_text(dumps_toml(tables))
    return path


def _launch(*args, env: dict | None = None, **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "iqtrain", "launch", *map(str, args)]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**subprocess_env(), **(env or {})},
        **popen,
    )


def _two_nodes(port: int) -> list[str]:
    return ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d"] + [
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        f"iqtrain-{port}",
    ]


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


@pytest.mark.exit_path
def test_a_node_that_never_joins_ends_the_launch_in_one_line_within_the_timeout(tmp_path):
    cfg = _config(tmp_path, dist_timeout_s=4)
    started = time.monotonic()
    proc = _launch(*_two_nodes(free_port()), "run", cfg)  # node 1 never comes
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err[-3000:]
    line = _one_line(err)
    assert line.startswith("iqtrain: error: rendezvous 127.0.0.1:"), line
    assert "the other nodes did not join within 4 s (--nnodes 2" in line, line
    assert time.monotonic() - started < 4 + 60
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
def test_an_endpoint_nothing_listens_on_ends_the_launch_in_one_line(tmp_path):
    cfg = _config(tmp_path, dist_timeout_s=4)
    # On one machine every agent could host the store itself: this one only connects.
    proc = _launch(*_two_nodes(free_port()), "--rdzv-conf", "is_host=0", "run", cfg)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err[-3000:]
    line = _one_line(err)
    assert "nothing answered within 4 s (is the first node's launch running?)" in line, line
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
def test_the_launch_exits_with_its_workers_code_and_one_line(tmp_path):
    cfg = _config(tmp_path)
    ok = _launch("--standalone", "--nproc-per-node", "2", "run", cfg)
    out, err = ok.communicate(timeout=TIMEOUT)
    assert ok.returncode == 0, err[-3000:]
    assert "attempt " in out and err.count("iqtrain: error") == 0
    refused = _launch("--standalone", "--nproc-per-node", "2", "run", cfg, "--set", "model.nope=1")
    _, err = refused.communicate(timeout=TIMEOUT)
    assert refused.returncode == 2, err[-3000:]
    assert _one_line(err) == "iqtrain: error: model.nope: unknown key"


@pytest.mark.exit_path
def test_a_worker_a_signal_killed_is_named_and_the_launch_exits_1(tmp_path):
    cfg = _config(tmp_path)
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(
        "import os, signal\n"
        "if os.environ.get('RANK') == '1':\n"
        "    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer would\n"
    )
    path = f"{inject}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    proc = _launch("--standalone", "--nproc-per-node", "2", "run", cfg, env={"PYTHONPATH": path})
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.startswith("iqtrain: error:")]
    assert any("rank 1 (pid " in ln and "was killed by SIGKILL" in ln for ln in lines), err


@pytest.mark.exit_path
def test_the_static_backend_ends_in_one_line_within_the_timeout(tmp_path):
    cfg = _config(tmp_path, dist_timeout_s=4)
    port = free_port()
    started = time.monotonic()
    # torchrun's default backend: node 1 of two, its master never there
    args = ["--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "1"]
    args += ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    proc = _launch(*args, "run", cfg)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 1, err[-3000:]
    assert _one_line(err).startswith(f"iqtrain: error: rendezvous 127.0.0.1:{port}: "), err
    assert time.monotonic() - started < 4 + 60
    assert not (tmp_path / "run").exists()


@pytest.mark.exit_path
@pytest.mark.parametrize(
    ("sig", "where"),
    [(signal.SIGTERM, []), (signal.SIGUSR1, ["--rdzv-conf", "is_host=0"])],
    ids=["joining", "connecting"],
)
def test_a_signal_before_the_workers_start_ends_the_launch_at_once(tmp_path, sig, where):
    # Waiting for node 1 (Python, in c10d's join loop), or for a store that is not there (in
    # C++, retrying its connection for up to a minute): the signal acts at once in both.
    cfg = _config(tmp_path, dist_timeout_s=120)
    proc = _launch(*_two_nodes(free_port()), *where, "run", cfg)
    time.sleep(3)
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + sig, err[-3000:]
    want = f"iqtrain: error: stopped by signal {int(sig)} before the workers started"
    assert _one_line(err) == want
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["verify", "x"], "launch: 'verify' is not a command it launches (one of: run, resume)"),
        (["-m", "run", "x"], "launch: -m, --no-python and --run-path are the launch's own"),
        (["--bogus", "run", "x"], "launch: unrecognized arguments: --bogus"),
        (["--nproc-per-node"], "launch: argument --nproc-per-node"),
    ],
    ids=["command", "module", "option", "value"],
)
def test_a_launch_it_cannot_run_is_refused_in_one_line(args, says):
    proc = _launch(*args)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 2, err
    assert _one_line(err).startswith(f"iqtrain: error: {says}"), err

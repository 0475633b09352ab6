"""``iqtrain launch``'s reading of torchrun's options: what it adds, what it leaves alone, and
the exit code it takes from its workers (the launches themselves: tests/e2e/test_launch.py)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest
from torch.distributed import run as torchrun

from iqtrain.distributed.launch import _child_code, _default_rendezvous, _parse
from iqtrain.errors import ConfigError


def test_the_script_becomes_iqtrain_and_sigusr1_is_forwarded():
    args = _parse(torchrun, ["--nproc-per-node", "2", "run", "cfg.toml", "--auto-resume"])
    assert args.module and args.training_script == "iqtrain"
    assert args.training_script_args == ["run", "cfg.toml", "--auto-resume"]
    assert args.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"


def test_signals_given_are_kept_and_sigusr1_added_once():
    args = _parse(torchrun, ["--signals-to-handle", "SIGTERM", "resume", "--attempt", "a"])
    assert args.signals_to_handle == "SIGTERM,SIGUSR1"
    args = _parse(torchrun, ["--signals-to-handle", "SIGUSR1,SIGTERM", "run", "c"])
    assert args.signals_to_handle == "SIGUSR1,SIGTERM"


def test_the_rendezvous_waits_the_configs_timeout_unless_told_otherwise():
    args = _parse(torchrun, ["--rdzv-backend", "c10d", "run", "c"])
    conf = _default_rendezvous(args, 45)
    assert conf == {"join_timeout": "45", "read_timeout": "45"}
    assert args.rdzv_conf == "join_timeout=45,read_timeout=45"
    args = _parse(
        torchrun,
        ["--rdzv-backend", "c10d", "--rdzv-conf", " join_timeout = 7 ,is_host=0", "run", "c"],
    )
    conf = _default_rendezvous(args, 1800)  # read_timeout: torchrun's 60 s at most
    assert conf == {"join_timeout": "7", "is_host": "0", "read_timeout": "60"}
    assert args.rdzv_conf == "join_timeout=7,is_host=0,read_timeout=60"
    # torchrun's default backend, static (--master-addr, --node-rank), waits its `timeout`
    args = _parse(torchrun, ["--nnodes", "2", "--node-rank", "1", "run", "c"])
    assert _default_rendezvous(args, 30)["timeout"] == "30"


def test_a_malformed_rendezvous_config_is_a_config_error():
    args = _parse(torchrun, ["--rdzv-conf", "=5", "run", "c"])
    with pytest.raises(ConfigError, match="^launch: --rdzv-conf '=5': "):
        _default_rendezvous(args, 30)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["probe", "a"], "'probe' is not a command it launches"),
        (["--no-python", "run", "c"], "-m, --no-python and --run-path are the launch's own"),
        (["--run-path", "run", "c"], "-m, --no-python and --run-path are the launch's own"),
        (["--signals-to-handle", "SIGTERM,SIGNOPE", "run", "c"], "'SIGNOPE' is not a signal"),
        (["--nnodes"], "argument --nnodes: expected one argument"),
        ([], "the following arguments are required"),
    ],
)
def test_a_launch_it_cannot_run_is_a_config_error(argv, says):
    with pytest.raises(ConfigError, match="^launch: ") as info:
        _parse(torchrun, argv)
    assert says in str(info.value)


def _failed(exitcode: int, rank: int = 1, pid: int = 4242):
    failure = SimpleNamespace(exitcode=exitcode, pid=pid)
    return SimpleNamespace(get_first_failure=lambda: (rank, failure))


@pytest.mark.parametrize("code", [1, 2, 138, 143])
def test_the_first_failed_workers_code_is_the_launchs(code, capsys):
    assert _child_code(_failed(code)) == code
    assert capsys.readouterr().err == ""  # the worker said why


def test_a_worker_a_signal_killed_is_named_in_one_line(capsys):
    assert _child_code(_failed(-signal.SIGKILL, rank=3, pid=77)) == 1
    err = capsys.readouterr().err
    assert err == "iqtrain: error: rank 3 (pid 77) was killed by SIGKILL; see the lines above it\n"

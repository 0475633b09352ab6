"""The ``iqtrain`` command: parse, build, train, always close.

Exit codes (docs/design.md "Exit codes"): 0 success; 2 bad input (one line naming the key or file,
no traceback, no attempt created); 1 training failure (non-finite, I/O; the attempt stays
verifiable); 130/143/129/138 after SIGINT/SIGTERM/SIGHUP/SIGUSR1, with a checkpoint saved and
the resume command printed (or, before the attempt existed, nothing created). Each error class
carries its code (:func:`iqtrain.errors.exit_code`).

``run`` and ``resume`` take the process's signals from their first line on
(:class:`~iqtrain.console.SignalLatch`). Under torchrun (``WORLD_SIZE`` > 1) a worker leaves
without interpreter finalization: once it has its exit code it flushes its output and calls
``os._exit``. Finalization would run while
the process group's threads still hold work (a gloo thread releasing tensors after the
interpreter began finalizing aborted the process: SIGABRT), and CPython restores the default
signal handlers early in it (torchrun's SIGTERM to a slower worker then killed it: -15).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from iqtrain.config.sections import SYNTH_DATATYPES
from iqtrain.console import (
    Interrupted,
    SignalLatch,
    StoppedBeforeStart,
    error,
    resume_command,
)
from iqtrain.distributed.world import RankExit
from iqtrain.errors import (
    EXIT_FAILURE,
    CheckpointError,
    ConfigError,
    IQTrainError,
    as_config_error,
    exit_code,
)

if TYPE_CHECKING:
    from iqtrain.config.schema import Config
    from iqtrain.distributed.world import World

__all__ = ["main"]

EXIT_OK = 0
#: ``iqtrain synth --burst-samples`` default: 4 windows of the quickstart's 512 samples.
SYNTH_BURST_SAMPLES = 2048


# ------------------------------------------------------------------------------------ commands


def cmd_run(args: argparse.Namespace) -> int:
    from iqtrain.config.schema import load_config
    from iqtrain.distributed.world import join
    from iqtrain.train.attempt import run_attempt

    if not args.auto_resume:
        world, config = join(lambda: load_config(args.config, args.set))
        return _finish(run_attempt(config, world=world))
    decided: list[Path | str | None] = []
    world, config = join(lambda: _requeue(args, decided))
    point = _agreed_point(world, decided[0])
    if isinstance(point, str):  # the run completed: a requeued job has nothing to do
        if world.is_main:
            print(point)
        world.close()
        return EXIT_OK
    if point is None:
        return _finish(run_attempt(config, world=world))
    from iqtrain.evidence.lineage import ParentRef

    # CONFIG as it is now: a change that resume refuses is refused here as there.
    return _finish(run_attempt(config, ParentRef(point, "latest"), world))


def _requeue(args: argparse.Namespace, decided: list) -> Config:
    """``--auto-resume``, inside the join (a refusal is every rank's, printed once): CONFIG,
    and in ``decided`` what ``requeue_point`` of its run.dir says (the attempt to resume from
    its latest checkpoint, a line saying the run completed, or None: start fresh)."""
    from iqtrain.config.schema import load_config
    from iqtrain.evidence.attempts import requeue_point

    config = load_config(args.config, args.set)
    run_dir = Path(config.run.dir)
    try:
        decided.append(requeue_point(run_dir, notes=os.environ.get("RANK", "0") == "0"))
    except OSError as exc:  # a refusal like any other: agreed, one line
        raise CheckpointError(f"{run_dir}: cannot read its attempts: {exc}") from None
    return config


def _agreed_point(world: World, point: Path | str | None) -> Path | str | None:
    """Every rank's ``--auto-resume`` decision, which must be rank 0's (the ranks read the same
    files; a rank that does not is refused as a config that differs is)."""
    from iqtrain.distributed.world import agree

    agree(world, None, same={"--auto-resume": None if point is None else os.fspath(point)})
    return point


def cmd_launch(args: argparse.Namespace) -> int:
    from iqtrain.distributed.launch import launch

    return launch(args.argv, _dist_timeout_s)


def _dist_timeout_s(command: list[str]) -> int:
    """``training.dist_timeout_s`` of the config an iqtrain command line will run: CONFIG
    (``run``) or the attempt's (``resume``), with ``--set``; the default when it does not load
    (the workers then refuse it, in one line, as they refuse any config)."""
    from iqtrain.config.schema import load_config
    from iqtrain.config.sections import TrainingConfig

    try:
        args = build_parser().parse_args(command)
        if args.command == "run":
            return load_config(args.config, args.set).training.dist_timeout_s
        return _resumed_config(Path(args.attempt), args.set, args.from_).training.dist_timeout_s
    except (IQTrainError, OSError, SystemExit):
        return TrainingConfig().dist_timeout_s


def cmd_resume(args: argparse.Namespace) -> int:
    from iqtrain.distributed.world import join
    from iqtrain.evidence.lineage import ParentRef
    from iqtrain.train.attempt import run_attempt

    world, config = join(lambda: _resumed_config(Path(args.attempt), args.set, args.from_))
    return _finish(run_attempt(config, ParentRef(args.attempt, args.from_), world))


def _resumed_config(attempt: Path, overrides: list[str], from_: str):
    from iqtrain.config.schema import apply_overrides, build_config, read_toml
    from iqtrain.config.sections import check_which

    check_which(from_, "--from")  # the flag's ConfigError, before a ParentRef's ValueError
    cfg_path = attempt / "config.toml"
    if not cfg_path.is_file():
        raise CheckpointError(f"{attempt}: not an attempt directory (no config.toml)")
    if any(s.split("=", 1)[0].strip() == "run.dir" for s in overrides):
        raise ConfigError("run.dir: a resumed attempt always joins its parent's run directory")
    return build_config(apply_overrides(read_toml(cfg_path), overrides))


def _finish(result) -> int:
    from iqtrain import objectives

    if result.rank != 0:  # several ranks: rank 0 reports for the job
        return EXIT_OK
    print(f"attempt {result.attempt}: {result.final_step} steps")
    if result.stopped_early is not None:
        print(f"  stopped early at step {result.final_step}: {result.stopped_early['reason']}")
    for line in objectives.get(result.objective).summary_lines(result):
        print(line)
    if result.probe is not None:
        from iqtrain.report.summary import probe_summary

        print(f"  probe at step {result.probe['step']}: {probe_summary(result.probe)}")
    print(f"  verify: iqtrain verify {result.attempt}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    from iqtrain.evidence.package import is_package, read_package
    from iqtrain.evidence.verify import check_attempt, verify_attempt_data

    if is_package(Path(args.dir)):  # a model package: every file, without torch
        if args.data:
            raise ConfigError("--data: a package holds no data to check")
        try:
            package = read_package(Path(args.dir))
        except CheckpointError as exc:
            print(f"MISMATCH {exc}")
            return EXIT_FAILURE
        print(
            f"{args.dir}: verified (package of {package.config['objective']!r}, step "
            f"{package.config['step']})"
        )
        return EXIT_OK
    check = check_attempt(Path(args.dir))  # CheckpointError (exit 2) if not an attempt at all
    problems = list(check.problems)
    if args.data:
        problems += verify_attempt_data(Path(args.dir))
    for note in check.notes:
        print(f"NOTE {note}")
    for p in problems:
        print(f"MISMATCH {p}")
    if problems:
        return EXIT_FAILURE
    what = " and its data" if args.data else ""
    print(f"{args.dir}: verified{what} ({check.status})")
    return EXIT_OK


#: ``iqtrain synth``'s flags by the name of the argument of synthesize (and synthesize_labelled)
#: each one is.
SYNTH_FLAGS = {
    "out_dir": "out_dir",
    "recordings": "--recordings",
    "samples": "--samples",
    "annotations": "--annotations",
    "burst_samples": "--burst-samples",
    "datatype": "--datatype",
    "seed": "--seed",
}


def cmd_synth(args: argparse.Namespace) -> int:
    from iqtrain.data.synth import synthesize, synthesize_labelled

    if args.annotations is not None:
        if args.recordings is not None or args.samples is not None:
            raise UsageError(
                "--annotations: a labelled set sizes its own recordings; drop --recordings and "
                "--samples (--burst-samples sets each annotation's length)"
            )
        with as_config_error(SYNTH_FLAGS):  # a bad flag: one line naming it, exit 2
            paths = synthesize_labelled(
                args.out_dir,
                annotations=args.annotations,
                burst_samples=args.burst_samples,
                datatype=args.datatype,
                seed=args.seed,
            )
        print(
            f"wrote {args.annotations} labelled annotations in {len(paths)} recordings to "
            f"{args.out_dir}"
        )
        return EXIT_OK
    if args.burst_samples != SYNTH_BURST_SAMPLES:
        raise UsageError("--burst-samples: needs --annotations N (a labelled set)")
    with as_config_error(SYNTH_FLAGS):
        paths = synthesize(
            args.out_dir,
            recordings=8 if args.recordings is None else args.recordings,
            samples=(1 << 18) if args.samples is None else args.samples,
            datatype=args.datatype,
            seed=args.seed,
        )
    print(f"wrote {len(paths)} recordings to {args.out_dir}")
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from iqtrain.train.inspection import inspect_config

    print(inspect_config(args.config, args.set))
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from iqtrain.report.summary import report

    attempt = Path(args.dir)
    text = [report(attempt)]  # CheckpointError (exit 2) before anything is written
    # Every output is checked before any is written: a refused one leaves nothing behind.
    if args.plot is not None:
        from iqtrain.report.plot import check_plot_target, write_plot

        check_plot_target(Path(args.plot), args.force)
    if args.tensorboard is not None:
        from iqtrain.report.tensorboard import export_tensorboard, tensorboard_target

        tensorboard_target(attempt, Path(args.tensorboard))
    if args.plot is not None:
        text.append(f"plot: {write_plot(attempt, Path(args.plot), args.force)}")
    if args.tensorboard is not None:
        where, count = export_tensorboard(attempt, Path(args.tensorboard))
        text.append(
            f"tensorboard: {count} scalars in {where} (tensorboard --logdir {args.tensorboard})"
        )
    print("\n".join(text))
    return EXIT_OK


# ------------------------------------------------------------------------------------ parsing


class UsageError(ConfigError):
    """The command line does not parse (exit 2, one line; argparse's default prints usage)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


class _Version(argparse.Action):
    """``--version``: ``iqtrain <version>`` (the installed distribution's; imports no torch)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        import iqtrain

        print(f"iqtrain {iqtrain.__version__}")
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="iqtrain", description="Next-patch-prediction pretraining on IQ recordings")
    p.add_argument("--version", action=_Version, help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add_set(sp):
        sp.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a config value, e.g. --set training.max_steps=2000",
        )

    sp = sub.add_parser("run", help="run one attempt of a config")
    sp.add_argument("config")
    sp.add_argument(
        "--auto-resume",
        action="store_true",
        help="resume the run's newest unfinished attempt from its latest checkpoint if it has "
        "one, do nothing if the run completed, else start: the command a requeued job reruns",
    )
    add_set(sp)
    sp.set_defaults(func=cmd_run)

    sp = sub.add_parser("resume", help="verify an attempt and continue it in a new attempt")
    sp.add_argument("--attempt", required=True, help="the parent attempt directory")
    sp.add_argument("--from", dest="from_", default="latest", help="latest, best or step_N")
    add_set(sp)
    sp.set_defaults(func=cmd_resume)

    sub.add_parser(
        "launch",
        help="torchrun -m iqtrain run|resume for a cluster job: SIGUSR1 forwarded, one line "
        "when the nodes do not meet, the workers' exit code (--help: torchrun's options)",
        add_help=False,
    )

    sp = sub.add_parser("verify", help="check an attempt's manifest against every file it lists")
    sp.add_argument("dir")
    sp.add_argument(
        "--data",
        action="store_true",
        help="also re-read every recording: full-content digests and SigMF core:sha512",
    )
    sp.set_defaults(func=cmd_verify)

    _add_synth_parser(sub)

    sp = sub.add_parser("inspect", help="one batch through every stage: shapes, dtypes, counts")
    sp.add_argument("config")
    add_set(sp)
    sp.set_defaults(func=cmd_inspect)

    _add_report_parser(sub)

    from iqtrain.cli.convert import add_convert_parser
    from iqtrain.cli.describe import add_describe_parser
    from iqtrain.cli.export import add_export_parser
    from iqtrain.cli.infer import add_embed_parser, add_predict_parser, add_score_parser
    from iqtrain.cli.probe import add_probe_parser

    add_probe_parser(sub)
    add_embed_parser(sub)
    add_score_parser(sub)
    add_predict_parser(sub)
    add_convert_parser(sub, _Parser)
    add_describe_parser(sub)
    add_export_parser(sub)
    return p


def _add_report_parser(sub: Any) -> None:
    sp = sub.add_parser("report", help="summarise an attempt's metric stream")
    sp.add_argument("dir")
    sp.add_argument(
        "--plot",
        metavar="OUT.png",
        help="also draw loss, lr, grad norm and probe curves of the whole lineage "
        "(needs iqtrain[plot]; the format follows the suffix: png, svg, pdf, ...)",
    )
    sp.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="also export the metric stream as TensorBoard events into DIR/<run>/<attempt>/, "
        "replacing an earlier export of the attempt (needs iqtrain[tensorboard])",
    )
    sp.add_argument("--force", action="store_true", help="--plot: replace OUT if it exists")
    sp.set_defaults(func=cmd_report)


def _add_synth_parser(sub: Any) -> None:
    sp = sub.add_parser("synth", help="write synthetic SigMF recordings")
    sp.add_argument("out_dir")
    sp.add_argument("--recordings", type=int, help="recordings (default 8)")
    sp.add_argument("--samples", type=int, help="complex samples per recording (default 262144)")
    sp.add_argument(
        "--annotations",
        type=int,
        metavar="N",
        help="instead: a labelled probe set of N bursts, classes spread evenly",
    )
    sp.add_argument(
        "--burst-samples",
        type=int,
        default=SYNTH_BURST_SAMPLES,
        help=f"with --annotations: samples per burst (default {SYNTH_BURST_SAMPLES})",
    )
    sp.add_argument("--datatype", default=SYNTH_DATATYPES[0], choices=SYNTH_DATATYPES)
    sp.add_argument("--seed", type=int, default=0)
    sp.set_defaults(func=cmd_synth)


def _flush_stdout(code: int) -> int:
    """Flush stdout; a reader that closed the pipe early (``iqtrain report | head``) ends the
    command quietly, as SIGPIPE ends other tools (141), not with a traceback at exit; a
    stdout that cannot be written otherwise (a terminal gone) costs the output, not the code."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except OSError:
        _silence_stdout()
    return code


def _silence_stdout() -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _under_torchrun() -> bool:
    return os.environ.get("WORLD_SIZE", "") not in ("", "1")


def main(argv: list[str] | None = None) -> int:
    """Run the command; its exit code. Under torchrun the worker ends here (``os._exit``).

    As the process's own command (``argv`` None: the console script, ``python -m iqtrain``,
    torchrun's workers) it takes the process's signals first (:class:`SignalLatch`); called
    with an ``argv`` from Python it leaves them to the caller (the loop's SignalGuard)."""
    args_list = sys.argv[1:] if argv is None else argv
    own_process = argv is None
    training = args_list[:1] == ["run"] or args_list[:1] == ["resume"]
    if own_process and training:
        SignalLatch.install(distributed=_under_torchrun())  # first: see the module docstring
    if not (own_process and _under_torchrun()):
        code = _run_command(args_list)  # a bug raises: its traceback, the interpreter's exit
        latch = SignalLatch.current()
        if latch is not None:
            latch.ending()  # done: a signal now can change nothing
        return _flush_stdout(code)
    code = EXIT_FAILURE
    try:
        code = _run_command(args_list)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()  # a bug: its traceback, and the worker still leaves at once
    finally:
        latch = SignalLatch.current()
        if latch is not None:
            latch.ending()
        code = _flush_stdout(code)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _parse(argv: list[str]) -> argparse.Namespace:
    if argv[:1] == ["launch"]:  # torchrun's options, parsed by torchrun's own parser
        return argparse.Namespace(command="launch", func=cmd_launch, argv=argv[1:])
    try:
        return build_parser().parse_args(argv)
    except UsageError as exc:
        if _under_torchrun() and SignalLatch.current() is not None:
            # Every worker refuses alike: they agree, so rank 0 alone says it.
            from iqtrain.distributed.world import join

            join(functools.partial(_raise, exc))
        raise


def _raise(exc: BaseException) -> NoReturn:
    raise exc


def _run_command(argv: list[str]) -> int:
    try:
        args = _parse(argv)
        return args.func(args)
    except RankExit as exc:  # a rank other than 0 in a failure rank 0 reports
        return exc.exit_code
    except Interrupted as exc:
        local = os.environ.get("LOCAL_WORLD_SIZE", "")
        per_node = int(local) if local.isdigit() else None
        print(
            f"\ninterrupted (signal {exc.signum}); checkpoint saved. Resume with:\n"
            f"  {resume_command(exc.attempt, exc.world_size, per_node)}",
            file=sys.stderr,
        )
        return exc.exit_code
    except StoppedBeforeStart as exc:
        if os.environ.get("RANK", "0") == "0":  # rank 0 speaks for the job
            error(str(exc))
        return exc.exit_code
    except IQTrainError as exc:
        error(str(exc))
        return exit_code(exc)
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except BrokenPipeError:  # the reader of our stdout went away (``| head``)
        _silence_stdout()
        return 128 + signal.SIGPIPE
    except OSError as exc:
        error(f"I/O error: {exc}")
        return EXIT_FAILURE
    except SystemExit as exc:  # argparse: --help (0) or a usage error it has printed (2)
        return exc.code if isinstance(exc.code, int) else EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

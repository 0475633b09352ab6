"""`.ci/dev fuzz`: the SigMF reader and the Rust decoder fuzzed for long
(tests/unit/data/sigmf/test_fuzz.py, its generators in tests/fuzz_sigmf.py), with the counts.

argv: the Python to run pytest with, then ``[--examples N] [--rounds R] [--seed S]``. Runs the
fuzz module's generated tests R times (default 10), each round ``N / R`` cases (default 10^5 in
all) with its own hypothesis seed (``S + round``; S random unless given), each in a fresh pytest
process (hypothesis keeps what it has generated: rounds bound its memory). Prints each round's
line as it ends, then the counts of every round together: cases run, opened, refused, refusals
by kind, annotations read and refused, the known bugs met (each an xfail test in the module).
Exits 1 at the first round that fails (its pytest output shown, with the hypothesis seed and the
``@reproduce_failure`` blob that replays the failing case).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/unit/data/sigmf/test_fuzz.py"
# The generated tests alone: the module's regression tests are xfail and run in `test`.
SELECT = "valid or mutated"


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bash .ci/dev fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("python", help="the interpreter to run pytest with")
    p.add_argument("--examples", type=int, default=100_000, help="cases in all (default 10^5)")
    p.add_argument("--rounds", type=int, default=10, help="pytest processes (default 10)")
    p.add_argument("--seed", type=int, default=None, help="the first round's hypothesis seed")
    args = p.parse_args(argv)
    if args.examples < 1 or args.rounds < 1 or args.rounds > args.examples:
        p.error("--examples and --rounds must be >= 1, and rounds no more than examples")
    return args


def _round(python: str, examples: int, seed: int, counts: Path) -> tuple[int, str]:
    """One pytest process over the fuzz module: its exit code and output."""
    env = dict(os.environ, IQTRAIN_FUZZ_EXAMPLES=str(examples), IQTRAIN_FUZZ_COUNTS=str(counts))
    cmd = [python, "-m", "pytest", MODULE, "-q", "-p", "no:cacheprovider", "-k", SELECT]
    cmd.append(f"--hypothesis-seed={seed}")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


def _section(total: Counter[str], prefix: str, title: str, width: int) -> None:
    items = sorted(((k[len(prefix) :], v) for k, v in total.items() if k.startswith(prefix)),
                   key=lambda kv: (-kv[1], kv[0]))  # fmt: skip
    if not items:
        return
    print(f"  {title}:")
    for name, value in items:
        print(f"    {value:>{width}}  {name}")


def report(total: Counter[str], seconds: float, seeds: list[int]) -> None:
    """The counts of every round together."""
    cases = total["cases"]
    width = len(str(max(total.values(), default=0)))
    print(
        f"\nfuzz: {cases} cases in {seconds:.0f} s (hypothesis seeds {seeds[0]}..{seeds[-1]}): "
        f"{total['opened']} opened ({total['outcome: opened, some skipped']} of them with "
        f"refused recordings skipped), {total['refused']} refused"
    )
    _section(total, "generator: ", "cases by generator", width)
    _section(total, "outcome: ", "cases by outcome", width)
    _section(total, "refused kind: ", "refusals by kind (one per refused recording or input)",
             width)  # fmt: skip
    _section(total, "annotation lists ", "each recording read: its annotations", width)
    _section(total, "known bug: ", "cases that met a known bug (xfail tests in test_fuzz.py)",
             width)  # fmt: skip


def main(argv: list[str]) -> int:
    args = _args(argv)
    first = args.seed if args.seed is not None else random.randrange(2**32)
    per = [args.examples // args.rounds + (i < args.examples % args.rounds)
           for i in range(args.rounds)]  # fmt: skip
    total: Counter[str] = Counter()
    seeds: list[int] = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="iqtrain-fuzz-counts-") as tmp:
        for i, examples in enumerate(per):
            seed = first + i
            seeds.append(seed)
            counts = Path(tmp, f"{i}.json")
            t0 = time.monotonic()
            rc, out = _round(args.python, examples, seed, counts)
            if rc != 0:
                print(out, file=sys.stderr)
                print(
                    f"iqtrain: error: fuzz: round {i + 1} of {args.rounds} (hypothesis seed "
                    f"{seed}) failed (exit {rc}); rerun it with: IQTRAIN_FUZZ_EXAMPLES="
                    f"{examples} pytest {MODULE} -k '{SELECT}' --hypothesis-seed={seed}",
                    file=sys.stderr,
                )
                return 1
            got = Counter(json.loads(counts.read_text()))
            total.update(got)
            print(
                f"fuzz: round {i + 1}/{args.rounds} (seed {seed}): {got['cases']} cases, "
                f"{got['opened']} opened, {got['refused']} refused, "
                f"{time.monotonic() - t0:.0f} s",
                flush=True,
            )
    report(total, time.monotonic() - start, seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

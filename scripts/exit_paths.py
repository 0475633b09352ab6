"""Run every torchrun exit-path test N times in a row (default 30) and report the counts.

An exit path that passes 4 runs in 5 is failing: after any change to exit, signal or
distributed code, run this (too slow for CI: about 10 s a run on 2 CPU cores):

    python scripts/exit_paths.py [-n 30] [-k EXPR] [--stop-first]

The tests are those marked ``exit_path`` (tests/e2e/test_distributed.py, test_two_nodes.py,
test_requeue.py).
Each runs N times in one pytest process (``--repeat N -x``, tests/conftest.py), one test after
the other; a test stops at its first failure (its output is kept in the log directory), and the
table at the end gives passes in a row for each.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _collect(expr: str | None, n: int) -> dict[str, list[str]]:
    """Each exit-path test's N node ids under ``--repeat n`` (``...[run1]`` to ``[runN]``, or
    ``[<params>-run1]`` for a parametrized test), keyed by the test's own id."""
    cmd = [sys.executable, "-m", "pytest", "tests", "-m", "exit_path", "--collect-only", "-q"]
    cmd += ["-p", "no:cacheprovider", "--repeat", str(n)] + (["-k", expr] if expr else [])
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False).stdout
    tests: dict[str, list[str]] = {}
    for line in out.splitlines():
        if "::" not in line or not line.endswith("]"):
            continue
        # The parameters start at the first "[" (a parameter may hold brackets of its own).
        head, _, params = line[:-1].partition("[")
        parts = params.split("-")
        runs = [p for p in parts if re.fullmatch(r"run\d+", p)]
        if len(runs) != 1:
            continue
        base = "-".join(p for p in parts if p != runs[0])
        tests.setdefault(f"{head}[{base}]" if base else head, []).append(line)
    return tests


def _run(ids: list[str], logs: Path) -> tuple[int, float]:
    """Passes in a row of one test's repeated ids (one pytest process, ``-x``) and the mean
    seconds of a run."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-rA"]
        + ["--repeat", str(len(ids)), *ids],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    passed = sum(1 for line in proc.stdout.splitlines() if line.startswith("PASSED "))
    seconds = (time.monotonic() - start) / max(passed + (proc.returncode != 0), 1)
    if proc.returncode != 0:
        name = ids[0].replace("/", "_").replace(":", "_").replace(" ", "_")
        log = logs / f"{name}.run{passed + 1}.log"
        log.write_text(proc.stdout + proc.stderr)
        print(f"  FAILED on run {passed + 1}: {log}", flush=True)
    return passed, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=30, help="runs of each test (default 30)")
    parser.add_argument("-k", dest="expr", help="only the tests pytest -k selects")
    parser.add_argument("--stop-first", action="store_true", help="stop at the first failure")
    args = parser.parse_args()
    tests = _collect(args.expr, args.n)
    if not tests:
        print("no exit-path test collected", file=sys.stderr)
        return 2
    logs = Path(tempfile.mkdtemp(prefix="iqtrain-exit-paths."))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = []
    for test, ids in tests.items():
        print(f"{test} x{args.n}", flush=True)
        passed, median = _run(ids, logs)
        rows.append((test, passed, median))
        if passed < args.n and args.stop_first:
            break
    print(f"\n{'passes in a row':>16}  {'s / run':>8}  test")
    for test, passed, median in rows:
        print(f"{passed:>9} of {args.n:<4}  {median:8.1f}  {test}")
    failed = [t for t, p, _ in rows if p < args.n]
    print(f"\n{len(rows) - len(failed)} of {len(rows)} tests passed {args.n} times in a row")
    return 1 if failed or len(rows) < len(tests) else 0


if __name__ == "__main__":
    sys.exit(main())

"""`.ci/dev gpu`'s pytest stages (smoke first, then cuda-tests and bench), counted.

    python scripts/ci/gpu_smoke.py STAGE -- PYTEST_ARGS...

Runs ``pytest -q -p no:cacheprovider PYTEST_ARGS`` in this process and appends one
``{"kind": "pytest", "stage": STAGE}`` line to ``$IQTRAIN_GPU_SUMMARY``: the counts, each
failure's test id and last line, the skips counted by reason, the slowest tests. A stage that
selects no test fails: a marker expression that matches nothing checks nothing. ``bench`` keeps
pytest-benchmark's JSON too, beside the summary (``bench.json``), and copies each benchmark's
median and ``extra_info`` into the line: the study stage reads the compiled step's ms/step
from it.
The exit status is pytest's (5, no test selected, included).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

SLOWEST = 8


class _Counts:
    """A pytest plugin that keeps what the summary line needs."""

    def __init__(self) -> None:
        self.stats: dict[str, list[Any]] = {}
        self.durations: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.stats = dict(terminalreporter.stats)


def _last_line(report: Any) -> str:
    text = getattr(report, "longreprtext", "") or ""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _skip_reason(report: Any) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return _last_line(report)


def _benchmarks(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    doc = json.loads(path.read_text())
    return [
        {
            "name": b["name"],
            "median_s": b["stats"]["median"],
            "rounds": b["stats"]["rounds"],
            "extra_info": b.get("extra_info", {}),
        }
        for b in doc.get("benchmarks", [])
    ]


def line(stage: str, rc: int, counts: _Counts, bench_json: Path | None) -> dict[str, Any]:
    """The summary line of one pytest stage."""
    stats = counts.stats  # pytest's own categories: "passed" holds the call phases only
    record: dict[str, Any] = {
        "kind": "pytest",
        "stage": stage,
        "exit": rc,
        "passed": len(stats.get("passed", [])),
        "failed": len(stats.get("failed", [])),
        "errors": len(stats.get("error", [])),  # setup, teardown and collection failures
        "skipped": len(stats.get("skipped", [])),
        "failures": [
            {"test": r.nodeid, "last_line": _last_line(r)}
            for key in ("failed", "error")
            for r in stats.get(key, [])
        ],
        "skip_reasons": dict(Counter(_skip_reason(r) for r in stats.get("skipped", []))),
        "skipped_tests": sorted(r.nodeid for r in stats.get("skipped", []))[:SLOWEST],
        "slowest": [
            [nodeid, round(s, 2)]
            for nodeid, s in sorted(counts.durations.items(), key=lambda kv: -kv[1])[:SLOWEST]
        ],
    }
    if bench_json is not None:
        record["benchmarks"] = _benchmarks(bench_json)
    return record


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] != "--":
        sys.exit("usage: gpu_smoke.py STAGE -- PYTEST_ARGS...")
    import pytest

    stage, args = argv[0], ["-q", "-p", "no:cacheprovider", *argv[2:]]
    summary = os.environ.get("IQTRAIN_GPU_SUMMARY")
    bench_json = None
    if stage == "bench":
        where = Path(summary).parent if summary else Path.cwd()
        bench_json = where / "bench.json"
        args += [f"--benchmark-json={bench_json}"]
    counts = _Counts()
    rc = int(pytest.main(args, plugins=[counts]))
    record = line(stage, rc, counts, bench_json)
    if summary:
        with open(summary, "a") as f:
            f.write(json.dumps(record) + "\n")
    total = record["passed"] + record["failed"] + record["errors"]
    print(
        f"   {stage}: {record['passed']} passed, {record['failed']} failed, {record['errors']} "
        f"errors, {record['skipped']} skipped",
        file=sys.stderr,
    )
    if rc == 0 and total == 0:
        print(f"iqtrain: error: gpu: {stage}: no test ran", file=sys.stderr)
        return 5
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Shared benchmark plumbing: ratio lines printed once, after pytest-benchmark's tables."""

from __future__ import annotations

import pytest

SUMMARY: list[str] = []


def median(benchmark) -> float | None:
    """Median seconds per round of a finished benchmark (None under --benchmark-disable)."""
    stats = getattr(benchmark, "stats", None)
    return None if stats is None else stats.stats.median


@pytest.fixture
def bench_summary():
    """Append a line to the end-of-run summary (ratios against the peer baselines)."""
    return SUMMARY.append


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("peer ratios (same run)")
        for line in SUMMARY:
            terminalreporter.write_line(line)

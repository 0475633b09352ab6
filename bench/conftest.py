"""Shared benchmark plumbing: ratio lines printed once, after pytest-benchmark's tables."""

from __future__ import annotations

import pytest
from helpers import skip_gpu_tests_without_cuda

SUMMARY: list[str] = []


@pytest.fixture
def bench_summary():
    """Append a line to the end-of-run summary (ratios against the peer baselines)."""
    return SUMMARY.append


def pytest_terminal_summary(terminalreporter):
    if SUMMARY:
        terminalreporter.section("peer ratios (same run)")
        for line in SUMMARY:
            terminalreporter.write_line(line)


def pytest_collection_modifyitems(config, items):
    """``gpu`` benchmarks skip on a machine without CUDA."""
    skip_gpu_tests_without_cuda(items)

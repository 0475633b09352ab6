"""No function over 80 lines (the one size rule; modules have none): `.ci/dev test` runs it.

    python scripts/function_lengths.py [--max 80] [PATH ...]   (default: python kernels)

A function's length runs from its ``def`` (decorators excluded) to its last line, docstring
and comments included: what a reader has to hold at once. Nested functions count inside their
parent too. Prints each one over the limit, longest first, and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def long_functions(paths: list[Path], limit: int) -> list[tuple[int, str]]:
    found = []
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for file in files:
            tree = ast.parse(file.read_text(), filename=str(file))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > limit:
                        where = f"{file.relative_to(REPO)}:{node.lineno} {node.name}"
                        found.append((n, where))
    return sorted(found, reverse=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=80)
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args()
    paths = [p.resolve() for p in args.paths] or [REPO / "python", REPO / "kernels"]
    found = long_functions(paths, args.max)
    for n, where in found:
        print(f"{where}: {n} lines (at most {args.max})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

"""The project's requirements, read from pyproject.toml: the one list of what iqtrain needs and
what its checks use (``[project] dependencies`` and the ``dev`` extra).

    python scripts/ci/requirements.py [--extra dev] [--check]

Prints each requirement that applies to this platform (its environment marker evaluated), one
a line, for ``pip install``. ``--check``: exits 1, naming on stderr the first few that are
missing or at another version, unless every one is installed and satisfies its specifier
(``.ci/dev setup`` installs only then). Without ``packaging`` in this Python (a fresh venv),
every requirement counts as missing.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def requirements(extras: list[str], pyproject: Path = PYPROJECT) -> list[str]:
    """``[project] dependencies`` then each extra's, in file order, without repeats."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    for extra in extras:
        try:
            found += project["optional-dependencies"][extra]
        except KeyError:
            sys.exit(f"iqtrain: error: pyproject.toml has no extra {extra!r}")
    return list(dict.fromkeys(found))


def unmet(reqs: list[str]) -> list[str]:
    """The requirements (of those that apply here) not installed at a version they accept."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return reqs
    missing = []
    for text in reqs:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if not req.specifier.contains(have, prereleases=True):
            missing.append(f"{text} ({have} installed)")
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", action="append", default=[], help="an optional extra")
    parser.add_argument("--check", action="store_true", help="exit 1 unless all are installed")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    reqs = requirements(args.extra, args.pyproject)
    print("\n".join(reqs))
    if args.check:
        missing = unmet(reqs)
        if missing:
            shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" * (len(missing) > 4))
            print(f"   missing: {shown}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

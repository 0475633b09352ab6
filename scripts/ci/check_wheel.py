"""`.ci/dev build` and `.ci/dev wheel`: the wheel holds exactly one extension module and no
duplicate names; with ``--manylinux TAG``, its file name claims ``TAG`` and ``auditwheel show``
reports that the wheel is consistent with it.

    python scripts/ci/check_wheel.py WHEEL [--manylinux manylinux_2_17_x86_64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import zipfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("wheel")
    ap.add_argument("--manylinux", metavar="TAG")
    args = ap.parse_args()
    names = zipfile.ZipFile(args.wheel).namelist()
    ext = [n for n in names if n.startswith("iqtrain/_native") and n.endswith((".so", ".pyd"))]
    if len(ext) != 1 or len(set(names)) != len(names):
        sys.exit(f"iqtrain: error: {args.wheel}: expected one extension module, found {ext}")
    if args.manylinux is None:
        return
    if args.manylinux not in Path(args.wheel).name:
        sys.exit(f"iqtrain: error: {args.wheel}: its name does not claim {args.manylinux}")
    auditwheel = Path(sys.executable).with_name("auditwheel")
    shown = subprocess.run(
        [auditwheel, "show", args.wheel], capture_output=True, text=True, check=False
    )
    text = " ".join(shown.stdout.split())
    want = f'is consistent with the following platform tag: "{args.manylinux}"'
    if shown.returncode != 0 or want not in text:
        sys.exit(f"iqtrain: error: auditwheel show {args.wheel}: {text or shown.stderr}")


if __name__ == "__main__":
    main()

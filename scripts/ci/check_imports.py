"""`.ci/dev install-paths`: where a throwaway venv imports iqtrain, its extension and kernels from.

argv: the checkout, then `source` (maturin develop: the checkout's python/iqtrain) or `site`
(pip install .: copies in site-packages, no top-level kernels package). Run outside the
checkout so the current directory cannot supply a package.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    root, mode = Path(sys.argv[1]).resolve(), sys.argv[2]
    # Imported here, after the arguments: which copy of iqtrain this venv finds is the question.
    import iqtrain
    import iqtrain._native as native
    import iqtrain.kernels.normalize_patch as kernel

    if mode == "source":
        pkg = root / "python" / "iqtrain"
    else:
        pkg = Path(sysconfig.get_path("purelib")) / "iqtrain"
    want = {iqtrain: pkg, native: pkg, kernel: pkg / "kernels"}
    found = {m: Path(m.__file__ or "?") for m in want}
    problems = [
        f"{m.__name__} from {found[m]}"
        for m, d in want.items()
        if found[m].parent.resolve() != d.resolve()
    ]
    source = (root / "kernels" / "normalize_patch.py").read_bytes()
    if found[kernel].read_bytes() != source:
        problems.append(f"{kernel.__file__} differs from kernels/normalize_patch.py")
    if mode == "site":
        files = [str(f) for f in md.files("iqtrain") or []]
        if found[kernel].is_symlink():
            problems.append(f"{kernel.__file__} is a symlink")
        top = importlib.util.find_spec("kernels")  # another project's may live in the shared venv
        if any(f.startswith("kernels/") for f in files) or (
            top and top.origin and Path(top.origin).resolve().is_relative_to(pkg.parent.resolve())
        ):
            problems.append("a top-level kernels package is installed")
        ext = [f for f in files if f.startswith("iqtrain/_native") and f.endswith(".so")]
        if len(ext) != 1:
            problems.append(f"expected one extension module, found {ext}")
    if problems:
        sys.exit(f"iqtrain: error: {mode} install: " + "; ".join(problems))
    print(f"   {mode}: iqtrain, _native and kernels.normalize_patch from {pkg}", file=sys.stderr)


if __name__ == "__main__":
    main()

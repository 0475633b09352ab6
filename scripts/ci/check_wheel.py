"""`.ci/dev build`: the wheel holds exactly one extension module and no duplicate names."""

from __future__ import annotations

import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
ext = [n for n in names if n.startswith("iqtrain/_native") and n.endswith((".so", ".pyd"))]
if len(ext) != 1 or len(set(names)) != len(names):
    sys.exit(f"iqtrain: error: {sys.argv[1]}: expected one extension module, found {ext}")

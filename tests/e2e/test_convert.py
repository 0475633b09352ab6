"""``iqtrain convert radioml2016|radioml2018``: the command in a fresh process.

One summary line and exit 0; bad input is one ``iqtrain: error:`` line, exit 2, and no OUT_DIR
(nor its temporary sibling); a forged pickle runs nothing.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import Forged, deep_key_pickle, h5py_or_skip

import iqtrain

#: The child runs the iqtrain these tests import (the source tree, or the installed wheel).
PYTHONPATH = os.pathsep.join(
    p for p in (os.fspath(Path(iqtrain.__file__).parents[1]), os.environ.get("PYTHONPATH")) if p
)


def iqtrain_cmd(*args, cwd=None, timeout=120, max_memory=None):
    """``iqtrain *args`` in a child; ``max_memory``: its address space in bytes at most (a
    read that would not end fails there instead of on the machine)."""

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (max_memory, max_memory))

    return subprocess.run(
        [sys.executable, "-m", "iqtrain", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": PYTHONPATH, "OPENBLAS_NUM_THREADS": "1"},
        timeout=timeout,
        preexec_fn=None if max_memory is None else limit,
    )


def one_error_line(proc, *fragments):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("iqtrain: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert proc.stdout == ""


def nothing_left(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(f"{out.name}.tmp-*"))


def test_radioml2016(tmp_path):
    rng = np.random.default_rng(1)
    d = {
        (mod, snr): rng.standard_normal((2, 2, 128)).astype(np.float32)
        for mod in ("BPSK", "QPSK", "WBFM")
        for snr in (-20, 0, 18)
    }
    src = tmp_path / "RML2016.10a_dict.pkl"
    src.write_bytes(pickle.dumps(d, protocol=2))
    out = tmp_path / "rml16"
    proc = iqtrain_cmd("convert", "radioml2016", src, out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote 18 examples of 3 classes in 1 recordings to {out}\n"
    meta = json.loads((out / "radioml2016_00000.sigmf-meta").read_text())
    assert [(a["core:label"], a["iqtrain:snr_db"]) for a in meta["annotations"]] == [
        key for key in sorted(d) for _ in range(2)
    ]
    data = np.fromfile(out / "radioml2016_00000.sigmf-data", "<f4").reshape(-1, 128, 2)
    assert np.array_equal(data, np.concatenate([d[k] for k in sorted(d)]).transpose(0, 2, 1))
    assert json.loads((out / "convert.json").read_text())["source"]["name"] == src.name

    again = iqtrain_cmd("convert", "radioml2016", src, out)  # OUT_DIR now exists, not empty
    one_error_line(again, f"{out}: exists and is not empty")


def test_radioml2018_with_a_classes_file(tmp_path):
    h5py = h5py_or_skip()
    rng = np.random.default_rng(2)
    n, width = 12, 3
    x = rng.standard_normal((n, 1024, 2)).astype(np.float32)
    y = np.eye(width, dtype=np.int64)[np.arange(n) % width]
    src = tmp_path / "GOLD_XYZ_OSC.0001_1024.hdf5"
    with h5py.File(src, "w") as f:
        f["X"], f["Y"], f["Z"] = x, y, np.full((n, 1), 6, np.int64)
    names = tmp_path / "classes.txt"
    names.write_text("OOK\nBPSK\nFM\n")
    out = tmp_path / "rml18"
    proc = iqtrain_cmd("convert", "radioml2018", src, out, "--classes", names)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote 12 examples of 3 classes in 1 recordings to {out}\n"
    meta = json.loads((out / "radioml2018_00000.sigmf-meta").read_text())
    assert [a["core:label"] for a in meta["annotations"]] == ["OOK", "BPSK", "FM"] * 4
    data = np.fromfile(out / "radioml2018_00000.sigmf-data", "<f4")
    assert data.tobytes() == x.tobytes()


def test_a_forged_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"

    src = tmp_path / "RML2016.10a_dict.pkl"
    src.write_bytes(pickle.dumps({("BPSK", 0): Forged(os.system, f"touch '{marker}'")}, protocol=2))
    out = tmp_path / "out"
    proc = iqtrain_cmd("convert", "radioml2016", src, out, cwd=tmp_path)
    one_error_line(proc, f"{src}: refused pickle global posix.system")
    assert not marker.exists()
    assert nothing_left(out)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["radioml2016", "{tmp}/missing.pkl", "{tmp}/out"], ["missing.pkl: cannot read"]),
        (["radioml2018", "{tmp}/notes.txt", "{tmp}/out"], ["notes.txt: not a readable HDF5"]),
        (["radioml2017", "{tmp}/notes.txt", "{tmp}/out"], ["invalid choice: 'radioml2017'"]),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, fragments):
    (tmp_path / "notes.txt").write_text("not a dataset\n")
    proc = iqtrain_cmd("convert", *(a.format(tmp=tmp_path) for a in args))
    one_error_line(proc, *fragments)
    assert nothing_left(tmp_path / "out")


def test_a_key_nested_too_deep_to_hash_is_one_line(tmp_path):
    # 200 000 levels: hashing the key (to put it in the dict) overflowed the C stack (SIGSEGV).
    src = tmp_path / "RML2016.10a_dict.pkl"
    src.write_bytes(deep_key_pickle(200_000))
    proc = iqtrain_cmd("convert", "radioml2016", src, tmp_path / "out")
    one_error_line(proc, f"{src}: not a RadioML 2016 pickle: refused dict key ((((")
    assert nothing_left(tmp_path / "out")


@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_a_classes_file_that_never_ends_is_refused(tmp_path, kind):
    # /dev/zero was read until memory ran out, a FIFO without a writer blocked forever.
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    with h5py.File(src, "w") as f:
        f["X"], f["Y"] = np.zeros((1, 1024, 2), np.float32), np.eye(24, dtype=np.int64)[:1]
        f["Z"] = np.zeros((1, 1), np.int64)
    classes = Path("/dev/zero")
    if kind == "FIFO":
        classes = tmp_path / "classes.fifo"
        os.mkfifo(classes)
    out = tmp_path / "out"
    proc = iqtrain_cmd(
        "convert", "radioml2018", src, out, "--classes", classes, timeout=60, max_memory=1 << 30
    )
    one_error_line(proc, f"{classes}: not a regular file")
    assert nothing_left(out)


def test_a_class_list_of_another_width_is_asked_for_by_its_flag(tmp_path):
    # The library names its parameter; the command names its flag.
    h5py = h5py_or_skip()
    src = tmp_path / "s.hdf5"
    with h5py.File(src, "w") as f:
        f["X"], f["Y"] = np.zeros((2, 1024, 2), np.float32), np.eye(3, dtype=np.int64)[:2]
        f["Z"] = np.zeros((2, 1), np.int64)
    out = tmp_path / "out"
    proc = iqtrain_cmd("convert", "radioml2018", src, out)
    one_error_line(
        proc,
        f"{src}: Y has 3 columns, the RadioML 2018.01A class list 24; "
        "pass --classes FILE with 3 names, one per line",
    )
    assert nothing_left(out)
    names = tmp_path / "classes.txt"
    names.write_text("A\nB\nC\n")
    proc = iqtrain_cmd("convert", "radioml2018", src, out, "--classes", names)
    assert proc.returncode == 0, proc.stderr
    order = json.loads((out / "convert.json").read_text())["class_order"]
    assert order == f"--classes {names}"

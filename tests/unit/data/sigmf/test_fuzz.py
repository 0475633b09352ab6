"""The SigMF reader and the Rust decoder fuzzed: generated metadata, datasets, archives and
collections, valid and mutated, each written into a fresh directory and read every way a user
can (tests/fuzz_sigmf.py says what is generated and what every case must pass: it opens and
every window is numpy's reading of the same bytes, or it is refused in one line per recording;
nothing else is raised, nothing hangs, nothing is written).

The number of cases: ``IQTRAIN_FUZZ_EXAMPLES`` for the whole module (shared by the tests by
weight), and with it the profile: unset, CI's (2,400 cases, the same ones every run); set (``bash
.ci/dev fuzz`` sets 10^5), new cases every run. ``IQTRAIN_FUZZ_COUNTS``: a JSON file the
module's counts are written to when it ends (cases run, opened, refused, refusals by kind).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import fuzz_sigmf as fz
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.configuration import set_hypothesis_home_dir

from iqtrain.data.dataset import IQDataset
from iqtrain.errors import DataError, RecordingsRefused

# Hypothesis caches what it reads of the project's modules (from collection on) in .hypothesis/
# of the current directory: beside the venv instead, never in the checkout.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    _cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    set_hypothesis_home_dir(_cache / "iqtrain" / "hypothesis")

settings.register_profile(
    "iqtrain-ci",
    deadline=timedelta(seconds=10),  # a case takes ~10 ms; 10 s is a hang on any machine
    database=None,  # nothing written into the checkout
    derandomize=True,  # CI runs the same cases every time; `fuzz` looks for new ones
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("iqtrain-fuzz", parent=settings.get_profile("iqtrain-ci"),
                          derandomize=False)  # fmt: skip

_EXAMPLES = os.environ.get("IQTRAIN_FUZZ_EXAMPLES")
TOTAL = int(_EXAMPLES) if _EXAMPLES else 2400
PROFILE = settings.get_profile("iqtrain-fuzz" if _EXAMPLES else "iqtrain-ci")


def share(weight: float) -> settings:
    """The profile, with ``weight`` of the module's cases."""
    return settings(PROFILE, max_examples=max(1, round(TOTAL * weight)))


@pytest.fixture(scope="module")
def base():
    """Where each case gets its fresh directory; the counts written when the module ends."""
    # tmpfs where there is one: a case's files are written and removed in a fraction of the time
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    path = Path(tempfile.mkdtemp(prefix="iqtrain-fuzz-", dir=shm))
    fz.STATS.clear()
    yield path
    shutil.rmtree(path, ignore_errors=True)
    counts = os.environ.get("IQTRAIN_FUZZ_COUNTS")
    if counts:
        Path(counts).write_text(json.dumps(dict(fz.STATS), indent=1, sort_keys=True))


@share(0.30)
@given(case=fz.valid_cases())
def test_valid_recordings_read_exactly_what_was_written(base, case):
    assert fz.run_case(case, base).startswith(("opened", "no window"))


@share(0.20)
@given(case=fz.metadata_cases())
def test_mutated_metadata_fields(base, case):
    fz.run_case(case, base)


@share(0.12)
@given(case=fz.json_byte_cases())
def test_mutated_metadata_bytes(base, case):
    fz.run_case(case, base)


@share(0.18)
@given(case=fz.archive_cases())
def test_mutated_archives(base, case):
    fz.run_case(case, base)


@share(0.10)
@given(case=fz.collection_cases())
def test_mutated_collections(base, case):
    fz.run_case(case, base)


@share(0.10)
@given(case=fz.data_and_input_cases())
def test_mutated_datasets_inputs_and_options(base, case):
    fz.run_case(case, base)


# ------------------------------------------------------------- what the fuzzer found (for the lead)


def _blocks_on_fifo(fifo: Path, read) -> bool:
    """Whether ``read()`` blocked opening FIFO ``fifo`` for more than two seconds (a thread then
    opens it for writing and closes it, so the reader sees an empty file and returns)."""
    done, unblocked = threading.Event(), threading.Event()

    def unblock() -> None:
        if done.wait(2.0):
            return
        while not done.is_set():
            try:  # succeeds only while a reader holds the FIFO open
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                time.sleep(0.05)
                continue
            unblocked.set()
            os.close(fd)
            return

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    try:
        read()
    except DataError:
        pass
    finally:
        done.set()
        thread.join()
    return unblocked.is_set()


@pytest.mark.parametrize("suffix", [".sigmf-meta", ".sigmf-collection"])
def test_a_fifo_a_glob_matches_is_refused_without_blocking(tmp_path, suffix):
    fifo = tmp_path / f"x{suffix}"
    os.mkfifo(fifo)
    assert not _blocks_on_fifo(fifo, lambda: IQDataset(os.fspath(tmp_path / "*"), window=4))


@pytest.mark.parametrize("name", ["bad.sigmf-collection", "a.sigmf.gz"])
def test_an_input_named_twice_is_refused_once(tmp_path, name):
    import gzip

    (tmp_path / "bad.sigmf-collection").write_text("{")
    (tmp_path / "a.sigmf.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(RecordingsRefused) as e:
        IQDataset([os.fspath(tmp_path / name), os.fspath(tmp_path / "*")], window=4)
    lines = [line for _, line in e.value.problems]
    assert len(lines) == len(set(lines)) == 2, lines
    assert str(e.value).startswith("2 of 2 recording(s) cannot be read")


def _collection(folder: Path, streams: list) -> Path:
    path = folder / "c.sigmf-collection"
    path.write_text(json.dumps({"collection": {"core:version": "1.2.0", "core:streams": streams}}))
    return path


def test_a_collection_stream_name_with_a_newline_is_refused_in_one_line(tmp_path):
    coll = _collection(tmp_path, [{"name": "a\nb"}])
    with pytest.raises(DataError) as e:
        IQDataset(os.fspath(coll), window=4)
    assert "\n" not in str(e.value), str(e.value)


def test_a_collection_hash_with_a_newline_is_refused_in_one_line(tmp_path):
    import sigmf

    meta = sigmf.fromarray(np.zeros(8, np.complex64))
    meta.tofile(tmp_path / "r")
    coll = _collection(tmp_path, [{"name": "r", "hash": "a\nb"}])
    with pytest.raises(DataError) as e:
        IQDataset(os.fspath(coll), window=4)
    assert "hash: 'a\\nb' is not a SHA-512 hex digest" in str(e.value)
    assert "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("why", ["no window", "a field refused"])
def test_an_archive_member_name_with_a_newline_is_refused_in_one_line(tmp_path, why):
    import io
    import tarfile

    meta = {"global": {"core:datatype": "ci8" if why == "no window" else "rf32_le",
                       "core:version": "1.2.0"}, "captures": [], "annotations": []}  # fmt: skip
    path = tmp_path / "a.sigmf"
    with tarfile.open(path, "w") as tar:
        for name, data in (("r.sigmf-meta", json.dumps(meta).encode()), ("r.sigmf-data", b"")):
            info = tarfile.TarInfo(f"x\ny/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(DataError) as e:
        IQDataset(os.fspath(path), window=4)
    assert "\n" not in str(e.value), str(e.value)

"""What a data list names: metadata files, archives (whole or one member), collections written by
sigmf-python, globs of all of them; every input that cannot be read is a problem of its own."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import sigmf
from sigmf import SigMFCollection

from iqtrain.data.sigmf import expand
from iqtrain.errors import DataError


def _recording(folder: Path, name: str, n: int = 64) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    meta = sigmf.fromarray((np.arange(n) * (1 + 1j)).astype(np.complex64))
    meta.sample_rate = 1e6
    meta.tofile(folder / name)
    return folder / f"{name}.sigmf-meta"


def _names(found):
    return [os.fspath(s.meta) for s in found.sources]


def test_metas_archives_and_members_sort_together(tmp_path):
    _recording(tmp_path, "b")
    meta = sigmf.fromarray(np.zeros(8, np.complex64))
    meta.tofile(tmp_path / "a.sigmf")
    meta.tofile(tmp_path / "c.sigmf")
    found = expand([os.fspath(tmp_path / "*.sigmf"), os.fspath(tmp_path / "b.sigmf-meta")])
    real = os.path.realpath(tmp_path)
    assert _names(found) == [
        f"{real}/a.sigmf/a/a.sigmf-meta",
        f"{real}/b.sigmf-meta",
        f"{real}/c.sigmf/c/c.sigmf-meta",
    ]
    one = expand(os.fspath(tmp_path / "c.sigmf" / "c" / "c.sigmf-meta"))
    assert _names(one) == [f"{real}/c.sigmf/c/c.sigmf-meta"]
    assert not found.problems


def test_a_collection_stands_for_its_streams_with_their_hashes(tmp_path):
    for name in ("x", "y"):
        _recording(tmp_path, name)
    coll = SigMFCollection(["x.sigmf-meta", "y.sigmf-meta"], base_path=tmp_path)
    coll.tofile(tmp_path / "both.sigmf-collection")
    found = expand(os.fspath(tmp_path / "both.sigmf-collection"))
    assert [s.meta.name for s in found.sources] == ["x.sigmf-meta", "y.sigmf-meta"]
    assert all(s.stream_hash and len(s.stream_hash) == 128 for s in found.sources)
    # Named both ways (a glob of everything): each recording once, its hash kept.
    both = expand(os.fspath(tmp_path / "*"))
    assert [s.meta.name for s in both.sources] == ["x.sigmf-meta", "y.sigmf-meta"]
    assert all(s.stream_hash for s in both.sources)


def test_a_stream_missing_or_a_collection_unreadable_is_a_problem(tmp_path):
    def collection(name: str, streams: list) -> None:
        doc = {"collection": {"core:streams": streams}}
        (tmp_path / f"{name}.sigmf-collection").write_text(json.dumps(doc))

    collection("c", [{"name": "gone", "hash": "0" * 128}])
    (tmp_path / "bad.sigmf-collection").write_text("{")
    collection("up", [{"name": "../x", "hash": "0" * 128}])
    collection("h", [{"name": "x", "hash": "0"}])
    found = expand(os.fspath(tmp_path / "*.sigmf-collection"))
    text = "\n".join(line for _, line in found.problems)
    assert "'gone' names no recording" in text
    assert "cannot be read as a SigMF collection" in text
    assert "not a recording's name" in text
    assert "hash: '0' is not a SHA-512 hex digest" in text
    assert not found.sources and len(found.problems) == 4


@pytest.mark.parametrize(
    "suffix, command",
    [(".sigmf.gz", "gzip -dk"), (".sigmf.xz", "xz -dk"), (".sigmf.zip", "unzip")],
)
def test_a_compressed_archive_says_how_to_decompress_it(tmp_path, suffix, command):
    path = tmp_path / f"r{suffix}"
    path.write_bytes(gzip.compress(b"x"))
    found = expand(os.fspath(path))
    [(where, line)] = found.problems
    assert where == os.fspath(path) and command in line and "\n" not in line


def test_what_a_list_cannot_name_is_one_error_at_once(tmp_path):
    _recording(tmp_path, "a")
    with pytest.raises(DataError, match="no recordings match"):
        expand(os.fspath(tmp_path / "nothing*.sigmf-meta"))
    with pytest.raises(DataError, match="no such file"):
        expand(os.fspath(tmp_path / "missing.sigmf-meta"))
    with pytest.raises(DataError, match="a directory"):
        expand(os.fspath(tmp_path))
    with pytest.raises(DataError, match="expected a .sigmf-meta"):
        expand(os.fspath(tmp_path / "a.sigmf-data"))
    with pytest.raises(DataError, match="no SigMF recordings found"):
        expand(os.fspath(tmp_path / "*.sigmf-data"))


def test_a_damaged_archive_is_a_problem_and_the_rest_is_read(tmp_path):
    _recording(tmp_path, "a")
    (tmp_path / "broken.sigmf").write_bytes(b"not a tar" * 100)
    found = expand(os.fspath(tmp_path / "*"))
    assert [s.meta.name for s in found.sources] == ["a.sigmf-meta"]
    [(where, line)] = found.problems
    assert where.endswith("broken.sigmf") and "tar" in line


def test_an_archive_named_through_a_symlink_keeps_the_link(tmp_path):
    meta = sigmf.fromarray(np.zeros(8, np.complex64))
    meta.tofile(tmp_path / "real.sigmf")
    (tmp_path / "link.sigmf").symlink_to(tmp_path / "real.sigmf")
    found = expand(os.fspath(tmp_path / "link.sigmf"))
    [source] = found.sources
    assert source.meta == Path(os.path.realpath(tmp_path), "real.sigmf", "real", "real.sigmf-meta")
    assert found.links[source.meta] == tmp_path / "link.sigmf" / "real" / "real.sigmf-meta"

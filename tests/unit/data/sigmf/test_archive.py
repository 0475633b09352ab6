"""SigMF archives listed in place: sigmf-python's own archives, and every way a tar can be
damaged or hostile (one line naming the archive, nothing extracted, nothing written)."""

from __future__ import annotations

import gzip
import io
import os
import tarfile

import numpy as np
import pytest
import sigmf

from iqtrain.data.sigmf.archive import open_archive
from iqtrain.errors import DataError


def _sigmf_archive(tmp_path, name="rec"):
    meta = sigmf.fromarray((np.arange(64) * (1 + 1j)).astype(np.complex64))
    meta.sample_rate = 1e6
    path = tmp_path / f"{name}.sigmf"
    meta.tofile(path)
    return path


def _tar(path, members, *, fmt=tarfile.PAX_FORMAT):
    """A tar of ``members``: ``(TarInfo, bytes or None)``."""
    with tarfile.open(path, "w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


def _file(name, data=b"x" * 10, **attrs):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


def test_an_archive_sigmf_python_writes_is_listed_in_place(tmp_path):
    path = _sigmf_archive(tmp_path)
    before = sorted(os.listdir(tmp_path))
    arc = open_archive(path)
    assert arc.metas() == ["rec/rec.sigmf-meta"]
    data = arc.members["rec/rec.sigmf-data"]
    raw = path.read_bytes()[data.offset : data.offset + data.size]
    assert np.array_equal(np.frombuffer(raw, np.complex64), np.arange(64) * (1 + 1j))
    assert arc.size == path.stat().st_size
    assert sorted(os.listdir(tmp_path)) == before  # nothing extracted


@pytest.mark.parametrize(
    "members, words",
    [
        ([_file("../evil.sigmf-meta")], "'..'"),
        ([_file("/abs/x.sigmf-meta")], "absolute"),
        ([_file("a/x.sigmf-meta"), _file("a/x.sigmf-meta")], "listed twice"),
    ],
)
def test_hostile_names_refuse_the_archive(tmp_path, members, words):
    path = _tar(tmp_path / "h.sigmf", members)
    with pytest.raises(DataError, match=words) as e:
        open_archive(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_links_and_sparse_sigmf_members_are_refused_when_read(tmp_path):
    link = tarfile.TarInfo("a/x.sigmf-data")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    hard = tarfile.TarInfo("a/y.sigmf-data")
    hard.type, hard.linkname = tarfile.LNKTYPE, "a/x.sigmf-meta"
    other = tarfile.TarInfo("a/README")
    other.type, other.linkname = tarfile.SYMTYPE, "elsewhere"
    path = _tar(
        tmp_path / "l.sigmf", [_file("a/x.sigmf-meta"), (link, None), (hard, None), (other, None)]
    )
    arc = open_archive(path)
    assert "symbolic link" in arc.refused["a/x.sigmf-data"]
    assert "hard link" in arc.refused["a/y.sigmf-data"]
    assert "a/README" not in arc.refused  # not SigMF: not read, not refused
    with pytest.raises(DataError, match="symbolic link"):
        arc.member("a/x.sigmf-data")


def test_a_sparse_member_is_refused(tmp_path):
    info, data = _file("a/x.sigmf-data", b"\0" * 512)
    info.type = tarfile.GNUTYPE_SPARSE
    path = _tar(
        tmp_path / "s.sigmf", [_file("a/x.sigmf-meta"), (info, data)], fmt=tarfile.GNU_FORMAT
    )
    arc = open_archive(path)
    assert arc.refused["a/x.sigmf-data"] == "is a sparse file"
    assert "a/x.sigmf-data" not in arc.members


@pytest.mark.parametrize("cut", ["mid-data", "at-member-end", "mid-header", "no-end-block"])
def test_a_truncated_archive_is_refused(tmp_path, cut):
    path = _sigmf_archive(tmp_path)
    arc = open_archive(path)
    raw = path.read_bytes()
    last = max(arc.members.values(), key=lambda m: m.offset)
    end = last.offset + -(-last.size // 512) * 512
    at = {
        "mid-data": last.offset + 10,
        "at-member-end": end,
        "mid-header": last.offset - 200,
        "no-end-block": end + 100,
    }[cut]
    path.write_bytes(raw[:at])
    with pytest.raises(DataError) as e:
        open_archive(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_damaged_header_is_refused(tmp_path):
    path = _sigmf_archive(tmp_path)
    arc = open_archive(path)
    raw = bytearray(path.read_bytes())
    header = max(m.offset for m in arc.members.values()) - 512
    raw[header + 148 : header + 156] = b"99999999"  # the checksum field
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="truncated or damaged|not a readable tar"):
        open_archive(path)


def test_compressed_data_named_sigmf_says_how_to_decompress(tmp_path):
    plain = _sigmf_archive(tmp_path)
    disguised = tmp_path / "z.sigmf"
    disguised.write_bytes(gzip.compress(plain.read_bytes()))
    with pytest.raises(DataError, match=r"gzip -dk .*z\.sigmf\.gz") as e:
        open_archive(disguised)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("content", [b"", b"not a tar at all" * 100, bytes(1024)])
def test_what_is_not_a_tar_is_one_line(tmp_path, content):
    path = tmp_path / "n.sigmf"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        open_archive(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)

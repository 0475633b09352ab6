"""SigMF archives (``.sigmf``: an uncompressed POSIX tar of one or more recordings), read in
place (docs/design.md "Recordings, capture segments, windows", archives).

:func:`open_archive` lists the archive's members once (headers only: nothing is extracted,
nothing is written) and refuses, in one line naming the archive, everything that would make a
member's bytes other than what its header says: a damaged or truncated tar, a member named with
``..`` or an absolute path, a member listed twice, and a SigMF member (``.sigmf-meta``,
``.sigmf-data``, ``.sigmf-collection``) that is a link, sparse or not a regular file. The data
reader then reads each data member at its byte offset in the tar file.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from iqtrain.data.sigmf.regular import open_regular
from iqtrain.errors import DataError

__all__ = [
    "COMPRESSED",
    "Archive",
    "Member",
    "compressed_hint",
    "open_archive",
    "sniff_compression",
]

#: Compressed archive suffixes (sigmf-python writes .sigmf.gz, .sigmf.xz and .sigmf.zip) and
#: the command that turns each into what iqtrain reads ({f}: the file, {o}: what it writes).
COMPRESSED = {
    ".sigmf.gz": "gzip -dk {f}  (writes {o}.sigmf)",
    ".sigmf.xz": "xz -dk {f}  (writes {o}.sigmf)",
    ".sigmf.bz2": "bzip2 -dk {f}  (writes {o}.sigmf)",
    ".sigmf.zst": "zstd -d {f}  (writes {o}.sigmf)",
    ".sigmf.zip": "unzip {f} -d {o}  (then give {o}/**/*.sigmf-meta)",
}

# Magic numbers of compressed data, for a compressed file named .sigmf.
_MAGIC = (
    (b"\x1f\x8b", ".sigmf.gz"),
    (b"\xfd7zXZ\x00", ".sigmf.xz"),
    (b"BZh", ".sigmf.bz2"),
    (b"\x28\xb5\x2f\xfd", ".sigmf.zst"),
    (b"PK\x03\x04", ".sigmf.zip"),
)

#: The member names iqtrain reads (a link or special file under one of these is refused).
SIGMF_SUFFIXES = (".sigmf-meta", ".sigmf-data", ".sigmf-collection")


def compressed_hint(path: str, suffix: str, *, named: str | None = None) -> str:
    """One line: ``path`` is a compressed archive (of ``suffix``), and the command that
    decompresses it. ``named``: the suffix the file has instead (a compressed ``.sigmf``)."""
    if named is None:
        stem = path[: -len(suffix)]
        command = COMPRESSED[suffix].format(f=path, o=stem)
        return f"{path}: a compressed SigMF archive is not read in place; decompress it: {command}"
    stem = path[: -len(named)]
    command = f"mv {path} {stem}{suffix} && " + COMPRESSED[suffix].format(f=stem + suffix, o=stem)
    return (
        f"{path}: is {suffix[7:]}-compressed although named {named}; a compressed archive is not "
        f"read in place; decompress it: {command}"
    )


def sniff_compression(head: bytes) -> str | None:
    """The compressed suffix whose magic number ``head`` starts with, or None."""
    for magic, suffix in _MAGIC:
        if head.startswith(magic):
            return suffix
    return None


@dataclass(frozen=True)
class Member:
    """One regular file of an archive: its name (normalised: no leading ``./``) and its bytes
    ``[offset, offset + size)`` in the tar file."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Archive:
    """A listed archive: its resolved path, its length when listed, its regular members, and
    (``refused``) why each SigMF-named link or special member cannot be read."""

    path: Path
    size: int
    members: dict[str, Member]
    refused: dict[str, str]

    def metas(self) -> list[str]:
        """The names of its ``.sigmf-meta`` members, sorted."""
        return sorted(n for n in self.members if n.endswith(".sigmf-meta"))

    def member(self, name: str) -> Member:
        """The regular member ``name``; DataError naming the archive when it is not one."""
        found = self.members.get(name)
        if found is not None:
            return found
        why = self.refused.get(name)
        if why is not None:
            raise DataError(f"{self.path}: member {name!r} {why}; it is not read")
        raise DataError(f"{self.path}: no member {name!r}")

    def read(self, member: Member) -> bytes:
        """The bytes of ``member`` (a metadata file: small), read at its offset; a short read
        (the archive shrank) is a DataError naming the archive."""
        try:
            fd = open_regular(self.path)
        except OSError as exc:
            raise DataError(f"{self.path}: cannot be read ({exc.strerror or exc})") from None
        try:
            data = os.pread(fd, member.size, member.offset)
        finally:
            os.close(fd)
        if len(data) != member.size:
            raise DataError(
                f"{self.path}: member {member.name!r} is cut short (the archive changed length "
                "while being read)"
            )
        return data


def _normalised(name: str) -> str | None:
    """``name`` without a leading ``./`` or trailing ``/``; None when it is absolute or climbs
    out with ``..``."""
    if name.startswith("/"):
        return None
    parts = [p for p in PurePosixPath(name).parts if p != "."]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def _kind(info: tarfile.TarInfo) -> str | None:
    """Why a member cannot be read as a file, or None for a regular, contiguous file."""
    if info.issym():
        return f"is a symbolic link (to {info.linkname!r})"
    if info.islnk():
        return f"is a hard link (to {info.linkname!r})"
    if info.issparse():
        return "is a sparse file"
    if not info.isreg():
        return "is not a regular file"
    return None


def _end_is_zero(f, at: int, size: int) -> bool:
    """True when the tar's end-of-archive block (512 zero bytes) is at ``at``."""
    if at + 512 > size:
        return False
    f.seek(at)
    return f.read(512) == bytes(512)


def _listing(f, path: Path, size: int) -> tuple[dict[str, Member], dict[str, str]]:
    """The regular members and the refused SigMF ones of the tar open as ``f``."""
    members: dict[str, Member] = {}
    refused: dict[str, str] = {}
    seen: set[str] = set()
    with tarfile.open(fileobj=f, mode="r:") as tar:
        for info in tar:
            name = _normalised(info.name)
            if name is None:
                raise DataError(
                    f"{path}: member {info.name!r} is named with an absolute path or '..'; "
                    "the archive is refused"
                )
            if name in seen and not info.isdir():
                raise DataError(
                    f"{path}: member {name!r} is listed twice (an appended archive?); the "
                    "archive is refused"
                )
            seen.add(name)
            why = _kind(info)
            if why is None:
                if info.offset_data + info.size > size:
                    raise DataError(
                        f"{path}: member {name!r} runs past the end of the file "
                        f"({info.offset_data + info.size} > {size} bytes): the archive is "
                        "truncated"
                    )
                members[name] = Member(name, info.offset_data, info.size)
            elif not info.isdir() and name.endswith(SIGMF_SUFFIXES):
                refused[name] = why
        # tarfile ends its listing quietly at a damaged header or at the end of the file; a
        # whole archive has its end-of-archive block there.
        if not _end_is_zero(f, tar.offset, size):
            raise DataError(
                f"{path}: no end-of-archive block at byte {tar.offset} (after the last member): "
                "the archive is truncated or damaged"
            )
    return members, refused


def open_archive(path: Path) -> Archive:
    """The members of the archive at ``path`` (resolved), or one DataError line naming it."""
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    try:
        with os.fdopen(fd, "rb") as f:
            suffix = sniff_compression(f.read(8))
            if suffix is not None:
                raise DataError(compressed_hint(os.fspath(path), suffix, named=".sigmf"))
            f.seek(0)
            members, refused = _listing(f, path, st.st_size)
    except tarfile.TarError as exc:
        raise DataError(f"{path}: not a readable tar archive ({exc})") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not members and not refused:
        raise DataError(f"{path}: the archive holds no file")
    return Archive(Path(path), st.st_size, members, refused)

"""What a data list names: ``.sigmf-meta`` files, ``.sigmf`` archives (every recording in
them, or one member as ``ARCHIVE/MEMBER``), ``.sigmf-collection`` files (their streams) and
globs of any of these, expanded into one sorted list of recordings to read (docs/design.md
"Recordings, capture segments, windows", inputs).

A pattern matching nothing, a path that does not exist or names no SigMF file is one
DataError line at once (the list itself is wrong). Everything wrong with one input that does
exist (an archive that is damaged or compressed, a collection that cannot be read, a stream
missing) is a *problem* of that input: the dataset lists every problem together with its
recordings' (:class:`~iqtrain.data.dataset.IQDataset`).
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from iqtrain.data.sigmf.archive import COMPRESSED, Archive, compressed_hint, open_archive
from iqtrain.data.sigmf.regular import read_regular
from iqtrain.errors import DataError

__all__ = ["Expanded", "Source", "expand", "sorted_as_paths"]

META, ARCHIVE, COLLECTION = ".sigmf-meta", ".sigmf", ".sigmf-collection"


@dataclass(frozen=True)
class Source:
    """One recording's metadata to read: ``meta`` is its path (resolved), or for an archive
    member ``ARCHIVE/MEMBER`` (``archive`` then holds the listing). ``stream_hash``: the SHA-512
    of the metadata a collection that named it records (checked when it is read)."""

    meta: Path
    archive: Archive | None = None
    member: str | None = None
    stream_hash: str | None = None
    collection: Path | None = None


@dataclass
class Expanded:
    """The recordings to read, sorted by path (window id order), the problems of inputs that
    exist but cannot be read (``(path, one line)``), and ``links``: the resolved metadata path
    -> the symbolic link it was named by."""

    sources: list[Source] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)
    links: dict[Path, Path] = field(default_factory=dict)


def _suffix(name: str) -> str | None:
    """The SigMF kind of a file name: META, ARCHIVE, COLLECTION, a compressed archive suffix, or
    None."""
    lower = name.lower()
    for s in COMPRESSED:
        if lower.endswith(s):
            return s
    for s in (META, COLLECTION, ARCHIVE):
        if name.endswith(s):
            return s
    return None


def _member_path(text: str) -> tuple[str, str] | None:
    """``(archive, member)`` when ``text`` names a member inside an existing ``.sigmf`` file."""
    parts = Path(text).parts
    for i in range(len(parts) - 1, 0, -1):
        head = os.path.join(*parts[:i])
        if head.endswith(ARCHIVE) and os.path.isfile(head):
            return head, "/".join(parts[i:])
    return None


#: The kind of a path naming a member inside an archive (``ARCHIVE/MEMBER``).
MEMBER = "member"


def _matches(entry: str) -> list[tuple[str, str]]:
    """``(file, kind)`` of each file ``entry`` (a path or a glob) names; DataError when it
    names nothing usable."""
    if glob.has_magic(entry):
        matches = glob.glob(entry, recursive=True)
        if not matches:
            raise DataError(f"{entry}: no recordings match this pattern")
        found = [(m, _suffix(os.path.basename(m))) for m in matches]
        return [(m, k) for m, k in found if k is not None]
    kind = _suffix(os.path.basename(entry))
    if os.path.isfile(entry) or os.path.islink(entry):
        if kind is None:
            raise DataError(
                f"{entry}: expected a .sigmf-meta file, a .sigmf archive (or a member of one) or "
                "a .sigmf-collection"
            )
        return [(entry, kind)]
    if _member_path(entry) is not None:
        return [(entry, MEMBER)]
    if os.path.isdir(entry):
        raise DataError(f"{entry}: a directory; name its recordings (e.g. {entry}/**/*.sigmf-meta)")
    if kind is None:
        raise DataError(
            f"{entry}: expected a .sigmf-meta file, a .sigmf archive (or a member of one) or a "
            ".sigmf-collection"
        )
    raise DataError(f"{entry}: no such file")


class _Resolver:
    """Paths resolved as ``Path.resolve`` does, each directory once (``realpath`` of every file
    lstat'ed every component of its path: 60-90 us a file, against one lstat of the file)."""

    def __init__(self, links: dict[Path, Path]) -> None:
        self.dirs: dict[str, str] = {}
        self.links = links

    def __call__(self, path: str) -> str:
        if os.path.islink(path):
            if not os.path.exists(path):
                raise DataError(
                    f"{Path(path)}: a symlink to {os.readlink(path)}, which does not exist"
                )
            target = os.path.realpath(path)
            self.links[Path(target)] = Path(path)
            return target
        head, name = os.path.split(path)
        real = self.dirs.get(head)
        if real is None:
            real = self.dirs[head] = os.path.realpath(head)
        return os.path.join(real, name)


def sorted_as_paths(paths: Sequence[str]) -> list[str]:
    """``paths`` (absolute, normalised) in the order ``sorted(map(Path, paths))`` gives.

    Path order compares component by component, which is not string order ("b/x" sorts before
    "b-c/x"); with every separator replaced by NUL, a string sorts exactly so (NUL is below
    every character a component holds) and without building a Path per file."""
    if os.sep != "/" or os.altsep:
        return [os.fspath(p) for p in sorted(map(Path, paths))]
    return sorted(paths, key=lambda p: p.replace("/", "\0"))


_SHA512 = re.compile(r"[0-9a-fA-F]{128}")


def _stream_names(data: object) -> list[tuple[str, str | None]]:
    """``(name, hash)`` of each stream of a collection's JSON; ValueError saying what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("collection"), dict):
        raise ValueError("collection: missing or not an object")
    streams = data["collection"].get("core:streams", [])
    if not isinstance(streams, list):
        raise ValueError("collection.core:streams: not an array")
    out = []
    for i, s in enumerate(streams):
        # A SigMF Recording Object, or the [name, hash] tuple the specification still allows.
        name, digest = (
            (s.get("name"), s.get("hash"))
            if isinstance(s, dict)
            else ((s[0], s[1]) if isinstance(s, list) and len(s) == 2 else (None, None))
        )
        parts = name.replace("\\", "/").split("/") if isinstance(name, str) and name else [".."]
        if not isinstance(name, str) or parts[0] == "" or ".." in parts or parts[-1] in ("", "."):
            raise ValueError(
                f"collection.core:streams[{i}].name: {name!r:.60} is not a recording's name "
                "beside the collection"
            )
        if digest is not None and not (
            isinstance(digest, str) and _SHA512.fullmatch(digest) is not None
        ):
            raise ValueError(
                f"collection.core:streams[{i}].hash: {digest!r:.60} is not a SHA-512 hex digest"
            )
        out.append((name, digest))
    return out


class _Expander:
    def __init__(self) -> None:
        self.out = Expanded()
        self.resolve = _Resolver(self.out.links)
        self.seen: dict[str, Source] = {}
        self.archives: dict[str, Archive | None] = {}

    def add(self, source: Source) -> None:
        key = os.fspath(source.meta)
        if key not in self.seen or source.stream_hash is not None:
            self.seen[key] = source

    def problem(self, path: str, message: str) -> None:
        if (path, message) not in self.out.problems:  # an input named twice is refused once
            self.out.problems.append((path, message))

    def archive(self, path: str) -> Archive | None:
        """The listing of archive ``path`` (resolved), once; None (and a problem) if refused."""
        if path not in self.archives:
            try:
                self.archives[path] = open_archive(Path(path))
            except DataError as exc:
                self.archives[path] = None
                self.problem(path, str(exc))
        return self.archives[path]

    def add_archive(self, path: str, named: str, member: str | None = None) -> None:
        arc = self.archive(path)
        if arc is None:
            return
        hashes = self._archive_streams(arc)
        if member is not None:
            if member not in arc.members and member not in arc.refused:
                self.problem(f"{named}/{member}", f"{path}: no member {member!r}")
                return
            metas = [member]
        else:
            metas = arc.metas() + [n for n in arc.refused if n.endswith(META)]
            if not metas:
                self.problem(path, f"{path}: the archive holds no .sigmf-meta member")
        link = os.path.islink(named)
        for name in metas:
            meta = Path(path, name)
            if link:  # named through a symbolic link to the archive
                self.out.links[meta] = Path(named, name)
            self.add(Source(meta, arc, name, hashes.get(name)))

    def _archive_streams(self, arc: Archive) -> dict[str, str | None]:
        """The stream hashes of the archive's top-level collection, by metadata member name."""
        out: dict[str, str | None] = {}
        for name, member in arc.members.items():
            if "/" in name or not name.endswith(COLLECTION):
                continue
            try:
                streams = _stream_names(json.loads(arc.read(member)))
            except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                self.problem(f"{arc.path}/{name}", f"{arc.path}/{name}: {exc}")
                continue
            for stream, digest in streams:
                for meta in arc.metas():
                    if meta.rsplit("/", 1)[-1] == stream + META:
                        out[meta] = digest
        return out

    def add_collection(self, path: str) -> None:
        try:
            streams = _stream_names(json.loads(read_regular(path)))
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else exc
            self.problem(path, f"{path}: cannot be read as a SigMF collection ({why})")
            return
        folder = os.path.dirname(path)
        for i, (name, digest) in enumerate(streams):
            meta, archive = os.path.join(folder, name + META), os.path.join(folder, name + ARCHIVE)
            if os.path.isfile(meta):
                self.add(
                    Source(Path(self.resolve(meta)), stream_hash=digest, collection=Path(path))
                )
            elif os.path.isfile(archive):
                self.add_archive(self.resolve(archive), archive)
            else:
                self.problem(
                    path,
                    f"{path}: collection.core:streams[{i}]: {name!r} names no recording (no "
                    f"{META} or {ARCHIVE} of that name next to the collection)",
                )


def expand(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> Expanded:
    """The recordings ``paths`` name, sorted by path, with the problems of inputs that exist
    but cannot be read and the symbolic links they were named by."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    ex = _Expander()
    for entry in paths:
        for match, kind in _matches(os.fspath(entry)):
            if kind in COMPRESSED:
                ex.problem(match, compressed_hint(match, kind))
            elif kind == MEMBER:
                archive, member = _member_path(match) or ("", "")
                ex.add_archive(ex.resolve(archive), archive, member)
            elif kind == ARCHIVE:
                ex.add_archive(ex.resolve(match), match)
            elif kind == COLLECTION:
                ex.add_collection(ex.resolve(match))
            else:
                ex.add(Source(Path(ex.resolve(match))))
    order = sorted_as_paths(list(ex.seen))
    ex.out.sources = [ex.seen[p] for p in order]
    if not ex.out.sources and not ex.out.problems:
        shown = ", ".join(os.fspath(p) for p in paths)
        raise DataError(f"{shown}: no SigMF recordings found")
    return ex.out

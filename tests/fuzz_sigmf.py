"""Generated SigMF inputs and the one check every one of them must pass: the fuzz harness of the
SigMF reader and the Rust decoder (tests/unit/data/sigmf/test_fuzz.py; ``bash .ci/dev fuzz``).

A :class:`Case` is a set of files (metadata, datasets, ``.sigmf`` archives, collections, links)
written into a fresh directory, the inputs a data list names and the options of the dataset.
Cases are built valid (every sample known: :class:`Rec` holds what each capture segment reads)
and then, for most tests, mutated (a field deleted or mistyped, bytes flipped, an archive cut or
made hostile, a collection hash wrong); a mutated case's samples are no longer known.

:func:`run_case` writes a case and reads it every way a user can (``expand``, ``read_recording``,
``read_annotations``, ``IQDataset``, ``windows``, a ``TrainStream`` batch, ``content_digests``,
``verify_content``) and checks, whatever the input:

- it opens, and then every window equals numpy's reading of the same bytes (the bytes each
  recording's segments name, and for a valid case the samples the generator wrote, placed by
  the SigMF rules independently of the reader); or it raises DataError with one line per
  recording (a RecordingsRefused: a count, then one line each), or, for an option out of range,
  a ValueError naming it;
- nothing else is raised, and nothing is written: the case directory, the current directory
  (the case directory) and the temporary directory (redirected into the case) are unchanged.

Outcomes are counted in :data:`STATS` (cases, opened, refused, refusals by kind).
"""

from __future__ import annotations

import bz2
import contextlib
import copy
import faulthandler
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import re
import shutil
import tarfile
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from helpers import COMPONENT_DTYPES, as_read, snapshot
from hypothesis import strategies as st

from iqtrain.config.sections import SIGMF_DATATYPES

__all__ = [
    "STATS",
    "Case",
    "archive_cases",
    "collection_cases",
    "metadata_cases",
    "json_byte_cases",
    "data_and_input_cases",
    "run_case",
    "valid_cases",
]

#: What the cases did, for ``bash .ci/dev fuzz``: "cases", "opened", "refused", "refused kind:
#: <kind>" (one per refused recording or input), "outcome: <outcome>".
STATS: Counter[str] = Counter()

CANONICAL = list(SIGMF_DATATYPES)
#: Datatypes as people write them, with the name they read as: no byte order on a wider type
#: (read little-endian) and a byte order on a one-byte type (ignored).
ALIASES = {f"c{t}": f"c{t}_le" for t in ("i16", "u16", "i32", "u32", "f32", "f64")}
ALIASES |= {f"c{t}_{e}": f"c{t}" for t in ("i8", "u8") for e in ("le", "be")}
WRITTEN = CANONICAL + sorted(ALIASES)

META, DATA, ARCHIVE, COLLECTION = ".sigmf-meta", ".sigmf-data", ".sigmf", ".sigmf-collection"


# ------------------------------------------------------------------------------------ the model


@dataclass
class Rec:
    """One generated recording: its metadata object, its dataset's bytes and what it reads.

    ``segments``: the sample components each capture segment holds, already as iqtrain reads
    them (:func:`helpers.as_read` of the chosen channel); None once the recording is mutated."""

    stem: str
    meta: dict
    data: bytes
    datatype: str  # canonical
    channels: int
    dataset: str | None  # core:dataset (a non-conforming dataset), else None: STEM.sigmf-data
    segments: list[np.ndarray] | None
    annotations: list[tuple[int, int, str | None]]  # (start, count, label) as read

    def data_name(self) -> str:
        return self.dataset if self.dataset is not None else self.stem + DATA


@dataclass
class Link:
    """A symbolic link to ``target`` (as written: relative to the link's folder)."""

    target: str


@dataclass
class Special:
    """A directory (``"dir"``) where a file is expected."""

    kind: str


Content = bytes | Link | Special


@dataclass
class Case:
    """Files to write (path relative to the case directory: bytes, a link or a directory), the
    inputs of the data list (relative to the case directory, which is the current directory
    while it is read), the dataset's options, and for a valid case the recordings it must open
    (``expected``: the resolved metadata path relative to the case directory -> Rec; None when
    not known). ``oracle``: data name relative to the case directory -> the dataset's bytes, for
    the content digest."""

    files: dict[str, Content] = field(default_factory=dict)
    inputs: list[str] = field(default_factory=list)
    expected: dict[str, Rec] | None = field(default_factory=dict, repr=False)
    oracle: dict[str, bytes] = field(default_factory=dict, repr=False)
    channel: int | None = None
    window: int = 8
    stride: int = 8
    skip_invalid: bool = False
    map_min_bytes: int | None = None
    max_open_files: int | None = None
    batch_size: int = 3
    prefetch: int = 1
    kind: str = "valid"
    mutations: list[str] = field(default_factory=list)
    #: Every recording generated, by metadata path relative to the case (an archive member as
    #: ``ARCHIVE/MEMBER``), mutated or not.
    recs: dict[str, Rec] = field(default_factory=dict, repr=False)
    #: Collections written by collection_unit: file -> the metadata each stream names.
    collections: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def __repr__(self) -> str:
        """The files (metadata and collections shown, up to 3000 bytes; other files by length),
        the inputs and the options: what reproduces a failure by hand."""
        shown = {}
        for name, content in self.files.items():
            if isinstance(content, bytes) and not name.endswith((META, COLLECTION)):
                shown[name] = f"<{len(content)} bytes>"
            else:
                shown[name] = content[:3000] if isinstance(content, bytes) else content
        return (
            f"Case(kind={self.kind!r}, mutations={self.mutations!r}, inputs={self.inputs!r}, "
            f"channel={self.channel}, window={self.window}, stride={self.stride}, "
            f"skip_invalid={self.skip_invalid}, map_min_bytes={self.map_min_bytes}, "
            f"max_open_files={self.max_open_files}, batch_size={self.batch_size}, "
            f"prefetch={self.prefetch}, files={shown!r})"
        )

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # hypothesis prints this
        p.text(repr(self))

    def unknown(self, why: str) -> None:
        """The case no longer has known samples (a mutation: ``why``)."""
        self.expected = None
        self.mutations.append(why)


# ------------------------------------------------------------------------------ one recording


def _place(
    frames: bytes, frame: int, offset: int, starts: list[int], headers: list[bytes]
) -> bytes:
    """The dataset's bytes (before trailing bytes): capture ``i``'s header bytes lie just before
    its first sample (``starts[i]``, clamped to the samples), in capture order; the header
    bytes of a capture past the end follow the last sample."""
    n = len(frames) // frame
    out, at = [], 0
    for s, h in sorted(
        zip(starts, headers, strict=True), key=lambda sh: min(max(sh[0], offset), offset + n)
    ):
        f = min(max(s, offset), offset + n) - offset
        out.append(frames[at * frame : f * frame])
        out.append(h)
        at = f
    out.append(frames[at * frame :])
    return b"".join(out)


def _continues(prev: dict, cap: dict) -> bool:
    """The specification's rule, for the fields the generator writes: ``cap`` continues ``prev``
    when it has no header bytes, every field but its start is the same, and its global index (if
    any) advances by the samples between them."""
    if cap.get("core:header_bytes", 0):
        return False
    skip = {"core:sample_start", "core:global_index"}
    if {k: v for k, v in prev.items() if k not in skip} != {
        k: v for k, v in cap.items() if k not in skip
    }:
        return False
    a, b = prev.get("core:global_index"), cap.get("core:global_index")
    if (a is None) != (b is None):
        return False
    return a is None or b - a == cap["core:sample_start"] - prev["core:sample_start"]


def _boundaries(offset: int, n: int, captures: list[dict]) -> list[int]:
    """Where windows may not cross: the first and last sample, the first capture when samples
    precede it, and each capture that does not continue the capture before it (captures at or
    past the end are ignored; one before the first sample starts at it)."""
    end = offset + n
    cuts = {offset, end}
    prev = None
    for cap in captures:
        start = cap["core:sample_start"]
        if start >= end:
            continue
        if prev is None or not _continues(prev, cap):
            cuts.add(max(start, offset))
        prev = cap
    return sorted(cuts)


def _components(raw: bytes, datatype: str, channels: int, channel: int) -> np.ndarray:
    """numpy's reading of ``raw`` (whole frames): channel ``channel``'s components as read."""
    comp = COMPONENT_DTYPES[datatype]
    frames = np.frombuffer(raw, comp).reshape(-1, channels, 2)[:, channel]
    with np.errstate(over="ignore", invalid="ignore"):
        return as_read(frames, datatype)


_FREQS = (915e6, 2.4e9)


def captures_for(rng: random.Random, offset: int, n: int, count: int) -> list[dict]:
    """``count`` sorted captures: in the samples, before ``offset``, at or past the end, equal
    starts; with header bytes, a global index that continues or jumps, one of two frequencies."""
    end = offset + n
    where = [
        lambda: rng.randint(offset, max(offset, end - 1)),
        lambda: offset,
        lambda: rng.randint(end, end + 9),
    ]
    if offset:
        where.append(lambda: rng.randint(max(0, offset - 20), offset - 1))
    starts = sorted(rng.choice(where)() for _ in range(count))
    index = rng.choice(["none", "continues", "jumps"])
    base = rng.randint(0, 10**6)
    out = []
    for i, s in enumerate(starts):
        cap: dict[str, Any] = {"core:sample_start": s}
        if rng.random() < 0.5:
            cap["core:frequency"] = rng.choice(_FREQS)
        if rng.random() < 0.25:
            cap["core:header_bytes"] = rng.randint(0, 12)
        if index != "none":
            cap["core:global_index"] = base + s + (7 * i if index == "jumps" else 0)
        out.append(cap)
    return out


def _frames(rng: random.Random, datatype: str, n: int, channels: int) -> bytes:
    """``n`` frames: any bytes (NaN, infinities, subnormals and -0.0 among floats), or values
    drawn over the type's range."""
    frame = channels * SIGMF_DATATYPES[datatype].bytes_per_sample
    gen = np.random.default_rng(rng.getrandbits(64))
    if rng.random() < 0.5:
        return gen.integers(0, 256, n * frame, dtype=np.uint8).tobytes()
    comp = COMPONENT_DTYPES[datatype]
    if comp.kind == "f":
        return gen.standard_normal(n * channels * 2).astype(comp).tobytes()
    info = np.iinfo(comp)
    return gen.integers(info.min, info.max, n * channels * 2, endpoint=True).astype(comp).tobytes()


@st.composite
def recordings(draw, stem: str, channel: int | None) -> Rec:
    """One valid recording with known samples (see the module docstring). The structure is
    drawn (datatype, channels, samples, offset, captures); the rest comes from a drawn seed."""
    written = draw(st.sampled_from(WRITTEN))
    datatype = ALIASES.get(written, written)
    channels = 1 if channel is None else draw(st.integers(channel + 1, 3))
    n = draw(st.integers(0, 96))
    # up to near the schema's largest index (captures past the end stay below 2**63)
    offset = draw(st.sampled_from([0, 0, 7, 1000, 2**40 + 3, 2**63 - 200]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    captures = captures_for(rng, offset, n, draw(st.integers(0, 4)))
    glob: dict[str, Any] = {"core:datatype": written}
    glob["core:version"] = rng.choice(["1.2.0", "1.0.0", "1.2.3", "1.0"])
    if channels > 1 or rng.random() < 0.5:
        glob["core:num_channels"] = channels
    if offset or rng.random() < 0.5:
        glob["core:offset"] = offset
    trailing = rng.choice([None, 0, 1, 5, 12])
    if trailing is not None:
        glob["core:trailing_bytes"] = trailing
    rate = rng.choice([None, 1e6, 48000, 2.5e-3])
    if rate is not None:
        glob["core:sample_rate"] = rate
    frames = _frames(rng, datatype, n, channels)
    frame = channels * SIGMF_DATATYPES[datatype].bytes_per_sample
    headers = [rng.randbytes(c.get("core:header_bytes", 0)) for c in captures]
    data = _place(frames, frame, offset, [c["core:sample_start"] for c in captures], headers)
    data += rng.randbytes(trailing or 0)
    dataset = None
    if rng.random() < 0.25:
        dataset = stem + rng.choice([".cu8", ".raw", ".bin", ".iq"])
        glob["core:dataset"] = dataset
    elif rng.random() < 0.15:
        glob["core:metadata_only"] = rng.random() < 0.5
    if rng.random() < 0.25:
        digest = hashlib.sha512(data).hexdigest()
        glob["core:sha512"] = digest.upper() if rng.random() < 0.5 else digest
    if rng.random() < 0.2:
        glob["core:author"] = rng.choice(["x", "é", ""])
    meta: dict[str, Any] = {"global": glob}
    if captures or rng.random() < 0.5:
        meta["captures"] = captures
    annotations = annotations_for(rng, offset, n)
    if annotations or rng.random() < 0.5:
        meta["annotations"] = [a for a, _ in annotations]
    if rng.random() < 0.15:
        meta["x-extension"] = {"anything": [1, 2]}
    read = _components(frames, datatype, channels, channel or 0)
    cuts = _boundaries(offset, n, captures)
    segments = [read[a - offset : b - offset] for a, b in zip(cuts, cuts[1:], strict=False)]
    return Rec(stem, meta, data, datatype, channels, dataset, segments, [r for _, r in annotations])


def annotations_for(
    rng: random.Random, offset: int, n: int
) -> list[tuple[dict, tuple[int, int, str | None]]]:
    """0-3 annotations inside the samples, sorted by start, with or without a count and a label;
    each with what read_annotations reads of it."""
    end = offset + n
    out = []
    for s in sorted(rng.randint(offset, end) for _ in range(rng.randint(0, 3))):
        ann: dict[str, Any] = {"core:sample_start": s}
        count = end - s
        if rng.random() < 0.5:
            count = rng.randint(0, end - s)
            ann["core:sample_count"] = count
        label = rng.choice([None, "bpsk", "qpsk", "", " ", "ÄÖ", "a.b"])
        if label is not None:
            ann["core:label"] = label
        if rng.random() < 0.25:
            ann["signal:detail"] = {"mod_class": "psk", "order": rng.randint(0, 9)}
        out.append((ann, (s, count, label)))
    return out


def meta_bytes(rec: Rec) -> bytes:
    return json.dumps(rec.meta, indent=1, ensure_ascii=False).encode()


# ------------------------------------------------------------------------------------ units


_STEMS = st.sampled_from(["rec", "a", "b-c", "b", "x y", "ünï", "r.1", "0"])


@st.composite
def _unique_stems(draw, count: int) -> list[str]:
    """``count`` file stems, unique (each ends in its index)."""
    return [f"{draw(_STEMS)}{i}" for i in range(count)]


def _tar_bytes(members: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for m in members:
            if isinstance(m, tuple):
                info, data = m
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(m)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime, info.mode = kind, link, 1_700_000_000, 0o644
    return info


@dataclass
class ArchiveSpec:
    """An archive being built: its members in order (name, bytes; None for a directory) and the
    recordings in it (metadata member -> Rec)."""

    name: str
    members: list[tuple[str, bytes | None]]
    recs: dict[str, Rec]
    fmt: int


def _twin(rec: Rec, shift: int) -> Rec:
    """A second recording of ``rec``'s non-conforming dataset: the same samples, its indices
    ``shift`` later (core:offset, captures and annotations moved together)."""
    meta = copy.deepcopy(rec.meta)
    glob = meta["global"]
    glob["core:offset"] = glob.get("core:offset", 0) + shift
    for key in ("captures", "annotations"):
        for item in meta.get(key, []):
            item["core:sample_start"] += shift
    anns = [(s + shift, n, label) for s, n, label in rec.annotations]
    return Rec(rec.stem + "-twin", meta, rec.data, rec.datatype, rec.channels, rec.dataset,
               rec.segments, anns)  # fmt: skip


@st.composite
def loose_unit(draw, case: Case, channel: int | None) -> None:
    """1-3 loose recordings (in the case folder or a subfolder), named one by one, by a glob or
    through a symbolic link."""
    folder = draw(st.sampled_from(["", "sub/", "d e/", "deep/er/"]))
    for stem in draw(_unique_stems(draw(st.integers(1, 3)))):
        rec = draw(recordings(stem, channel))
        rel = f"{folder}{stem}{META}"
        if rel in case.recs:
            continue
        case.recs[rel] = rec
        case.files[rel] = meta_bytes(rec)
        case.files[folder + rec.data_name()] = rec.data
        if rec.dataset is not None and draw(st.booleans()):
            case.files[f"{folder}{stem}{DATA}"] = b"\x01" * 8  # beside it, not read (a note)
        assert case.expected is not None
        case.expected[rel] = rec
        case.oracle[folder + rec.data_name()] = rec.data
        if rec.dataset is not None and draw(st.integers(0, 3)) == 0:
            shift = draw(st.sampled_from([1, 1000, 2**40]))
            big = rec.meta["global"].get("core:offset", 0) > 2**62  # stay below 2**63
            twin = _twin(rec, -shift if big else shift)
            case.recs[f"{folder}{twin.stem}{META}"] = twin
            case.expected[f"{folder}{twin.stem}{META}"] = twin
            case.files[f"{folder}{twin.stem}{META}"] = meta_bytes(twin)
            case.inputs.append(f"@/{folder}{twin.stem}{META}")
        how = draw(st.sampled_from(["path", "relative", "link", "glob"]))
        if how == "link":
            link = f"{folder}{stem}-link{META}"
            case.files[link] = Link(f"{stem}{META}")
            case.inputs.append(link)
        elif how == "glob":
            case.inputs.append(f"{folder}*{META}")
        else:
            case.inputs.append(rel if how == "relative" else "@/" + rel)


@st.composite
def archive_unit(draw, case: Case, channel: int | None) -> ArchiveSpec:
    """A ``.sigmf`` archive of 1-3 recordings in folders (sometimes with a top-level collection
    naming them with their hashes, a README and directory members), named whole, member by
    member, or by a glob."""
    name = draw(st.sampled_from(["arc", "set-1", "ü"])) + str(len(case.files)) + ARCHIVE
    case.files[name] = b""  # the name taken (the archive is written by finish)
    fmt = draw(st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT, tarfile.USTAR_FORMAT]))
    members: list[tuple[str, bytes | None]] = []
    recs: dict[str, Rec] = {}
    for stem in draw(_unique_stems(draw(st.integers(1, 3)))):
        rec = draw(recordings(stem, channel))
        folder = draw(st.sampled_from([f"{stem}/", "", "x/y/", "./"]))
        meta_name, data_name = folder + stem + META, folder + rec.data_name()
        clean = meta_name.removeprefix("./")
        if clean in recs or any(clean == m.removeprefix("./") for m, _ in members):
            continue
        pair = [(meta_name, meta_bytes(rec)), (data_name, rec.data)]
        members += pair if draw(st.booleans()) else pair[::-1]
        recs[clean] = rec
    if draw(st.integers(0, 3)) == 0:
        members.insert(draw(st.integers(0, len(members))), ("README.txt", b"hello\n"))
    if draw(st.integers(0, 3)) == 0:
        members.insert(0, ("x/", None))
    if draw(st.integers(0, 3)) == 0:
        streams = [
            {"name": m.rsplit("/", 1)[-1][: -len(META)], "hash": hashlib.sha512(
                meta_bytes(r)).hexdigest()}
            for m, r in recs.items()
        ]  # fmt: skip
        coll = {"collection": {"core:version": "1.2.0", "core:streams": streams}}
        members.append(("index" + COLLECTION, json.dumps(coll).encode()))
    spec = ArchiveSpec(name, members, recs, fmt)
    for member, rec in recs.items():
        assert case.expected is not None
        case.expected[f"{name}/{member}"] = rec
        case.recs[f"{name}/{member}"] = rec
        folder = member.rpartition("/")[0]
        case.oracle[f"{name}/{folder + '/' if folder else ''}{rec.data_name()}"] = rec.data
    how = draw(st.sampled_from(["whole", "members", "glob", "link"]))
    if how == "members":
        case.inputs += [f"@/{name}/{m}" for m in recs]
    elif how == "glob":
        case.inputs.append("*" + ARCHIVE)
    elif how == "link":
        case.files["link-" + name] = Link(name)
        case.inputs.append("link-" + name)
    else:
        case.inputs.append(name)
    return spec


def build_archive(spec: ArchiveSpec) -> bytes:
    infos: list[tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]] = []
    for name, data in spec.members:
        if data is None:
            infos.append(_info(name, tarfile.DIRTYPE))
        else:
            infos.append((_info(name), data))
    return _tar_bytes(infos, spec.fmt)


@st.composite
def collection_unit(draw, case: Case, channel: int | None) -> None:
    """A ``.sigmf-collection`` naming loose recordings beside it (with their SHA-512, or none)
    in either stream form."""
    stems = draw(_unique_stems(draw(st.integers(1, 3))))
    forms = []
    for stem in stems:
        stem = "c" + stem
        rec = draw(recordings(stem, channel))
        rel = stem + META
        if rel in case.recs:
            continue
        case.recs[rel] = rec
        case.files[rel] = meta_bytes(rec)
        case.files[rec.data_name()] = rec.data
        assert case.expected is not None
        case.expected[rel] = rec
        case.oracle[rec.data_name()] = rec.data
        forms.append((rel, draw(st.sampled_from(["object", "object-nohash", "pair"]))))
    name = "set" + str(len(case.files)) + COLLECTION
    case.collections[name] = [rel for rel, _ in forms]
    case.files[name] = _collection(case, forms)
    case.inputs.append(name)


def _collection(case: Case, forms: list[tuple[str, str]]) -> bytes:
    """A collection of the loose recordings ``forms`` names (metadata path, stream form), with
    the SHA-512 of their metadata as written now."""
    streams: list[Any] = []
    for rel, form in forms:
        stem = rel[: -len(META)]
        meta = case.files[rel]
        digest = hashlib.sha512(meta if isinstance(meta, bytes) else b"").hexdigest()
        if form == "pair":
            streams.append([stem, digest])
        else:
            streams.append({"name": stem, **({"hash": digest} if form == "object" else {})})
    return json.dumps({"collection": {"core:version": "1.2.0", "core:streams": streams}}).encode()


def rehash(case: Case) -> None:
    """Every collection_unit collection written again with the hashes of its streams' metadata
    as it is now (after a mutation), so that the mutation is what the reader meets."""
    for name, rels in case.collections.items():
        forms = []
        for i, s in enumerate(json.loads(case.files[name])["collection"]["core:streams"]):  # type: ignore[arg-type]
            form = "pair" if isinstance(s, list) else "object" if "hash" in s else "object-nohash"
            forms.append((rels[i], form))
        case.files[name] = _collection(case, forms)


@dataclass
class Built:
    """A valid case with its archives still as specs (the archive mutations edit those)."""

    case: Case
    archives: list[ArchiveSpec]


@st.composite
def built_cases(draw, *, archives: bool | None = None) -> Built:
    """A valid case of 1-3 units (loose recordings, archives, collections) and the options."""
    channel = draw(st.sampled_from([None, None, 0, 1, 2]))
    case = Case(channel=channel)
    specs: list[ArchiveSpec] = []
    units = draw(st.lists(st.sampled_from(["loose", "archive", "collection"]), min_size=1,
                          max_size=3))  # fmt: skip
    if archives:
        units.append("archive")
    for unit in units:
        if unit == "loose":
            draw(loose_unit(case, channel))
        elif unit == "archive" and archives is not False:
            specs.append(draw(archive_unit(case, channel)))
        else:
            draw(collection_unit(case, channel))
    if draw(st.integers(0, 4)) == 0:
        case.inputs = ["**/*"]  # everything (a recursive glob)
    elif draw(st.integers(0, 5)) == 0:
        case.inputs.append(case.inputs[0])  # named twice: read once
    case.window = draw(st.sampled_from([1, 2, 3, 5, 8, 16, 33]))
    case.stride = draw(st.sampled_from([None, 1, 2, 7, case.window])) or case.window
    case.skip_invalid = draw(st.booleans())
    case.map_min_bytes = draw(st.sampled_from([None, 0, 1, 4096, 2**64 - 1]))
    case.max_open_files = draw(st.sampled_from([None, None, 1, 2]))
    case.batch_size = draw(st.integers(1, 5))
    case.prefetch = draw(st.integers(0, 2))
    return Built(case, specs)


def finish(built: Built) -> Case:
    """The case with its archives written into its files."""
    for spec in built.archives:
        built.case.files[spec.name] = build_archive(spec)
    return built.case


@st.composite
def valid_cases(draw) -> Case:
    return finish(draw(built_cases()))


# ------------------------------------------------------------------------------- mutations

#: Values of the wrong kind, or at the edges of the right one.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 3, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**70, -(2**64),
    0.5, 1.0, -0.0, 1e308, 1e-310, float("inf"), float("-inf"), float("nan"), "", "x", "1",
    "ci16_le", "cf32_le", "rf32_le", "ci16_lex", "../x", "/etc/passwd", "a\nb", "\x00", [], [1],
    [{}], {}, {"core:sample_start": 0}, "é" * 200,
]  # fmt: skip

GLOBAL_KEYS = [
    "core:datatype", "core:num_channels", "core:offset", "core:trailing_bytes", "core:dataset",
    "core:metadata_only", "core:sha512", "core:sample_rate", "core:version", "core:author",
    "core:description", "core:extensions", "core:collection", "core:hw", "core:geolocation",
    "core:recorder", "core:license", "x-unknown",
]  # fmt: skip
CAPTURE_KEYS = [
    "core:sample_start", "core:header_bytes", "core:global_index", "core:datetime",
    "core:frequency", "x-unknown",
]  # fmt: skip
ANNOTATION_KEYS = [
    "core:sample_start", "core:sample_count", "core:label", "core:freq_lower_edge",
    "core:freq_upper_edge", "core:comment", "signal:detail", "x-unknown",
]  # fmt: skip


@st.composite
def _order(draw, meta: dict, action: str) -> str:
    """Captures or annotations out of order ("unsort"), or all at one start ("equal")."""
    key = draw(st.sampled_from(["captures", "annotations"]))
    items = meta.get(key)
    if not isinstance(items, list) or len(items) < 2:
        items = meta[key] = [{"core:sample_start": 5}, {"core:sample_start": 1}]
    if action == "unsort":
        items.reverse()
    else:
        first = items[0].get("core:sample_start") if isinstance(items[0], dict) else 0
        for item in items:
            if isinstance(item, dict):
                item["core:sample_start"] = first
    return f"{action} {key}"


@st.composite
def _deep(draw, meta: dict, action: str) -> str:
    """A value nested deeper than the parser, or a repr, may follow (a marker, replaced by the
    nested brackets once the metadata is serialised: json.dumps would recurse as deep)."""
    key = draw(st.sampled_from(["core:sample_rate", "core:extensions", "x-unknown"]))
    depth = draw(st.sampled_from([100, 500, 800, 950, 1200]))
    where = draw(st.sampled_from(["global", "captures", "annotations"]))
    items = meta.get(where)
    target = items if where == "global" else items[0] if isinstance(items, list) and items else None
    if isinstance(target, dict):
        target[key if where == "global" else "core:sample_start"] = f"__DEEP_{depth}__"
    return f"deep {where}"


@st.composite
def _top(draw, meta: dict, action: str) -> str:
    """A top-level member deleted or given an odd value."""
    key = draw(st.sampled_from(["global", "captures", "annotations", "x-top"]))
    if draw(st.booleans()) and key in meta:
        del meta[key]
        return f"delete {key}"
    meta[key] = draw(st.sampled_from(ODD_VALUES))
    return f"set {key}"


_DATETIMES = [
    "2024-01-01T00:00:00Z", "2024-01-01T00:00:00.5+01:00", "2024-13-45T99:00:00Z",
    "2024-01-01 00:00:00", 1700000000, "garbage",
]  # fmt: skip


@st.composite
def _datetimes(draw, meta: dict, action: str) -> str:
    """Every capture given a ``core:datetime`` (whether they continue each other then depends
    on the sample rate; some cannot be parsed)."""
    caps = meta.setdefault("captures", [])
    for cap in caps if isinstance(caps, list) else []:
        if isinstance(cap, dict):
            cap["core:datetime"] = draw(st.sampled_from(_DATETIMES))
    return "datetimes"


@st.composite
def _big(draw, meta: dict, action: str) -> str:
    """A global count at or past what 64 bits hold."""
    key = draw(st.sampled_from(["core:offset", "core:num_channels", "core:trailing_bytes"]))
    glob = meta.get("global")
    if isinstance(glob, dict):
        glob[key] = draw(st.sampled_from([2**62, 2**63, 2**64 - 1, 2**64, 10**30, 10**6]))
    return f"big {key}"


@st.composite
def _field(draw, meta: dict, action: str) -> str:
    """One field of the global object, a capture or an annotation deleted ("delete") or given
    an odd value ("set")."""
    where = draw(st.sampled_from(["global", "captures", "annotations"]))
    if where == "global":
        target, keys = meta.get("global"), GLOBAL_KEYS
    else:
        items = meta.get(where)
        if not isinstance(items, list) or not items:
            items = meta[where] = [{"core:sample_start": 0}]
        i = draw(st.integers(0, len(items) - 1))
        target, keys = items[i], CAPTURE_KEYS if where == "captures" else ANNOTATION_KEYS
    if not isinstance(target, dict):
        return "noop"
    key = draw(st.sampled_from(keys))
    if action == "delete":
        target.pop(key, None)
        return f"delete {where}.{key}"
    target[key] = draw(st.sampled_from(ODD_VALUES))
    return f"set {where}.{key}"


_METADATA_MUTATIONS = {
    "set": _field, "delete": _field, "top": _top, "datetime": _datetimes, "big": _big,
    "unsort": _order, "equal": _order, "deep": _deep,
}  # fmt: skip


@st.composite
def mutate_metadata(draw, meta: dict) -> str:
    """One field-level change to ``meta`` (in place); returns what it did."""
    action = draw(st.sampled_from(["set", "set", *_METADATA_MUTATIONS]))
    return draw(_METADATA_MUTATIONS[action](meta, action))


@st.composite
def mutate_json(draw, raw: bytes) -> tuple[bytes, str]:
    """One byte-level change to a metadata file's bytes."""
    action = draw(
        st.sampled_from(
            ["flip", "insert", "delete", "truncate", "bom", "latin1", "nest", "digits", "empty",
             "dupkey", "trail"]
        )
    )  # fmt: skip
    n = len(raw)
    at = draw(st.integers(0, max(n - 1, 0)))
    if action == "flip" and n:
        b = bytearray(raw)
        b[at] ^= draw(st.integers(1, 255))
        return bytes(b), action
    if action == "insert":
        junk = draw(st.sampled_from([b",", b"}", b"]", b"\"", b"\\", b"\xff", b"\x00", b"-", b"1e9",
                                     b"NaN", b"Infinity", b"null", b"{}", b"[]"]))  # fmt: skip
        return raw[:at] + junk + raw[at:], action
    if action == "delete":
        return raw[:at] + raw[at + draw(st.integers(1, 20)) :], action
    if action == "truncate":
        return raw[:at], action
    if action == "bom":
        return b"\xef\xbb\xbf" + raw, action
    if action == "latin1":
        return raw.replace(b'"core:', b'"c\xe9re:', 1), action
    if action == "nest":
        depth = draw(st.sampled_from([10, 1000, 100_000]))
        return raw.replace(b"{", b'{"deep": ' + b"[" * depth + b"]" * depth + b", ", 1), action
    if action == "digits":
        return raw.replace(b'"core:sample_start": 0', b'"core:sample_start": ' + b"9" * 5000, 1)\
            .replace(b"{", b'{"core:offset": ' + b"1" * 5000 + b", ", 1), action  # fmt: skip
    if action == "dupkey":
        return raw.replace(b"{", b'{"global": 1, ', 1), action
    if action == "trail":
        return raw + draw(st.sampled_from([b"\n", b" x", b"{}", b"\x00"])), action
    return b"", "empty"


@st.composite
def metadata_cases(draw) -> Case:
    """A valid case with 1-3 field-level changes to one recording's metadata (loose or in an
    archive)."""
    built = draw(built_cases())
    case = built.case
    target = draw(st.sampled_from(sorted(case.recs)))
    rec = case.recs[target]
    rec.meta = copy.deepcopy(rec.meta)
    for _ in range(draw(st.integers(1, 3))):
        case.unknown(draw(mutate_metadata(rec.meta)))
    raw = json.dumps(rec.meta, allow_nan=True).encode()
    raw = re.sub(rb'"__DEEP_(\d+)__"', lambda m: b"[" * int(m[1]) + b"]" * int(m[1]), raw)
    _rewrite_meta(built, target, raw)
    if draw(st.integers(0, 3)):
        rehash(case)
    case.kind = "metadata"
    return finish(built)


@st.composite
def json_byte_cases(draw) -> Case:
    """A valid case with byte-level changes to one recording's metadata file."""
    built = draw(built_cases())
    case = built.case
    target = draw(st.sampled_from(sorted(case.recs)))
    raw = meta_bytes(case.recs[target])
    for _ in range(draw(st.integers(1, 2))):
        raw, what = draw(mutate_json(raw))
        case.unknown(what)
    _rewrite_meta(built, target, raw)
    if draw(st.integers(0, 3)):
        rehash(case)
    case.kind = "json bytes"
    return finish(built)


def _rewrite_meta(built: Built, target: str, raw: bytes) -> None:
    """Replace the metadata bytes of recording ``target`` (a loose file or an archive member)."""
    case = built.case
    if target in case.files:
        case.files[target] = raw
        return
    name, _, member = target.partition("/")
    for spec in built.archives:
        if spec.name == name:
            spec.members = [
                (m, raw if m.removeprefix("./") == member else d) for m, d in spec.members
            ]


def _compressed(raw: bytes, how: str) -> bytes:
    if how == "gzip":
        return gzip.compress(raw, mtime=0)
    if how == "xz":
        return lzma.compress(raw)
    return bz2.compress(raw)


@st.composite
def archive_cases(draw) -> Case:
    """A valid case with at least one archive, then changes to an archive: cut at a random byte,
    garbage written or appended, a member renamed with '..' or an absolute path, a link or
    special member where a SigMF file is, a member listed twice, the whole compressed."""
    built = draw(built_cases(archives=True))
    case = built.case
    spec = draw(st.sampled_from(built.archives))
    case.kind = "archive"
    action = draw(
        st.sampled_from(
            ["truncate", "garbage", "append", "rename", "symlink", "hardlink", "special",
             "duplicate", "compress", "compress-named", "empty", "not-sigmf", "odd-names",
             "long-names", "sparse", "pax-size"]
        )
    )  # fmt: skip
    case.unknown(f"archive {action}")
    if action in ("rename", "symlink", "hardlink", "special", "duplicate", "odd-names",
                  "long-names", "empty", "not-sigmf", "sparse", "pax-size"):  # fmt: skip
        case.files[spec.name] = draw(_hostile_tar(spec, action))
    else:
        raw = build_archive(spec)
        n = len(raw)
        if action == "truncate":
            raw = raw[: draw(st.integers(0, n - 1))]
        elif action == "garbage":
            b = bytearray(raw)
            for _ in range(draw(st.integers(1, 4))):
                at = draw(st.integers(0, n - 1))
                b[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
            raw = bytes(b)
        elif action == "append":
            raw += draw(st.sampled_from([b"x", bytes(512), build_archive(spec), b"\xff" * 700]))
        elif action == "compress":
            raw = _compressed(raw, draw(st.sampled_from(["gzip", "xz", "bz2"])))
        else:  # compressed, and named so
            how = draw(st.sampled_from(["gzip", "xz", "bz2"]))
            suffix = {"gzip": ".gz", "xz": ".xz", "bz2": ".bz2"}[how]
            case.files[spec.name + suffix] = _compressed(raw, how)
            case.inputs = [i.replace(spec.name, spec.name + suffix) for i in case.inputs]
            case.inputs.append(spec.name + suffix)
        case.files[spec.name] = raw
    built.archives.remove(spec)
    return finish(built)


@st.composite
def _hostile_member(draw, infos: list, k: int, action: str) -> int | None:
    """Member ``k`` of ``infos`` made hostile or unusual (in place); the tar format it needs,
    if any."""
    info, data = infos[k]
    if action == "rename":
        info.name = draw(st.sampled_from(["../", "/", "/tmp/", "a/../../", "./../"])) + info.name
    elif action in ("symlink", "hardlink", "special"):
        kind = {"symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}.get(
            action, draw(st.sampled_from([tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.DIRTYPE]))
        )
        target = draw(st.sampled_from(["/etc/passwd", "../x", info.name, "other"]))
        infos[k] = _info(info.name, kind, target)
    elif action == "duplicate":
        infos.insert(draw(st.integers(0, len(infos))), (_info(info.name), data[::-1] or b"x"))
    elif action == "pax-size":  # a PAX size other than the header's and the data's
        sizes = ["0", "1", "513", "99999999", "-1", "x", str(2**64)]
        info.pax_headers = {"size": draw(st.sampled_from(sizes))}
        return tarfile.PAX_FORMAT
    elif action == "sparse":
        infos[k] = (_info(info.name, tarfile.GNUTYPE_SPARSE), data)
        return tarfile.GNU_FORMAT
    return None


_WEIRD = ["a\nb", "sp ace", "tab\t", "ü/ñ", "a//b", "a/./b", "\\x", "-", "C:", "a" * 150, "é" * 60]


@st.composite
def _hostile_tar(draw, spec: ArchiveSpec, action: str) -> bytes:
    """The archive of ``spec`` with one hostile or unusual member, or unusual names."""
    infos: list[Any] = []
    for name, data in spec.members:
        infos.append(_info(name, tarfile.DIRTYPE) if data is None else (_info(name), data))
    files = [i for i, m in enumerate(infos) if isinstance(m, tuple)]
    fmt = spec.fmt
    if action in ("odd-names", "long-names"):
        folder = draw(st.sampled_from(_WEIRD)) if action == "odd-names" else "L" * 120
        if action == "long-names":
            fmt = draw(st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
        for i in files:
            info, data = infos[i]
            infos[i] = (_info(f"{folder}/{info.name}"), data)
    elif action == "empty":
        infos = []
    elif action == "not-sigmf":
        infos = [(_info("notes.txt"), b"x"), _info("d/", tarfile.DIRTYPE)]
    elif files:
        fmt = draw(_hostile_member(infos, draw(st.sampled_from(files)), action)) or fmt
    return _tar_bytes(infos, fmt)


@st.composite
def _edit_stream(draw, streams: list, action: str) -> None:
    """One stream's hash made wrong ("hash") or of the wrong type ("hash-type"), or its name
    made one that is not a recording's name beside the collection ("name")."""
    s = streams[draw(st.integers(0, len(streams) - 1))]
    if action == "name":
        value = draw(
            st.sampled_from(ODD_VALUES + ["../up", "/abs", "a/", ".", "a\\..\\b", "sub/x"])
        )
    elif action == "hash":
        value = draw(st.sampled_from(["0" * 128, "", "zz", "A" * 128]))
    else:
        value = draw(st.sampled_from(ODD_VALUES))
    if isinstance(s, dict):
        s["name" if action == "name" else "hash"] = value
    elif isinstance(s, list) and len(s) == 2:
        s[0 if action == "name" else 1] = value


@st.composite
def collection_cases(draw) -> Case:
    """A valid case with a collection, then its streams changed: a hash wrong or of the wrong
    type, a stream missing or named outside its folder, the JSON broken."""
    built = draw(built_cases())
    case = built.case
    draw(collection_unit(case, case.channel))
    name = [f for f in case.files if f.endswith(COLLECTION)][-1]
    coll = json.loads(case.files[name])  # type: ignore[arg-type]
    streams = coll["collection"]["core:streams"]
    action = draw(st.sampled_from(["hash", "hash-type", "missing", "name", "json", "shape",
                                   "archive-stream", "empty"]))  # fmt: skip
    case.kind = "collection"
    case.unknown(f"collection {action}")
    if action == "shape":
        where = draw(st.sampled_from(["streams", "collection", "root", "stream"]))
        odd = draw(st.sampled_from(ODD_VALUES))
        if where == "streams":
            coll["collection"]["core:streams"] = odd
        elif where == "collection":
            coll["collection"] = odd
        elif where == "root":
            coll = odd
        elif streams:
            streams[draw(st.integers(0, len(streams) - 1))] = odd
    elif action == "missing":
        streams.append({"name": draw(st.sampled_from(["gone", "sub/gone", "rec"])), "hash": "0"})
    elif action == "archive-stream" and built.archives:
        arc = built.archives[0].name
        streams.append({"name": arc[: -len(ARCHIVE)], "hash": "0" * 128})
    elif action == "empty":
        coll["collection"]["core:streams"] = []
    elif action in ("hash", "hash-type", "name") and streams:
        draw(_edit_stream(streams, action))
    raw = json.dumps(coll, allow_nan=True).encode()
    if action == "json":
        raw, _ = draw(mutate_json(raw))
    case.files[name] = raw
    return finish(built)


@st.composite
def data_and_input_cases(draw) -> Case:
    """A valid case, then its datasets, files or options changed: a dataset cut, grown or
    removed, a directory or a dangling link where a file is; inputs that name nothing, a
    directory, a data file, a missing member; odd options."""
    built = draw(built_cases())
    case = built.case
    case.kind = "data and inputs"
    action = draw(st.sampled_from(["cut", "grow", "remove", "dir", "dangling", "inputs",
                                   "options", "meta-dir", "swap"]))  # fmt: skip
    case.unknown(f"data {action}")
    loose = [r for r in case.recs if r in case.files]
    if action in ("cut", "grow", "remove", "dir", "dangling", "swap") and loose:
        target = draw(st.sampled_from(loose))
        folder = target.rpartition("/")[0]
        data = (folder + "/" if folder else "") + case.recs[target].data_name()
        old = case.files.get(data)
        if action == "cut" and isinstance(old, bytes):
            case.files[data] = old[: draw(st.integers(0, max(len(old) - 1, 0)))]
        elif action == "grow" and isinstance(old, bytes):
            case.files[data] = old + draw(st.binary(min_size=1, max_size=9))
        elif action == "remove":
            case.files.pop(data, None)
        elif action == "dir":
            case.files[data] = Special("dir")
        elif action == "dangling":
            case.files[data] = Link("nowhere" + DATA)
        else:  # another recording's dataset under this name
            others = [v for k, v in case.files.items() if k != data and isinstance(v, bytes)]
            case.files[data] = draw(st.sampled_from(others)) if others else b""
    elif action == "meta-dir":
        case.files["dir" + META] = Special("dir")
        case.files["dir" + ARCHIVE] = Special("dir")
        case.inputs.append("*" + draw(st.sampled_from([META, ARCHIVE])))
    elif action == "inputs":
        odd = draw(st.sampled_from([
            "nothing*.sigmf-meta", "missing.sigmf-meta", "sub", ".", "x.sigmf-data", "*.txt",
            "@/missing.sigmf", "missing.sigmf/a/a.sigmf-meta", "**/*.sigmf-data", "",
            "a.sigmf.gz", "*.sigmf-collection", "[", "*" + DATA,
        ]))  # fmt: skip
        archives = [f for f in case.files if f.endswith(ARCHIVE)]
        if archives and draw(st.booleans()):
            odd = f"{archives[0]}/{draw(st.sampled_from(['no/such.sigmf-meta', 'x', '']))}"
        if odd in ("sub", "a.sigmf.gz") and odd not in case.files:
            case.files[odd + "/keep" if odd == "sub" else odd] = b"x"
        case.inputs.append(odd)
    else:
        case.channel = draw(st.sampled_from([None, 0, 1, 2, 5, -1, 2**64]))
        case.window = draw(st.sampled_from([case.window, 0, -1, 10**6, 2**63]))
        case.stride = draw(st.sampled_from([case.stride, 0, 10**9]))
    return finish(built)


# --------------------------------------------------------------------------------- running


def _write(root: Path, files: dict[str, Content]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Link):
            if not os.path.lexists(path):
                os.symlink(content.target, path)
        elif isinstance(content, Special):
            path.mkdir(exist_ok=True)
        elif not path.is_dir():
            path.write_bytes(content)


@contextlib.contextmanager
def isolated(root: Path) -> Iterator[Path]:
    """The case directory as the current directory, with ``TMPDIR``, ``tempfile``'s directory,
    ``HOME`` and ``XDG_CACHE_HOME`` inside ``root`` (so whatever is written shows in the
    snapshot)."""
    case, tmp = root / "case", root / "tmp"
    case.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    saved_env = {k: os.environ.get(k) for k in ("TMPDIR", "HOME", "XDG_CACHE_HOME")}
    saved_cwd, saved_tempdir = os.getcwd(), tempfile.tempdir
    os.environ.update(TMPDIR=str(tmp), HOME=str(tmp), XDG_CACHE_HOME=str(tmp))
    tempfile.tempdir = str(tmp)
    os.chdir(case)
    try:
        yield case
    finally:
        os.chdir(saved_cwd)
        tempfile.tempdir = saved_tempdir
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Refusals by kind: the first pattern a refusal line matches names its kind.
KINDS = [
    ("json", r"not valid JSON|cannot be read as JSON"),
    ("global missing", r": global: missing"),
    ("core:datatype missing", r": core:datatype: missing"),
    ("stream hash", r"records for it"),
    ("collection unreadable", r"cannot be read as a SigMF collection"),
    ("collection stream missing", r"names no recording"),
    ("archive's collection unreadable", r"\.sigmf/[^ ]*\.sigmf-collection: "),
    ("archive: compressed", r"compressed"),
    ("archive: unsafe member name", r"absolute path or '\.\.'"),
    ("archive: member listed twice", r"listed twice"),
    ("archive: truncated or damaged", r"truncated|no end-of-archive|runs past the end"),
    ("archive: not a tar", r"not a readable tar"),
    ("archive: holds nothing", r"holds no"),
    ("data member link or special", r"data member .* (is a|is not a regular)"),
    ("member link or special", r"member .* (is a symbolic|is a hard|is a sparse|is not a regular)"),
    ("archive: no member", r"no member|is not in the archive"),
    ("data length", r"data length .* is not a whole number"),
    ("header and trailing bytes", r"header and \d+ trailing bytes are more"),
    ("data missing", r"data file missing|not found next to the metadata"),
    ("not a regular file", r"not a regular file|cannot be inspected"),
    ("no samples (metadata_only)", r"the recording has no samples"),
    ("multi-channel without data.channel", r"interleaved channels; "),
    ("data.channel out of range", r"is not one of them"),
    ("schema: used field", r"invalid SigMF metadata"),
    ("capture sample_start", r"captures\[\d+\]\.core:sample_start"),
    ("capture header_bytes", r"captures\[\d+\]\.core:header_bytes"),
    ("captures", r": captures(\[\d+\])?: "),
    ("annotation", r"annotations(\[\d+\])?"),
    ("native layout", r"below 2\^64"),
    ("option", r"^(window|stride|channel|max_open_files): "),
    ("field", r": (core:[a-z_0-9]+): "),
    ("cannot read", r"cannot read|cannot be read"),
    ("window too long", r"shorter than the window"),
    ("input names nothing", r"no recordings match|no such file|expected a \.sigmf-meta|a "
                            r"directory; name|no SigMF recordings found|which does not exist"),
]  # fmt: skip
_KIND_RE = [(k, re.compile(p)) for k, p in KINDS]


def kind_of(line: str) -> str:
    for kind, pattern in _KIND_RE:
        m = pattern.search(line)
        if m:
            if kind in ("field", "option"):
                return f"{kind} {m[1]}"
            return kind
    text = re.sub(r"/[^ :]*", "PATH", line)
    return "other: " + re.sub(r"\d+", "N", text)[:60]


#: Refusals of more than one line the fuzzer found, each kept as a regression test in
#: test_fuzz.py (the name in the comment); counted, not failed, so the fuzzer looks further.
KNOWN_MULTILINE = [
    # test_an_archive_member_name_with_a_newline_is_refused_in_one_line
    ("archive member name", re.compile(r"\.sigmf/[^ ]*\n")),
]


#: The known bugs the current case met (counted once a case, in STATS).
KNOWN_MET: set[str] = set()


def _one_line(text: str) -> None:
    """``text`` is one line, or one of the known refusals of several (counted)."""
    if "\n" not in text:
        return
    for name, pattern in KNOWN_MULTILINE:
        if pattern.search(text):
            KNOWN_MET.add(f"a refusal of more than one line ({name})")
            return
    raise AssertionError(f"a refusal of more than one line: {text!r}")


def check_refusal(exc: BaseException, case_dir: Path) -> list[str]:
    """The message of a DataError (or an option's ValueError) is one line per refused recording
    (a RecordingsRefused of several: a count, then one line each); returns each line's kind."""
    from iqtrain.errors import DataError, RecordingsRefused

    assert isinstance(exc, DataError | ValueError), repr(exc)
    text = str(exc)
    assert text.strip(), repr(exc)
    if isinstance(exc, RecordingsRefused):
        problems = exc.problems
        real = os.path.realpath(case_dir)
        for _, line in problems:
            assert line
            _one_line(line)
            named = line.split(": ", 1)[0]
            assert os.fspath(case_dir) in line or real in line or os.path.lexists(named), (
                f"names no file: {line!r}"
            )
        # Once per input: two metadata files over one dataset may each be refused in the same
        # words (a line about the dataset names the dataset), but never one input twice.
        assert len(set(problems)) == len(problems), f"an input refused twice: {problems}"
        assert len(problems) >= 1
        if len(problems) > 1:
            head, _, rest = text.partition("\n")
            assert re.fullmatch(rf"{len(problems)} of \d+ recording\(s\) cannot be read.*:",
                                head), head  # fmt: skip
            shown = min(len(problems), exc.SHOWN)
            body = [f"  {line}" for _, line in problems[:shown]]
            if len(problems) > shown:
                body.append(f"  ... and {len(problems) - shown} more")
            assert rest == "\n".join(body), text
        else:
            _one_line(text)
        return [kind_of(line) for _, line in problems]
    _one_line(text)
    return [kind_of(text)]


def _expected_windows(recs: list[tuple[np.ndarray, ...]], window: int, stride: int):
    out = []
    for segments in recs:
        for seg in segments:
            for j in range(0, len(seg) - window + 1, stride):
                out.append(seg[j : j + window])
    return out


def _read_by_layout(rec, window: int, stride: int) -> list[np.ndarray]:
    """numpy's reading of the windows of opened recording ``rec``: its segments' bytes, each
    inside the dataset's bytes."""
    frame = rec.frame_bytes
    with open(rec.data_path, "rb") as f:
        raw = f.read()
    region = (rec.data_offset, rec.data_offset + rec.data_bytes)
    segments = []
    for (first, count), byte in zip(rec.segments, rec.segment_bytes, strict=True):
        assert first >= rec.offset and count >= 0
        assert region[0] <= byte and byte + count * frame <= region[1], (
            f"segment at byte {byte} of {count} frames leaves the dataset {region}"
        )
        seg = raw[byte : byte + count * frame]
        segments.append(_components(seg, rec.datatype, rec.channels, rec.channel))
    return _expected_windows([tuple(segments)], window, stride)


def _same(got: np.ndarray, want: list[np.ndarray], dtype: np.dtype, what: str) -> None:
    assert got.shape[0] == len(want), f"{what}: {got.shape[0]} windows, expected {len(want)}"
    if want:
        expect = np.stack(want).astype(dtype)
        np.testing.assert_array_equal(got, expect, err_msg=what)


def _check_annotations(recs: list, known: dict[str, Rec] | None, case_dir: Path) -> None:
    """Each recording's annotations are read, or refused in one line; a valid one's are the
    ones written."""
    from iqtrain.data.sigmf import read_annotations
    from iqtrain.errors import DataError

    real = Path(os.path.realpath(case_dir))
    for rec in recs:
        try:
            anns = read_annotations(rec)
        except DataError as exc:
            for kind in check_refusal(exc, case_dir):
                STATS[f"annotation lists refused: {kind}"] += 1
            assert known is None, f"a valid recording's annotations refused: {exc}"
            continue
        STATS["annotation lists read"] += 1
        if known is not None:
            gen = known[os.path.relpath(rec.meta_path, real)]
            got = [(a.sample_start, a.sample_count, a.label) for a in anns]
            assert got == gen.annotations


#: Seconds a case may take before the process is ended as hung (a case takes ~10 ms).
HANG_S = 120


def run_case(case: Case, base: Path) -> str:
    """Write ``case`` into a fresh directory under ``base``, read it every way, check it (module
    docstring), remove it; returns the outcome."""
    root = Path(tempfile.mkdtemp(prefix="case-", dir=base))
    KNOWN_MET.clear()
    # A hang that the deadline cannot interrupt (a blocking open, a native loop) ends the
    # process with every thread's traceback instead of blocking CI.
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        case_dir, oracle = root / "case", root / "oracle"
        case_dir.mkdir()
        oracle.mkdir()
        (root / "tmp").mkdir()
        _write(case_dir, case.files)
        copies = {}
        for i, (name, data) in enumerate(sorted(case.oracle.items())):
            (oracle / str(i)).write_bytes(data)
            copies[name] = os.fspath(oracle / str(i))
        before = snapshot(root)
        beside = sorted(os.listdir(base))
        with isolated(root) as cwd:
            outcome = _exercise(case, cwd, copies)
        assert snapshot(root) == before, "a file was written, changed or removed"
        assert sorted(os.listdir(base)) == beside, "something was written beside the case"
        STATS["cases"] += 1
        for bug in KNOWN_MET:
            STATS[f"known bug: {bug}"] += 1
        STATS[f"generator: {case.kind}"] += 1
        STATS[f"outcome: {outcome}"] += 1
        if outcome.startswith("opened"):
            STATS["opened"] += 1
        return outcome
    finally:
        faulthandler.cancel_dump_traceback_later()
        shutil.rmtree(root, ignore_errors=True)


def _inputs(case: Case, case_dir: Path) -> list[str]:
    """The data list: ``@/`` marks a path given absolute, the rest stay relative to the case
    directory (the current directory)."""
    return [os.fspath(case_dir / i[2:]) if i.startswith("@/") else i for i in case.inputs]


def _exercise(case: Case, case_dir: Path, copies: dict[str, str]) -> str:
    from iqtrain.data.sigmf import expand, read_recording
    from iqtrain.errors import DataError, RecordingsRefused

    inputs = _inputs(case, case_dir)
    known = case.expected
    # The reader alone: expand, then each recording.
    try:
        found = expand(inputs)
    except DataError as exc:
        kinds = check_refusal(exc, case_dir)
        assert known is None, f"a valid case refused: {exc}"
        _dataset_refuses_too(case, inputs, exc)
        return _refused(kinds, "input refused")
    problems = list(found.problems)
    recs = []
    for source in found.sources:
        try:
            rec, _ = read_recording(source, channel=_channel(case.channel))
        except DataError as exc:
            check_refusal(exc, case_dir)
            problems.append((os.fspath(source.meta), str(exc)))
            continue
        recs.append(rec)
    if known is not None:
        assert not problems, f"a valid case refused: {problems}"
        real = Path(os.path.realpath(case_dir))
        assert [os.path.relpath(r.meta_path, real) for r in recs] == [
            os.path.relpath(p, real) for p in sorted(real / k for k in known)
        ]
    _check_annotations(recs, known, case_dir)
    # The dataset.
    try:
        ds = _open(case, inputs)
    except (DataError, ValueError) as exc:
        kinds = check_refusal(exc, case_dir)
        if isinstance(exc, RecordingsRefused):
            assert [line for _, line in exc.problems] == [line for _, line in problems]
            return _refused(kinds, "refused")
        if not isinstance(exc, DataError):  # an option: a ValueError naming it
            assert known is None or _odd_options(case)
            return _refused(kinds, "option refused")
        if "shorter than the window" in str(exc):
            _no_window_fits(case, known, recs)
            return _refused(kinds, "no window")
        raise AssertionError(f"an unexpected DataError: {exc!r}") from None
    _check_open(case, ds, recs, problems, copies)
    for _, line in problems:
        STATS[f"refused kind: {kind_of(line)}"] += 1
    return "opened, some skipped" if problems else "opened"


def _channel(channel: int | None) -> int | None:
    return channel if channel is None or channel >= 0 else None


def _odd_options(case: Case) -> bool:
    return case.window < 1 or case.stride < 1 or case.channel not in (None, 0, 1, 2)


def _refused(kinds: list[str], outcome: str) -> str:
    STATS["refused"] += 1
    for k in kinds:
        STATS[f"refused kind: {k}"] += 1
    return outcome


def _open(case: Case, inputs: list[str]):
    from iqtrain.data.dataset import IQDataset

    return IQDataset(
        inputs,
        window=case.window,
        stride=case.stride,
        channel=case.channel,
        skip_invalid=case.skip_invalid,
        map_min_bytes=case.map_min_bytes,
        max_open_files=case.max_open_files,
    )


def _dataset_refuses_too(case: Case, inputs: list[str], exc: BaseException) -> None:
    from iqtrain.errors import DataError

    try:
        _open(case, inputs)
    except (DataError, ValueError) as again:
        assert not isinstance(again, DataError) or str(again) == str(exc), (again, exc)
        return
    raise AssertionError(f"expand refused ({exc}) but the dataset opened")


def _no_window_fits(case: Case, known: dict[str, Rec] | None, recs: list) -> None:
    longest = max((n for r in recs for _, n in r.segments), default=0)
    assert longest < case.window
    if known is not None:
        assert all(len(s) < case.window for r in known.values() for s in r.segments or [])


def _check_open(case: Case, ds, recs: list, problems: list, copies: dict[str, str]) -> None:
    """An opened dataset: its recordings are the ones read, every window is numpy's reading of
    the bytes its segments name (and for a valid case the samples written), a stream's batches
    are those windows, digests are of each dataset's bytes."""
    from iqtrain.data.dataset import TrainStream

    known = case.expected
    assert case.skip_invalid or not problems
    assert [r.meta_path for r in ds.recordings] == [r.meta_path for r in recs]
    assert ds.refused == problems
    n = ds.num_windows
    got = ds.windows(np.arange(n, dtype=np.uint64))
    assert got.dtype == ds.dtype and got.shape == (n, ds.window_len, 2)
    want: list[np.ndarray] = []
    for rec in ds.recordings:
        want += _read_by_layout(rec, case.window, case.stride)
    _same(got, want, ds.dtype, "windows against numpy's reading of the segments' bytes")
    real = Path(os.path.realpath(os.getcwd()))
    if known is not None:
        order = [known[os.path.relpath(r.meta_path, real)] for r in ds.recordings]
        expect = _expected_windows([tuple(r.segments or ()) for r in order], case.window,
                                   case.stride)  # fmt: skip
        _same(got, expect, ds.dtype, "windows against the samples written")
    if n:
        np.testing.assert_array_equal(ds.window(n - 1), got[n - 1])
        stream = TrainStream(ds, batch_size=case.batch_size, seed=n, prefetch=case.prefetch)
        for _ in range(2):
            batch = stream.next()
            np.testing.assert_array_equal(batch, got[stream.last_ids().astype(np.intp)])
        del stream
    digests = ds.content_digests()
    # One key per dataset: two metadata files over one non-conforming dataset share it.
    assert list(digests) == list(dict.fromkeys(r.data_name for r in ds.recordings))
    assert all(re.fullmatch("[0-9a-f]{64}", d) for d in digests.values())
    if known is not None:
        # Each dataset's digest (a region of its file, or a whole file) is the digest of a file
        # of exactly its bytes.
        from iqtrain._native import digest_files

        names = [os.path.relpath(name, real) for name in digests]
        plain = digest_files([copies[name] for name in names])
        assert list(digests.values()) == plain
    for line in ds.verify_content():
        assert "\n" not in line
        assert known is None, f"core:sha512 of a valid recording refused: {line}"

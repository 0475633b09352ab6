"""One recording's metadata: the verdict sigmf-python's reader gives, and where the samples are
(docs/design.md "Datatypes and the metadata verdict", "Recordings, capture segments,
windows").

A recording is read when sigmf-python's own reader (``sigmf.fromfile``) reads it and iqtrain
can locate every sample exactly. What iqtrain uses must be well formed, and is checked here
field by field, naming the first faulty element: ``core:datatype``, ``core:num_channels``,
``core:offset``, ``core:trailing_bytes``, ``core:dataset``, ``core:metadata_only``,
``core:sha512``, ``core:sample_rate``, and each capture's ``core:sample_start`` and
``core:header_bytes`` (annotations only when labels are read: :mod:`.annotations`). Every other
departure from the SigMF schema that sigmf-python's reader tolerates (a version string of
another form, an integer ``core:datetime``, a missing ``annotations`` list, an unknown
top-level key) is a *note* on the recording, not a refusal.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from iqtrain.config.sections import SIGMF_DATATYPES
from iqtrain.data.sigmf.datatypes import DatatypeProblem, parse_datatype
from iqtrain.data.sigmf.inputs import Source
from iqtrain.data.sigmf.layout import LayoutProblem, plan_layout
from iqtrain.data.sigmf.regular import read_regular
from iqtrain.data.sigmf.schema import schema_problems
from iqtrain.errors import DataError

__all__ = ["Recording", "meta_sha256", "read_metadata", "read_recording"]

#: The global fields iqtrain reads (a schema violation there is a refusal, not a note).
USED_GLOBAL = frozenset(
    {
        "core:datatype", "core:num_channels", "core:offset", "core:trailing_bytes",
        "core:metadata_only", "core:dataset", "core:sha512", "core:sample_rate",
    }
)  # fmt: skip
#: The capture fields iqtrain reads.
USED_CAPTURE = frozenset({"core:sample_start", "core:header_bytes"})


@dataclass(frozen=True)
class Recording:
    """One recording whose every sample iqtrain can locate.

    ``meta_path``: the metadata file, or ``ARCHIVE/MEMBER`` for a member of a ``.sigmf``
    archive. ``data_path``: the file the samples are read from (the ``.sigmf-data``, the
    non-conforming dataset ``core:dataset`` names, or the archive). The dataset is bytes
    ``[data_offset, data_offset + data_bytes)`` of it (the whole file, or the archive member),
    which had ``file_bytes`` bytes when opened. ``segments``: ``(first SigMF sample index,
    samples)`` of each capture segment, ``segment_bytes`` the byte of ``data_path`` its first
    frame starts at; ``channels`` interleaved, ``channel`` the one read. ``notes``: ``(field,
    message)`` of what was tolerated (docs/design.md "Datatypes and the metadata verdict").
    """

    meta_path: Path
    data_path: Path
    datatype: str
    num_samples: int
    sample_rate: float | None
    sha512: str | None
    segments: tuple[tuple[int, int], ...] = ()
    meta_sha256: str = ""
    segment_bytes: tuple[int, ...] = ()
    channels: int = 1
    channel: int = 0
    offset: int = 0
    data_offset: int = 0
    data_bytes: int = 0
    file_bytes: int = 0
    archive: Path | None = None
    meta_member: str | None = None
    data_member: str | None = None
    notes: tuple[tuple[str, str], ...] = ()
    #: Where the metadata was read from (an archive's listing included): read again from it.
    source: Source | None = field(default=None, compare=False, repr=False)

    @property
    def data_name(self) -> str:
        """The dataset's name: its file's path, or ``ARCHIVE/MEMBER`` for an archive member
        (the key of its content digest)."""
        if self.archive is not None and self.data_member is not None:
            return os.fspath(Path(self.archive, self.data_member))
        return os.fspath(self.data_path)

    @property
    def frame_bytes(self) -> int:
        """Bytes of one frame: a complex sample of every channel."""
        return self.channels * SIGMF_DATATYPES[self.datatype].bytes_per_sample

    def layout(self) -> tuple[int, int, int, list[tuple[int, int, int]]]:
        """What the native reader is given: ``(file bytes, channels, channel, [(first index,
        samples, byte)])``."""
        runs = [(a, n, b) for (a, n), b in zip(self.segments, self.segment_bytes, strict=True)]
        return self.file_bytes, self.channels, self.channel, runs


def meta_sha256(meta_bytes: bytes) -> str:
    """The metadata digest of docs/design.md "Dataset identity": SHA-256 (hex) of a .sigmf-meta's
    bytes."""
    return hashlib.sha256(meta_bytes).hexdigest()


def _field_error(meta: Path, field: str, msg: str) -> DataError:
    return DataError(f"{meta}: {field}: {msg}")


def _meta_bytes(source: Source) -> bytes:
    if source.archive is not None and source.member is not None:
        return source.archive.read(source.archive.member(source.member))
    try:
        return read_regular(source.meta)
    except OSError as exc:
        raise DataError(f"{source.meta}: cannot read: {exc.strerror or exc}") from None


def _parse(meta: Path, meta_bytes: bytes) -> dict:
    """The metadata object (with a ``global`` object), or a DataError naming the file."""
    try:
        metadata = json.loads(meta_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{meta}: not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise DataError(f"{meta}: cannot be read as JSON: {exc}") from None
    except RecursionError:
        raise DataError(f"{meta}: cannot be read as JSON: nested too deep") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("global"), dict):
        raise _field_error(meta, "global", "missing or not an object")
    if metadata["global"].get("core:datatype") is None:
        raise _field_error(meta, "core:datatype", "missing")
    return metadata


def read_metadata(rec: Recording) -> dict:
    """The metadata of ``rec`` read again (for its annotations): a DataError when its bytes are
    not the ones the recording was opened from."""
    data = _meta_bytes(rec.source if rec.source is not None else Source(rec.meta_path))
    if rec.meta_sha256 and meta_sha256(data) != rec.meta_sha256:
        raise DataError(f"{rec.meta_path}: metadata changed since the recording was opened")
    return _parse(rec.meta_path, data)


def _integer(value: Any) -> int | None:
    """An integer as JSON Schema counts one (an int, or a float with no fraction), else None."""
    if type(value) is int:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


#: The largest integer the SigMF schema allows (a signed 64-bit integer).
INT_MAX = (1 << 63) - 1


def _uint(meta: Path, where: str, value: Any, minimum: int = 0) -> int:
    n = _integer(value)
    if n is None or not minimum <= n <= INT_MAX:
        raise _field_error(
            meta, where, f"must be an integer in [{minimum}, 2^63), got {value!r:.40}"
        )
    return n


def _sample_rate(meta: Path, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _field_error(meta, "core:sample_rate", f"must be a number, got {value!r:.40}")
    rate = float(value)
    if not 0 < rate < float("inf"):
        raise _field_error(meta, "core:sample_rate", f"must be positive and finite, got {value}")
    return rate


def _sha512(meta: Path, value: Any) -> str | None:
    if value is None:
        return None
    if (
        not isinstance(value, str)
        or len(value) != 128
        or not all(c in "0123456789abcdefABCDEF" for c in value)
    ):
        raise _field_error(meta, "core:sha512", f"{value!r:.40} is not a SHA-512 hex digest")
    return value.lower()


def _captures(meta: Path, metadata: dict) -> list[dict]:
    """Each capture checked: an object with an integer ``core:sample_start`` >= 0, in
    non-decreasing order, and ``core:header_bytes`` an integer >= 0 where present (the
    integers made ints). Missing ``captures`` is none (one capture at the first sample)."""
    captures = metadata.get("captures", [])
    if not isinstance(captures, list):
        raise _field_error(meta, "captures", "must be an array of capture objects")
    out: list[dict] = []
    for i, capture in enumerate(captures):
        if not isinstance(capture, dict):
            raise _field_error(meta, f"captures[{i}]", "must be an object")
        where = f"captures[{i}].core:sample_start"
        if "core:sample_start" not in capture:
            raise _field_error(meta, where, "missing")
        start = _uint(meta, where, capture["core:sample_start"])
        if out and start < out[-1]["core:sample_start"]:
            raise _field_error(
                meta,
                where,
                f"{start} is before the previous capture's {out[-1]['core:sample_start']} "
                "(captures must be sorted by core:sample_start)",
            )
        fixed = dict(capture)
        fixed["core:sample_start"] = start
        if "core:header_bytes" in capture:
            hb = capture["core:header_bytes"]
            fixed["core:header_bytes"] = _uint(meta, f"captures[{i}].core:header_bytes", hb)
        out.append(fixed)
    return out


def _path_text(path: tuple[Any, ...]) -> str:
    """A schema path as a field name: ``captures[2].core:datetime``, ``core:version``."""
    if not path:
        return "metadata"
    if path[0] == "global" and len(path) > 1:
        path = path[1:]
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _used(path: tuple[Any, ...]) -> bool:
    if not path:
        return False
    if path[0] == "global":
        return len(path) == 1 or path[1] in USED_GLOBAL
    if path[0] == "captures":
        return len(path) <= 2 or path[2] in USED_CAPTURE
    return False


_REQUIRED = re.compile(r"'(captures|annotations)' is a required property")


def _schema_notes(meta: Path, metadata: dict) -> list[tuple[str, str]]:
    """The schema's violations as notes; one in a field iqtrain uses (its own check missed it)
    is a refusal with the schema's message."""
    notes = []
    for path, message in schema_problems(metadata):
        if _used(path):
            raise _field_error(meta, _path_text(path), f"invalid SigMF metadata: {message}")
        required = _REQUIRED.fullmatch(message) if not path else None
        if required is not None:  # a missing top-level list: sigmf-python reads it as empty
            key = required[1]
            read = "one capture at the first sample" if key == "captures" else "none"
            notes.append((key, f"missing (read as {read})"))
        elif path == ("global", "core:version"):  # sigmf-python reads it as its own version
            version = metadata["global"].get("core:version")
            notes.append(("core:version", f"{version!r:.40} is not of the form X.Y.Z"))
        else:
            notes.append((_path_text(path), message))
    return notes


def _relative(meta: Path, value: Any) -> str:
    """``core:dataset``: a relative file name that stays beside the metadata."""
    if not isinstance(value, str) or not value:
        raise _field_error(meta, "core:dataset", f"must be a file name, got {value!r:.40}")
    p = PurePosixPath(value.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or value.startswith(("/", "\\")) or ":" in p.parts[0]:
        raise _field_error(
            meta,
            "core:dataset",
            f"{value!r:.60} is not a name beside the metadata (absolute paths and '..' are "
            "refused)",
        )
    return str(p)


@dataclass(frozen=True)
class _Data:
    path: Path
    offset: int
    size: int
    file_bytes: int
    member: str | None
    notes: tuple[tuple[str, str], ...] = ()


def _loose_data(meta: Path, glob_: dict) -> _Data:
    """The dataset beside a metadata file: ``core:dataset`` or ``NAME.sigmf-data``."""
    compliant = meta.with_suffix(".sigmf-data")
    notes: tuple[tuple[str, str], ...] = ()
    if glob_.get("core:dataset") is not None:
        name = _relative(meta, glob_["core:dataset"])
        path = meta.parent / name
        if not os.path.lexists(path):
            raise _field_error(meta, "core:dataset", f"{name!r} not found next to the metadata")
        if os.path.exists(compliant):
            notes = (("core:dataset", f"names {name!r}; {compliant.name} beside it is not read"),)
    else:
        path = compliant
        if not os.path.lexists(path):
            if glob_.get("core:metadata_only") is True:
                raise _field_error(meta, "core:metadata_only", "the recording has no samples")
            raise DataError(f"{path}: data file missing (next to {meta.name})")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DataError(f"{path}: data file cannot be inspected ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or lie about its size
        raise DataError(f"{path}: data file is not a regular file")
    return _Data(path, 0, st.st_size, st.st_size, None, notes)


def _member_data(source: Source, glob_: dict) -> _Data:
    """The dataset member of an archive recording, in the metadata member's folder."""
    assert source.archive is not None and source.member is not None
    folder, _, name = source.member.rpartition("/")
    if glob_.get("core:dataset") is not None:
        target = _relative(source.meta, glob_["core:dataset"])
    else:
        target = name[: -len(".sigmf-meta")] + ".sigmf-data"
    member_name = f"{folder}/{target}" if folder else target
    arc = source.archive
    if member_name not in arc.members:
        why = arc.refused.get(member_name)
        raise DataError(
            f"{source.meta}: its data member {member_name!r} "
            + (f"{why}; it is not read" if why else f"is not in the archive {arc.path}")
        )
    m = arc.members[member_name]
    return _Data(arc.path, m.offset, m.size, arc.size, member_name)


def _channels(meta: Path, glob_: dict, channel: int | None) -> tuple[int, int]:
    """``(channels, the one read)``: a multi-channel recording needs ``data.channel``."""
    channels = _uint(meta, "core:num_channels", glob_.get("core:num_channels", 1), minimum=1)
    if channel is None:
        if channels > 1:
            raise _field_error(
                meta,
                "core:num_channels",
                f"{channels} interleaved channels; choose the one to read (0 to {channels - 1}) "
                "with data.channel (--channel for the commands that use a model)",
            )
        return 1, 0
    if channel >= channels:
        raise _field_error(
            meta,
            "core:num_channels",
            f"{channels} channel(s): channel {channel} (data.channel, --channel) is not one "
            "of them",
        )
    return channels, channel


@dataclass(frozen=True)
class _Fields:
    """The global fields iqtrain uses, checked."""

    datatype: str
    channels: int
    channel: int
    offset: int
    trailing: int
    rate: float | None
    sha512: str | None


def _global_fields(
    meta: Path, glob_: dict, channel: int | None, notes: list[tuple[str, str]]
) -> _Fields:
    try:
        datatype, dt_note = parse_datatype(glob_["core:datatype"])
    except DatatypeProblem as exc:
        raise _field_error(meta, "core:datatype", str(exc)) from None
    if dt_note:
        notes.append(("core:datatype", dt_note))
    channels, chan = _channels(meta, glob_, channel)
    only = glob_.get("core:metadata_only", False)
    if not isinstance(only, bool):
        raise _field_error(meta, "core:metadata_only", f"must be true or false, got {only!r:.40}")
    if only and glob_.get("core:dataset") is not None:
        raise _field_error(meta, "core:metadata_only", "set together with core:dataset")
    return _Fields(
        datatype=datatype,
        channels=channels,
        channel=chan,
        offset=_uint(meta, "core:offset", glob_.get("core:offset", 0)),
        trailing=_uint(meta, "core:trailing_bytes", glob_.get("core:trailing_bytes", 0)),
        rate=_sample_rate(meta, glob_.get("core:sample_rate")),
        sha512=_sha512(meta, glob_.get("core:sha512")),
    )


def read_recording(source: Source | Path, *, channel: int | None = None) -> tuple[Recording, bytes]:
    """Parse and check one recording (a DataError line naming the file and field when it
    cannot be read); return it with its raw metadata bytes."""
    if not isinstance(source, Source):
        source = Source(Path(source))
    meta = source.meta
    meta_bytes = _meta_bytes(source)
    metadata = _parse(meta, meta_bytes)
    if source.stream_hash is not None:
        got = hashlib.sha512(meta_bytes).hexdigest()
        if got != source.stream_hash.lower():
            raise DataError(
                f"{meta}: the SHA-512 {source.collection or 'its collection'} records for it "
                f"({source.stream_hash[:16]}…) is not its own ({got[:16]}…)"
            )
    glob_ = metadata["global"]
    notes: list[tuple[str, str]] = []
    f = _global_fields(meta, glob_, channel, notes)
    captures = _captures(meta, metadata)
    notes += _schema_notes(meta, metadata)
    data = _member_data(source, glob_) if source.archive is not None else _loose_data(meta, glob_)
    notes += data.notes
    if glob_.get("core:metadata_only") is True:
        notes.append(("core:metadata_only", "is set, but the data is there: it is read"))
    per = SIGMF_DATATYPES[f.datatype].bytes_per_sample
    try:
        layout = plan_layout(
            region=data.size,
            frame=f.channels * per,
            offset=f.offset,
            trailing=f.trailing,
            captures=captures,
            rate=f.rate,
        )
    except LayoutProblem as exc:
        if exc.field == "data length":
            raise DataError(
                f"{data.path}: data length {exc} is not a whole number of {f.datatype} samples "
                f"({f.channels * per} bytes each)"
            ) from None
        raise _field_error(meta, exc.field, str(exc)) from None
    rec = Recording(
        meta_path=meta,
        data_path=data.path,
        datatype=f.datatype,
        num_samples=layout.samples,
        sample_rate=f.rate,
        sha512=f.sha512,
        segments=layout.segments,
        meta_sha256=meta_sha256(meta_bytes),
        segment_bytes=tuple(data.offset + b for b in layout.bytes),
        channels=f.channels,
        channel=f.channel,
        offset=f.offset,
        data_offset=data.offset,
        data_bytes=data.size,
        file_bytes=data.file_bytes,
        archive=source.archive.path if source.archive is not None else None,
        meta_member=source.member,
        data_member=data.member,
        notes=tuple(notes) + layout.notes,
        source=source,
    )
    return rec, meta_bytes

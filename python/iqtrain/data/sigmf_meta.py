"""SigMF metadata: reading and validating one ``.sigmf-meta`` and the recording it describes.

Decides how a recording's bytes are to be read (datatype, capture segments); everything that
cannot be read correctly (real-valued or multi-channel data, header or trailing bytes, a data
length that is not whole samples) is rejected as a DataError naming the file and field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import numbers
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from iqtrain.config.sections import SIGMF_DATATYPES
from iqtrain.errors import DataError

__all__ = [
    "Annotation",
    "Recording",
    "SUPPORTED_DATATYPES",
    "meta_sha256",
    "read_annotations",
    "read_recording",
    "validate_metadata",
]

# SigMF datatype -> the kind the native reader understands (the same name), from the one table
# in iqtrain.config.schema. Only complex, single-channel data of these types is accepted; everything
# else is rejected with the file and field named.
SUPPORTED_DATATYPES = {name: name for name in SIGMF_DATATYPES}
BYTES_PER_SAMPLE = {name: d.bytes_per_sample for name, d in SIGMF_DATATYPES.items()}


@dataclass(frozen=True)
class Recording:
    """One validated SigMF recording."""

    meta_path: Path
    data_path: Path
    datatype: str
    num_samples: int
    sample_rate: float | None
    sha512: str | None
    # Each capture's core:sample_start, in metadata order (validated: strictly increasing,
    # within the data). Empty when the metadata has no captures.
    capture_starts: tuple[int, ...] = ()
    # SHA-256 (hex) of the .sigmf-meta bytes this recording was parsed from: the metadata
    # digest of docs/design.md 1.3, taken from the one read instead of reading the file again.
    meta_sha256: str = ""

    @property
    def data_bytes(self) -> int:
        """The data file's length in bytes (what the dataset opened)."""
        return self.num_samples * BYTES_PER_SAMPLE[self.datatype]

    @property
    def segments(self) -> list[tuple[int, int]]:
        """``(first sample, samples)`` of each run windowed on its own (see :class:`IQDataset`)."""
        starts = list(self.capture_starts) or [0]
        if starts[0] > 0:
            starts.insert(0, 0)  # samples before the first capture: a leading segment
        ends = starts[1:] + [self.num_samples]
        return [(a, b - a) for a, b in zip(starts, ends, strict=True)]


def _field_error(meta: Path, field: str, msg: str) -> DataError:
    return DataError(f"{meta}: {field}: {msg}")


def _capture_starts(meta_path: Path, metadata: dict) -> tuple[int, ...]:
    """Each capture's ``core:sample_start``: integers >= 0, strictly increasing.

    Checked before the schema so the error names ``captures[i].core:sample_start``.
    """
    captures = metadata.get("captures", [])
    if not isinstance(captures, list):
        raise _field_error(meta_path, "captures", "must be an array of capture objects")
    starts: list[int] = []
    for i, capture in enumerate(captures):
        field = f"captures[{i}].core:sample_start"
        if not isinstance(capture, dict):
            raise _field_error(meta_path, f"captures[{i}]", "must be an object")
        if "core:sample_start" not in capture:
            raise _field_error(meta_path, field, "missing")
        start = capture["core:sample_start"]
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise _field_error(meta_path, field, f"must be an integer >= 0, got {start!r}")
        if starts and start <= starts[-1]:
            raise _field_error(
                meta_path,
                field,
                f"{start} is not after the previous capture's {starts[-1]} "
                "(captures must start at strictly increasing samples)",
            )
        starts.append(start)
    return tuple(starts)


def meta_sha256(meta_bytes: bytes) -> str:
    """The metadata digest of docs/design.md 1.3: SHA-256 (hex) of a .sigmf-meta's bytes."""
    return hashlib.sha256(meta_bytes).hexdigest()


def _read_file(path: Path) -> bytes:
    """The bytes of ``path``: one open, fstat and read for a small file (Path.read_bytes, through
    a buffered file object, took 3x as long here: docs/design.md 1.2)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        parts = [os.read(fd, os.fstat(fd).st_size + 1)]
        while parts[-1]:  # to the end, whatever the size said (a file that grew, a short read)
            parts.append(os.read(fd, 1 << 20))
        return b"".join(parts)
    finally:
        os.close(fd)


def _load_metadata(meta_path: Path) -> tuple[dict, bytes]:
    """The parsed JSON and raw bytes of ``meta_path`` (an object with a datatype)."""
    try:
        meta_bytes = _read_file(meta_path)
    except OSError as exc:
        raise DataError(f"{meta_path}: cannot read: {exc.strerror or exc}") from None
    try:
        metadata = json.loads(meta_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{meta_path}: not valid JSON: {exc}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (4300)
        raise DataError(f"{meta_path}: cannot be read as JSON: {exc}") from None
    except RecursionError:
        raise DataError(f"{meta_path}: cannot be read as JSON: nested too deep") from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("global"), dict):
        raise _field_error(meta_path, "global", "missing or not an object")
    if metadata["global"].get("core:datatype") is None:
        raise _field_error(meta_path, "core:datatype", "missing")
    return metadata, meta_bytes


@functools.cache
def _schema_validator() -> Any:
    """The SigMF metadata schema's validator, built (and the schema itself checked) once per
    process. ``sigmf.validate.validate`` builds both again for every file, through
    ``jsonschema.validate``: that was 95% of opening a small recording (docs/design.md 1.2)."""
    import jsonschema
    from sigmf import schema

    ref = schema.get_schema()  # sigmf has one schema file, whatever core:version says
    cls = jsonschema.validators.validator_for(ref)
    cls.check_schema(ref)
    return cls(ref)


Check = Callable[[Any], bool]


class _Unsupported(Exception):
    """A schema keyword the compiled check does not implement: jsonschema checks every file."""


def _is_number(x: Any) -> bool:
    t = type(x)
    if t is float or t is int:  # what json.loads makes: skip the ABC check
        return True
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _is_integer(x: Any) -> bool:
    # jsonschema's draft 6+ type checker: an int that is not a bool, or an integral float.
    t = type(x)
    if t is int:
        return True
    return (isinstance(x, int) and not isinstance(x, bool)) or (
        isinstance(x, float) and x.is_integer()
    )


# The draft 2020-12 type checker's seven types, as jsonschema defines them.
_TYPES: dict[str, Check] = {
    "array": lambda x: isinstance(x, list),
    "boolean": lambda x: isinstance(x, bool),
    "integer": _is_integer,
    "null": lambda x: x is None,
    "number": _is_number,
    "object": lambda x: isinstance(x, dict),
    "string": lambda x: isinstance(x, str),
}


def _all(checks: list[Check]) -> Check:
    """One predicate, true when every check is (plain loops: this runs per value per file)."""
    if not checks:
        return lambda x: True
    if len(checks) == 1:
        return checks[0]

    def check(x: Any) -> bool:
        for c in checks:  # noqa: SIM110 - all() over a generator took twice as long here
            if not c(x):
                return False
        return True

    return check


def _type_check(types: Any) -> Check:
    names = [types] if isinstance(types, str) else list(types)
    if any(n not in _TYPES for n in names):
        raise _Unsupported("type")
    checks = [_TYPES[n] for n in names]
    return checks[0] if len(checks) == 1 else lambda x: any(c(x) for c in checks)


def _object_check(schema: dict) -> Check | None:
    """``properties``, ``required`` and ``additionalProperties`` in one pass over the value's
    keys; each asserts nothing about a non-object (as in jsonschema)."""
    props = {k: _compile(v) for k, v in schema.get("properties", {}).items()}
    required = tuple(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    rest = None if extra is True else _compile(extra)
    if not props and not required and rest is None:
        return None

    def check(x: Any) -> bool:
        if not isinstance(x, dict):
            return True
        for k in required:
            if k not in x:
                return False
        for k, v in x.items():
            c = props.get(k, rest)
            if c is not None and not c(v):
                return False
        return True

    return check


def _bound_checks(s: dict) -> list[Check]:
    """minimum, maximum, exclusive bounds (numbers only) and minItems, maxItems (arrays only)."""
    out: list[Check] = []
    if "minimum" in s:
        lo = s["minimum"]
        out.append(lambda x: not _is_number(x) or not x < lo)
    if "maximum" in s:
        hi = s["maximum"]
        out.append(lambda x: not _is_number(x) or not x > hi)
    if "exclusiveMinimum" in s:
        elo = s["exclusiveMinimum"]
        out.append(lambda x: not _is_number(x) or not x <= elo)
    if "exclusiveMaximum" in s:
        ehi = s["exclusiveMaximum"]
        out.append(lambda x: not _is_number(x) or not x >= ehi)
    if "minItems" in s:
        least = s["minItems"]
        out.append(lambda x: not isinstance(x, list) or not len(x) < least)
    if "maxItems" in s:
        most = s["maxItems"]
        out.append(lambda x: not isinstance(x, list) or not len(x) > most)
    return out


def _value_checks(s: dict) -> list[Check]:
    """The keywords on one value: each as jsonschema's keyword function decides it."""
    out: list[Check] = []
    if "type" in s:
        out.append(_type_check(s["type"]))
    if "enum" in s:
        # jsonschema compares a string with ==, so an enum of strings is a set of strings; other
        # members have its own JSON equality (1 != True): not compiled.
        if not all(isinstance(e, str) for e in s["enum"]):
            raise _Unsupported("enum")
        enum = frozenset(s["enum"])
        out.append(lambda x: isinstance(x, str) and x in enum)
    if "pattern" in s:
        search = re.compile(s["pattern"]).search  # re.search(pattern, x), compiled once
        out.append(lambda x: not isinstance(x, str) or search(x) is not None)
    out += _bound_checks(s)
    if "items" in s:
        item = _compile(s["items"])
        out.append(lambda x: not isinstance(x, list) or all(item(v) for v in x))
    return out


# Keywords the compiled check implements; "format" asserts nothing without a format checker
# (iqtrain's validator has none, as jsonschema.validate's had none).
_COMPILED = frozenset(
    {
        "type", "enum", "pattern", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "minItems", "maxItems", "items", "properties", "required", "additionalProperties",
        "format",
    }
)  # fmt: skip


def _compile(schema: Any) -> Check:
    """``schema`` as one predicate: True exactly when jsonschema finds no error in a value.

    Raises _Unsupported for any keyword jsonschema's draft 2020-12 validator acts on that is not
    in _COMPILED ($ref, prefixItems, ...); keywords it ignores (additionalItems, titles) are
    ignored here too."""
    import jsonschema

    if schema is True:
        return lambda x: True
    if schema is False:
        return lambda x: False
    acted_on = set(schema) & set(jsonschema.Draft202012Validator.VALIDATORS)
    if acted_on - _COMPILED:
        raise _Unsupported(", ".join(sorted(acted_on - _COMPILED)))
    obj = _object_check(schema)
    return _all(_value_checks(schema) + ([obj] if obj is not None else []))


@functools.cache
def _compiled_check() -> Check | None:
    """The SigMF schema compiled into one predicate, or None when it uses a keyword that is not
    compiled (a later sigmf): then jsonschema itself decides every file.

    jsonschema walks the schema generically (a validator object evolved per keyword and value):
    966 us a small recording on the shared cores, against 54 us for this closure tree (18x,
    bench/test_startup.py; docs/design.md 1.2). A file it fails is handed to jsonschema for the
    verdict and the message, so the error is unchanged.
    """
    import jsonschema

    validator = _schema_validator()
    if type(validator) is not jsonschema.Draft202012Validator or validator.format_checker:
        return None
    try:
        return _compile(validator.schema)
    except _Unsupported:
        return None


def validate_metadata(metadata: dict) -> None:
    """Exactly ``sigmf.validate.validate(metadata, schema)``, with the validator built once:
    ``jsonschema.validate``'s best-match error, then sigmf's sample-start ordering rule (its
    warning about undeclared extensions is not an error, and was silenced before too). The
    compiled check (:func:`_compiled_check`) passes a valid file without jsonschema; a file it
    fails goes through jsonschema, whose verdict and message stand."""
    import jsonschema

    fast = _compiled_check()
    if fast is None or not fast(metadata):
        error = jsonschema.exceptions.best_match(_schema_validator().iter_errors(metadata))
        if error is not None:
            raise error
    for key in ("captures", "annotations"):
        count = -1
        for item in metadata[key]:
            new_count = item["core:sample_start"]
            if new_count < count:
                raise jsonschema.exceptions.ValidationError(
                    f"{key} has incorrect sample start ordering."
                )
            count = new_count


def _check_schema(meta_path: Path, metadata: dict) -> None:
    try:
        validate_metadata(metadata)
    except Exception as exc:  # jsonschema.ValidationError and sigmf's own errors
        where = "/".join(str(p) for p in getattr(exc, "absolute_path", [])) or "metadata"
        msg = getattr(exc, "message", None) or str(exc)
        raise _field_error(meta_path, where, f"invalid SigMF metadata: {msg}") from None


def _check_readable(meta_path: Path, metadata: dict) -> str:
    """The recording's datatype, after rejecting every layout the reader cannot handle."""
    glob_ = metadata["global"]
    datatype = glob_["core:datatype"]
    if not isinstance(datatype, str) or not datatype.startswith("c"):
        raise _field_error(
            meta_path, "core:datatype", f"{datatype!r} is not complex (real-valued data rejected)"
        )
    if datatype not in SUPPORTED_DATATYPES:
        raise _field_error(
            meta_path,
            "core:datatype",
            f"{datatype!r} is not supported (use one of {', '.join(SUPPORTED_DATATYPES)})",
        )
    channels = glob_.get("core:num_channels", 1)
    if channels != 1:
        raise _field_error(meta_path, "core:num_channels", f"{channels} channels; only 1 supported")
    if glob_.get("core:offset", 0) not in (0, None):
        raise _field_error(meta_path, "core:offset", "a non-zero sample offset is not supported")
    if glob_.get("core:trailing_bytes", 0):
        raise _field_error(meta_path, "core:trailing_bytes", "trailing bytes are not supported")
    if glob_.get("core:metadata_only", False):
        raise _field_error(meta_path, "core:metadata_only", "recording has no samples")
    if glob_.get("core:dataset"):
        raise _field_error(meta_path, "core:dataset", "non-conforming datasets are not supported")
    for i, capture in enumerate(metadata.get("captures", [])):
        if capture.get("core:header_bytes", 0):
            raise _field_error(
                meta_path, f"captures[{i}].core:header_bytes", "header bytes are not supported"
            )
    return datatype


def _num_samples(
    meta_path: Path, data_path: Path, datatype: str, capture_starts: tuple[int, ...]
) -> int:
    """Samples in the data file next to ``meta_path``; every capture must start within them."""
    try:
        st = os.stat(data_path)
    except OSError:
        raise DataError(f"{data_path}: data file missing (next to {meta_path.name})") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or lie about its size
        raise DataError(f"{data_path}: data file is not a regular file")
    nbytes = st.st_size
    per = BYTES_PER_SAMPLE[datatype]
    if nbytes % per:
        raise DataError(
            f"{data_path}: data length {nbytes} bytes is not a whole number of "
            f"{datatype} samples ({per} bytes each)"
        )
    num_samples = nbytes // per
    for i, start in enumerate(capture_starts):
        if start > num_samples:
            raise _field_error(
                meta_path,
                f"captures[{i}].core:sample_start",
                f"{start} is beyond the end of the data "
                f"({num_samples} samples in {data_path.name})",
            )
    return num_samples


def read_recording(meta_path: Path) -> tuple[Recording, bytes]:
    """Parse and validate one recording; return it with its raw metadata bytes."""
    metadata, meta_bytes = _load_metadata(meta_path)
    # Checked before the schema so the error names captures[i].core:sample_start.
    capture_starts = _capture_starts(meta_path, metadata)
    _check_schema(meta_path, metadata)
    datatype = _check_readable(meta_path, metadata)
    glob_ = metadata["global"]
    rate = glob_.get("core:sample_rate")
    data_path = meta_path.with_suffix(".sigmf-data")
    rec = Recording(
        meta_path=meta_path,
        data_path=data_path,
        datatype=datatype,
        num_samples=_num_samples(meta_path, data_path, datatype, capture_starts),
        sample_rate=float(rate) if rate is not None else None,
        sha512=glob_.get("core:sha512"),
        capture_starts=capture_starts,
        meta_sha256=meta_sha256(meta_bytes),
    )
    return rec, meta_bytes


@dataclass(frozen=True)
class Annotation:
    """One SigMF annotation: samples ``[sample_start, sample_start + sample_count)``."""

    sample_start: int
    sample_count: int
    label: str | None  # core:label; None when the annotation has none
    # Every field of the annotation as written (``iqtrain:snr_db``, ``torchsig:snr_db``, ...):
    # what ``iqtrain probe --by`` bins by.
    fields: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


def read_annotations(rec: Recording) -> list[Annotation]:
    """The annotations of ``rec``, in metadata order, each checked against its data.

    A missing ``core:sample_count`` runs to the end of the data (the SigMF reading). Samples
    an annotation claims beyond the data would be misread, so that is a DataError naming
    ``annotations[i]``, as is a non-integer start or count and a non-string ``core:label``.
    Training ignores annotations; only what reads labels (the probe) calls this.
    """
    metadata, _ = _load_metadata(rec.meta_path)
    annotations = metadata.get("annotations", [])
    if not isinstance(annotations, list):
        raise _field_error(rec.meta_path, "annotations", "must be an array of annotation objects")
    found = []
    for i, ann in enumerate(annotations):
        where = f"annotations[{i}]"
        if not isinstance(ann, dict):
            raise _field_error(rec.meta_path, where, "must be an object")
        start = ann.get("core:sample_start")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise _field_error(
                rec.meta_path,
                f"{where}.core:sample_start",
                f"must be an integer >= 0, got {start!r}",
            )
        count = ann.get("core:sample_count", max(rec.num_samples - start, 0))
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise _field_error(
                rec.meta_path,
                f"{where}.core:sample_count",
                f"must be an integer >= 0, got {count!r}",
            )
        if start + count > rec.num_samples:
            raise _field_error(
                rec.meta_path,
                where,
                f"samples [{start}, {start + count}) run beyond the end of the data "
                f"({rec.num_samples} samples in {rec.data_path.name})",
            )
        label = ann.get("core:label")
        if label is not None and not isinstance(label, str):
            raise _field_error(
                rec.meta_path, f"{where}.core:label", f"must be a string, got {label!r}"
            )
        found.append(Annotation(start, count, label, dict(ann)))
    return found

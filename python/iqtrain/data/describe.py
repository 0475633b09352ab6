"""``iqtrain describe``: the SigMF metadata a raw capture needs to be read (docs/data.md, raw
captures).

An SDR tool's raw file (``capture.cu8`` from rtl_sdr, ``capture.cs8`` from hackrf_transfer,
``capture.cf32`` from GNU Radio) becomes a SigMF non-conforming dataset: a ``.sigmf-meta``
beside it whose ``core:dataset`` names it, with its datatype, sample rate, centre frequency,
header and trailing bytes and, optionally, one label over all its samples. The file is checked
by sigmf-python (its schema and its reading of the dataset) and by iqtrain's own reader before
it is written, and written atomically: nothing is left behind by a refusal. Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from iqtrain.config.sections import SIGMF_DATATYPES
from iqtrain.data.sigmf import read_recording, validate_metadata
from iqtrain.data.sigmf.datatypes import DatatypeProblem, parse_datatype
from iqtrain.errors import ConfigError, DataError
from iqtrain.storage import storage_error, write_bytes_atomic

__all__ = ["DATATYPE_ALIASES", "RawCapture", "describe_raw"]

#: The names SDR tools give their formats, and the SigMF datatype each is.
DATATYPE_ALIASES = {
    "cs8": "ci8",  # hackrf_transfer
    "cs16": "ci16_le",
    "cf32": "cf32_le",  # GNU Radio's gr_complex, SDR++ / GQRX raw
    "fc32": "cf32_le",
    "cu16": "cu16_le",
    "cs32": "ci32_le",
    "cf64": "cf64_le",
}


def _datatype(text: str) -> str:
    name = DATATYPE_ALIASES.get(text, text)
    try:
        canonical, _ = parse_datatype(name)
    except DatatypeProblem as exc:
        known = ", ".join(SIGMF_DATATYPES)
        raise ConfigError(f"--datatype: {exc} (SigMF: {known}; or cs8, cf32, cs16)") from None
    return canonical


def _sha512(path: Path) -> str:
    h = hashlib.sha512()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True, kw_only=True)
class RawCapture:
    """What a raw capture's bytes are: its sample format (a SigMF datatype or an SDR tool's
    name, :data:`DATATYPE_ALIASES`), sample rate (Hz), centre frequency (Hz), the bytes before
    and after its samples, and one label for all of them."""

    datatype: str
    sample_rate: float
    frequency: float | None = None
    header_bytes: int = 0
    trailing_bytes: int = 0
    label: str | None = None


def describe_raw(
    raw: str | os.PathLike,
    capture: RawCapture,
    *,
    out: str | os.PathLike | None = None,
    force: bool = False,
    checksum: bool = True,
) -> tuple[Path, int]:
    """Write the ``.sigmf-meta`` that describes ``raw`` as ``capture`` says (default: beside
    it, its name with the suffix replaced); return its path and the samples it describes.
    ConfigError (a flag) or DataError (the file) when it cannot describe it; nothing is written
    then."""
    raw = Path(raw)
    c = capture
    dt = _datatype(c.datatype)
    meta = Path(out) if out is not None else raw.with_suffix(".sigmf-meta")
    conforming = raw.name.endswith(".sigmf-data")
    _check_inputs(raw, meta, c, force, conforming)
    sample_rate, frequency, label = c.sample_rate, c.frequency, c.label
    header_bytes, trailing_bytes = c.header_bytes, c.trailing_bytes
    size = raw.stat().st_size
    per = SIGMF_DATATYPES[dt].bytes_per_sample
    payload = size - header_bytes - trailing_bytes
    if payload <= 0 or payload % per:
        raise DataError(
            f"{raw}: {size} bytes less {header_bytes} header and {trailing_bytes} trailing is "
            f"not a whole, non-zero number of {dt} samples ({per} bytes each)"
        )
    samples = payload // per
    first: dict[str, object] = {"core:sample_start": 0}
    if header_bytes:
        first["core:header_bytes"] = header_bytes
    if frequency is not None:
        first["core:frequency"] = float(frequency)
    glob_: dict[str, object] = {
        "core:datatype": dt,
        "core:version": _spec_version(),
        "core:sample_rate": float(sample_rate),
        "core:recorder": "iqtrain describe",
    }
    if not conforming:
        glob_["core:dataset"] = os.path.relpath(raw, meta.parent)
    if trailing_bytes:
        glob_["core:trailing_bytes"] = trailing_bytes
    if checksum:
        glob_["core:sha512"] = _sha512(raw)
    annotations = []
    if label is not None:
        annotations.append(
            {"core:sample_start": 0, "core:sample_count": samples, "core:label": label}
        )
    metadata = {"global": glob_, "captures": [first], "annotations": annotations}
    _check_with_sigmf(metadata, raw)
    text = json.dumps(metadata, indent=4) + "\n"
    try:
        write_bytes_atomic(meta, text.encode())
    except OSError as exc:
        raise storage_error(meta, exc) from None
    try:  # iqtrain's own verdict on what was written: never leave a file it refuses
        read_recording(meta.resolve())
    except DataError:
        meta.unlink(missing_ok=True)
        raise
    return meta, samples


def _check_inputs(
    raw: Path, meta: Path, capture: RawCapture, force: bool, conforming: bool
) -> None:
    try:
        st = raw.stat()
    except OSError as exc:
        raise DataError(f"{raw}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise DataError(f"{raw}: not a regular file")
    if raw.name.endswith((".sigmf-meta", ".sigmf", ".sigmf-collection")):
        raise DataError(f"{raw}: already SigMF metadata or an archive, not a raw capture")
    if not meta.name.endswith(".sigmf-meta"):
        raise ConfigError(f"--out: {meta} must end in .sigmf-meta")
    if meta.parent.resolve() != raw.parent.resolve():
        raise ConfigError(
            f"--out: {meta} must be beside {raw} (SigMF keeps a dataset in its metadata's folder)"
        )
    if conforming and meta.name[: -len(".sigmf-meta")] != raw.name[: -len(".sigmf-data")]:
        raise ConfigError(
            f"--out: a .sigmf-data file's metadata has its name: {raw.stem}.sigmf-meta"
        )
    if os.path.lexists(meta) and not force:
        raise ConfigError(f"--out: {meta} exists; pass --force to replace it")
    _check_capture(capture)


def _check_capture(capture: RawCapture) -> None:
    """The flags that describe the samples: a ConfigError naming the flag."""
    rate = capture.sample_rate
    if isinstance(rate, bool) or not (isinstance(rate, int | float) and 0 < rate < float("inf")):
        raise ConfigError(f"--sample-rate: must be a positive number of Hz, got {rate!r}")
    if capture.frequency is not None and not abs(capture.frequency) < float("inf"):
        raise ConfigError(f"--frequency: must be a finite number of Hz, got {capture.frequency}")
    for flag, n in (
        ("--header-bytes", capture.header_bytes),
        ("--trailing-bytes", capture.trailing_bytes),
    ):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"{flag}: must be an integer >= 0, got {n!r}")
    if capture.label is not None and (not capture.label.strip() or not capture.label.isprintable()):
        raise ConfigError(f"--label: {capture.label!r} is not a class name (printable, not blank)")


def _spec_version() -> str:
    from sigmf import __specification__

    return str(__specification__)


def _check_with_sigmf(metadata: dict, raw: Path) -> None:
    """The metadata through sigmf-python: its schema, and its reading of the dataset."""
    import warnings

    from sigmf import SigMFFile

    try:
        validate_metadata(metadata)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "not an integer number of samples" and the like
            SigMFFile(metadata=metadata, data_file=raw, skip_checksum=True)
    except Exception as exc:  # sigmf's own errors, jsonschema's, its warnings made errors
        raise DataError(f"{raw}: sigmf-python refuses the description: {exc}") from None

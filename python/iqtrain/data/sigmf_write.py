"""Writing one SigMF recording: what every recording iqtrain writes (``iqtrain synth``,
``iqtrain convert``) has in common.

- :data:`EXTENSION`: the ``iqtrain`` namespace its annotations use (``iqtrain:snr_db`` and the
  like), declared optional in ``core:extensions`` (sigmf wants a namespace declared);
- :func:`attach_data`: the samples, over which sigmf computes ``core:sha512``;
- :func:`write_recording`: checked against the SigMF schema (the validator built once:
  :func:`~iqtrain.data.sigmf.validate_metadata`), written by sigmf (``SigMFFile.tofile``:
  keys sorted by its ``ordered_metadata``), optionally fsynced; a failure removes both files
  and is the StorageError naming the data file.

Imports no torch.
"""

from __future__ import annotations

import io
from pathlib import Path

from sigmf import SigMFFile

from iqtrain.data.sigmf import validate_metadata
from iqtrain.storage import fsync_file, storage_error, unlink_quietly

__all__ = ["EXTENSION", "attach_data", "extensions", "write_recording"]

#: The ``iqtrain`` SigMF extension: its name, version, and that a reader may ignore it.
EXTENSION = {"name": "iqtrain", "version": "1.0.0", "optional": True}


def extensions() -> list[dict[str, object]]:
    """``core:extensions`` of a recording iqtrain writes (a fresh list: sigmf keeps it)."""
    return [dict(EXTENSION)]


def attach_data(meta: SigMFFile, data: bytes) -> None:
    """``data`` as the recording's samples: sigmf computes ``core:sha512`` over them here and
    writes them in :func:`write_recording`."""
    meta.set_data_file(data_buffer=io.BytesIO(data))


def write_recording(meta: SigMFFile, base: Path, *, durable: bool = False) -> Path:
    """``base.sigmf-meta`` and ``base.sigmf-data`` (replacing either), after the check sigmf's
    own ``tofile`` makes first (the SigMF schema), made with the validator built once: sigmf's
    own rebuilds and re-checks the schema for every recording (docs/design.md "Decisions").
    ``durable``: both files fsynced. An OSError (a full disk) removes both and is the
    :class:`~iqtrain.errors.StorageError` naming the data file. Returns the metadata path."""
    validate_metadata(meta.ordered_metadata())
    files = [base.with_name(base.name + suffix) for suffix in (".sigmf-meta", ".sigmf-data")]
    try:
        meta.tofile(base, overwrite=True, skip_validate=True)
        for path in files if durable else ():
            fsync_file(path)
    except OSError as exc:  # name the recording, leave no half of it
        for path in files:
            unlink_quietly(path)
        raise storage_error(files[1], exc) from None
    return files[0]

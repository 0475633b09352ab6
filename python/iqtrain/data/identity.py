"""Data identity: what an attempt trained on, and every check that the data is still that.

Two identities (docs/design.md section 1):

- the sampled **fingerprint** of a dataset (:attr:`IQDataset.fingerprint`: metadata bytes,
  data lengths and fixed sampled blocks; O(1) per recording), the cursor's quick check;
- the full-content **digests**: BLAKE3 of every data file (the Rust extension, multi-threaded)
  and SHA-256 of every ``.sigmf-meta`` (its captures and datatype decide what a window reads),
  recorded in every checkpoint's state.json ``data``.

Here: computing them (:func:`compute_digests`, in the background for a fresh run:
:class:`DataIdentity`), the comparison a resume makes before the child exists
(:func:`check_parent_data`, exit 2 naming the recording), and ``iqtrain verify --data``
(:func:`verify_data`), which re-reads every recording a checkpoint recorded. Imports no torch.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from iqtrain.checkpoint.state import CheckpointState
from iqtrain.data.dataset import IQDataset
from iqtrain.data.sigmf_meta import BYTES_PER_SAMPLE
from iqtrain.errors import CursorMismatchError, DataError

__all__ = [
    "DataIdentity",
    "check_parent_data",
    "compute_digests",
    "meta_digest",
    "verify_data",
]

Digests = dict[str, dict[str, str]]
_GROUPS = ("train", "val")


def meta_digest(meta_path: Path) -> str:
    """SHA-256 of a ``.sigmf-meta`` file (DataError naming it when it cannot be read)."""
    try:
        return hashlib.sha256(Path(meta_path).read_bytes()).hexdigest()
    except OSError as exc:
        raise DataError(f"{meta_path}: cannot read: {exc.strerror or exc}") from None


def compute_digests(train: IQDataset, val: IQDataset) -> Digests:
    """Full-content digests of every recording (reads every byte): ``train``/``val`` map each
    data file to its BLAKE3, ``train_meta``/``val_meta`` each ``.sigmf-meta`` to its SHA-256."""
    out: Digests = {}
    for key, ds in (("train", train), ("val", val)):
        out[key] = ds.content_digests()
        out[f"{key}_meta"] = {str(r.meta_path): meta_digest(r.meta_path) for r in ds.recordings}
    return out


class DataIdentity:
    """What the attempt trained on: sampled fingerprints and full-content digests.

    A fresh run computes the digests in a background thread (the Rust digest releases the GIL),
    so the first step never waits for them; the first checkpoint does, since it records them.
    A resume passes the digests it already computed and compared with its parent's.
    """

    def __init__(self, train: IQDataset, val: IQDataset, digests: Digests | None = None):
        self.fingerprints = {"train": train.fingerprint, "val": val.fingerprint}
        self._lengths = [
            (rec, rec.num_samples * BYTES_PER_SAMPLE[rec.datatype])
            for ds in (train, val)
            for rec in ds.recordings
        ]
        self._digests = digests
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if digests is None:
            self._thread = threading.Thread(
                target=self._run, args=(train, val), name="iqtrain-digest", daemon=True
            )
            self._thread.start()

    def _run(self, train: IQDataset, val: IQDataset) -> None:
        try:
            self._digests = compute_digests(train, val)
        except BaseException as exc:  # re-raised in the loop's thread by digests()
            self._error = exc

    def check_lengths(self) -> None:
        """Every data file still has the length it was opened with (a file that grew is not
        read past its old end, but it is not the data the digests describe any more)."""
        for rec, nbytes in self._lengths:
            try:
                found = os.stat(rec.data_path).st_size
            except OSError as exc:
                raise DataError(f"{rec.data_path}: cannot inspect: {exc.strerror}") from None
            if found != nbytes:
                raise DataError(
                    f"{rec.data_path}: data file changed length while being read "
                    f"(expected {nbytes} bytes, found {found})"
                )

    def digests(self) -> Digests:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        assert self._digests is not None
        return self._digests


def _compare(key: str, old: dict[str, str], new: dict[str, str], what: str, ds: IQDataset) -> None:
    added = sorted(new.keys() - old.keys())
    for path in added:  # named through a symlink that now points elsewhere: say so first
        link = ds.links.get(Path(path).with_suffix(".sigmf-meta"))
        if link is not None:
            raise CursorMismatchError(
                f"data.{key}: {link} is a symlink that now resolves to {path}, which the parent "
                "did not train on (was it retargeted?)"
            )
    for path in sorted(old.keys() | new.keys()):
        if path not in new:
            raise CursorMismatchError(
                f"data.{key}: {path} was in the parent's dataset and is missing now"
            )
        if path not in old:
            raise CursorMismatchError(f"data.{key}: {path} is new since the parent")
        if old[path] != new[path]:
            raise CursorMismatchError(
                f"data.{key}: {path} changed since the parent was written ({what} "
                f"{new[path][:16]}… differs from the recorded {old[path][:16]}…)"
            )


def check_parent_data(
    recorded: CheckpointState, train: IQDataset, val: IQDataset, *, read: bool
) -> Digests | None:
    """Refuse (exit 2, naming the recording) data a resume's parent did not train on.

    With ``read`` (rank 0) every byte first: the content digests, then the metadata digests;
    they are returned, for the child's first checkpoint. Every rank then compares the sampled
    fingerprints (the cursor's identity)."""
    digests = compute_digests(train, val) if read else None
    if digests is not None:
        for key, ds in (("train", train), ("val", val)):
            _compare(key, recorded.data[key], digests[key], "content digest", ds)
        for key, ds in (("train", train), ("val", val)):
            meta = f"{key}_meta"
            _compare(key, recorded.data[meta], digests[meta], "metadata digest", ds)
    for key, ds in (("train", train), ("val", val)):
        if recorded.fingerprints[key] != ds.fingerprint:
            raise CursorMismatchError(
                f"data.{key}: the dataset's fingerprint {ds.fingerprint[:16]}… differs from "
                f"the parent's {recorded.fingerprints[key][:16]}… (data changed)"
            )
    return digests


def verify_data(recorded: CheckpointState, checkpoint: str) -> list[str]:
    """``iqtrain verify --data``: every recording ``recorded`` (the state of checkpoint
    ``checkpoint``, by name) lists, re-read and compared with its digests, and each
    recording's SigMF ``core:sha512`` where its metadata carries one. Reads every byte."""
    problems: list[str] = []
    for key in _GROUPS:
        digests = recorded.data[key]
        metas = [str(Path(p).with_suffix(".sigmf-meta")) for p in sorted(digests)]
        try:
            dataset = IQDataset(metas, window=1)  # every recording, whatever its length
            now = dataset.content_digests()
            problems += dataset.verify_content()
        except DataError as exc:
            problems.append(f"data.{key}: {exc}")
            continue
        problems += [
            f"data.{key}: {p}: content differs from what {checkpoint} recorded"
            for p in sorted(digests)
            if now.get(p) != digests[p]
        ]
        for meta, want in sorted(recorded.data[f"{key}_meta"].items()):
            try:
                got = meta_digest(Path(meta))
            except DataError as exc:
                problems.append(f"data.{key}: {exc}")
                continue
            if got != want:
                problems.append(
                    f"data.{key}: {meta}: metadata differs from what {checkpoint} recorded"
                )
    return problems

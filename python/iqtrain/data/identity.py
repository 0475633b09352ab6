"""Data identity: what an attempt trained on, and every check that the data is still that.

Two identities (docs/design.md "Dataset identity"):

- the sampled **fingerprint** of a dataset (:attr:`IQDataset.fingerprint`: metadata bytes,
  data lengths and fixed sampled blocks; O(1) per recording), the cursor's quick check;
- the full-content **digests**: BLAKE3 of every data file (the Rust extension, multi-threaded)
  and SHA-256 of every ``.sigmf-meta`` (its captures and datatype decide what a window reads),
  recorded in every checkpoint's state.json ``data``.

Here: computing them (:func:`compute_digests` in one process; shared by the ranks of a job,
each reading its 1/W: :class:`DigestPlan` ``share`` and ``merge``, in the background for a
fresh run: :class:`DataIdentity`), the comparison a resume makes before the child exists
(:func:`check_parent_data`, exit 2 naming the recording), and ``iqtrain verify --data``
(:func:`verify_data`), which re-reads every recording a checkpoint recorded. Imports no torch.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from iqtrain._native import digest_merge, digest_pieces, digest_plan
from iqtrain.checkpoint.state import CheckpointState
from iqtrain.data.dataset import IQDataset
from iqtrain.data.sigmf import meta_sha256
from iqtrain.distributed.world import World, agree
from iqtrain.errors import CursorMismatchError, DataError, TrainingError

__all__ = [
    "DataIdentity",
    "DigestShare",
    "check_parent_data",
    "compute_digests",
    "DigestPlan",
    "meta_digest",
    "share_of",
    "verify_data",
]

Digests = dict[str, dict[str, str]]
_GROUPS = ("train", "val")


def meta_digest(meta_path: Path) -> str:
    """SHA-256 of a ``.sigmf-meta`` file (DataError naming it when it cannot be read)."""
    try:
        return meta_sha256(Path(meta_path).read_bytes())
    except OSError as exc:
        raise DataError(f"{meta_path}: cannot read: {exc.strerror or exc}") from None


def compute_digests(train: IQDataset, val: IQDataset) -> Digests:
    """Full-content digests of every recording (reads every data byte): ``train``/``val`` map
    each data file to its BLAKE3, ``train_meta``/``val_meta`` each ``.sigmf-meta`` to the
    SHA-256 of the bytes the dataset parsed when it opened (what it trains on; not read again:
    that was one more open and read per recording, holding the GIL beside the first steps)."""
    out: Digests = {}
    for key, ds in (("train", train), ("val", val)):
        out[key] = ds.content_digests()
        out[f"{key}_meta"] = {str(r.meta_path): r.meta_sha256 for r in ds.recordings}
    return out


class DataIdentity:
    """What the attempt trained on: sampled fingerprints and full-content digests.

    Every rank holds one. A fresh run computes the digests in a background thread on every
    rank, each reading its share of the bytes (:meth:`DigestPlan.share`; the Rust digest releases
    the GIL), so the first step never waits for them; the first checkpoint does, since it
    records them: there every rank hands its share to rank 0 (one gather), which merges them.
    A resume passes ``checked`` and the digests its data check already merged and compared
    (rank 0's; None on the others): nothing is read again.
    """

    def __init__(
        self,
        train: IQDataset,
        val: IQDataset,
        digests: Digests | None = None,
        *,
        world: World | None = None,
        checked: bool = False,
    ):
        self.fingerprints = {"train": train.fingerprint, "val": val.fingerprint}
        # Each data file once (an archive's recordings share one), with its length at open.
        self._lengths = {
            os.fspath(rec.data_path): rec.file_bytes for ds in (train, val) for rec in ds.recordings
        }
        self._datasets = (train, val)
        self._world = world
        self._digests = digests
        self._share: DigestShare | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._merged = checked or digests is not None
        self._plan: DigestPlan | None = None
        if not self._merged:
            self._plan = DigestPlan.of(train, val)  # once: the share reads it, rank 0 merges by it
            self._thread = threading.Thread(target=self._run, name="iqtrain-digest", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        rank, size = (0, 1) if self._world is None else (self._world.rank, self._world.world_size)
        assert self._plan is not None
        try:
            self._share = self._plan.share(rank, size)
        except BaseException as exc:  # re-raised in the loop's thread by digests()
            self._error = exc

    def check_lengths(self) -> None:
        """Every data file still has the length it was opened with (a file that grew is not
        read past its old end, but it is not the data the digests describe any more)."""
        for path, nbytes in self._lengths.items():
            try:
                found = os.stat(path).st_size
            except OSError as exc:
                raise DataError(f"{path}: cannot inspect: {exc.strerror}") from None
            if found != nbytes:
                raise DataError(
                    f"{path}: data file changed length while being read "
                    f"(expected {nbytes} bytes, found {found})"
                )

    def digests(self) -> Digests | None:
        """The digests (rank 0; None on the others). The first call on a fresh run is a
        collective, made by every rank at the same point (the first checkpoint): each waits
        for its share, the shares go to every rank, rank 0 merges them. A share that failed
        (a file changed under it) fails every rank: rank 0 raises the first failed rank's
        DataError (the attempt exists: exit 1), the others exit 1 silently."""
        if not self._merged:
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            self._merged = True
            shares = self._agreed_shares()
            if self._world is None or self._world.is_main:
                assert self._plan is not None
                self._digests = self._plan.merge(shares)
        if self._world is not None and not self._world.is_main:
            return None
        assert self._digests is not None
        return self._digests

    def _agreed_shares(self) -> list[DigestShare]:
        """Every rank's share, through :func:`~iqtrain.distributed.world.agree` (it waits on
        the long barrier first: shares finish at different times). A failed share is a failure
        of the run (the attempt exists): rank 0 raises its own error as it was, or a DataError
        ``"rank R: ..."`` for another rank's; the others exit 1 silently."""
        if self._world is None:
            if self._error is not None:
                raise self._error
            assert self._share is not None
            return [self._share]
        failure = None if self._error is None else _ShareFailed(self._error)
        try:
            return agree(self._world, failure, payload=self._share)
        except _ShareFailed as own:  # this rank's (rank 0: agree raises its own error)
            raise own.error from None
        except TrainingError as exc:
            if type(exc) is not TrainingError:  # a PeerError: the collective itself failed
                raise
            raise DataError(str(exc)) from None  # another rank's share: "rank R: ..."


class _ShareFailed(TrainingError):
    """A rank's share that failed, as :func:`agree` carries it: exit 1 on every rank (a
    failure of the run, the attempt exists), the message the error's own."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _compare(key: str, old: dict[str, str], new: dict[str, str], what: str, ds: IQDataset) -> None:
    added = sorted(new.keys() - old.keys())
    metas = {r.data_name: r.meta_path for r in ds.recordings} | {
        os.fspath(r.meta_path): r.meta_path for r in ds.recordings
    }
    for path in added:  # named through a symlink that now points elsewhere: say so first
        meta = metas.get(path)
        link = ds.links.get(meta) if meta is not None else None
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
    recorded: CheckpointState, train: IQDataset, val: IQDataset, digests: Digests | None
) -> None:
    """Refuse (exit 2, naming the recording) data a resume's parent did not train on.

    With ``digests`` (rank 0: every byte read, by every rank's share, merged) first the content
    digests, then the metadata digests. Every rank then compares the sampled fingerprints (the
    cursor's identity)."""
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


def verify_data(
    recorded: CheckpointState, checkpoint: str, channel: int | None = None
) -> list[str]:
    """``iqtrain verify --data``: every recording ``recorded`` (the state of checkpoint
    ``checkpoint``, by name) lists, re-opened from its metadata (``channel``: the attempt's
    ``data.channel``), re-read and compared with its digests, and each recording's SigMF
    ``core:sha512`` where its metadata carries one. Reads every byte."""
    problems: list[str] = []
    for key in _GROUPS:
        digests = recorded.data[key]
        metas = sorted(recorded.data[f"{key}_meta"])
        try:
            # every recording, whatever its length, read as the attempt read it
            dataset = IQDataset(metas, window=1, channel=channel)
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
        # The bytes each metadata file (or archive member) was parsed from just now.
        parsed = {os.fspath(r.meta_path): r.meta_sha256 for r in dataset.recordings}
        for meta, want in sorted(recorded.data[f"{key}_meta"].items()):
            got = parsed.get(meta)
            if got is None:
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


# --- the full-content digests shared across the ranks of a job -------------------------------


@dataclass(frozen=True)
class _Piece:
    """Bytes ``[offset, offset + size)`` of the dataset ``name`` of ``group``: the ``region``
    bytes from ``base`` of file ``path`` (``length`` bytes long)."""

    group: str
    name: str
    path: str
    length: int
    base: int
    region: int
    offset: int
    size: int


#: Bytes per piece of a shared digest: a power of two, so each piece is a BLAKE3 subtree.
#: 64 MiB: a file up to that is one rank's whole; the per-piece overhead is nothing beside it.
PIECE = 64 << 20


def _pieces(train: IQDataset, val: IQDataset) -> list[_Piece]:
    """Every data file of both datasets cut in BLAKE3 subtree pieces (``digest_plan``: the whole
    file up to :data:`PIECE`), files in dataset order, pieces in file order."""
    out = []
    for group, ds in (("train", train), ("val", val)):
        for rec in ds.recordings:
            path, name, region = os.fspath(rec.data_path), rec.data_name, rec.data_bytes
            out += [
                _Piece(group, name, path, rec.file_bytes, rec.data_offset, region, o, n)
                for o, n in digest_plan(region, PIECE)
            ]
    return out


@dataclass(frozen=True)
class DigestPlan:
    """The pieces of both datasets (built once) and their metadata digests: what a rank's share
    reads (:meth:`share`) and what rank 0 merges the shares by (:meth:`merge`). Build it once
    per attempt (:meth:`of`) and use it for both."""

    pieces: list[_Piece]
    metas: Digests

    @classmethod
    def of(cls, train: IQDataset, val: IQDataset) -> DigestPlan:
        metas = {
            f"{key}_meta": {str(r.meta_path): r.meta_sha256 for r in ds.recordings}
            for key, ds in (("train", train), ("val", val))
        }
        return cls(_pieces(train, val), metas)

    def share(
        self, rank: int, world_size: int, progress: Callable[[str], None] | None = None
    ) -> DigestShare:
        """Rank ``rank``'s share of every data file's BLAKE3 (:func:`share_of`), read and hashed
        in parallel in Rust. ``progress`` (rank 0's console) hears how far it is every ~10 s. A
        data file whose length is not what the dataset opened, or that changes while read, is
        the DataError naming it (the first in order among this rank's pieces)."""
        return _read_share(self.pieces, rank, world_size, progress)

    def merge(self, shares: list[DigestShare]) -> Digests:
        """Every rank's share merged into the digests :func:`compute_digests` gives (the same
        values: BLAKE3's tree rebuilt from its pieces), for rank 0."""
        return _merge(self.pieces, shares) | self.metas


def share_of(sizes: list[int], rank: int, world_size: int) -> list[int]:
    """Indices of the pieces (of ``sizes`` bytes, in order) rank ``rank`` of ``world_size``
    reads: piece ``i`` goes to the rank whose ``1/W`` slice of the total bytes holds its first
    byte, so each rank reads a contiguous run of about ``total / W`` bytes (within one piece)."""
    total = sum(sizes)
    out, before = [], 0
    for i, size in enumerate(sizes):
        owner = min(before * world_size // total, world_size - 1) if total else 0
        if owner == rank:
            out.append(i)
        before += size
    return out


@dataclass
class DigestShare:
    """One rank's part of the digests: piece index -> 32-byte value, the bytes it read and the
    seconds it took."""

    values: dict[int, bytes]
    bytes: int
    seconds: float


_PROGRESS_S = 10.0  # seconds between progress notes of a long data check
_BATCH_BYTES = 1 << 30  # bytes per native call: the granularity of the progress notes


def _read_share(
    pieces: list[_Piece],
    rank: int,
    world_size: int,
    progress: Callable[[str], None] | None,
) -> DigestShare:
    mine = share_of([p.size for p in pieces], rank, world_size)
    total = sum(pieces[i].size for i in mine)
    values: dict[int, bytes] = {}
    t0 = last = time.monotonic()
    done, at = 0, 0
    while at < len(mine):
        batch: list[int] = []
        nbytes = 0
        while at < len(mine) and (not batch or nbytes < _BATCH_BYTES):
            batch.append(mine[at])
            nbytes += pieces[mine[at]].size
            at += 1
        got = digest_pieces(
            [pieces[i].path for i in batch],
            [pieces[i].length for i in batch],
            [pieces[i].offset for i in batch],
            [pieces[i].size for i in batch],
            [pieces[i].base for i in batch],
            [pieces[i].region for i in batch],
        )
        values.update(zip(batch, got, strict=True))
        done += nbytes
        now = time.monotonic()
        if progress is not None and now - last >= _PROGRESS_S and at < len(mine):
            last = now
            rate = done / max(now - t0, 1e-9) / 1e9
            progress(
                f"data check: {done / 1e9:.1f} of {total / 1e9:.1f} GB read "
                f"(this rank's 1/{world_size}), {rate:.2f} GB/s"
            )
    return DigestShare(values, total, time.monotonic() - t0)


def _merge(pieces: list[_Piece], shares: list[DigestShare]) -> Digests:
    """The content digests (``train``, ``val``) of ``pieces`` from the shares that read them."""
    values: dict[int, bytes] = {}
    for share in shares:
        values.update(share.values)
    if values.keys() != set(range(len(pieces))):
        missing = sorted(set(range(len(pieces))) - values.keys())[:3]
        raise DataError(f"data check: pieces {missing} of {len(pieces)} were read by no rank")
    per_file: dict[tuple[str, str, int], list[bytes]] = {}
    for i, p in enumerate(pieces):
        per_file.setdefault((p.group, p.name, p.region), []).append(values[i])
    out: Digests = {"train": {}, "val": {}}
    for (group, name, region), vals in per_file.items():
        # A one-piece dataset's value is its BLAKE3 already.
        out[group][name] = vals[0].hex() if len(vals) == 1 else digest_merge(region, vals, PIECE)
    return out

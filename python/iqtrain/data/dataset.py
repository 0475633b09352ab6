"""SigMF recordings, windows and the deterministic training stream.

Python reads each recording's metadata (:mod:`iqtrain.data.sigmf`: loose files, archives,
collections, non-conforming datasets) and decides where every sample is (datatype, channels,
capture segments and their bytes); the Rust extension (``iqtrain._native``) opens the data
files and owns every byte after that: window lookup, the seeded epoch permutation, parallel
batch assembly, the background prefetch and full-content digests.

Samples are read from a guarded memory map or with positioned reads (``pread``), so a data file
truncated while a run reads it raises :class:`~iqtrain.errors.DataError` naming the file ("data
file changed length while being read") instead of killing the process with SIGBUS.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iqtrain._native import NativeDataset, NativeStream, digest_files
from iqtrain.data.sigmf import Recording, Source, expand, read_recording
from iqtrain.data.sigmf.regular import open_regular
from iqtrain.errors import (
    CursorMismatchError,
    DataError,
    RecordingsRefused,
    WindowTooLongError,
    int_argument,
    one_line,
)

__all__ = [
    "IQDataset",
    "ReadOptions",
    "TrainStream",
    "shown_path",
]

# Quick identity (the cursor's check): FINGERPRINT_BLOCKS blocks of FINGERPRINT_BLOCK bytes at
# fixed, evenly spaced offsets (first and last block included), so fingerprinting costs O(1) per
# recording however large the file is. Every byte is covered by IQDataset.content_digests().
FINGERPRINT_BLOCK = 4096
FINGERPRINT_BLOCKS = 16
CURSOR_VERSION = 1


def shown_path(path: str | os.PathLike) -> str:
    """A path as a note shows it: relative to the current directory when it lies inside it,
    else absolute (never a bare file name: two folders may hold the same name)."""
    text = os.fspath(path)
    with contextlib.suppress(ValueError):
        rel = os.path.relpath(text)
        if not rel.startswith(".."):
            return rel
    return text


@dataclass(frozen=True)
class ReadOptions:
    """How recordings are read, beside the window: ``channel`` (of multi-channel recordings)
    and ``skip_invalid`` (read past recordings that cannot be read) as :class:`IQDataset` takes
    them."""

    channel: int | None = None
    skip_invalid: bool = False


def _sampled_digest(path: Path, base: int, nbytes: int) -> bytes:
    """SHA-256 of the dataset's bytes ``[base, base + nbytes)`` of ``path``: all of them up to
    16 blocks, else 16 blocks at fixed offsets (docs/design.md "Dataset identity")."""
    # Plain descriptor reads: a buffered file object cost as much again as the reads here.
    h = hashlib.sha256()
    fd = open_regular(path)
    try:
        if nbytes <= FINGERPRINT_BLOCK * FINGERPRINT_BLOCKS:
            if base == 0:
                while chunk := os.read(fd, FINGERPRINT_BLOCK * FINGERPRINT_BLOCKS + 1):
                    h.update(chunk)  # the whole file, to its end now
            else:
                h.update(os.pread(fd, nbytes, base))
        else:
            last = nbytes - FINGERPRINT_BLOCK
            for i in range(FINGERPRINT_BLOCKS):
                at = base + i * last // (FINGERPRINT_BLOCKS - 1)
                h.update(os.pread(fd, FINGERPRINT_BLOCK, at))
    finally:
        os.close(fd)
    return h.digest()


def _fingerprint_piece(rec: Recording, meta_bytes: bytes) -> bytes:
    """What recording ``rec`` adds to its dataset's fingerprint (docs/design.md "Dataset
    identity"), in order:
    its metadata's name and bytes, the data length and the sampled digest (reads the data)."""
    nbytes = rec.data_bytes
    piece = [
        rec.meta_path.name.encode() + b"\0",
        len(meta_bytes).to_bytes(8, "little") + meta_bytes,
        nbytes.to_bytes(8, "little"),
        _sampled_digest(rec.data_path, rec.data_offset, nbytes),
    ]
    segments = rec.segments
    if len(segments) > 1:
        # Window ids of a recording cut into several capture segments differ from those of
        # iqtrain before segmenting (windows then ran across captures), so a cursor saved by it
        # must not match; one segment keeps its fingerprint and ids.
        piece.append(b"segments\0" + json.dumps([list(s) for s in segments]).encode())
    if rec.channels > 1:  # data.channel chooses what a window reads: not in the file's bytes
        piece.append(f"channel\0{rec.channel}/{rec.channels}".encode())
    return b"".join(piece)


def _selection_fingerprint(base: str, selection: np.ndarray) -> str:
    """The fingerprint of a dataset restricted to ``selection`` (base window ids, in order):
    SHA-256 of a tag, the base fingerprint's hex and the ids as little-endian uint64."""
    h = hashlib.sha256(b"iqtrain-selection-v1\0")
    h.update(base.encode())
    h.update(np.ascontiguousarray(selection, dtype="<u8").tobytes())
    return h.hexdigest()


def _read_one(source: Source, channel: int | None) -> tuple[Recording, bytes]:
    """One recording, parsed and checked, with its fingerprint piece (a DataError when it
    cannot be read, the data file unreadable included)."""
    rec, meta_bytes = read_recording(source, channel=channel)
    try:
        return rec, _fingerprint_piece(rec, meta_bytes)
    except OSError as exc:
        raise DataError(
            f"{rec.data_path}: data file: cannot be read ({exc.strerror or exc})"
        ) from None


def _sha512_problem(rec: Recording) -> str | None:
    """Why ``rec``'s data does not match its ``core:sha512``, or None when it does. The hash is
    of the dataset's bytes: the data file, or the archive member."""
    h = hashlib.sha512()
    want, got = rec.data_bytes, 0
    view = memoryview(bytearray(1 << 22))
    try:
        # Plain reads to the end (no map): a truncated file reads short instead of faulting.
        with os.fdopen(open_regular(rec.data_path), "rb", buffering=0) as f:
            f.seek(rec.data_offset)
            while got < want and (n := f.readinto(view[: min(len(view), want - got)])):
                h.update(view[:n])  # hashlib releases the GIL for large updates
                got += n
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        return f"{rec.data_path}: cannot be read ({exc.strerror or exc})"
    if got != want or size != rec.file_bytes:
        return (
            f"{rec.data_path}: data file changed length while being read "
            f"(expected {rec.file_bytes} bytes, found {size})"
        )
    digest = h.hexdigest()
    if digest != str(rec.sha512).lower():
        return (
            f"{rec.data_name}: core:sha512 does not match the data "
            f"(metadata {str(rec.sha512)[:16]}…, data {digest[:16]}…)"
        )
    return None


def _nr_open() -> int | None:
    """Linux's ceiling on any process's open-file limit (``fs.nr_open``), None elsewhere."""
    try:
        with open("/proc/sys/fs/nr_open", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _open_file_budget(n: int) -> int:
    """How many of ``n`` data files a dataset opening now may hold open
    (docs/design.md "Recordings, capture segments, windows", descriptors).

    Raises the soft open-file limit, up to the hard limit, to fit all ``n`` beside the
    descriptors in use and 64 more for the rest of the process. Where the limit allows, that is
    every file (each stays open for positioned reads). Where it does not (100,000 recordings
    against a hard limit of 20,000), the dataset holds half of what is free beyond those 64, at
    least 16, and opens the others again when it reads them: half, so a second dataset (the
    validation set) and the rest of the process still find some.
    """
    try:
        import resource
    except ImportError:  # not POSIX: no limit to consult
        return n
    in_use = 64
    for fds in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            in_use = len(os.listdir(fds))
            break
    want = in_use + n + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or want <= soft:
        return n
    if hard != resource.RLIM_INFINITY and want > hard:
        # A process allowed to (root, CAP_SYS_RESOURCE) raises the hard limit too, up to the
        # kernel's per-process ceiling, so that every file stays open; others stay at the hard
        # limit and share it.
        ceiling = _nr_open()
        with contextlib.suppress(ValueError, OSError):
            top = min(want, ceiling) if ceiling else want
            resource.setrlimit(resource.RLIMIT_NOFILE, (top, top))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or want <= soft:
        return n
    return max(16, (soft - in_use - 64) // 2)


class IQDataset:
    """Fixed-length windows over a sorted set of SigMF recordings.

    ``paths``: ``.sigmf-meta`` files, ``.sigmf`` archives (or ``ARCHIVE/MEMBER``),
    ``.sigmf-collection`` files, or globs of them (:func:`iqtrain.data.sigmf.expand`).

    A window is ``window`` consecutive complex samples starting at a multiple of ``stride``
    (default: ``window``, i.e. non-overlapping) inside one capture segment of one recording, so
    windows never cross a recording or a capture boundary (a retune, or a ``core:global_index``
    jump marking dropped samples). Each SigMF capture is a segment from its ``core:sample_start``
    to the next capture's (or the end of the data), captures that continue each other with
    nothing else changed being one; samples before the first capture form a leading segment of
    their own (docs/design.md "Recordings, capture segments, windows"). Global window ids enumerate
    recordings in sorted path order, then segments in order, then windows. Opening costs
    O(recordings + captures).

    Every recording that cannot be read is listed at once (:class:`RecordingsRefused`, each
    with its file and field); ``skip_invalid`` reads the others instead, and ``refused`` keeps
    ``(path, reason)`` of each. ``notes`` holds ``(metadata path, field, message)`` of what the
    reader tolerated (a version string of another form, a missing annotations list, ...).
    ``channel``: the channel read of multi-channel recordings (required for them).

    ``skipped`` lists ``(metadata path, samples)`` of every recording that yields no window at
    all (shorter than the window, or only capture segments that are); they are read by nothing.
    ``links`` maps each recording's resolved metadata path to the symlink it was named by,
    where it was named by one (its identity is the resolved file's).

    ``map_min_bytes``: data files of at least this many bytes are read from a guarded memory map (a
    truncation is still a ``DataError``, never a SIGBUS: docs/design.md "The guarded map"); smaller
    ones with positioned reads. ``None`` is the native default (256 KiB); ``2**64 - 1`` maps
    nothing.

    ``max_open_files``: at most this many data files are open at once; the others are opened
    again, by path, when read, and must still be the file opened here (another file renamed
    over one, or one deleted and written again, is a ``DataError`` naming it). The open-file
    limit is raised (up to the hard limit) to fit every file; where it cannot, at most half of
    what is then free beyond 64 descriptors (at least 16), whatever this asks for.

    ``select``: restrict the dataset to chosen windows (e.g. the labelled ones, for fine-tuning).
    A 1-D array (uint64, or non-negative int64) or sequence of window ids in this dataset's own
    numbering (with ``window`` and ``stride`` as given, as if there were no selection); window
    ``i`` of the dataset is then base window ``select[i]``. Order is kept and a repeated id is
    one more window (sampled as often per epoch). :attr:`num_windows`, :meth:`window`,
    :meth:`windows`, :meth:`val_batches` and every :class:`TrainStream` over the dataset then
    see only the selected windows, with the same guarantees (seeded permutation, O(1) cursor,
    exact resume). An empty selection is a ValueError, an id that is negative or not below
    :attr:`base_num_windows` an IndexError, any other type (a float or boolean array, a 2-D
    array) a TypeError or ValueError. Every bad argument is a TypeError or ValueError naming
    it. :attr:`fingerprint` then covers the selection too (so a cursor saved
    over one selection, or none, is refused by another); :attr:`base_fingerprint` is the
    fingerprint without it. ``skipped`` is still about recordings, whatever is selected.
    """

    def __init__(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        window: int,
        stride: int | None = None,
        map_min_bytes: int | None = None,
        max_open_files: int | None = None,
        select: np.ndarray | Sequence[int] | None = None,
        channel: int | None = None,
        skip_invalid: bool = False,
    ) -> None:
        window = int_argument("window", window, minimum=1)
        stride = window if stride is None else int_argument("stride", stride, minimum=1)
        if max_open_files is not None:
            max_open_files = int_argument("max_open_files", max_open_files, minimum=1)
        if channel is not None:
            channel = int_argument("channel", channel, minimum=0)
        if isinstance(select, list | tuple) and any(isinstance(i, bool) for i in select):
            # True is an int to Python (and to the extension): a list of flags is no list of ids.
            raise TypeError("select: window ids, not flags (a bool in the sequence)")
        self.recordings, h = self._read(paths, channel, skip_invalid)
        self.stride = stride
        self._check_window(window)
        budget = _open_file_budget(len(self.recordings))
        if max_open_files is not None:
            budget = min(budget, max_open_files)
        self._native = NativeDataset(
            [os.fspath(r.data_path) for r in self.recordings],
            [r.datatype for r in self.recordings],
            window,
            stride,
            [r.layout() for r in self.recordings],
            map_min_bytes,
            budget,
            select,
        )
        self.skipped: list[tuple[str, int]] = [
            (os.fspath(r.meta_path), r.num_samples)
            for r, n in zip(self.recordings, self._native.recording_windows, strict=True)
            if n == 0
        ]
        #: The fingerprint of the recordings alone, whatever is selected.
        self.base_fingerprint: str = h.hexdigest()
        selection = self._native.selection
        self.fingerprint: str = (
            self.base_fingerprint
            if selection is None
            else _selection_fingerprint(self.base_fingerprint, selection)
        )

    def _read(
        self,
        paths: str | os.PathLike | Sequence[str | os.PathLike],
        channel: int | None,
        skip_invalid: bool,
    ) -> tuple[list[Recording], Any]:
        """Every recording ``paths`` name, read in order, and the fingerprint's hash of them.
        Sets ``links``, ``refused`` and ``notes``; raises RecordingsRefused listing every
        recording that cannot be read (unless ``skip_invalid`` and some can)."""
        found = expand(paths)
        self.links = found.links
        problems = list(found.problems)
        recordings: list[Recording] = []
        h = hashlib.sha256(b"iqtrain-dataset-v1\0")
        for source in found.sources:
            try:
                rec, piece = _read_one(source, channel)
            except DataError as exc:
                problems.append((os.fspath(source.meta), str(exc)))
                continue
            recordings.append(rec)
            h.update(piece)
        #: ``(path, reason)`` of every input refused (recorded, and read past, with
        #: ``skip_invalid``).
        self.refused: list[tuple[str, str]] = problems
        #: ``(metadata path, field, message)`` of everything tolerated
        #: (docs/design.md "Datatypes and the metadata verdict").
        self.notes: list[tuple[str, str, str]] = [
            (os.fspath(r.meta_path), f, m) for r in recordings for f, m in r.notes
        ]
        if problems and (not skip_invalid or not recordings):
            raise RecordingsRefused(problems, len(problems) + len(recordings))
        return recordings, h

    def _check_window(self, window: int) -> None:
        """WindowTooLongError, naming the recordings, when none holds a window."""
        longest = max((n for r in self.recordings for _, n in r.segments), default=0)
        if longest >= window:
            return
        names = [one_line(shown_path(r.meta_path)) for r in self.recordings]
        shown = ", ".join(names[:8]) + (f" (+{len(names) - 8} more)" if len(names) > 8 else "")
        raise WindowTooLongError(
            f"every recording is shorter than the window ({window} samples; longest capture "
            f"segment: {longest}): {shown}"
        )

    @property
    def num_windows(self) -> int:
        """Windows of the dataset: the selected ones when there is a selection."""
        return self._native.num_windows

    @property
    def base_num_windows(self) -> int:
        """Windows of every recording, whatever is selected (the range of ``select`` ids)."""
        return self._native.base_num_windows

    @property
    def selection(self) -> np.ndarray | None:
        """The selected base window ids (a new uint64 array), or None without a selection."""
        return self._native.selection

    @property
    def window_len(self) -> int:
        return self._native.window_len

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._native.dtype)

    def __len__(self) -> int:
        return self.num_windows

    def __repr__(self) -> str:
        selected = (
            f", {self.num_windows} of {self.base_num_windows} windows selected"
            if self.fingerprint != self.base_fingerprint
            else ""
        )
        return (
            f"IQDataset({len(self.recordings)} recordings, {self.num_windows} windows of "
            f"{self.window_len}, stride {self.stride}, {self.dtype}{selected})"
        )

    def window(self, i: int) -> np.ndarray:
        """Window ``i`` as ``[window_len, 2]`` (I, Q) in the storage dtype."""
        return self._native.window(i)

    def windows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Windows ``ids`` gathered into a new ``[len(ids), window_len, 2]`` array."""
        return self._native.windows(np.ascontiguousarray(ids, dtype=np.uint64))

    def val_batches(self, batch_size: int) -> Iterator[np.ndarray]:
        """Every window once, in id order, in batches of ``batch_size`` (the last may be partial).

        Independent of any TrainStream: it touches no cursor and no RNG.
        """
        batch_size = int_argument("batch_size", batch_size, minimum=1)
        n = self.num_windows
        for start in range(0, n, batch_size):
            yield self.windows(np.arange(start, min(start + batch_size, n), dtype=np.uint64))

    def content_digests(self) -> dict[str, str]:
        """BLAKE3 of every byte of each recording's dataset: ``{data name: lowercase hex}``.

        Keys are the datasets' names (:attr:`Recording.data_name`: the absolute data file path,
        or ``ARCHIVE/MEMBER`` for an archive member, whose bytes alone are hashed) in window id
        order, every recording included (also those in ``skipped``). Covers the datasets only:
        each metadata file is
        hashed whole by :attr:`fingerprint`. Reads every byte on every call (multi-threaded, in
        Rust, without the GIL; no cache). A data file whose length is not what this dataset
        opened, or changes while being read, or cannot be read is a DataError naming it.
        """
        recs = self.recordings
        values = digest_files(
            [os.fspath(r.data_path) for r in recs],
            [r.file_bytes for r in recs],
            [r.data_offset for r in recs],
            [r.data_bytes for r in recs],
        )
        return dict(zip((r.data_name for r in recs), values, strict=True))

    def verify_content(self) -> list[str]:
        """Check each recording's data against its SigMF ``core:sha512`` (reads every byte).

        Returns one line per problem, each naming the data file: a hash mismatch, a length other
        than this dataset opened (or one that changes while being read), an unreadable file.
        Empty: every recording that declares ``core:sha512`` matches; recordings without it are
        not checked. Files are hashed in parallel threads (hashlib releases the GIL).
        """
        todo = [r for r in self.recordings if r.sha512 is not None]
        if not todo:
            return []
        with ThreadPoolExecutor(max_workers=min(len(todo), os.cpu_count() or 1)) as pool:
            return [p for p in pool.map(_sha512_problem, todo) if p is not None]


class TrainStream:
    """The endless, seeded, resumable training stream of one rank.

    Global sample ``g`` is window ``perm(seed, g // n)[g % n]``; global batch ``k`` is samples
    ``[k*B, (k+1)*B)`` and rank ``r`` of ``W`` takes the slice ``[r*B/W, (r+1)*B/W)``, so the
    sequence of global batches does not depend on the world size. The cursor is a global sample
    count: restoring it is arithmetic, never replay.

    A bad argument, or a call out of turn (a ring slot released twice, :meth:`next` after
    :meth:`use_ring`), is a TypeError or ValueError naming the argument or the call.
    """

    def __init__(
        self,
        dataset: IQDataset,
        *,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
    ) -> None:
        batch_size = int_argument("batch_size", batch_size, minimum=1)
        seed = int_argument("seed", seed, minimum=0, maximum=(1 << 64) - 1)
        rank = int_argument("rank", rank, minimum=0)
        world_size = int_argument("world_size", world_size, minimum=1)
        prefetch = int_argument("prefetch", prefetch, minimum=0)
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self._native = NativeStream(dataset._native, batch_size, seed, rank, world_size, prefetch)

    def __iter__(self) -> TrainStream:
        return self

    def __next__(self) -> np.ndarray:
        return self._native.next()

    next = __next__

    def use_ring(self, buffers: Sequence[np.ndarray]) -> None:
        """Assemble every later batch straight into ``buffers``, caller-owned, instead of a fresh
        array per batch; :meth:`next_slot` then names the buffer holding the next batch.

        Each buffer: a C-contiguous, aligned, writable ``[batch_size // world_size, window_len,
        2]`` array of the dataset's storage dtype, none sharing memory with another; at least
        ``prefetch + 1`` of them (``prefetch`` batches assembled ahead plus the one being read;
        holding ``k`` batches at once, e.g. grad_accum microbatches, needs ``prefetch + k`` to
        keep the prefetch full). The stream keeps a reference to each. Contract: between
        :meth:`release` of a slot and :meth:`next_slot` returning it again, the stream writes
        that buffer from another thread, so the caller must not touch it (nor resize or free
        its storage, e.g. ``Tensor.resize_``). Batches prefetched so far are dropped; the
        cursor does not move. Afterwards :meth:`next` raises ValueError. Calling it again
        replaces the ring. A buffer that is not as above is a ValueError naming it.
        """
        self._native.use_ring(list(buffers))

    def next_slot(self) -> int:
        """Index into the :meth:`use_ring` buffers of the one now holding the next batch (the
        batch :meth:`next` would have returned; same cursor, ids and bytes). The caller holds it
        until :meth:`release`. Raises ValueError when every buffer is held (rather than wait
        forever) and DataError as :meth:`next` does, without consuming the batch.
        """
        return self._native.next_slot()

    def release(self, slot: int) -> None:
        """Give buffer ``slot`` back to the stream for a later batch (any order). Releasing a
        slot not held (twice, or never returned by :meth:`next_slot`) raises ValueError."""
        self._native.release(slot)

    def last_ids(self) -> np.ndarray:
        """Global window ids (uint64) of the rows last returned by :meth:`next` or
        :meth:`next_slot`."""
        return self._native.last_ids()

    @property
    def batches_consumed(self) -> int:
        return self._native.batches_consumed

    @property
    def samples_consumed(self) -> int:
        return self._native.samples_consumed

    def state_dict(self) -> dict[str, Any]:
        """The cursor: JSON-serialisable; restoring it yields exactly the next batch."""
        return {
            "version": CURSOR_VERSION,
            "seed": self.seed,
            "samples_consumed": self.samples_consumed,
            "fingerprint": self.dataset.fingerprint,
            "window": self.dataset.window_len,
            "stride": self.dataset.stride,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch the cursor was saved behind (with a ring: batches
        prefetched into it are dropped; buffers the caller holds stay held)."""
        if not isinstance(state, dict):
            raise CursorMismatchError(f"cursor: expected a dict, got {type(state).__name__}")
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        unknown = sorted(set(state) - set(expected))
        if missing or unknown:
            raise CursorMismatchError(
                f"cursor: missing keys {missing}, unknown keys {unknown}"
                if missing and unknown
                else f"cursor: missing keys {missing}"
                if missing
                else f"cursor: unknown keys {unknown}"
            )
        for key in ("version", "fingerprint", "window", "stride", "seed"):
            if state[key] != expected[key]:
                raise CursorMismatchError(
                    f"cursor.{key}: {state[key]!r} does not match this stream ({expected[key]!r})"
                )
        consumed = state["samples_consumed"]
        if isinstance(consumed, bool) or not isinstance(consumed, int) or consumed < 0:
            raise CursorMismatchError(f"cursor.samples_consumed: invalid value {consumed!r}")
        self._native.seek(consumed)

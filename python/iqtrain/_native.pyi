"""Stub of the private Rust extension ``iqtrain._native``.

Use the wrappers in :mod:`iqtrain.data.dataset`; stubtest checks this against the extension.
"""

from collections.abc import Sequence
from typing import Literal, Self, final

import numpy as np
import numpy.typing as npt

__all__ = [
    "NativeDataset",
    "NativeStream",
    "digest_files",
    "digest_merge",
    "digest_pieces",
    "digest_plan",
    "feistel_index",
]

@final
class NativeDataset:
    def __new__(
        cls,
        data_paths: list[str],
        kinds: list[str],
        window: int,
        stride: int,
        layouts: Sequence[tuple[int, int, int, Sequence[tuple[int, int, int]]] | None]
        | None = None,
        map_min_bytes: int | None = None,
        max_open_files: int | None = None,
        select: npt.NDArray[np.uint64] | npt.NDArray[np.int64] | Sequence[int] | None = None,
    ) -> Self: ...
    @property
    def num_windows(self) -> int: ...
    @property
    def base_num_windows(self) -> int: ...
    @property
    def selection(self) -> npt.NDArray[np.uint64] | None: ...
    @property
    def window_len(self) -> int: ...
    @property
    def stride(self) -> int: ...
    @property
    def dtype(self) -> Literal["int8", "int16", "float32"]: ...
    @property
    def num_recordings(self) -> int: ...
    @property
    def mapped_recordings(self) -> int: ...
    @property
    def open_files(self) -> tuple[int, int]: ...
    @property
    def recording_windows(self) -> list[int]: ...
    @property
    def recording_samples(self) -> list[int]: ...
    def window(self, i: int) -> npt.NDArray[np.generic]: ...
    def gather(
        self, ids: npt.NDArray[np.uint64] | npt.NDArray[np.int64], out: npt.NDArray[np.generic]
    ) -> None: ...
    def windows(
        self, ids: npt.NDArray[np.uint64] | npt.NDArray[np.int64]
    ) -> npt.NDArray[np.generic]: ...

@final
class NativeStream:
    def __new__(
        cls,
        dataset: NativeDataset,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int = 2,
    ) -> Self: ...
    def next(self) -> npt.NDArray[np.generic]: ...
    def use_ring(self, buffers: list[npt.NDArray[np.generic]]) -> None: ...
    def next_slot(self) -> int: ...
    def release(self, slot: int) -> None: ...
    @property
    def ring_size(self) -> int: ...
    def last_ids(self) -> npt.NDArray[np.uint64]: ...
    @property
    def samples_consumed(self) -> int: ...
    @property
    def batches_consumed(self) -> int: ...
    def seek(self, samples_consumed: int) -> None: ...

def feistel_index(n: int, seed: int, epoch: int, pos: int) -> int: ...
def digest_files(
    paths: list[str],
    expected_lengths: list[int] | None = None,
    offsets: list[int] | None = None,
    sizes: list[int] | None = None,
) -> list[str]: ...
def digest_plan(length: int, piece: int) -> list[tuple[int, int]]: ...
def digest_pieces(
    paths: list[str],
    lengths: list[int],
    offsets: list[int],
    sizes: list[int],
    bases: list[int] | None = None,
    regions: list[int] | None = None,
) -> list[bytes]: ...
def digest_merge(length: int, values: list[bytes], piece: int) -> str: ...

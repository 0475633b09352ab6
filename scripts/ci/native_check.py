"""The Rust extension's results on fixed inputs, against the digests this file holds: the same
shuffle, batches and file digests on every machine a wheel is built for (x86_64, aarch64).

    python scripts/ci/native_check.py [--print]

Writes three small raw ci16_le recordings into a temporary directory (seeded), then digests:
``feistel_index`` over three epochs, ``digest_files`` of the recordings, and the batches and
ids of a two-rank ``NativeStream`` (twenty batches a rank, then a ``seek``). Exit 0 when every
digest equals ``EXPECTED``, 1 naming the first that differs. ``--print`` prints them instead
(how ``EXPECTED`` was made). Needs numpy and the installed ``iqtrain._native`` only (no torch):
the release workflow runs it on each wheel, CI on the development build.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile

import numpy as np

from iqtrain import _native

EXPECTED = {
    "digest_files": [
        "2b57eb7de4182e95cccf6617ee11af2f1578b7c35157a912945c4c90f7c846a6",
        "32a531295f12c71051f20700822f7b0aa0cae9169cb6c5f7e59271b250b70ec9",
        "f72fb373d6d6f70d37998c116a056da7f89ceb76a6515f81da0f6943c2e92f3f",
    ],
    "feistel": "2f4ed1772392aac98faa14f8b23c40918e571ee68381689190b062cdc13926dc",
    "stream": "ea342aa5e0fbf6a24e08b11c19f8dd3a68873c2039b47bd7c1dc5ca0e64254bf",
    "windows": 113,
}


def digests(root: str) -> dict:
    rng = np.random.default_rng(3)
    paths = []
    for name, samples in (("a.raw", 5000), ("b.raw", 3000), ("c.raw", 7000)):
        path = os.path.join(root, name)
        rng.integers(-30000, 30000, size=(samples, 2)).astype(np.int16).tofile(path)
        paths.append(path)
    order = [_native.feistel_index(1000, 7, e, i) for e in range(3) for i in range(0, 1000, 7)]
    out: dict = {"feistel": hashlib.sha256(str(order).encode()).hexdigest()}
    out["digest_files"] = _native.digest_files(paths)
    dataset = _native.NativeDataset(paths, ["ci16_le"] * 3, 256, 128)
    out["windows"] = dataset.num_windows
    h = hashlib.sha256()
    for rank in (0, 1):
        stream = _native.NativeStream(dataset, 8, 11, rank=rank, world_size=2)
        for _ in range(20):
            h.update(stream.next().tobytes())
            h.update(stream.last_ids().tobytes())
        stream.seek(8 * 256 * 5)
        h.update(stream.next().tobytes())
    out["stream"] = h.hexdigest()
    return out


def main(argv: list[str]) -> int:
    with tempfile.TemporaryDirectory() as root:
        got = digests(root)
    if "--print" in argv:
        print(json.dumps(got, indent=4, sort_keys=True))
        return 0
    for key, want in EXPECTED.items():
        if got[key] != want:
            print(f"native_check: {key} differs on {os.uname().machine}: {got[key]} != {want}")
            return 1
    print(f"native_check: {os.uname().machine}: the extension's results equal the expected ones")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

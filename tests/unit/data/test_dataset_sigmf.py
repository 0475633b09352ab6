"""IQDataset over recordings written by sigmf-python in every form it writes them: every sample
iqtrain feeds the model is what sigmf-python's ``read_samples`` reads from the same file (by
value: unsigned types less half their range, fixed point unscaled), per window, for every
complex datatype, archives, non-conforming datasets, offsets and channels."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import sigmf
from helpers import COMPONENT_DTYPES, as_read
from sigmf import SigMFFile

from iqtrain.data.dataset import IQDataset, TrainStream

WINDOW, STRIDE = 48, 20


def _components(rng: np.random.Generator, n: int, datatype: str, channels: int = 1):
    """``[n, channels, 2]`` components of ``datatype`` whose every value sigmf-python reads
    exactly (its autoscale rounds to float32 before taking the offset off unsigned types, so
    32-bit values are kept to 24 significant bits)."""
    dt = COMPONENT_DTYPES[datatype]
    shape = (n, channels, 2)
    if dt.kind == "f":
        return (rng.standard_normal(shape) * 1e3).astype(dt)
    bits = 8 * dt.itemsize
    lo, hi = (0, 1 << bits) if dt.kind == "u" else (-(1 << (bits - 1)), 1 << (bits - 1))
    values = rng.integers(lo, hi, size=shape, dtype=np.int64)
    if bits == 32:
        values = values >> 8 << 8  # multiples of 256: exact in float32 at any magnitude
    return values.astype(dt)


def _by_sigmf(meta: Path, start: int, count: int, channel: int = 0) -> np.ndarray:
    """sigmf-python's reading of samples ``[start, start + count)`` as ``[count, 2]`` float64,
    unscaled to the values iqtrain feeds (by value; unsigned less half their range)."""
    handle = sigmf.fromfile(os.fspath(meta))
    datatype = handle.get_global_field("core:datatype")
    dt = COMPONENT_DTYPES[datatype]
    x = handle.read_samples(start, count)
    if x.ndim == 2:
        x = x[:, channel]
    out = np.stack([x.real, x.imag], axis=-1).astype(np.float64)
    if dt.kind in "iu":  # sigmf's autoscale: (v - offset) / 2**(bits - 1)
        out *= float(1 << (8 * dt.itemsize - 1))
    return out


def _check_every_window(ds: IQDataset, metas: list[Path], iqs: list[np.ndarray], datatype):
    """Each window of ``ds`` against sigmf-python's reading and numpy's, recording by
    recording (one capture at 0 each)."""
    first = 0
    for meta, iq in zip(metas, iqs, strict=True):
        n = (len(iq) - WINDOW) // STRIDE + 1
        got = ds.windows(np.arange(first, first + n))
        for k in range(n):
            want = as_read(iq[k * STRIDE : k * STRIDE + WINDOW], datatype)
            np.testing.assert_array_equal(got[k], want)
            np.testing.assert_array_equal(
                got[k].astype(np.float64), _by_sigmf(meta, k * STRIDE, WINDOW)
            )
        first += n
    assert first == ds.num_windows


@pytest.mark.parametrize("datatype", sorted(COMPONENT_DTYPES))
def test_every_window_of_every_datatype_is_what_sigmf_reads(tmp_path, datatype):
    rng = np.random.default_rng(len(datatype))
    metas, iqs = [], []
    for name, n in (("a", 300), ("b", 211)):
        iq = _components(rng, n, datatype)[:, 0]
        data = tmp_path / f"{name}.sigmf-data"
        iq.tofile(data)
        meta = SigMFFile(data_file=data, global_info={"core:datatype": datatype})
        meta.add_capture(0)
        meta.tofile(tmp_path / f"{name}.sigmf-meta")
        metas.append(tmp_path / f"{name}.sigmf-meta")
        iqs.append(iq)
    ds = IQDataset(os.fspath(tmp_path / "*.sigmf-meta"), window=WINDOW, stride=STRIDE)
    _check_every_window(ds, metas, iqs, datatype)
    # A batch of the training stream holds the same rows.
    stream = TrainStream(ds, batch_size=4, seed=1, prefetch=1)
    batch = next(stream)
    np.testing.assert_array_equal(batch, ds.windows(stream.last_ids()))


def test_a_complex128_array_through_fromarray_reads_as_float32(tmp_path):
    iq = np.random.default_rng(0).standard_normal(500) * 1e3 + 1j
    sigmf.fromarray(iq).tofile(tmp_path / "x")
    ds = IQDataset([tmp_path / "x.sigmf-meta"], window=WINDOW, stride=STRIDE)
    assert ds.recordings[0].datatype == "cf64_le" and ds.dtype == np.float32
    want = np.stack([iq.real, iq.imag], -1).astype(np.float32)
    np.testing.assert_array_equal(ds.window(3), want[3 * STRIDE : 3 * STRIDE + WINDOW])


@pytest.mark.parametrize("datatype", ["ci16_le", "cf64_be", "cu8"])
def test_an_archive_reads_as_its_recordings_do_loose(tmp_path, datatype):
    rng = np.random.default_rng(3)
    iq = _components(rng, 400, datatype)[:, 0]
    loose = tmp_path / "loose"
    loose.mkdir()
    iq.tofile(loose / "r.sigmf-data")
    meta = SigMFFile(data_file=loose / "r.sigmf-data", global_info={"core:datatype": datatype})
    meta.add_capture(0)
    meta.tofile(loose / "r.sigmf-meta")
    meta.tofile(tmp_path / "r.sigmf", toarchive=True)  # sigmf-python's own archive
    a = IQDataset([tmp_path / "r.sigmf"], window=WINDOW, stride=STRIDE)
    b = IQDataset([loose / "r.sigmf-meta"], window=WINDOW, stride=STRIDE)
    np.testing.assert_array_equal(
        a.windows(np.arange(a.num_windows)), b.windows(np.arange(b.num_windows))
    )
    rec = a.recordings[0]
    assert rec.meta_path == Path(os.path.realpath(tmp_path), "r.sigmf", "r", "r.sigmf-meta")
    assert rec.data_name.endswith("r.sigmf/r/r.sigmf-data") and rec.data_offset > 0
    # Its content digest covers the member's bytes alone: the loose file's digest.
    assert list(a.content_digests().values()) == list(b.content_digests().values())
    assert a.verify_content() == []  # core:sha512 of the member
    archived = sigmf.fromarchive(os.fspath(tmp_path / "r.sigmf"))
    x = archived.read_samples(40, WINDOW)
    assert x.shape == (WINDOW,)


def test_an_archive_of_several_recordings_in_folders(tmp_path):
    rng = np.random.default_rng(4)
    src = tmp_path / "src"
    iqs = {}
    for name in ("one/a", "one/b", "two/c"):
        iq = _components(rng, 260, "ci16_le")[:, 0]
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        iq.tofile(src / f"{name}.sigmf-data")
        meta = SigMFFile(
            data_file=src / f"{name}.sigmf-data", global_info={"core:datatype": "ci16_le"}
        )
        meta.add_capture(0)
        meta.tofile(src / f"{name}.sigmf-meta")
        iqs[name] = iq
    with tarfile.open(tmp_path / "set.sigmf", "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(src / "two", arcname="two")
        tar.add(src / "one", arcname="one")
    ds = IQDataset([tmp_path / "set.sigmf"], window=WINDOW, stride=STRIDE)
    assert [r.meta_member for r in ds.recordings] == [
        "one/a.sigmf-meta",
        "one/b.sigmf-meta",
        "two/c.sigmf-meta",
    ]
    metas = [src / f"{n}.sigmf-meta" for n in ("one/a", "one/b", "two/c")]
    _check_every_window(ds, metas, [iqs[n] for n in ("one/a", "one/b", "two/c")], "ci16_le")


def test_a_non_conforming_dataset_with_header_and_trailing_bytes(tmp_path):
    iq = _components(np.random.default_rng(5), 300, "cu8")[:, 0]
    raw = tmp_path / "capture.cu8"
    raw.write_bytes(b"RIFF" * 11 + iq.tobytes() + b"\xee" * 7)
    md = {
        "global": {
            "core:datatype": "cu8",
            "core:version": "1.2.0",
            "core:dataset": "capture.cu8",
            "core:trailing_bytes": 7,
        },
        "captures": [{"core:sample_start": 0, "core:header_bytes": 44}],
        "annotations": [],
    }
    meta = tmp_path / "capture.sigmf-meta"
    meta.write_text(json.dumps(md))
    ds = IQDataset([meta], window=WINDOW, stride=STRIDE)
    _check_every_window(ds, [meta], [iq], "cu8")
    assert ds.content_digests().keys() == {os.fspath(raw.resolve())}


def test_header_bytes_before_each_capture(tmp_path):
    # The specification's example: 4-byte headers before captures at 0 and 500 (cu8).
    iq = _components(np.random.default_rng(6), 1000, "cu8")[:, 0]
    raw = tmp_path / "x.dat"
    raw.write_bytes(b"HDR1" + iq[:500].tobytes() + b"HDR2" + iq[500:].tobytes())
    caps = [{"core:sample_start": 0, "core:header_bytes": 4}]
    caps.append({"core:sample_start": 500, "core:header_bytes": 4})
    md = {
        "global": {"core:datatype": "cu8", "core:version": "1.2.0", "core:dataset": "x.dat"},
        "captures": caps,
        "annotations": [],
    }
    meta = tmp_path / "x.sigmf-meta"
    meta.write_text(json.dumps(md))
    ds = IQDataset([meta], window=100)
    assert ds.recordings[0].segments == ((0, 500), (500, 500)) and ds.num_windows == 10
    got = ds.windows(np.arange(10)).reshape(1000, 2)
    np.testing.assert_array_equal(got, as_read(iq, "cu8"))
    handle = sigmf.fromfile(os.fspath(meta))
    assert handle.get_capture_byte_boundaries(1) == (1008, 2008)


# sigmf-python counts annotation indices from the file's first sample (it ignores
# core:offset there), so it warns that this one runs past the data; the specification makes
# them absolute, as iqtrain reads them.
@pytest.mark.filterwarnings("ignore:Data source ends before the final annotation")
def test_an_offset_makes_indices_absolute(tmp_path):
    iq = _components(np.random.default_rng(7), 300, "ci16_le")[:, 0]
    iq.tofile(tmp_path / "r.sigmf-data")
    md = {
        "global": {"core:datatype": "ci16_le", "core:version": "1.2.0", "core:offset": 5000},
        "captures": [{"core:sample_start": 5000}],
        "annotations": [{"core:sample_start": 5100, "core:sample_count": 96, "core:label": "x"}],
    }
    meta = tmp_path / "r.sigmf-meta"
    meta.write_text(json.dumps(md))
    ds = IQDataset([meta], window=WINDOW, stride=STRIDE)
    assert ds.recordings[0].segments == ((5000, 300),)
    _check_every_window(ds, [meta], [iq], "ci16_le")
    from iqtrain.data.windows import labelled_windows

    ls = labelled_windows(os.fspath(meta), WINDOW, min_classes=1)
    assert ls.starts.tolist() == [5100, 5148]  # SigMF indices, as the annotation writes them
    np.testing.assert_array_equal(
        ls.dataset.windows(ls.ids[:1])[0], as_read(iq[100:148], "ci16_le")
    )


@pytest.mark.parametrize("channels", [2, 3])
def test_one_channel_of_interleaved_ones(tmp_path, channels):
    iq = _components(np.random.default_rng(channels), 250, "ci16_be", channels)
    iq.tofile(tmp_path / "m.sigmf-data")
    meta = SigMFFile(
        data_file=tmp_path / "m.sigmf-data",
        global_info={"core:datatype": "ci16_be", "core:num_channels": channels},
    )
    meta.add_capture(0)
    meta.tofile(tmp_path / "m.sigmf-meta")
    for channel in range(channels):
        ds = IQDataset([tmp_path / "m.sigmf-meta"], window=WINDOW, stride=STRIDE, channel=channel)
        n = ds.num_windows
        got = ds.windows(np.arange(n))
        for k in range(n):
            want = iq[k * STRIDE : k * STRIDE + WINDOW, channel]
            np.testing.assert_array_equal(got[k], as_read(want, "ci16_be"))
            np.testing.assert_array_equal(
                got[k].astype(np.float64),
                _by_sigmf(tmp_path / "m.sigmf-meta", k * STRIDE, WINDOW, channel),
            )
    a = IQDataset([tmp_path / "m.sigmf-meta"], window=WINDOW, channel=0)
    b = IQDataset([tmp_path / "m.sigmf-meta"], window=WINDOW, channel=1)
    assert a.fingerprint != b.fingerprint  # the channel read is part of what was trained on


def test_mixed_datatypes_are_float32_by_value(tmp_path):
    rng = np.random.default_rng(8)
    iqs, metas = [], []
    for name, datatype in (("a", "cu8"), ("b", "ci32_be"), ("c", "cu16_le")):
        iq = _components(rng, 100, datatype)[:, 0]
        iq.tofile(tmp_path / f"{name}.sigmf-data")
        meta = SigMFFile(
            data_file=tmp_path / f"{name}.sigmf-data", global_info={"core:datatype": datatype}
        )
        meta.add_capture(0)
        meta.tofile(tmp_path / f"{name}.sigmf-meta")
        iqs.append((iq, datatype))
        metas.append(tmp_path / f"{name}.sigmf-meta")
    ds = IQDataset(metas, window=100)
    assert ds.dtype == np.float32
    for k, (iq, datatype) in enumerate(iqs):
        np.testing.assert_array_equal(ds.window(k), as_read(iq, datatype).astype(np.float32))


def _blue(path: Path, iq: np.ndarray) -> None:
    """A minimal BLUE (X-Midas) type-1000 CI file: 512 header bytes, then complex int16."""
    import struct

    with open(path, "wb") as f:
        f.write(b"\0" * 512)
        f.seek(0)
        f.write(b"BLUEEEEIEEEI")  # magic, little-endian header and data
        f.seek(32)
        f.write(struct.pack("<ddi2s", 512, iq.nbytes, 1000, b"CI"))  # data start, size, type
        f.seek(256)
        f.write(struct.pack("<ddi", 0, 1 / 192e3, 0))  # xstart, xdelta (1 / rate), xunits
        f.seek(512)
        f.write(iq.tobytes())


def test_what_sigmf_convert_ncd_writes_is_read(tmp_path):
    import subprocess
    import sys

    iq = _components(np.random.default_rng(9), 640, "ci16_le")[:, 0]
    _blue(tmp_path / "cap.cdif", iq)
    done = subprocess.run(
        [sys.executable, "-m", "sigmf.convert", "cap.cdif", "cap", "--ncd"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    meta = tmp_path / "cap.sigmf-meta"
    ds = IQDataset([meta], window=WINDOW, stride=STRIDE)
    rec = ds.recordings[0]
    assert rec.data_path.name == "cap.cdif" and rec.segment_bytes == (512,)
    assert rec.sample_rate == 192e3
    _check_every_window(ds, [meta], [iq], "ci16_le")

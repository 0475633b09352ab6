"""One recording's verdict: what sigmf-python's reader reads is read (the fields iqtrain does not
use that break the schema are notes); what iqtrain uses must be well formed, and a refusal is
one line naming the file and the first faulty element."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import sigmf

from iqtrain.data.sigmf import read_recording
from iqtrain.errors import DataError


def _write(folder: Path, name: str, metadata: dict, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.sigmf-data").write_bytes(data)
    meta = folder / f"{name}.sigmf-meta"
    meta.write_text(json.dumps(metadata))
    return meta


def _md(**glob):
    return {
        "global": {"core:datatype": "ci16_le", "core:version": "1.2.0", **glob},
        "captures": [{"core:sample_start": 0}],
        "annotations": [],
    }


def _read(meta: Path, **kw):
    return read_recording(meta.resolve(), **kw)[0]


def test_what_sigmf_python_writes_for_a_complex128_array_is_read(tmp_path):
    iq = (np.arange(10) + 1j).astype(np.complex128)
    meta = sigmf.fromarray(iq)
    meta.tofile(tmp_path / "a")
    rec = _read(tmp_path / "a.sigmf-meta")
    assert rec.datatype == "cf64_le" and rec.num_samples == 10 and rec.notes == ()


def test_the_forms_sigmf_python_tolerates_are_notes(tmp_path):
    md = _md()
    md["global"]["core:version"] = "1.0"
    md["captures"][0]["core:datetime"] = 1700000000
    del md["annotations"]
    md["x-extra"] = {"anything": 1}
    rec = _read(_write(tmp_path, "r", md, bytes(40)))
    fields = {f for f, _ in rec.notes}
    assert fields == {"core:version", "captures[0].core:datetime", "annotations", "metadata"}
    assert sigmf.fromfile(os.fspath(tmp_path / "r.sigmf-meta")).sample_count == 10


@pytest.mark.parametrize(
    "edit, field",
    [
        ({"core:datatype": "rf32_le"}, "core:datatype"),
        ({"core:datatype": "cf32_lex"}, "core:datatype"),
        ({"core:sample_rate": "2.4e6"}, "core:sample_rate"),
        ({"core:sample_rate": -1}, "core:sample_rate"),
        ({"core:num_channels": 0}, "core:num_channels"),
        ({"core:offset": -3}, "core:offset"),
        ({"core:trailing_bytes": 1.5}, "core:trailing_bytes"),
        ({"core:sha512": "abc"}, "core:sha512"),
        ({"core:dataset": "/etc/passwd"}, "core:dataset"),
        ({"core:dataset": "../up.cu8"}, "core:dataset"),
        ({"core:metadata_only": "yes"}, "core:metadata_only"),
    ],
)
def test_a_field_iqtrain_uses_must_be_well_formed(tmp_path, edit, field):
    meta = _write(tmp_path, "r", _md(**edit), bytes(40))
    with pytest.raises(DataError) as e:
        _read(meta)
    assert str(e.value).startswith(f"{meta.resolve()}: {field}:") and "\n" not in str(e.value)


def test_a_capture_error_names_the_first_faulty_one(tmp_path):
    md = _md()
    md["captures"] = [
        {"core:sample_start": 0},
        {"core:sample_start": -1},
        {"core:sample_start": -2},
    ]
    with pytest.raises(DataError, match=r"captures\[1\]\.core:sample_start"):
        _read(_write(tmp_path, "r", md, bytes(40)))
    md["captures"] = [{"core:sample_start": 5}, {"core:sample_start": 2}]
    with pytest.raises(DataError, match=r"captures\[1\]\.core:sample_start: 2 is before"):
        _read(_write(tmp_path, "r", md, bytes(40)))
    md["captures"] = [{"core:sample_start": 0, "core:header_bytes": "4"}]
    with pytest.raises(DataError, match=r"captures\[0\]\.core:header_bytes"):
        _read(_write(tmp_path, "r", md, bytes(40)))


def test_a_non_conforming_dataset_is_read_where_it_lies(tmp_path):
    (tmp_path / "cap.cu8").write_bytes(b"HDR!" + bytes(range(200)) + b"TAIL")
    md = {
        "global": {
            "core:datatype": "cu8",
            "core:version": "1.2.0",
            "core:dataset": "cap.cu8",
            "core:trailing_bytes": 4,
        },
        "captures": [{"core:sample_start": 0, "core:header_bytes": 4}],
        "annotations": [],
    }
    meta = tmp_path / "cap.sigmf-meta"
    meta.write_text(json.dumps(md))
    rec = _read(meta)
    assert rec.data_path == (tmp_path / "cap.cu8").resolve()
    assert rec.num_samples == 100 and rec.segment_bytes == (4,) and rec.data_bytes == 208
    f = sigmf.fromfile(os.fspath(meta))
    assert f.sample_count == 100


def test_the_data_must_be_there(tmp_path):
    meta = tmp_path / "r.sigmf-meta"
    meta.write_text(json.dumps(_md()))
    with pytest.raises(DataError, match="data file missing"):
        _read(meta)
    meta.write_text(json.dumps(_md(**{"core:metadata_only": True})))
    with pytest.raises(DataError, match="core:metadata_only: the recording has no samples"):
        _read(meta)
    meta.write_text(json.dumps(_md(**{"core:dataset": "absent.cu8"})))
    with pytest.raises(DataError, match="core:dataset: 'absent.cu8' not found"):
        _read(meta)


def test_multi_channel_recordings_need_a_channel(tmp_path):
    meta = _write(tmp_path, "r", _md(**{"core:num_channels": 2}), bytes(80))
    with pytest.raises(DataError, match=r"2 interleaved channels; choose .* \(0 to 1\)"):
        _read(meta)
    with pytest.raises(DataError, match=r"channel 2 \(data.channel, --channel\) is not one"):
        _read(meta, channel=2)
    rec = _read(meta, channel=1)
    assert rec.channels == 2 and rec.channel == 1 and rec.num_samples == 10
    assert rec.frame_bytes == 8


def test_a_datatype_without_byte_order_reads_little_endian_with_a_note(tmp_path):
    rec = _read(_write(tmp_path, "r", _md(**{"core:datatype": "ci16"}), bytes(40)))
    assert rec.datatype == "ci16_le" and rec.notes[0][0] == "core:datatype"
    rec = _read(_write(tmp_path, "s", _md(**{"core:datatype": "cu8_le"}), bytes(40)))
    assert rec.datatype == "cu8" and rec.notes == ()


def test_samples_must_be_whole(tmp_path):
    meta = _write(tmp_path, "r", _md(), bytes(41))
    with pytest.raises(DataError, match=r"r\.sigmf-data: data length 41 bytes is not a whole"):
        _read(meta)


def test_the_collection_hash_of_a_metadata_file_is_checked(tmp_path):
    from iqtrain.data.sigmf import expand

    meta = _write(tmp_path, "r", _md(), bytes(40))
    coll = sigmf.SigMFCollection(["r.sigmf-meta"], base_path=tmp_path)
    coll.tofile(tmp_path / "c.sigmf-collection")
    [source] = expand(os.fspath(tmp_path / "c.sigmf-collection")).sources
    read_recording(source)
    meta.write_text(json.dumps(_md(**{"core:author": "someone else"})))
    with pytest.raises(DataError, match="c.sigmf-collection records for it"):
        read_recording(source)


def _tar_of(path: Path, members: dict[str, bytes]) -> Path:
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_an_archive_member_without_its_data_or_with_too_few_bytes_is_one_line(tmp_path):
    from iqtrain.data.dataset import IQDataset
    from iqtrain.errors import RecordingsRefused

    md = json.dumps(_md()).encode()
    lone = _tar_of(tmp_path / "lone.sigmf", {"r/r.sigmf-meta": md})
    with pytest.raises(RecordingsRefused) as e:
        IQDataset([lone], window=4)
    assert str(e.value) == (
        f"{lone.resolve()}/r/r.sigmf-meta: its data member 'r/r.sigmf-data' is not in the archive "
        f"{lone.resolve()}"
    )
    short = _tar_of(tmp_path / "short.sigmf", {"r/r.sigmf-meta": md, "r/r.sigmf-data": bytes(42)})
    with pytest.raises(
        RecordingsRefused, match=r"short\.sigmf: data length 42 bytes is not a whole"
    ):
        IQDataset([short], window=4)
    md2 = _md()
    md2["captures"] = [{"core:sample_start": 0, "core:header_bytes": 100}]
    big = _tar_of(
        tmp_path / "hdr.sigmf",
        {"r/r.sigmf-meta": json.dumps(md2).encode(), "r/r.sigmf-data": bytes(40)},
    )
    with pytest.raises(RecordingsRefused, match=r"core:header_bytes: 100 header .* more than"):
        IQDataset([big], window=4)

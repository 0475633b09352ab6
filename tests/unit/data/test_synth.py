"""Tests of iqtrain.data.synth: determinism, SigMF conformance, labels and signal levels."""

from __future__ import annotations

import hashlib
import json
import pathlib
import warnings

import numpy as np
import pytest
import sigmf
from helpers import misuse, refused_in_one_line
from sigmf import validate as sigmf_validate

from iqtrain.config.sections import SYNTH_MAX_RECORDINGS
from iqtrain.data.synth import CLASSES, DATATYPES, SNR_RANGE_DB, name_width, synthesize

# Small enough to keep the file fast, big enough for several bursts and gaps per recording.
N = 1 << 14
SEED = 7

RAW_DTYPE = {"ci16_le": "<i2", "cf32_le": "<f4", "ci8": "i1", "cu8": "u1"}


def _data(meta: pathlib.Path) -> pathlib.Path:
    return meta.with_suffix(".sigmf-data")


def _raw(meta: pathlib.Path, datatype: str) -> np.ndarray:
    """The file's I/Q as float64 [n, 2], straight from the bytes (cu8 left offset)."""
    return np.fromfile(_data(meta), dtype=RAW_DTYPE[datatype]).astype(np.float64).reshape(-1, 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[pathlib.Path]]:
    """One run per datatype with the same seed (so the waveforms can be compared)."""
    return {
        dt: synthesize(tmp_path_factory.mktemp(dt), recordings=4, samples=N, datatype=dt, seed=SEED)
        for dt in DATATYPES
    }


@pytest.fixture(scope="module")
def labelled(tmp_path_factory) -> list[pathlib.Path]:
    """A moderately sized float run for the label and SNR checks."""
    out = tmp_path_factory.mktemp("labelled")
    return synthesize(out, recordings=8, samples=1 << 16, datatype="cf32_le", seed=11)


def test_files_and_names(runs):
    paths = runs["ci16_le"]
    assert [p.name for p in paths] == [f"synth_{i:04d}.sigmf-meta" for i in range(4)]
    assert paths == sorted(paths)
    for p in paths:
        assert _data(p).stat().st_size == N * 4


def test_same_arguments_give_byte_identical_files(tmp_path, runs):
    again = synthesize(tmp_path / "again", recordings=4, samples=N, datatype="ci16_le", seed=SEED)
    for a, b in zip(runs["ci16_le"], again, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert _data(a).read_bytes() == _data(b).read_bytes()


def test_recording_does_not_depend_on_count(tmp_path, runs):
    # Recording i is seeded by (seed, i) only, so a shorter run is a prefix of a longer one.
    two = synthesize(tmp_path, recordings=2, samples=N, datatype="ci16_le", seed=SEED)
    for a, b in zip(runs["ci16_le"][:2], two, strict=True):
        assert a.read_bytes() == b.read_bytes()
        assert _data(a).read_bytes() == _data(b).read_bytes()


def test_different_seed_gives_different_data(tmp_path, runs):
    other = synthesize(tmp_path, recordings=4, samples=N, datatype="ci16_le", seed=SEED + 1)
    for a, b in zip(runs["ci16_le"], other, strict=True):
        assert _data(a).read_bytes() != _data(b).read_bytes()
    # Recordings of one run differ from each other too.
    blobs = {_data(p).read_bytes() for p in other}
    assert len(blobs) == 4


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_roundtrip_through_sigmf(runs, datatype):
    for p in runs[datatype]:
        # skip_checksum=False: sigmf recomputes the SHA-512 of the data and compares.
        rec = sigmf.fromfile(p, skip_checksum=False, autoscale=False)
        assert rec.get_global_field("core:datatype") == datatype
        samples = rec.read_samples()
        assert samples.shape == (N,)
        raw = _raw(p, datatype)
        np.testing.assert_array_equal(samples.real, raw[:, 0])
        np.testing.assert_array_equal(samples.imag, raw[:, 1])


def test_datatype_changes_only_the_quantisation(runs):
    # The float waveform does not depend on the datatype: every integer file is the cf32 file
    # rounded to its full scale (and cu8 is ci8 in offset binary).
    for i in range(4):
        ref = _raw(runs["cf32_le"][i], "cf32_le")
        for dt in ("ci16_le", "ci8"):
            fs = DATATYPES[dt]
            q = _raw(runs[dt][i], dt)
            unclipped = np.abs(ref * fs) < fs
            assert np.all(np.abs(ref * fs - q)[unclipped] <= 0.5 + 1e-3)
        cu8, ci8 = _raw(runs["cu8"][i], "cu8"), _raw(runs["ci8"][i], "ci8")
        np.testing.assert_array_equal(cu8 - 128, ci8)


def test_metadata_validates_and_has_the_documented_keys(runs):
    for dt, paths in runs.items():
        for p in paths:
            meta = json.loads(p.read_text())
            with warnings.catch_warnings():
                # sigmf only warns about undeclared extension namespaces (for now): fail on it.
                warnings.simplefilter("error")
                sigmf_validate.validate(meta)
                sigmf.fromfile(p).validate()
            g = meta["global"]
            assert set(g) == {
                "core:author",
                "core:datatype",
                "core:description",
                "core:extensions",
                "core:num_channels",
                "core:offset",
                "core:recorder",
                "core:sample_rate",
                "core:sha512",
                "core:version",
            }
            assert g["core:datatype"] == dt
            assert g["core:author"] == "iqtrain synth"
            assert g["core:sample_rate"] == 1e6
            assert g["core:num_channels"] == 1
            assert g["core:sha512"] == hashlib.sha512(_data(p).read_bytes()).hexdigest()
            assert [e["name"] for e in g["core:extensions"]] == ["iqtrain"]
            assert meta["captures"] == [
                {"core:sample_start": 0, "core:frequency": meta["captures"][0]["core:frequency"]}
            ]
            assert meta["captures"][0]["core:frequency"] > 0
            assert "core:datetime" not in p.read_text()  # nothing time-dependent


def test_annotations_tile_the_recording(labelled):
    n = 1 << 16
    for p in labelled:
        anns = json.loads(p.read_text())["annotations"]
        assert 1 <= len(anns) <= 6
        end = 0
        for a in anns:
            assert a["core:sample_start"] >= end  # sorted, no overlap
            assert a["core:sample_count"] > 0
            end = a["core:sample_start"] + a["core:sample_count"]
            assert a["core:freq_lower_edge"] < a["core:freq_upper_edge"]
        assert end <= n
        # Bursts fill the recording apart from small noise-only gaps.
        assert sum(a["core:sample_count"] for a in anns) >= 0.85 * n


def test_annotations_cover_every_class_and_snr_range(labelled):
    labels, snrs = [], []
    for p in labelled:
        for a in json.loads(p.read_text())["annotations"]:
            labels.append(a["core:label"])
            snrs.append(a["iqtrain:snr_db"])
            assert f"{a['iqtrain:snr_db']:.2f} dB" in a["core:comment"]
            assert a["iqtrain:samples_per_symbol"] in range(4, 9)
    assert set(labels) == set(CLASSES)
    lo, hi = SNR_RANGE_DB
    assert all(lo <= s <= hi for s in snrs)
    # Spread over the range, not clustered.
    assert min(snrs) < lo + 10 and max(snrs) > hi - 10


def test_annotated_snr_is_the_measured_snr(labelled):
    # Noise power from the unannotated gaps; each burst's power over it gives its SNR.
    checked = 0
    for p in labelled:
        rec = sigmf.fromfile(p)
        x = rec.read_samples().astype(np.complex128)
        anns = rec.get_annotations()
        busy = np.zeros(len(x), dtype=bool)
        for a in anns:
            busy[a["core:sample_start"] : a["core:sample_start"] + a["core:sample_count"]] = True
        if np.count_nonzero(~busy) < 1000:
            continue
        noise = np.mean(np.abs(x[~busy]) ** 2)
        for a in anns:
            if a["iqtrain:snr_db"] < 0:
                continue  # the estimate's variance grows as the burst sinks into the noise
            s, c = a["core:sample_start"], a["core:sample_count"]
            seg = x[s + 64 : s + c - 64]  # inside the on/off ramps
            est = 10 * np.log10(np.mean(np.abs(seg) ** 2) / noise - 1)
            assert abs(est - a["iqtrain:snr_db"]) < 1.0, (p.name, a)
            checked += 1
    assert checked >= 5


@pytest.mark.parametrize("datatype", ["ci16_le", "ci8", "cu8"])
def test_integer_levels_are_sane(runs, datatype):
    # Full scale is the integer type's own (cu8: ci8 in offset binary), not the table's word.
    fs = np.iinfo("i1" if datatype == "cu8" else RAW_DTYPE[datatype]).max
    for p in runs[datatype]:
        raw = _raw(p, datatype) - (128 if datatype == "cu8" else 0)
        clipped = np.mean((raw >= fs) | (raw <= -fs - 1))
        assert clipped < 1e-3  # no clipping storm
        rms = np.sqrt(np.mean(raw**2))
        # Loudest burst sits at -20..-12 dBFS, so the whole recording is well above 1 LSB.
        assert rms > 0.01 * fs
        assert rms < 0.3 * fs


def test_rerun_removes_stale_recordings_only(tmp_path):
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    synthesize(tmp_path, recordings=3, samples=2048)
    synthesize(tmp_path, recordings=1, samples=2048)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt",
        "synth_0000.sigmf-data",
        "synth_0000.sigmf-meta",
    ]


def test_names_sort_in_generation_order_at_every_count():
    # Four digits up to 10,000 recordings (every set written before keeps its names, so the
    # synthetic cache and its fingerprints do not move), then as many as the count needs.
    assert [name_width(n) for n in (1, 8, 10_000, 10_001, 100_000, 100_001)] == [4, 4, 4, 5, 5, 6]
    for n in (10_000, 10_001, 123_457):
        width = name_width(n)
        names = [f"synth_{i:0{width}d}.sigmf-meta" for i in (0, 9, 10, 999, 9_999, n - 1)]
        assert names == sorted(names)
        assert len(f"{n - 1}") <= width


def test_a_rerun_removes_recordings_numbered_to_another_width(tmp_path):
    # A set of more than 10,000 recordings is numbered to five digits or more: a smaller set
    # written into its directory must not leave any of them behind, whatever its number.
    for stale in ("synth_00000", "synth_00001", "synth_10000", "synth_000"):
        for suffix in (".sigmf-meta", ".sigmf-data"):
            (tmp_path / f"{stale}{suffix}").write_bytes(b"")
    synthesize(tmp_path, recordings=2, samples=2048)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "synth_000.sigmf-data",  # not one of ours: fewer than four digits was never written
        "synth_000.sigmf-meta",
        "synth_0000.sigmf-data",
        "synth_0000.sigmf-meta",
        "synth_0001.sigmf-data",
        "synth_0001.sigmf-meta",
    ]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"recordings": 0}, "recordings"),
        ({"recordings": -2}, "recordings"),
        ({"recordings": 1.5}, "recordings"),
        ({"recordings": True}, "recordings"),
        ({"recordings": SYNTH_MAX_RECORDINGS + 1}, "recordings"),
        ({"samples": 16}, "samples"),
        ({"samples": "4096"}, "samples"),
        ({"samples": 1 << 40}, "samples"),
        ({"datatype": "cf64_le"}, "datatype"),
        ({"datatype": "ci16_be"}, "datatype"),
        ({"datatype": "ri16_le"}, "datatype"),
        ({"datatype": None}, "datatype"),
        ({"seed": -1}, "seed"),
        ({"seed": 1.0}, "seed"),
    ],
)
def test_bad_arguments_name_the_argument(tmp_path, kwargs, name):
    with misuse(rf"^{name}: ", (TypeError, ValueError)):
        synthesize(tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()  # nothing written on bad input


def test_out_dir_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with misuse(r"^out_dir: .* exists and is not a directory"):
        synthesize(f)
    with misuse(r"^out_dir: must be a path", TypeError):
        synthesize(None)  # type: ignore[arg-type]


def test_numpy_integer_arguments_are_accepted(tmp_path):
    paths = synthesize(tmp_path, recordings=np.int64(1), samples=np.int32(2048), seed=np.uint8(3))
    assert len(paths) == 1


def test_datatypes_come_from_the_one_table():
    from iqtrain.config.sections import SIGMF_DATATYPES, SYNTH_DATATYPES

    assert list(DATATYPES) == list(SYNTH_DATATYPES)
    assert {k: SIGMF_DATATYPES[k].full_scale for k in SYNTH_DATATYPES} == DATATYPES
    with misuse("^datatype: "):
        synthesize("unused", recordings=1, samples=1024, datatype="ci16_be")


def test_cli_datatype_choices_are_the_table():
    from iqtrain.cli.main import UsageError, build_parser
    from iqtrain.config.sections import SIGMF_DATATYPES, SYNTH_DATATYPES

    parser = build_parser()
    assert parser.parse_args(["synth", "out"]).datatype == SYNTH_DATATYPES[0]
    for name in SIGMF_DATATYPES:
        if name in SYNTH_DATATYPES:
            assert parser.parse_args(["synth", "out", "--datatype", name]).datatype == name
        else:
            with pytest.raises(UsageError) as exc:  # main() prints it: one line, exit 2
                parser.parse_args(["synth", "out", "--datatype", name])
            assert exc.value.exit_code == 2 and name in str(exc.value)


# --------------------------------------------------------------------------- a labelled probe set


def test_a_labelled_set_spreads_its_classes_evenly_over_whole_bursts(tmp_path):
    from iqtrain.data.synth import LABELLED_GAP, synthesize_labelled
    from iqtrain.data.windows import labelled_windows

    paths = synthesize_labelled(tmp_path / "a", annotations=38, burst_samples=256, seed=3)
    assert len(paths) == 3  # 16 bursts to a recording
    found = labelled_windows([str(tmp_path / "a" / "*.sigmf-meta")], 64)
    assert found.num_annotations == 38 and len(found) == 38 * 4
    counts = np.bincount(found.labels[np.unique(found.groups, return_index=True)[1]])
    assert sorted(found.classes) == sorted(CLASSES) and counts.max() - counts.min() <= 1
    for meta in paths:
        doc = json.loads(meta.read_text())
        for k, ann in enumerate(doc["annotations"]):
            assert ann["core:sample_count"] == 256
            assert ann["core:sample_start"] == k * (256 + LABELLED_GAP) + LABELLED_GAP
    again = synthesize_labelled(tmp_path / "b", annotations=38, burst_samples=256, seed=3)
    for p, q in zip(paths, again, strict=True):
        assert _data(p).read_bytes() == _data(q).read_bytes()
    with misuse("^annotations: must be >= 7"):
        synthesize_labelled(tmp_path / "c", annotations=6)
    with misuse("^burst_samples: must be >= 128"):
        synthesize_labelled(tmp_path / "c", annotations=7, burst_samples=100)


def test_synth_annotations_from_the_command_line(tmp_path, capsys):
    from iqtrain.cli.main import main

    out = tmp_path / "p"
    assert main(["synth", str(out), "--annotations", "20", "--burst-samples", "512"]) == 0
    assert "wrote 20 labelled annotations in 2 recordings" in capsys.readouterr().out
    assert main(["synth", str(out), "--annotations", "20", "--recordings", "2"]) == 2
    assert "--annotations" in capsys.readouterr().err
    assert main(["synth", str(out), "--burst-samples", "512"]) == 2
    assert "--burst-samples: needs --annotations" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--recordings", "0"], "--recordings: must be >= 1, got 0"),
        (["--samples", "16"], "--samples: must be >= 1024, got 16"),
        (["--seed", "-1"], "--seed: must be >= 0, got -1"),
        (["--annotations", "6"], "--annotations: must be >= 7, got 6"),
        (["--annotations", "7", "--burst-samples", "100"], "--burst-samples: must be >= 128"),
    ],
)
def test_a_bad_synth_flag_is_one_line_naming_it_and_exit_2(tmp_path, capsys, flags, line):
    # synthesize's ValueError, said of the flag at the command line's boundary.
    err = refused_in_one_line(capsys, ["synth", str(tmp_path / "out"), *flags], line)
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_a_synth_out_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    refused_in_one_line(capsys, ["synth", str(tmp_path / "file")], "out_dir:", "not a directory")

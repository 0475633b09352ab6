"""A package's torch-free checks: the tensors an architecture has, the safetensors header's
tiling, and what a package directory is."""

from __future__ import annotations

import json
import struct

import pytest

from iqtrain.config.schema import Config, config_to_dict
from iqtrain.config.sections import DataConfig, ModelConfig
from iqtrain.evidence.package import expected_tensors, is_package, safetensors_header
from iqtrain.model.transformer import IQTransformer

TINY = {"dim": 16, "layers": 2, "heads": 2, "patch_len": 4, "max_patches": 8}


@pytest.mark.parametrize(
    ("kw", "classes"),
    [
        ({"objective": "mse"}, 0),
        ({"objective": "categorical", "bins": 8}, 0),
        ({"objective": "classify"}, 3),
        ({"objective": "classify", "pool": "attention"}, 5),
    ],
)
def test_the_expected_tensors_are_the_models_state(kw, classes):
    cfg = ModelConfig(**TINY, **kw)
    model = IQTransformer(cfg, classes)
    data = DataConfig(patch_len=cfg.patch_len, seq_patches=cfg.max_patches)
    arch = config_to_dict(Config(model=cfg, data=data))["model"]  # what config.json holds
    want = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert expected_tensors(arch, classes) == want


def _file(tmp_path, header: dict, data: bytes = b"") -> object:
    raw = json.dumps(header).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_a_header_must_tile_its_data(tmp_path):
    ok = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    header, start = safetensors_header(_file(tmp_path, ok, bytes(8)))
    assert header == ok and start == 8 + len(json.dumps(ok))
    with pytest.raises(ValueError, match="the tensors hold 8 bytes, the file 12"):
        safetensors_header(_file(tmp_path, ok, bytes(12)))
    gap = {**ok, "b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}
    with pytest.raises(ValueError, match="do not follow 8"):
        safetensors_header(_file(tmp_path, gap, bytes(16)))
    (tmp_path / "short").write_bytes(b"\x01\x02")
    with pytest.raises(ValueError, match="too short"):
        safetensors_header(tmp_path / "short")
    (tmp_path / "huge").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ValueError, match="a header of"):
        safetensors_header(tmp_path / "huge")


def test_a_package_is_named_by_its_lineage(tmp_path):
    assert not is_package(tmp_path)
    (tmp_path / "lineage.json").write_text('{"format": "iqtrain-model"}')
    assert is_package(tmp_path)
    (tmp_path / "lineage.json").write_text("[1]")
    assert not is_package(tmp_path)

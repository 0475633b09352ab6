"""The sharded state's metadata read by the restricted unpickler (iqtrain.distributed.dcp):
what DCP writes loads, anything else is one CheckpointError naming the file."""

from __future__ import annotations

import io
import pickle

import pytest
from helpers import Forged

from iqtrain.distributed.dcp import _check_metadata, _MetadataUnpickler, _plain_data_planner
from iqtrain.errors import CheckpointError


def test_dcp_metadata_unpickles_and_other_globals_are_refused(tmp_path):
    from torch.distributed.checkpoint.metadata import Metadata

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    _check_metadata(tmp_path)  # DCP's own classes: admitted
    with pytest.raises(pickle.UnpicklingError, match=r"it names os\.system, not checkpoint"):
        _MetadataUnpickler(io.BytesIO()).find_class("os", "system")


@pytest.mark.parametrize(
    "data, reason",
    [(b"\x80\x04\xff.", "invalid load key"), (b"", "EOFError"), (b"\x80\x04(", "")],
    ids=["unknown opcode", "empty", "truncated"],
)
def test_damaged_metadata_is_one_checkpoint_error(tmp_path, data, reason):
    (tmp_path / ".metadata").write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        _check_metadata(tmp_path)
    text = str(info.value)
    assert text.startswith(f"{tmp_path / '.metadata'}: refused: ") and reason in text
    assert "\n" not in text


def test_a_forged_plain_data_item_is_refused_before_it_runs_anything(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError):
        _plain_data_planner().load_bytes(
            None, io.BytesIO(pickle.dumps(Forged(open, str(marker), "w"), protocol=2))
        )
    assert not marker.exists()

"""state.json of a "classify" lineage: ``classes`` (written only when set, validated on read)
and the loop's ``best_val_accuracy`` (absent in older states); every lineage's ``sample_rate``
(absent in older states: unknown)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import checkpoint_state

from iqtrain.checkpoint.state import (
    RATE_UNKNOWN,
    CheckpointState,
    classes_problem,
    sample_rate_problem,
)
from iqtrain.errors import CheckpointError

PATH = Path("/x/step_00000004/state.json")


def _decoded(state: CheckpointState) -> dict:
    return json.loads(state.encode())


def test_classes_are_written_only_when_set_and_read_back():
    plain = _decoded(checkpoint_state(4))
    assert "classes" not in plain  # every other objective's state is what it always was
    assert CheckpointState.from_json(plain, PATH).classes is None
    obj = _decoded(checkpoint_state(4, classes=["8PSK", "AM-DSB", "QPSK"]))
    assert obj["classes"] == ["8PSK", "AM-DSB", "QPSK"]
    state = CheckpointState.from_json(obj, PATH)
    assert state.classes == ["8PSK", "AM-DSB", "QPSK"]
    assert _decoded(state) == obj  # round trip


@pytest.mark.parametrize(
    "classes",
    [
        ["qpsk", "bpsk"],  # not sorted
        ["bpsk", "bpsk"],  # not distinct
        ["bpsk", ""],
        ["bpsk", 3],
        [],
        "bpsk",
        {"bpsk": 0},
    ],
    ids=["unsorted", "duplicate", "empty name", "not a string", "empty", "a string", "a dict"],
)
def test_malformed_classes_are_one_line_naming_the_file_and_the_key(classes):
    obj = _decoded(checkpoint_state(4))
    obj["classes"] = classes
    with pytest.raises(CheckpointError) as err:
        CheckpointState.from_json(obj, PATH)
    message = str(err.value)
    assert message.startswith(f"{PATH}: classes is ") and "\n" not in message, message
    assert classes_problem(classes) is not None


def test_well_formed_classes_have_no_problem():
    assert classes_problem(["a"]) is None
    assert classes_problem(["AM", "FM", "am"]) is None  # sorted as Python sorts strings


def test_best_val_accuracy_is_none_when_absent_and_typed_when_present():
    loop = {"best_checkpoint": None, "stale_validations": 0}
    assert checkpoint_state(4, components={"loop": loop}).best_val_accuracy is None  # older
    loop_acc = {**loop, "best_val_accuracy": None}
    assert checkpoint_state(4, components={"loop": loop_acc}).best_val_accuracy is None
    loop_acc = {**loop, "best_val_accuracy": 0.75, "early_stop_ref": 0.75}
    state = checkpoint_state(4, components={"loop": loop_acc})
    assert state.best_val_accuracy == 0.75
    assert state.early_stop == (0.75, 0)  # "classify": the reference is an accuracy
    bad = checkpoint_state(4, components={"loop": {**loop, "best_val_accuracy": "0.75"}})
    with pytest.raises(CheckpointError, match="loop.best_val_accuracy"):
        _ = bad.best_val_accuracy


def test_the_sample_rate_is_written_null_included_and_absent_reads_as_unknown():
    plain = _decoded(checkpoint_state(4))
    assert "sample_rate" not in plain  # a state built without one: as states were before
    state = CheckpointState.from_json(plain, PATH)
    assert state.sample_rate is RATE_UNKNOWN and state.known_rate is None
    assert _decoded(state) == plain  # read back as it was: still no key
    for rate in (2.4e6, None):
        obj = _decoded(checkpoint_state(4, sample_rate=rate))
        assert "sample_rate" in obj and obj["sample_rate"] == rate
        state = CheckpointState.from_json(obj, PATH)
        assert state.sample_rate == rate and state.known_rate == rate
        assert _decoded(state) == obj
    obj = {**plain, "sample_rate": 1000000}  # an integer is a rate too
    assert CheckpointState.from_json(obj, PATH).sample_rate == 1e6


@pytest.mark.parametrize("rate", [0, -1.0, True, "1e6", [1e6], 10**400, 1e400], ids=str)
def test_a_malformed_sample_rate_is_one_line_naming_the_file_and_the_key(rate):
    obj = {**_decoded(checkpoint_state(4)), "sample_rate": rate}
    with pytest.raises(CheckpointError) as err:
        CheckpointState.from_json(obj, PATH)
    message = str(err.value)
    assert message.startswith(f"{PATH}: sample_rate is ") and "\n" not in message, message
    assert sample_rate_problem(rate) is not None

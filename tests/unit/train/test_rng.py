"""Random generators in checkpoints: exact round trip, and re-derivation at another world size."""

from __future__ import annotations

import json

import pytest
import torch

from iqtrain.distributed.world import World
from iqtrain.train.rng import RNGState, restore_rng_state, rng_state


def test_rng_state_round_trip():
    state = json.loads(json.dumps(rng_state()))
    a = torch.rand(5)
    restore_rng_state(state)
    assert torch.equal(torch.rand(5), a)


def test_rng_state_restores_at_the_same_world_size_and_rederives_at_another():
    torch.manual_seed(1)
    saved = RNGState(World()).state_dict()
    expected = torch.rand(3)
    torch.manual_seed(99)
    RNGState(World()).load_state_dict(saved)
    assert torch.equal(torch.rand(3), expected)
    # At another world size every rank is seeded from the checkpoint, rank and world size.
    draws = []
    for rank in (0, 1, 0):
        RNGState(World(rank, 2, rank, "gloo")).load_state_dict(saved)
        draws.append(torch.rand(3))
    assert torch.equal(draws[0], draws[2]) and not torch.equal(draws[0], draws[1])
    with pytest.raises(ValueError, match="2 rank states"):
        RNGState(World()).load_state_dict({"world_size": 3, "ranks": saved["ranks"] * 2})

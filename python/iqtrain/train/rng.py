"""Random generators in checkpoints: every rank's CPU (and CUDA) generator states as JSON, and
the loop component that saves them and restores them at the same or another world size."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import torch

from iqtrain.distributed.world import World

__all__ = ["RNGState", "restore_rng_state", "rng_state"]


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "cpu": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return state


def _bytes_tensor(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(_bytes_tensor(state["cpu"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_bytes_tensor(s) for s in state["cuda"]])


class RNGState:
    """Every rank's CPU (and CUDA) random generators as one component.

    ``state_dict()`` is a collective with several ranks: ``{"world_size": W, "ranks": [the
    generators of rank 0, ..., rank W-1]}``. Loading at the same world size restores this
    rank's generators exactly. At another world size no saved stream belongs to a rank (rank r
    of W' did not exist, or read other rows), so every rank's generators are re-derived: seeded
    with a hash of rank 0's saved CPU state, the new world size and the rank, the same on every
    resume of that checkpoint.
    """

    def __init__(self, world: World | None = None) -> None:
        self.world = World() if world is None else world

    def state_dict(self) -> dict[str, Any]:
        ranks = self.world.all_gather_object(rng_state())
        return {"world_size": self.world.world_size, "ranks": ranks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks, size = state["ranks"], state["world_size"]
        if not isinstance(ranks, list) or not ranks or len(ranks) != size:
            raise ValueError(f"rng: {len(ranks)} rank states for world_size {size!r}")
        if size == self.world.world_size:
            restore_rng_state(ranks[self.world.rank])
            return
        key = f"{ranks[0]['cpu']}:{self.world.world_size}:{self.world.rank}".encode()
        torch.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "little"))

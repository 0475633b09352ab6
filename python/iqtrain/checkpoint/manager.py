"""The checkpoints of one attempt: when to save, what to keep, and how the ranks write one.

The loop asks :meth:`CheckpointManager.due` after each step and calls :meth:`save` on every
rank at the same step; everything else is the manager's: rank 0 writes the checkpoint (the
format and its atomicity are :mod:`iqtrain.checkpoint.files`'), the other ranks wait for it on
the World's long-timeout barrier, and under ``training.parallel = "fsdp"`` every rank writes its
own shards into rank 0's temporary directory, whose path rank 0 broadcasts. Then rank 0 prunes
by policy. Format and protocol: docs/design.md "Checkpoint directory", "Policy,
pruning, leftovers". Imports no torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from iqtrain.checkpoint.files import remove_checkpoint, save_checkpoint
from iqtrain.checkpoint.state import CheckpointState
from iqtrain.distributed.world import World

if TYPE_CHECKING:
    import torch

__all__ = ["CheckpointManager"]


class CheckpointManager:
    """The checkpoint policy and protocol of one attempt.

    Saves every ``every`` steps, at the final step, on each validation improvement (that one
    is ``best``) and, when a signal arrives, at the step the loop stops on. Keeps the newest
    ``keep_last`` checkpoints of this attempt (0 keeps all), the latest and the best always;
    pruning is atomic (:func:`~iqtrain.checkpoint.files.remove_checkpoint`). ``saved`` lists
    this attempt's checkpoints on rank 0 (empty elsewhere); ``saved_step`` is the step of the
    last save on every rank.
    """

    def __init__(
        self,
        root: Path,
        run_dir: Path,
        *,
        every: int,
        keep_last: int,
        world: World | None = None,
    ) -> None:
        self.root, self.run_dir = Path(root), Path(run_dir)
        self.every, self.keep_last = every, keep_last
        self.world = World() if world is None else world
        self.saved: list[Path] = []  # this attempt's checkpoints, oldest first (rank 0)
        self.saved_step: int | None = None

    def due(self, step: int, *, final: bool, improved: bool) -> bool:
        return step % self.every == 0 or improved or final

    def saved_at(self, step: int) -> bool:
        return self.saved_step == step

    @property
    def latest(self) -> Path | None:
        return self.saved[-1] if self.saved else None

    def save(
        self,
        model_state: dict[str, torch.Tensor],
        optimizer_state: dict[str, Any] | None,
        state: CheckpointState | None,
        *,
        step: int,
        protect: str | None = None,
        write_shards: Callable[[Path], None] | None = None,
    ) -> Path | None:
        """Every rank calls it at ``step``. Rank 0 passes the ``state`` and writes the
        checkpoint, then prunes (``protect``: the best, relative to the run directory, possibly
        in an ancestor attempt, is never pruned) and returns its path; the other ranks pass
        None and return None. ``write_shards`` (every rank, sharded state) writes this rank's
        shards into the directory it is given, with the other ranks (a collective)."""
        self.saved_step = step
        world = self.world
        if not world.is_main:
            if write_shards is not None:
                world.wait_for_main()  # while rank 0 writes model.safetensors alone
                write_shards(Path(world.broadcast_object(None)))
            world.wait_for_main()  # while rank 0 finishes and renames the checkpoint
            return None
        if state is None or state.step != step:
            raise ValueError("CheckpointManager.save: rank 0 passes the state of this step")

        def sharded(directory: Path) -> None:
            world.wait_for_main()
            world.broadcast_object(os.fspath(directory))
            assert write_shards is not None
            write_shards(directory)

        path = save_checkpoint(
            self.root,
            model_state,
            optimizer_state,
            state,
            sharded=None if write_shards is None else sharded,
        )
        self.saved.append(path)
        self._prune(None if protect is None else (self.run_dir / protect).resolve())
        world.wait_for_main()
        return path

    def _prune(self, protect: Path | None) -> None:
        if self.keep_last <= 0:
            return
        keep = set(self.saved[-self.keep_last :]) | {self.saved[-1]}
        for path in list(self.saved):
            if path in keep or path.resolve() == protect:
                continue
            remove_checkpoint(path)
            self.saved.remove(path)

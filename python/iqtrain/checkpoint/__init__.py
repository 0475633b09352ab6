"""Checkpoints (torch-free at import; tensors only inside the functions that handle them): the
on-disk format and its verification, the state.json schema, the optimizer codec, the sharded
(DCP) format, and the CheckpointManager that decides when to save and how ranks write."""

"""Several ranks under torchrun (torch at use): who this process is and the collectives the
trainer needs (:mod:`~iqtrain.distributed.world`), and how the model is replicated (DDP) or
sharded (FSDP2) over the ranks (:mod:`~iqtrain.distributed.parallel`)."""

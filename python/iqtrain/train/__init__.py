"""Training (torch): one attempt from preflight to manifest (:mod:`~iqtrain.train.attempt`), the
loop (:mod:`~iqtrain.train.loop`) over its components: the step, optimizer, schedule, validation,
RNG state and the in-training probe."""

"""One optimizer step and one evaluation pass of the next-patch model (docs/design.md "One
optimizer step").

The training loop owns batches, the schedule and checkpoints; this module owns what happens to
one batch: A microbatches forward/backward -> global grad norm (reported before clipping) ->
reject a non-finite loss or norm (raise, no update) -> optional clip -> AdamW step at the learning
rate the loop passes in.

Compilation. ``compile=True`` runs the microbatch forward and loss through ``torch.compile``
(fullgraph); AOTAutograd compiles the matching backward, so the whole forward/backward of a
step is generated code. Gradient norm and clipping are torch's foreach kernels and the update is
torch's fused AdamW kernel (one pass over parameters, gradients and both moments), so the part
outside the graph is already a handful of fused launches; compiling it would cost another graph
on every cold start for no measurable gain. ``compile=False`` calls the very same Python
function eagerly.

Learning rate. Every parameter group's ``lr`` is a 0-dim CPU float64 tensor updated in place
with ``fill_``. No compiled code reads it, so a changing schedule can never trigger a recompile;
fused AdamW accepts a tensor lr (and treats a CPU one as a scalar, so CUDA runs need no copy),
and float64 keeps the value the loop asked for exactly.

Preparation. :meth:`TrainStep.prepare` turns a loader batch into the model's input on the step's
device: CUDA runs copy it through pinned memory (``non_blocking``: a copy from pageable memory
would synchronise the stream) and run the Triton kernel; CPU runs with ``compile=True`` run the
compiled reference (:func:`iqtrain.model.prepare.compiled_reference`, bit-identical to the eager
one), CPU runs without it the eager reference. So ``compile`` selects compiled code for the
whole step.

Host synchronisations. Every call the loop makes per step queues device work and returns, except:

- ``train_step``: exactly one, the ``.tolist()`` of ``[loss, grad_norm]`` after the backward.
  The contract needs it: a non-finite loss or norm must be rejected before the update, and
  whether to clip (``norm > grad_clip``) is decided from the same value; the loop records
  both numbers anyway. With several ranks the same sync also carries the step's one extra
  collective (besides DDP's gradient all-reduce; FSDP2 instead gathers parameters, reduces
  gradients shard by shard and all-reduces the sharded norm): the sum of the ranks' losses and
  of their stop requests (a signal on any rank), so the logged loss is global, the finite check
  and the stop step are agreed, and no rank waits for another a second time. The lr is a CPU
  tensor (``fill_``, no device work), the norm and the clip stay on the device, and fused
  AdamW reads a CPU lr as a scalar.
- ``eval_step``: one per validation batch (its ``float``), for callers that want a number.
  :meth:`TrainStep.eval_loss_sum` is the same pass without it: it returns the device tensor,
  so a validation loop can queue every batch and synchronise once at the end.
- ``prepare`` and ``eval_loss_sum``: none on CUDA (pinned, non-blocking copies; the Triton
  kernel). On CPU there is no device to wait for.

A classifier's labels reach ``train_step`` and ``eval_sums`` as tensors and are copied to the
device without blocking: on CUDA they must be in pinned memory or on the device already (a
non-blocking copy from pageable memory is staged through a synchronous one), and not written
before the step's sync. The loop's label ring (pinned buffers held and released with their
batch's slot) and validation's one copy per pass of every label are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

# The [optimizer] table and the device/precision names live in the torch-free config module;
# re-exported here.
from iqtrain.config.sections import (
    Device,
    Norm,
    OptimizerConfig,
    Parallel,
    Precision,
    TrainingConfig,
)
from iqtrain.distributed.dcp import load_sharded, save_sharded
from iqtrain.distributed.parallel import (
    full_model_state,
    full_optimizer_state,
    global_norm,
    load_full_optimizer_state,
    replicate,
    shard,
)
from iqtrain.distributed.world import World
from iqtrain.errors import ConfigError, NonFiniteError
from iqtrain.model.prepare import compiled_reference, prepare_iq_input, prepare_iq_input_reference
from iqtrain.model.transformer import IQTransformer
from iqtrain.train.optim import build_adamw, split_parameters

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

__all__ = [
    "StepResult",
    "TrainStep",
]

# torch.compile wraps modules in OptimizedModule, whose state dict keys carry this prefix.
_COMPILE_PREFIX = "_orig_mod."


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports: mean loss, pre-clip global grad norm, whether it clipped."""

    loss: float
    grad_norm: float
    clipped: bool
    lr: float
    stop: bool = False  # some rank asked to stop after this step (see ``train_step``)


def _strip_compile_prefix(state: Mapping[str, Any]) -> dict[str, Any]:
    return {k.removeprefix(_COMPILE_PREFIX): v for k, v in state.items()}


def _id_list(window_ids: object) -> list:
    # Tensors and numpy arrays become plain lists, so a message reads the same either way.
    tolist = getattr(window_ids, "tolist", None)
    return tolist() if callable(tolist) else list(window_ids)  # type: ignore[call-overload]


def format_ids(window_ids: object) -> str:
    return repr(_id_list(window_ids))


def _check_step_inputs(
    microbatches: Sequence[Tensor],
    lr: float,
    labels: Sequence[Tensor] | None = None,
    labelled: bool = False,
) -> list[Tensor]:
    mbs = list(microbatches)
    if not mbs:
        raise ValueError("train_step needs at least one microbatch")
    if labelled != (labels is not None) or (labels is not None and len(labels) != len(mbs)):
        raise ValueError(
            "train_step: labels, one tensor per microbatch, for a labelled objective's model only"
        )
    shape = mbs[0].shape
    for mb in mbs[1:]:
        if mb.shape != shape:
            # Unequal target counts would make loss / A a biased mean.
            raise ValueError(
                f"microbatches must have equal shapes, got {tuple(shape)} and {tuple(mb.shape)}"
            )
    if (
        isinstance(lr, bool)
        or not isinstance(lr, int | float)
        or not (math.isfinite(lr) and lr >= 0.0)
    ):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    return mbs


class _ForwardLoss(nn.Module):
    """``patches -> (mean loss, summed loss, target count, summed squared error of the
    predicted mean)``: the model and its objective's loss as one module, so DDP can wrap them
    together (its forward must produce the loss). A labelled objective: ``(patches, labels) ->
    (mean cross-entropy, summed, windows, each window's predicted class)``."""

    def __init__(self, model: IQTransformer, device_type: str, precision: Precision) -> None:
        super().__init__()
        self.model = model
        self.model_config = model.config  # what the objective reads (the categorical's bins)
        self.objective = model.objective
        self.device_type = device_type
        self.bf16 = precision == "bf16"

    def forward(
        self, patches: Tensor, labels: Tensor | None = None, squared_error: bool = False
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        # Autocast is entered inside the compiled function so dynamo traces it into the graph.
        with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(patches)
        # Training uses the mean loss only: the predicted mean's error is evaluation's.
        return self.objective.loss(out, patches, labels, self.model_config, squared_error)


class TrainStep:
    """The optimizer step and evaluation pass for one model on one device.

    ``TrainStep(model, opt_cfg, *, device, precision, compile)``: ``device`` is exactly ``"cpu"``
    or ``"cuda"``, ``precision`` ``"fp32"`` or ``"bf16"`` (CUDA only: autocast with fp32
    parameters and fp32 AdamW state; the patches :meth:`prepare` makes, the residual stream
    and the losses stay fp32), ``compile`` a bool. The model is moved to the device in
    fp32. Attributes for the loop: ``model`` (never a compile wrapper), ``optimizer`` (the AdamW
    to checkpoint), ``decay_param_names`` / ``no_decay_param_names``.
    """

    def __init__(
        self,
        model: IQTransformer,
        opt_cfg: OptimizerConfig,
        *,
        device: Device,
        precision: Precision,
        compile: bool,  # shadows the builtin on purpose: the config key is training.compile
        world: World | None = None,
        parallel: Parallel = "ddp",
    ) -> None:
        if not isinstance(opt_cfg, OptimizerConfig):
            raise TypeError(f"opt_cfg must be an OptimizerConfig, got {type(opt_cfg).__name__}")
        # The [training] section is the one validator of these keys (exact literals: "cuda:1"
        # or "CPU" would silently pick another device than the resolved config records; bf16
        # only on CUDA); a step built from a config passes values it has checked already.
        TrainingConfig(device=device, precision=precision, compile=compile, parallel=parallel)
        if device == "cuda" and not torch.cuda.is_available():
            raise ConfigError('training.device: "cuda" requested but no CUDA device is available')

        # A module someone already compiled would put _orig_mod. into every key: unwrap it.
        model = getattr(model, "_orig_mod", model)
        self.model: IQTransformer = model.to(device=device, dtype=torch.float32)
        self.device = torch.device(device)
        self.precision = precision
        self.compiled = compile
        self.config = opt_cfg
        # A labelled objective: model.freeze_trunk trains the head alone (the trunk needs no
        # gradient, so autograd stops at the head); the trunk's lr is scaled
        # (optimizer.trunk_lr_scale).
        self.labelled = self.model.objective.labelled
        if self.labelled and self.model.config.freeze_trunk:
            for name, p in self.model.named_parameters():
                p.requires_grad_(self.model.is_head(name))

        decay, no_decay = split_parameters(self.model)
        if not decay and not no_decay:
            raise ValueError("the model has no trainable parameters")
        self.decay_param_names: tuple[str, ...] = tuple(n for n, _ in decay)
        self.no_decay_param_names: tuple[str, ...] = tuple(n for n, _ in no_decay)
        decay_params, no_decay_params = [p for _, p in decay], [p for _, p in no_decay]
        self._params: list[nn.Parameter] = decay_params + no_decay_params
        self.optimizer = build_adamw(decay_params, no_decay_params, opt_cfg, self._head_ids())

        self.world = World() if world is None else world
        # "fsdp": checkpoints hold sharded state (save_sharded/load_sharded), at every world
        # size; the model itself is sharded by data_parallel() when there are several ranks.
        self.sharded = parallel == "fsdp"
        # Set once the model is sharded: every forward then gathers parameters with all ranks.
        self.forward_is_collective = False
        # The model again once sharded (with forward_is_collective), typed for FSDP2's methods.
        self._fsdp: FSDPModule | None = None
        self._loss_module = _ForwardLoss(self.model, self.device.type, precision)
        # fullgraph: a graph break would silently fall back to eager for part of the model.
        # CPU: inductor's C++ wrapper calls the graph's kernels and matmuls from C++ instead of
        # generated Python: per-step wrapper time 7.2 -> 3.6 ms of a 116 ms step at dim 128
        # (per-op minima), loop per FLOP vs the nanoGPT peer median 1.03x -> 1.11x over 3 and 5
        # runs of bench/test_loop.py; the cost is a longer first compile (~41 -> ~50 s cold).
        self._compile_options: dict[str, Any] | None = (
            {"cpp_wrapper": True} if device == "cpu" else None
        )
        self._forward_loss_fn = (
            torch.compile(self._forward_loss, fullgraph=True, options=self._compile_options)
            if compile
            else self._forward_loss
        )
        self._train_fn: Any = self._forward_loss_fn
        self._ddp: Any = None
        # CPU + compile: prepare compiled as well (CUDA always runs the Triton kernel).
        self._prepare_fn = (
            compiled_reference() if compile and device == "cpu" else prepare_iq_input_reference
        )
        # What prepare hands the model: fp32 under bf16 too. The patches are also the targets:
        # "categorical" bins them (bins 2 * bin_range / bins wide, 0.125 by default, against
        # bf16's half-ulp of 2**-8 in [1, 2)) and every objective's error is taken against
        # them, as pretrained scoring does from fp32 patches. The model's input loses nothing:
        # autocast rounds it to bf16 in the embedding, as the kernel would (round to nearest
        # even), and halving the bytes of a [B, N, 2P] tensor saves nothing that matters.
        self.input_dtype = torch.float32

    def _head_ids(self) -> set[int] | None:
        """A labelled objective: the ids of the head's parameters (their own optimizer groups)."""
        if not self.labelled:
            return None
        return {id(p) for n, p in self.model.named_parameters() if self.model.is_head(n)}

    # ------------------------------------------------------------------ the compiled region

    def _forward_loss(
        self, patches: Tensor, labels: Tensor | None = None, squared_error: bool = False
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        return self._loss_module.forward(patches, labels, squared_error)

    def data_parallel(self) -> None:
        """Several ranks only: replicate the forward and loss in DistributedDataParallel, or
        (``training.parallel = "fsdp"``) shard the model with FSDP2
        (:mod:`iqtrain.distributed.parallel`).

        A collective: every rank calls it at the same point, after the ranks agreed that
        preflight passed. Evaluation under DDP calls the inner compiled module: it needs no
        gradient synchronisation.
        """
        if not self.world.distributed or self._ddp is not None or self.forward_is_collective:
            return
        if self.sharded:
            self._shard()
            return
        if self.compiled:
            self._loss_module.compile(fullgraph=True, options=self._compile_options)
            self._forward_loss_fn = self._loss_module
        self._ddp = replicate(self._loss_module, self.world, cuda=self.device.type == "cuda")
        self._train_fn = self._ddp

    def _shard(self) -> None:
        """FSDP2: shard the model, then build the optimizer again over the sharded parameters
        (same groups, same order, same hyperparameters). Optimizer state already restored (from
        a replicated checkpoint: training.parallel changed on resume) is carried over, sharded;
        a sharded parent's state is loaded afterwards (:meth:`load_sharded`)."""
        from torch.distributed.fsdp import FSDPModule

        carried = full_optimizer_state(self.model, self.optimizer)
        shard(self.model, compile_options=self._compile_options, compile=self.compiled)
        # fully_shard swaps the model's class in place for a subclass of FSDPModule.
        assert isinstance(self.model, FSDPModule)
        self._fsdp = self.model
        # The blocks are compiled inside (before sharding); the rest runs eagerly around them.
        self._forward_loss_fn = self._train_fn = self._forward_loss
        named = dict(self.model.named_parameters())
        decay = [named[n] for n in self.decay_param_names]
        no_decay = [named[n] for n in self.no_decay_param_names]
        self._params = decay + no_decay
        self.optimizer = build_adamw(decay, no_decay, self.config, self._head_ids())
        if carried is not None:
            load_full_optimizer_state(self.model, self.optimizer, carried)
        self.forward_is_collective = True

    # ------------------------------------------------------------------ public API

    def prepare(
        self,
        raw: Any,
        patch_len: int,
        *,
        norm: Norm = "window",
        prefix_patches: int = 4,
    ) -> tuple[Tensor, Tensor]:
        """A loader batch ``raw [B, L, 2]`` (numpy array or tensor, int8/int16/float32) ->
        ``(patches [B, L/P, 2P], scale [B])`` on this step's device, ready for ``train_step``.

        ``prepare_iq_input`` with the step's device and compile mode: patches are fp32 at
        either precision (they are the targets too; autocast rounds the model's input to bf16
        in the embedding under ``precision="bf16"``). CUDA: pinned non-blocking copy, then
        the Triton kernel. CPU: the compiled reference when ``compile=True`` (bit-identical to
        the eager reference, one graph for every batch size >= 2), else the eager reference.
        Raises ``ValueError`` naming a bad argument, as ``prepare_iq_input`` does.
        """
        t = raw if isinstance(raw, Tensor) else torch.from_numpy(raw)
        if self.device.type == "cuda":
            if t.device.type == "cpu":
                # The trainer's ring buffers are pinned already: no staging copy for those.
                t = (t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True)
            return prepare_iq_input(
                t,
                patch_len,
                norm=norm,
                prefix_patches=prefix_patches,
                out_dtype=self.input_dtype,
            )
        return self._prepare_fn(
            t, patch_len, norm=norm, prefix_patches=prefix_patches, out_dtype=self.input_dtype
        )

    def train_step(
        self,
        microbatches: Sequence[Tensor],
        lr: float,
        *,
        step: int | None = None,
        window_ids: object = None,
        stop: bool | Callable[[], bool] = False,
        labels: Sequence[Tensor] | None = None,
    ) -> StepResult:
        """One optimizer step over ``microbatches`` (each ``[b, N, 2P]``) at learning rate ``lr``.

        Each microbatch's mean loss is divided by A = ``len(microbatches)`` before its backward:
        microbatches are equal-sized (checked here) and windows fixed length, so the mean of the
        A means is the mean over all targets, and the gradient exactly the batch mean's.

        Order: zero grads; forward/backward every microbatch; global L2 grad norm; if the loss
        or the norm is non-finite, zero the grads and raise :class:`NonFiniteError` naming
        ``step``, the values and ``window_ids`` (parameters and optimizer state untouched);
        clip to ``grad_clip`` when it is > 0 (``clipped`` is norm > grad_clip); set ``lr`` on
        every group; ``optimizer.step()``. The reported ``grad_norm`` is the pre-clip norm.
        Gradients stay on the parameters until the next step zeroes them. A labelled
        objective: ``labels``, one ``[b]`` int64 tensor of classes per microbatch, pinned on CUDA.
        """
        mbs = _check_step_inputs(microbatches, lr, labels, self.labelled)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        accum = len(mbs)
        loss_sum: Tensor | None = None
        for i, mb in enumerate(mbs):
            # Several ranks: only the last microbatch's backward all-reduces the gradients.
            last = i == accum - 1
            if self._fsdp is not None:  # FSDP2: reduce-scatter after the last only
                self._fsdp.set_requires_gradient_sync(last)
            with (
                self.world.collective("the step's gradient all-reduce"),
                self._ddp.no_sync() if self._ddp is not None and not last else nullcontext(),
            ):
                y = None if labels is None else labels[i].to(self.device, non_blocking=True)
                mean, *_ = self._train_fn(mb.to(self.device, non_blocking=True), y)
                (mean / accum).backward()
            loss_sum = mean.detach() if loss_sum is None else loss_sum + mean.detach()
        assert loss_sum is not None
        # A callable is asked as late as possible: a signal during this step's backward still
        # stops every rank after this step.
        stop = stop() if callable(stop) else stop
        loss_t, stop_t = self._global_loss(loss_sum / accum, stop)

        grads = [p.grad for p in self._params if p.grad is not None]
        if self.forward_is_collective:  # sharded gradients: all-reduced over every shard
            with self.world.collective("the step's gradient norm"):
                norm_t = global_norm(torch.nn.utils.get_total_norm(grads, foreach=True))
        else:
            norm_t = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
        # The single host sync of the step: the finite check must precede the update.
        values = torch.stack([loss_t.float(), norm_t.float(), *stop_t]).tolist()
        loss_v, norm_v = values[0], values[1]
        stop = stop or (len(values) > 2 and values[2] > 0)
        if not (math.isfinite(loss_v) and math.isfinite(norm_v)):
            self.optimizer.zero_grad(set_to_none=True)
            where = "training step" if step is None else f"training step {step}"
            if window_ids is not None and self.world.distributed:
                # Every rank is here (the check is agreed): name the whole global batch.
                parts = self.world.all_gather_object(_id_list(window_ids))
                window_ids = [i for part in parts for i in part]
            ids = "" if window_ids is None else f"; window ids {format_ids(window_ids)}"
            raise NonFiniteError(
                f"{where}: non-finite loss={loss_v!r} or grad_norm={norm_v!r}{ids}; "
                f"no update was applied"
            )

        clip = self.config.grad_clip
        clipped = clip > 0.0 and norm_v > clip
        if clipped:
            # Reuses the norm above; scales by clip / (norm + 1e-6) so the result is <= clip.
            torch.nn.utils.clip_grads_with_norm_(self._params, clip, norm_t, foreach=True)
        self._set_lr(lr)
        self.optimizer.step()
        return StepResult(loss=loss_v, grad_norm=norm_v, clipped=clipped, lr=float(lr), stop=stop)

    def eval_step(self, patches: Tensor) -> tuple[float, int]:
        """(summed loss, target count) of ``patches`` in eval mode without gradients.

        Summing lets the caller form the exact mean over a partial last batch. The model's
        previous mode (train, normally) is restored afterwards. Synchronises with the device
        to return a float: a validation loop should call :meth:`eval_loss_sum` per batch and
        convert once at the end.
        """
        total, count = self.eval_loss_sum(patches)
        return float(total), count

    def eval_loss_sum(self, patches: Tensor) -> tuple[Tensor, int]:
        """:meth:`eval_step` without the synchronisation: ``(0-dim fp32 tensor on the device,
        target count)``. ``float(tensor)`` is exactly what ``eval_step`` returns."""
        total, count, _ = self.eval_sums(patches)
        return total, count

    @torch.no_grad()
    def eval_sums(
        self, patches: Tensor, labels: Tensor | None = None
    ) -> tuple[Tensor, int, Tensor]:
        """``(summed loss, target count, summed squared error of the predicted mean)`` of
        ``patches`` in eval mode without gradients and without a host synchronisation (0-dim
        fp32 tensors on the device). For ``model.objective = "mse"`` both sums are one tensor.

        Compiled, the batch dimension is marked dynamic, so the training batch size, the
        validation batch size and a partial last batch share one evaluation graph.

        A labelled objective (``labels [b]``): ``(summed cross-entropy, windows, predicted
        classes [b])``.
        """
        was_training = self.model.training
        self.model.eval()
        try:
            x = patches.to(self.device, non_blocking=True)
            y = None if labels is None else labels.to(self.device, non_blocking=True)
            if self.compiled and x.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(x, 0)
                if y is not None:
                    torch._dynamo.maybe_mark_dynamic(y, 0)
            # Sharded, a forward gathers parameters with every rank: a peer lost is one line.
            sharded = self.forward_is_collective
            what = "a forward of the sharded model"
            with self.world.collective(what) if sharded else nullcontext():
                _, total, count, squared_error = self._forward_loss_fn(x, y, True)
            return total, int(count), squared_error
        finally:
            self.model.train(was_training)

    def state_dict(self) -> dict[str, Any]:
        """The step's state: ``{"model": ..., "optimizer": ...}`` (what safetensors store).

        Live references, as torch's own state dicts are: copy it (a checkpoint does) before
        loading it into another step that keeps training alongside this one. ``sharded``: the
        optimizer is None (it is saved by :meth:`save_sharded`) and the model is gathered
        whole (see :meth:`model_state_dict`).
        """
        optimizer = None if self.sharded else self.optimizer.state_dict()
        return {"model": self.model_state_dict(), "optimizer": optimizer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.load_model_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def model_state_dict(self) -> dict[str, Tensor]:
        """The model's state dict; keys never carry a compile prefix. A sharded model is
        gathered whole onto rank 0's CPU (a collective; the other ranks get ``{}``)."""
        if self.forward_is_collective:
            with self.world.collective("gathering the sharded model"):
                return full_model_state(self.model)
        return _strip_compile_prefix(self.model.state_dict())

    def save_sharded(self, directory: Path) -> None:
        """``sharded``: write the model and optimizer state into ``directory`` as
        torch.distributed.checkpoint, every rank its own shards (a collective)."""
        with self.world.collective("writing the sharded checkpoint"):
            save_sharded(self.model, self.optimizer, directory, self.world)

    def load_sharded(self, directory: Path) -> None:
        """``sharded``: load what :meth:`save_sharded` wrote, at any world size (a collective
        with several ranks); CheckpointError names ``directory`` if it does not fit."""
        with self.world.collective("loading the sharded checkpoint"):
            load_sharded(self.model, self.optimizer, directory, self.world)

    def load_model_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load model weights strictly; foreign ``_orig_mod.`` key prefixes are dropped."""
        self.model.load_state_dict(_strip_compile_prefix(state), strict=True)

    # ------------------------------------------------------------------ internals

    def _global_loss(self, loss_t: Tensor, stop: bool) -> tuple[Tensor, list[Tensor]]:
        """Several ranks: the mean of the ranks' mean losses (every rank holds the same number
        of targets, so it is the mean over the global batch) and whether any rank asked to
        stop, in one all-reduce. A non-finite loss on any rank makes the sum non-finite on
        every rank, so the finite check that follows is agreed. The gradient norm needs no
        collective: DDP has already made the gradients identical on every rank."""
        if not self.world.distributed:
            return loss_t, []
        both = torch.stack([loss_t.float(), torch.zeros_like(loss_t, dtype=torch.float32)])
        if stop:
            both[1] = 1.0
        self.world.all_reduce_sum(both)
        return both[0] / self.world.world_size, [both[1]]

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            value = lr * group.get("lr_scale", 1.0)  # a fine-tune: the trunk's scale
            current = group["lr"]
            if isinstance(current, Tensor):
                current.fill_(value)
            else:
                # optimizer.load_state_dict with a float-lr checkpoint: go back to a tensor.
                group["lr"] = torch.tensor(value, dtype=torch.float64)

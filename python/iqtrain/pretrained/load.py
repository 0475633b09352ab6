"""A trained model as a product: :func:`load_pretrained` loads one checkpoint verified, and its
:class:`Pretrained` embeds and scores IQ windows exactly as training prepared them
(docs/design.md "A trained model as a product").

Every command that uses a trained model goes through here: ``iqtrain probe``, ``embed``,
``score``, and ``[init] from`` (a new attempt that starts from a checkpoint's weights). The
checkpoint is resolved and verified as a resume verifies its parent
(:func:`iqtrain.evidence.lineage.load_parent`: the attempt's manifest, every hash), the config
is the one of the attempt that wrote it, and the weights must fit it exactly.

Nothing here draws from or reseeds torch's global generators, so a probe during training leaves
the training stream untouched: the random-init twin seeds the CPU generator alone (the model is
built on the CPU; ``torch.manual_seed`` would also reseed every CUDA generator) under
``fork_rng``, which puts the CPU generator back.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch

from iqtrain.checkpoint.files import listed_sha256
from iqtrain.config.schema import Config, build_config
from iqtrain.config.sections import STEP_NAME, DataConfig, ModelConfig, Precision, check_which
from iqtrain.console import note
from iqtrain.data.sources import format_rate
from iqtrain.data.windows import FEATURE_BATCH
from iqtrain.errors import CheckpointError, ConfigError, InputError, int_argument
from iqtrain.evidence.lineage import Parent, ParentRef, load_parent
from iqtrain.model.prepare import prepare_iq_input
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives import Objective
from iqtrain.pretrained.inputs import check_windows, loader_batches

__all__ = [
    "POOLS",
    "PRECISIONS",
    "EmbedPool",
    "InferencePrecision",
    "Pretrained",
    "SampleRateWarning",
    "check_precision",
    "load_pretrained",
    "load_weights",
    "nonfinite_rows",
    "parse_layer",
    "random_init_model",
    "resolve_device",
    "source_config",
    "source_ref",
    "window_features",
    "window_log_probs",
    "window_scores",
]

#: ``embed(pool=...)``: the mean over patches ("mean"), or every patch's state (None).
EmbedPool = Literal["mean"]
POOLS: tuple[EmbedPool | None, ...] = (*get_args(EmbedPool), None)


def random_init_model(config: ModelConfig, seed: int, classes: int = 0) -> IQTransformer:
    """The model training starts from (``classes``: a labelled objective's model's): the weights of
    ``torch.manual_seed(seed)`` then ``IQTransformer``, built on the CPU from the CPU generator
    alone, seeded under ``fork_rng``: every global generator of the caller, the CUDA ones
    included, is left as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(seed)  # not torch.manual_seed: it reseeds CUDA too
        return IQTransformer(config, classes)


def parse_layer(
    text: str | int | None,
    layers: int,
    name: str = "layer",
    error: type[ValueError] = ValueError,
) -> int | str:
    """A layer (``layer=``, ``--layer``, ``probe.layer``): ``None`` (the final hidden states,
    ``layers``), an integer in ``[0, layers]`` or ``"all"``; else ``error`` naming ``name``
    (ValueError for a Python argument, ConfigError for a flag or a config key)."""
    if text is None:
        return layers
    if text == "all":
        return "all"
    # Plain ASCII digits only: int() would also take " 1", "01", "+1", "-0" and "١".
    plain = (
        isinstance(text, int)
        and not isinstance(text, bool)
        or (isinstance(text, str) and re.fullmatch(r"0|[1-9][0-9]*", text) is not None)
    )
    n = int(text) if plain else -1
    if not 0 <= n <= layers:
        raise error(
            f"{name}: expected 'all' or an integer in [0, {layers}] (0 the patch embeddings, "
            f"{layers} the final hidden states of this {layers}-block model), got {text!r}"
        )
    return n


def source_ref(
    source: str | os.PathLike,
    which: str | None,
    name: str = "which",
    error: type[ValueError] = ValueError,
) -> ParentRef:
    """The checkpoint ``source`` names: an attempt directory and ``which`` (``latest``,
    ``best``, ``step_N``; None: ``best``), or a checkpoint directory
    (``<attempt>/checkpoints/step_N``, whose own name says which: a ``which`` naming another
    is refused). ``error`` naming ``name`` for a bad ``which`` (ValueError for a Python
    argument, ConfigError for a flag or a config key)."""
    path = Path(source)
    if which is not None:
        check_which(which, name, error)
    if path.parent.name == "checkpoints" and STEP_NAME.fullmatch(path.name):
        if which is not None and not (
            STEP_NAME.fullmatch(which) and int(which[5:]) == int(path.name[5:])
        ):
            raise error(f"{name}: {which!r}, but {path} is itself a checkpoint")
        return ParentRef(path.parent.parent, path.name)
    return ParentRef(path, which or "best")


def load_weights(model: IQTransformer, state: dict[str, torch.Tensor], where: Path) -> None:
    """Every weight of ``model`` from ``state``, strictly: a missing, extra or misshapen tensor
    is a CheckpointError naming ``where``."""
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(
            f"{where}: does not fit the attempt's model config ({first})"
        ) from None


def resolve_device(
    device: str | torch.device, name: str = "device", error: type[ValueError] = ValueError
) -> torch.device:
    """``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"`` or a torch.device) as a device of this
    process: one CUDA is there for, with an index below the visible count. A TypeError naming
    ``name`` for a value that is neither a str nor a torch.device, else ``error`` naming it
    (ValueError for a Python argument, ConfigError for a flag)."""
    if not isinstance(device, str | torch.device):
        raise TypeError(f"{name}: expected 'cpu' or 'cuda[:N]', got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise error(f"{name}: expected 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type not in ("cpu", "cuda"):
        raise error(f"{name}: expected 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise error(f"{name}: {str(device)!r} requested but no CUDA device is available")
    count = torch.cuda.device_count() if dev.type == "cuda" else 0
    if dev.type == "cuda" and dev.index is not None and dev.index >= count:
        # (moving the model there would be a CUDA traceback: invalid device ordinal)
        visible = "cuda:0" if count == 1 else f"cuda:0 .. cuda:{count - 1}"
        raise error(f"{name}: {str(dev)!r}, but {count} CUDA device(s) are visible ({visible})")
    return dev


class SampleRateWarning(RuntimeWarning):
    """Samples given to a :class:`Pretrained` at another sample rate than the model was
    trained at (a model sees samples, not seconds: the same signal looks otherwise to it)."""


def _check_rate(given: Any) -> float | None:
    """A ``sample_rate=`` argument: None, or a positive finite number of Hz (a TypeError naming
    it for another type, a ValueError for another number)."""
    if given is None:
        return None
    if not isinstance(given, numbers.Real) or isinstance(given, bool | np.bool_):
        raise TypeError(f"sample_rate: expected a positive rate in Hz or None, got {given!r:.100}")
    try:  # numpy's numbers too; an integer too large for a float is no rate
        rate = float(given)
    except OverflowError:
        rate = -1.0
    if not 0 < rate < math.inf:
        raise ValueError(f"sample_rate: expected a positive rate in Hz or None, got {given!r:.100}")
    return rate


#: ``precision=``: fp32 (the default: exactly the probe's features), bf16 (CUDA autocast), or
#: auto (bf16 on CUDA where the model trained in bf16, else fp32).
InferencePrecision = Literal["fp32", "bf16", "auto"]
PRECISIONS: tuple[InferencePrecision, ...] = get_args(InferencePrecision)


def check_precision(
    precision: object,
    device: torch.device,
    name: str = "precision",
    error: type[ValueError] = ValueError,
) -> InferencePrecision:
    """``precision`` (one of :data:`PRECISIONS`; bf16 on a CUDA ``device`` only), else
    ``error`` naming ``name`` (ValueError for a Python argument, ConfigError for a flag)."""
    if precision not in PRECISIONS:
        raise error(f"{name}: expected 'fp32', 'bf16' or 'auto', got {precision!r}")
    if precision == "bf16" and device.type != "cuda":
        raise error(f"{name}: bf16 needs a CUDA device")
    return precision


def _precision(
    precision: InferencePrecision, trained: Precision, device: torch.device
) -> Precision:
    """The precision ``precision`` (checked) resolves to for a model trained at ``trained``."""
    if precision == "auto":  # where the model was trained so: bf16 on CUDA
        return trained if device.type == "cuda" else "fp32"
    return precision


@dataclass(frozen=True)
class Pretrained:
    """One verified checkpoint's model, ready to use.

    ``model`` (eval mode, on its device), ``config`` (the writing attempt's resolved config),
    ``step``, ``checkpoint`` (the directory), ``attempt`` (the attempt that wrote it),
    ``model_sha256`` (of its ``model.safetensors``), ``precision`` (``bf16``: forwards under
    bf16 autocast on CUDA; features and losses are returned in fp32 either way), ``classes``
    (a labelled objective's class names, in the order of its outputs; None for a pretraining
    model), ``sample_rate`` (Hz: the one rate of the recordings it was trained on, its
    state.json's; None when they had none, or several under ``data.sample_rate = "any"``, or
    the checkpoint predates the record).

    ``embed``, ``score`` and ``predict`` take the samples' ``sample_rate=`` (Hz): when it is
    given, the model's is known and they differ, a :class:`SampleRateWarning` names both.
    """

    model: IQTransformer
    config: Config
    step: int
    checkpoint: Path
    attempt: Path
    model_sha256: str
    precision: Precision = "fp32"
    classes: tuple[str, ...] | None = None
    sample_rate: float | None = None

    @property
    def window(self) -> int:
        """Samples per window (``data.seq_patches * data.patch_len``)."""
        return self.config.data.window

    @property
    def objective(self) -> Objective:
        """What the model was trained to do (:mod:`iqtrain.objectives`): its ``uses`` are the
        methods of this model that answer (``embed``, ``score``, ``predict``)."""
        return self.model.objective

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def random_init(self) -> Pretrained:
        """The same config with the random initialisation of ``run.seed`` (training's step 0
        for an attempt without ``[init]``): the baseline every pretrained number is read
        against."""
        n = 0 if self.classes is None else len(self.classes)
        model = random_init_model(self.config.model, self.config.run.seed, n)
        return Pretrained(
            model.to(self.device).eval(),
            self.config,
            0,
            self.checkpoint,
            self.attempt,
            "",
            self.precision,
            self.classes,
            self.sample_rate,
        )

    def warn_rate(self, sample_rate: float | None, stacklevel: int = 2) -> None:
        """A :class:`SampleRateWarning` naming both rates when ``sample_rate`` (Hz, of the
        samples given) is not the model's (both known; within one part in 10**9); nothing
        otherwise. A TypeError or ValueError for a ``sample_rate`` that is not a positive
        rate."""
        given = _check_rate(sample_rate)
        if given is None or self.sample_rate is None:
            return
        if math.isclose(given, self.sample_rate, rel_tol=1e-9):
            return
        warnings.warn(
            f"the model ({self.checkpoint}) was trained on recordings at "
            f"{format_rate(self.sample_rate)}, these samples are at {format_rate(given)}",
            SampleRateWarning,
            stacklevel=stacklevel + 1,
        )

    # ------------------------------------------------------------------ inference

    def embed(
        self,
        iq: Any,
        *,
        layer: int | None = None,
        pool: EmbedPool | None = "mean",
        batch_size: int = FEATURE_BATCH,
        sample_rate: float | None = None,
    ) -> np.ndarray:
        """Hidden states of windows ``iq`` (:func:`~iqtrain.pretrained.inputs.as_windows`:
        complex ``[..., window]`` or real ``[..., window, 2]``), float32: ``[N, dim]`` mean-pooled
        over patches (``pool="mean"``: the probe's features) or ``[N, patches, dim]``
        (``pool=None``). ``layer`` numbers as ``probe --layer`` (0 the patch embeddings,
        ``model.layers``, the default, the final hidden states). ``sample_rate``: the samples'
        rate in Hz (a :class:`SampleRateWarning` when it is not the model's). A bad argument is
        a TypeError or ValueError naming it."""
        self.warn_rate(sample_rate)
        if pool not in POOLS:
            raise ValueError(f"pool: expected 'mean' or None, got {pool!r}")
        k = parse_layer(layer, self.config.model.layers, name="layer")
        if k == "all":
            raise ValueError("layer: embed takes one layer (an integer), not 'all'")
        batches = _batches(iq, self.window, batch_size)
        out = self.features(batches, [int(k)], pool=pool)[int(k)]
        bad = nonfinite_rows(out.numpy())
        if bad.size:
            raise InputError(
                f"iq: window {int(bad[0])} gives non-finite features ({bad.size} window(s) in "
                "all): non-finite samples in it?"
            )
        return out.numpy()

    def score(
        self, iq: Any, *, batch_size: int = FEATURE_BATCH, sample_rate: float | None = None
    ) -> np.ndarray:
        """``[N]`` float64: each window's mean next-patch loss under the model's objective, in
        the units validation records (categorical: nats per complex sample; mse: NMSE). A
        likelihood-based novelty score: the higher, the more surprising to the model. A
        classifier predicts no next patch: ObjectiveError, a ValueError (use :meth:`predict`).
        A window with non-finite samples is an InputError naming it, as for :meth:`embed` and
        :meth:`predict` and the ``score`` command (a NaN would sort anywhere).
        ``sample_rate``: as :meth:`embed`'s."""
        self.warn_rate(sample_rate)
        out = self.losses(_batches(iq, self.window, batch_size))
        bad = np.flatnonzero(~np.isfinite(out))
        if bad.size:
            raise InputError(
                f"iq: window {int(bad[0])} gives a non-finite score ({bad.size} window(s) in "
                "all): non-finite samples in it?"
            )
        return out

    def predict(
        self, iq: Any, *, batch_size: int = FEATURE_BATCH, sample_rate: float | None = None
    ) -> np.ndarray:
        """``[N, classes]`` float64: each window's log-probability of each class (a fine-tuned
        model; columns in :attr:`classes` order), from the forward training validates with.
        ``self.classes[p.argmax(axis=1)]`` names the predicted classes. A pretraining model (no
        classes) is an ObjectiveError, a ValueError; a window with non-finite samples an InputError.
        ``sample_rate``: as :meth:`embed`'s."""
        self.objective.require("predict", self.attempt)
        self.warn_rate(sample_rate)
        out = self.log_probs(_batches(iq, self.window, batch_size))
        bad = nonfinite_rows(out)
        if bad.size:
            raise InputError(
                f"iq: window {int(bad[0])} gives non-finite class probabilities ({bad.size} "
                "window(s) in all): non-finite samples in it?"
            )
        return out

    def log_probs(self, batches: Iterable[np.ndarray]) -> np.ndarray:
        """:func:`window_log_probs` of this model."""
        return window_log_probs(self.model, self.config.data, batches, precision=self.precision)

    def features(
        self,
        batches: Iterable[np.ndarray],
        layers: Sequence[int],
        *,
        pool: EmbedPool | None = "mean",
    ) -> dict[int, torch.Tensor]:
        """:func:`window_features` of this model."""
        return window_features(
            self.model, self.config.data, batches, layers, pool=pool, precision=self.precision
        )

    def losses(self, batches: Iterable[np.ndarray]) -> np.ndarray:
        """:func:`window_scores` of this model (ObjectiveError naming the attempt for a model
        whose objective gives no score, a classifier's)."""
        self.objective.require("score", self.attempt)
        return window_scores(self.model, self.config.data, batches, precision=self.precision)


# --------------------------------------------------------------------------- the one forward path


def _patches(raw: np.ndarray, data: DataConfig, device: torch.device) -> torch.Tensor:
    """One batch of windows, normalised and patched as training does (``data.patch_len``,
    ``norm``, ``prefix_patches``; the Triton kernel on CUDA, the reference elsewhere), fp32."""
    patches, _ = prepare_iq_input(
        torch.from_numpy(raw).to(device),
        data.patch_len,
        norm=data.norm,
        prefix_patches=data.prefix_patches,
    )
    return patches


def _evaluating(model: IQTransformer, precision: Precision) -> contextlib.ExitStack:
    """Eval mode (the model's own mode restored on exit), no_grad, and bf16 autocast only for
    ``precision = "bf16"`` (fp32 otherwise: autocast off, whatever the caller's state)."""
    stack = contextlib.ExitStack()
    was_training = model.training
    model.eval()
    stack.callback(model.train, was_training)
    device = next(model.parameters()).device
    stack.enter_context(torch.no_grad())
    stack.enter_context(
        torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    )
    return stack


def window_features(
    model: IQTransformer,
    data: DataConfig,
    batches: Iterable[np.ndarray],
    layers: Sequence[int],
    *,
    pool: EmbedPool | None = "mean",
    precision: Precision = "fp32",
) -> dict[int, torch.Tensor]:
    """``{layer: features}`` (CPU fp32; ``[n, dim]`` mean-pooled over patches, or
    ``[n, patches, dim]`` with ``pool=None``) of every window of ``batches`` (``[b, window, 2]``
    in a loader dtype), from one forward per batch on the model's device, in eval mode under
    no_grad. ``layers`` number as :meth:`IQTransformer.layer_states` (0 the patch embeddings,
    ``model.layers`` the final hidden states). Non-finite features are returned as they are
    (the caller names the window)."""
    device = next(model.parameters()).device
    out: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
    with _evaluating(model, precision):
        for raw in batches:
            states = model.layer_states(_patches(raw, data, device))
            for k in out:
                s = states[k].float()
                out[k].append((s.mean(dim=1) if pool == "mean" else s).cpu())
    empty = (0, model.config.dim) if pool == "mean" else (0, data.seq_patches, model.config.dim)
    return {k: torch.cat(v) if v else torch.zeros(empty) for k, v in out.items()}


def window_scores(
    model: IQTransformer,
    data: DataConfig,
    batches: Iterable[np.ndarray],
    *,
    precision: Precision = "fp32",
) -> np.ndarray:
    """``[n]`` float64: each window's mean next-patch loss under the model's objective
    (:meth:`~iqtrain.objectives.Objective.window_losses`), from one forward per batch, in eval
    mode under no_grad. A window with non-finite samples scores NaN."""

    def losses(patches: torch.Tensor) -> torch.Tensor:
        return model.objective.window_losses(model(patches), patches, model.config)

    return _per_window(model, data, batches, precision, losses, empty=(0,))


def window_log_probs(
    model: IQTransformer,
    data: DataConfig,
    batches: Iterable[np.ndarray],
    *,
    precision: Precision = "fp32",
) -> np.ndarray:
    """``[n, classes]`` float64: a fine-tuned model's log-softmax over its classes for every
    window of ``batches``, one forward per batch in eval mode under no_grad (non-finite rows
    as they come: the caller names the window)."""

    def log_probs(patches: torch.Tensor) -> torch.Tensor:
        return model(patches).float().log_softmax(dim=1)

    return _per_window(model, data, batches, precision, log_probs, empty=(0, model.classes))


def _per_window(
    model: IQTransformer,
    data: DataConfig,
    batches: Iterable[np.ndarray],
    precision: Precision,
    per_batch: Callable[[torch.Tensor], torch.Tensor],
    empty: tuple[int, ...],
) -> np.ndarray:
    """``per_batch(patches)`` of every batch, in eval mode under no_grad, concatenated as
    float64 (``empty``'s shape when there is no batch)."""
    device = next(model.parameters()).device
    out = []
    with _evaluating(model, precision):
        for raw in batches:
            out.append(per_batch(_patches(raw, data, device)).double().cpu())
    return torch.cat(out).numpy() if out else np.zeros(empty)


def nonfinite_rows(values: np.ndarray) -> np.ndarray:
    """Indices of the rows (first dimension) of ``values`` that hold a non-finite value."""
    values = np.asarray(values)
    flat = values.reshape(len(values), -1) if values.size else values.reshape(len(values), 0)
    return np.flatnonzero(~np.isfinite(flat).all(axis=1))


def _batches(iq: Any, window: int, batch_size: int) -> Iterable[np.ndarray]:
    size = int_argument("batch_size", batch_size, minimum=1)
    return loader_batches(check_windows(iq, window), size)


def source_config(parent: Parent, name: str = "") -> Config:
    """The resolved config of the attempt that wrote ``parent``'s checkpoint; one this version
    cannot build is a CheckpointError naming its config.toml (prefixed ``name``). An ``[init]``
    table without ``from`` (random initialisation; early attempts wrote ``which`` beside an
    empty ``from``) says nothing and is read as absent."""
    tables = parent.config_tables
    init = tables.get("init")
    if isinstance(init, dict) and not init.get("from"):
        tables = {k: v for k, v in tables.items() if k != "init"}
    try:
        return build_config(tables)
    except ConfigError as exc:
        raise CheckpointError(f"{name}{parent.attempt / 'config.toml'}: {exc}") from None


def _model_of(parent: Parent) -> tuple[IQTransformer, Config]:
    config = source_config(parent)
    classes = parent.state.classes
    if config.model.task.labelled != (classes is not None) or (
        classes is not None and len(classes) < 2
    ):
        raise CheckpointError(
            f"{parent.checkpoint / 'state.json'}: classes {classes!r} do not fit "
            f"model.objective {config.model.objective!r}"
        )
    # every weight is overwritten
    model = random_init_model(config.model, config.run.seed, len(classes or ()))
    load_weights(model, parent.model_state, parent.checkpoint / "model.safetensors")
    if not all(bool(torch.isfinite(t).all()) for t in model.state_dict().values()):
        raise CheckpointError(
            f"{parent.checkpoint / 'model.safetensors'}: the weights hold non-finite values"
        )
    return model, config


def load_pretrained(
    source: str | os.PathLike,
    *,
    which: str | None = None,
    device: str | torch.device = "cpu",
    precision: InferencePrecision = "fp32",
) -> Pretrained:
    """Load a trained model, verified: ``source`` is an attempt directory (the checkpoint
    ``which`` names: ``latest``, ``best``, ``step_N``; None: ``best``), a checkpoint directory,
    or a package ``iqtrain export`` wrote (``which`` must then be None).

    Verified as a resume verifies its parent (the attempt's manifest when it has one, every
    listed hash); a running attempt is refused. A package: every file against its
    ``lineage.json``, its config and weights against each other. ``precision``: ``fp32``
    (features exactly the probe's), ``bf16`` (bf16 autocast; CUDA only) or ``auto`` (bf16 on
    CUDA where the model trained in bf16, else fp32). A bad or missing file is a
    CheckpointError naming it; a bad argument a TypeError or ValueError naming it.
    """
    from iqtrain.evidence.package import is_package

    path = Path(source).expanduser()
    if is_package(path):
        if which is not None:
            raise ValueError(f"which: {which!r}, but {path} is a package of one checkpoint")
        return _load_package(path, device, precision)
    ref = source_ref(path, which)
    dev = resolve_device(device)
    chosen = check_precision(precision, dev)
    parent = load_parent(ref, optimizer=False)
    for skipped in parent.skipped:  # a crashed attempt: say which checkpoint answers, and why
        note(
            f"{parent.attempt}: {ref.checkpoint} is {parent.checkpoint.name}: checkpoint "
            f"{skipped['checkpoint']} does not verify ({skipped['reason']})"
        )
    model, config = _model_of(parent)
    return Pretrained(
        model=model.to(dev).eval(),
        config=config,
        step=parent.state.step,
        checkpoint=parent.checkpoint,
        attempt=parent.attempt,
        model_sha256=listed_sha256(parent.checkpoint),
        precision=_precision(chosen, config.training.precision, dev),
        classes=None if parent.state.classes is None else tuple(parent.state.classes),
        sample_rate=parent.state.known_rate,
    )


def _load_package(
    path: Path, device: str | torch.device, precision: InferencePrecision
) -> Pretrained:
    from iqtrain.pretrained.package import load_package_state, package_model

    dev = resolve_device(device)
    chosen = check_precision(precision, dev)
    package, config, state = load_package_state(path)
    doc = package.config
    model = package_model(config, doc["classes"], state, package.path)
    return Pretrained(
        model=model.to(dev).eval(),
        config=config,
        step=doc["step"],
        checkpoint=package.path,
        attempt=package.path,
        model_sha256=doc["model_sha256"],
        precision=_precision(chosen, doc["trained_precision"], dev),
        classes=None if doc["classes"] is None else tuple(doc["classes"]),
        sample_rate=doc["sample_rate"],
    )

"""The sections of the run configuration: one ``kw_only`` dataclass per TOML table.

Each validates its own values in ``__post_init__`` and names the dotted key in every error. The
closed sets of names (devices, precisions, schedule kinds and shapes), the one SigMF datatype
table and the shared validators live here too. :mod:`iqtrain.config.schema` assembles the
sections into a :class:`~iqtrain.config.schema.Config`. Imports no torch (nor numpy).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from iqtrain import objectives
from iqtrain.errors import ConfigError, as_config_error, int_argument
from iqtrain.objectives import Objective

__all__ = [
    "ARCHITECTURE_KEYS",
    "TRUNK_KEYS",
    "DEVICES",
    "KINDS",
    "MAX_BINS",
    "NORMS",
    "PARALLEL",
    "PRECISIONS",
    "SAMPLE_RATE_RULES",
    "SHAPES",
    "SIGMF_DATATYPES",
    "STEP_NAME",
    "SYNTH_DATATYPES",
    "DataConfig",
    "Datatype",
    "DecayShape",
    "Device",
    "InitConfig",
    "LoggingConfig",
    "ModelConfig",
    "Norm",
    "OptimizerConfig",
    "Parallel",
    "Pool",
    "Precision",
    "ProbeConfig",
    "RunConfig",
    "ScheduleConfig",
    "ScheduleKind",
    "SynthConfig",
    "TrainingConfig",
    "WandbConfig",
    "POOLS",
    "check_which",
    "default_mlp_hidden",
    "require_float",
    "require_int",
]


# --------------------------------------------------------------------------- closed sets of names
# Each set is a Literal type (what the code that reads a checked value is typed with) and the
# tuple of its values (what a section's __post_init__ checks the TOML string against).

#: ``training.device``: exactly these ("cuda:1" or "CPU" are mistakes we name, not guess at).
Device = Literal["cpu", "cuda"]
DEVICES: tuple[Device, ...] = get_args(Device)
#: ``training.precision``; bf16 requires cuda.
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
#: ``training.parallel``: how several ranks hold the model (docs/design.md "DDP and FSDP2").
Parallel = Literal["ddp", "fsdp"]
PARALLEL: tuple[Parallel, ...] = get_args(Parallel)
#: ``schedule.kind`` and ``schedule.decay_shape`` (docs/design.md "Learning-rate schedule").
ScheduleKind = Literal["wsd", "cosine", "constant"]
KINDS: tuple[ScheduleKind, ...] = get_args(ScheduleKind)
DecayShape = Literal["linear", "cosine", "sqrt"]
SHAPES: tuple[DecayShape, ...] = get_args(DecayShape)
#: ``data.norm``: each window normalised by its own power, or by its first ``prefix_patches``.
Norm = Literal["window", "prefix"]
NORMS: tuple[Norm, ...] = get_args(Norm)
#: ``data.sample_rate`` as a rule rather than a rate (docs/design.md "Recordings, capture segments,
#: windows", sample rates).
SAMPLE_RATE_RULES = ("same", "any")
#: ``model.pool`` of "classify": how the patches' hidden states become one vector per window.
Pool = Literal["mean", "attention"]
POOLS: tuple[Pool, ...] = get_args(Pool)


#: ``[model]`` keys that shape the weights or what they compute: a checkpoint's tensors mean
#: what they meant in training only with every one of these equal. (``dropout`` and
#: ``init_std`` only act in training and at initialisation: they may differ.) A config with
#: ``[init] from`` takes each one its ``[model]`` does not give from the source
#: (``schema.inherit_architecture``).
ARCHITECTURE_KEYS = (
    "dim",
    "layers",
    "heads",
    "mlp_hidden",
    "patch_len",
    "max_patches",
    "rope_theta",
    "objective",
    "bins",
    "bin_range",
)
#: The keys that shape the trunk (every weight but the head's): what a fine-tune's
#: ``[model]`` must share with the pretrained checkpoint it starts from.
TRUNK_KEYS = ARCHITECTURE_KEYS[:7]

#: ``model.objective``: what the model is trained to do, one of :func:`iqtrain.objectives.names`
#: (docs/design.md "Objectives"); ``ModelConfig.task`` is its
#: :class:`~iqtrain.objectives.Objective`. ``model.bins``: bins per I/Q value of the categorical
#: objective (its head is 2P x bins wide).
MAX_BINS = 4096


@dataclass(frozen=True)
class Datatype:
    """One SigMF complex datatype iqtrain reads (docs/design.md "Datatypes and the metadata
    verdict")."""

    bytes_per_sample: int  # one complex sample: I and Q
    full_scale: float | None  # the code a float 1.0 is written as by synth; None: read only
    #: What a batch of recordings of this datatype alone holds: "int8", "int16" or "float32".
    storage: str = "float32"
    #: numpy's dtype of one component (I or Q) as stored: "<i2", ">f8", "u1", ...
    component: str = "<f4"


def _datatypes() -> dict[str, Datatype]:
    """The 14 complex SigMF datatypes: today's four synth writes first (its default first)."""
    storage = {"i8": "int8", "u8": "int8", "i16": "int16", "u16": "int16"}
    scale = {"ci16_le": 32767.0, "cf32_le": 1.0, "ci8": 127.0, "cu8": 127.0}
    names = ["ci16_le", "cf32_le", "ci8", "cu8", "ci16_be", "cf32_be"]
    names += [f"c{t}_{e}" for t in ("u16", "i32", "u32", "f64") for e in ("le", "be")]
    out = {}
    for name in names:
        kind, _, order = name[1:].partition("_")
        bits = int(kind[1:])
        out[name] = Datatype(
            bytes_per_sample=2 * bits // 8,
            full_scale=scale.get(name),
            storage=storage.get(kind, "float32"),
            component=("|" if bits == 8 else "<" if order == "le" else ">")
            + kind[0]
            + str(bits // 8),
        )
    return out


#: Every SigMF datatype iqtrain reads: the 14 complex ones of the specification (the one table:
#: the reader in :mod:`iqtrain.data.sigmf`, :mod:`iqtrain.data.synth`,
#: ``data.synthetic.datatype`` and ``iqtrain synth --datatype`` all take theirs from it).
#: Unsigned types are offset binary (``u - 2**(bits-1)``); 8- and 16-bit integers are stored
#: as they are, 32-bit integers and cf64 as float32 (by value, rounded to nearest). Only
#: ``ci16_le``, ``cf32_le``, ``ci8`` and ``cu8`` are written (by synth); real-valued data is
#: refused by the reader.
SIGMF_DATATYPES: dict[str, Datatype] = _datatypes()
#: The datatypes ``iqtrain synth`` writes, its default first.
SYNTH_DATATYPES = tuple(k for k, v in SIGMF_DATATYPES.items() if v.full_scale is not None)


# --------------------------------------------------------------------------- shared validators
# Every message starts with the dotted key so a user can find the offending line of the TOML
# file without reading a traceback.


def require_int(key: str, value: object, *, minimum: int, maximum: int | None = None) -> int:
    """``value`` as a Python int within ``[minimum, maximum]``: the one integer rule of every
    setting. An int or a numpy
    integer (anything with ``__index__``: TOML gives ints, a script may pass ``np.int64``); not
    a bool (an int subclass: ``layers = true`` is a mistake, not 1), nor ``8.0`` or ``"8"``.
    The caller keeps the returned int, so a setting holds one type whatever it was given.
    A ConfigError naming ``key`` otherwise (a Python argument's rule:
    :func:`~iqtrain.errors.int_argument`, the same with TypeError and ValueError)."""
    with as_config_error():
        return int_argument(key, value, minimum=minimum, maximum=maximum)


def require_float(
    key: str,
    value: object,
    *,
    gt: float | None = None,
    ge: float | None = None,
    lt: float | None = None,
    le: float | None = None,
) -> float:
    # TOML writes `rope_theta = 10000` as an integer; accept it and store the float so the
    # resolved config has one type per field.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}: must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ConfigError(f"{key}: must be finite, got {value!r}")
    if gt is not None and not v > gt:
        raise ConfigError(f"{key}: must be > {gt}, got {value!r}")
    if ge is not None and not v >= ge:
        raise ConfigError(f"{key}: must be >= {ge}, got {value!r}")
    if lt is not None and not v < lt:
        raise ConfigError(f"{key}: must be < {lt}, got {value!r}")
    if le is not None and not v <= le:
        raise ConfigError(f"{key}: must be <= {le}, got {value!r}")
    return v


def require_str(key: str, value: object, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key}: must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def require_str_list(key: str, value: object) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: must be a list of paths or glob patterns, got {value!r}")
    return list(value)


def require_path(key: str, value: object) -> str:
    """``value`` as an absolute path: ``~`` expanded, then relative to the current directory."""
    value = require_str(key, value)
    if not value:
        raise ConfigError(f"{key}: must not be empty")
    # Path() joins and drops "." components and doubled slashes but never resolves "..",
    # symlinks or glob characters, so a pattern stays the same pattern.
    return os.fspath(Path.cwd() / os.path.expanduser(value))


def require_bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


@dataclass(kw_only=True)
class RunConfig:
    """``[run]``: where attempts go and the seed of everything random.

    ``dir`` is resolved against the current working directory when the config is built.
    """

    dir: str = "runs/default"
    seed: int = 0

    def __post_init__(self) -> None:
        self.dir = require_path("run.dir", self.dir)
        self.seed = require_int("run.seed", self.seed, minimum=0)
        if self.seed >= 1 << 63:
            raise ConfigError(f"run.seed: must be below 2**63, got {self.seed}")


#: The synthetic generator's limits (``iqtrain synth`` and ``[data.synthetic]`` alike). It holds
#: a few complex128 copies of a recording at once (~100 bytes/sample at peak), so MAX_SAMPLES
#: keeps one recording within a few GiB; use more recordings for more data. File names are
#: zero-padded to as many digits as the count needs (four up to 10,000: ``synth.name_width``),
#: so name order is generation order at any count; MAX_RECORDINGS (a million) only bounds a
#: typo's cost (each recording is two files).
SYNTH_MIN_SAMPLES = 1024
SYNTH_MAX_SAMPLES = 1 << 26
SYNTH_MAX_RECORDINGS = 1_000_000
SYNTH_MAX_SEED = (1 << 64) - 1
#: The validation set's seed is the training set's plus this (it must not repeat it).
SYNTH_VAL_SEED_OFFSET = 1_000_003


@dataclass(kw_only=True)
class SynthConfig:
    """``[data.synthetic]``: the built-in default data, used when ``data.train`` is empty.

    Generated deterministically on first use into ``cache_dir`` (resolved to an absolute path
    when the config is built) and reused afterwards.
    """

    train_recordings: int = 8
    val_recordings: int = 2
    samples: int = 1 << 17
    datatype: str = "ci16_le"
    seed: int = 0
    cache_dir: str = "~/.cache/iqtrain/synth"

    def __post_init__(self) -> None:
        for key in ("train_recordings", "val_recordings"):
            value = getattr(self, key)
            limit = SYNTH_MAX_RECORDINGS
            setattr(
                self, key, require_int(f"data.synthetic.{key}", value, minimum=1, maximum=limit)
            )
        self.samples = require_int(
            "data.synthetic.samples",
            self.samples,
            minimum=SYNTH_MIN_SAMPLES,
            maximum=SYNTH_MAX_SAMPLES,
        )
        require_str("data.synthetic.datatype", self.datatype, SYNTH_DATATYPES)
        # The validation set is generated with seed + SYNTH_VAL_SEED_OFFSET.
        top = SYNTH_MAX_SEED - SYNTH_VAL_SEED_OFFSET
        self.seed = require_int("data.synthetic.seed", self.seed, minimum=0, maximum=top)
        self.cache_dir = require_path("data.synthetic.cache_dir", self.cache_dir)


@dataclass(kw_only=True)
class DataConfig:
    """``[data]``: recordings, windowing, batching and input normalisation.

    ``train`` and ``val`` are paths or glob patterns, resolved to absolute ones (relative to
    the current working directory) when the config is built.
    """

    train: list[str] = field(default_factory=list)
    val: list[str] = field(default_factory=list)
    patch_len: int = 16
    seq_patches: int = 64
    # stride and val_batch_size are typed as __post_init__ leaves them: it replaces None.
    stride: int = None  # type: ignore[assignment]  # samples; None = window (non-overlapping)
    batch_size: int = 32  # windows per microbatch, global across ranks
    val_batch_size: int = None  # type: ignore[assignment]  # None = batch_size
    norm: Norm = "window"
    prefix_patches: int = 4
    prefetch: int = 2
    # model.objective = "classify": the annotation field whose value is a window's class (a
    # field name, or a path into its objects: "signal:detail.mod_class").
    label_key: str = "core:label"
    # The channel read of multi-channel recordings (core:num_channels > 1); None: refuse them.
    channel: int | None = None
    # Recordings that cannot be read: refused, every one named (false), or read past and
    # recorded in attempt.json and the manifest (true).
    skip_invalid: bool = False
    # The recordings' core:sample_rate: "same" (one rate, or none, across each set and the
    # training and validation sets alike), "any" (mixed rates allowed), or a rate in Hz every
    # recording must have.
    sample_rate: str | float = "same"
    synthetic: SynthConfig = field(default_factory=SynthConfig)

    def __post_init__(self) -> None:
        self.train = [
            require_path(f"data.train[{i}]", p)
            for i, p in enumerate(require_str_list("data.train", self.train))
        ]
        self.val = [
            require_path(f"data.val[{i}]", p)
            for i, p in enumerate(require_str_list("data.val", self.val))
        ]
        if bool(self.train) != bool(self.val):
            missing = "data.val" if self.train else "data.train"
            raise ConfigError(
                f"{missing}: set both data.train and data.val, or neither (synthetic)"
            )
        self.patch_len = require_int("data.patch_len", self.patch_len, minimum=1)
        self.seq_patches = require_int("data.seq_patches", self.seq_patches, minimum=2)
        if self.stride is None:
            self.stride = self.window
        self.stride = require_int("data.stride", self.stride, minimum=1)
        self.batch_size = require_int("data.batch_size", self.batch_size, minimum=1)
        if self.val_batch_size is None:
            self.val_batch_size = self.batch_size
        self.val_batch_size = require_int("data.val_batch_size", self.val_batch_size, minimum=1)
        require_str("data.norm", self.norm, NORMS)
        self.prefix_patches = require_int("data.prefix_patches", self.prefix_patches, minimum=1)
        if self.norm == "prefix" and self.prefix_patches > self.seq_patches:
            raise ConfigError(
                f"data.prefix_patches: must be <= data.seq_patches ({self.seq_patches}), "
                f"got {self.prefix_patches}"
            )
        self.prefetch = require_int("data.prefetch", self.prefetch, minimum=0)
        if not require_str("data.label_key", self.label_key).strip():
            raise ConfigError("data.label_key: must not be empty")
        if self.channel is not None:
            self.channel = require_int("data.channel", self.channel, minimum=0)
        if not isinstance(self.skip_invalid, bool):
            raise ConfigError(
                f"data.skip_invalid: must be true or false, got {self.skip_invalid!r}"
            )
        if isinstance(self.sample_rate, str):
            if self.sample_rate not in SAMPLE_RATE_RULES:
                raise ConfigError(
                    "data.sample_rate: a rate in Hz (a number), 'same' or 'any', got "
                    f"{self.sample_rate!r}"
                )
        else:
            self.sample_rate = require_float("data.sample_rate", self.sample_rate, gt=0.0)
        if not isinstance(self.synthetic, SynthConfig):
            raise ConfigError("data.synthetic: must be a table")

    @property
    def window(self) -> int:
        """Samples per window: ``seq_patches * patch_len``."""
        return self.seq_patches * self.patch_len

    @property
    def is_synthetic(self) -> bool:
        return not self.train


def default_mlp_hidden(dim: int) -> int:
    """SwiGLU hidden width for ``dim``: round(8/3 * dim), rounded up to a multiple of 64.

    8/3 keeps the three SwiGLU matrices at the parameter count of a 4x two-matrix MLP; the
    multiple of 64 keeps matmul shapes aligned to vector units and tensor-core tiles.
    """
    return -(-round(8 * dim / 3) // 64) * 64


@dataclass(kw_only=True)
class ModelConfig:
    """The ``[model]`` table. Validated on construction; ``mlp_hidden=None`` is resolved."""

    dim: int = 128
    layers: int = 4
    heads: int = 4
    mlp_hidden: int | None = None
    rope_theta: float = 10000.0
    dropout: float = 0.0
    init_std: float = 0.02
    patch_len: int = 16
    max_patches: int = 256
    objective: str = "mse"
    # The categorical objective's grid: ``bins`` equal bins over [-bin_range, bin_range] in
    # window-normalised units (unit mean power per complex sample); read for "mse" too, so a
    # mistyped value is an error whatever the objective.
    bins: int = 64
    bin_range: float = 4.0
    # A labelled objective's (iqtrain.objectives.classify; read for every objective, so a typo
    # is an error whatever it is): how the patches' states become one vector ("mean";
    # "attention": one learned query), and whether the trunk is frozen (the head alone trains:
    # the linear probe by training).
    pool: Pool = "mean"
    freeze_trunk: bool = False

    def __post_init__(self) -> None:
        self.dim = require_int("model.dim", self.dim, minimum=1)
        self.layers = require_int("model.layers", self.layers, minimum=1)
        self.heads = require_int("model.heads", self.heads, minimum=1)
        if self.dim % self.heads:
            raise ConfigError(f"model.heads: must divide model.dim ({self.dim}), got {self.heads}")
        # RoPE rotates pairs of channels, so every head needs an even width.
        if (self.dim // self.heads) % 2:
            raise ConfigError(
                f"model.heads: model.dim / model.heads must be even for rotary embeddings, "
                f"got {self.dim} / {self.heads} = {self.dim // self.heads}"
            )
        if self.mlp_hidden is None:
            # Resolved here, not at build time, so the resolved config records the width used.
            self.mlp_hidden = default_mlp_hidden(self.dim)
        else:
            self.mlp_hidden = require_int("model.mlp_hidden", self.mlp_hidden, minimum=1)
        self.rope_theta = require_float("model.rope_theta", self.rope_theta, gt=1.0)
        self.dropout = require_float("model.dropout", self.dropout, ge=0.0, lt=1.0)
        self.init_std = require_float("model.init_std", self.init_std, gt=0.0)
        self.patch_len = require_int("model.patch_len", self.patch_len, minimum=1)
        # One patch has no successor to predict, so a usable window has at least two.
        self.max_patches = require_int("model.max_patches", self.max_patches, minimum=2)
        require_str("model.objective", self.objective, objectives.names())
        require_str("model.pool", self.pool, POOLS)
        require_bool("model.freeze_trunk", self.freeze_trunk)
        objectives.check_keys(self.task, "model", self)
        self.bins = require_int("model.bins", self.bins, minimum=2, maximum=MAX_BINS)
        # fp32 grid: beyond 1e4 window-normalised units (80 dB above the window's power) or
        # below bins 1e-6 wide, the centres stop being distinct finite numbers.
        self.bin_range = require_float("model.bin_range", self.bin_range, gt=0.0, le=1e4)
        if 2.0 * self.bin_range / self.bins < 1e-6:
            raise ConfigError(
                f"model.bin_range: {self.bin_range} over {self.bins} bins makes bins narrower "
                "than 1e-6 (fp32 cannot tell their centres apart)"
            )

    @property
    def task(self) -> Objective:
        """``model.objective`` as its type: what the head, the loss, the monitored validation
        field and the uses of the trained model are (:mod:`iqtrain.objectives`)."""
        return objectives.get(self.objective)

    @property
    def outputs_per_value(self) -> int:
        """Head outputs per predicted I/Q value of a next-patch head: 1 (the value) or
        ``bins`` (its logits)."""
        return self.task.outputs_per_value(self)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(kw_only=True)
class OptimizerConfig:
    """The ``[optimizer]`` table: AdamW hyperparameters, the schedule's peak and floor, clipping."""

    lr: float = 1e-3
    min_lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # <= 0 turns clipping off
    # The trunk's (every weight but the "classify" head's) learning rate is the schedule's
    # times this; 1.0 for the other objectives, whose whole model is the trunk.
    trunk_lr_scale: float = 1.0

    def __post_init__(self) -> None:
        self.lr = require_float("optimizer.lr", self.lr, gt=0.0)
        self.min_lr = require_float("optimizer.min_lr", self.min_lr, ge=0.0)
        if self.min_lr > self.lr:
            raise ConfigError(
                f"optimizer.min_lr: must be <= optimizer.lr ({self.lr}), got {self.min_lr}"
            )
        # TOML has arrays, not tuples: accept a two-element list and store the tuple.
        if not isinstance(self.betas, tuple | list) or len(self.betas) != 2:
            raise ConfigError(f"optimizer.betas: must be two numbers, got {self.betas!r}")
        self.betas = (
            require_float("optimizer.betas[0]", self.betas[0], ge=0.0, lt=1.0),
            require_float("optimizer.betas[1]", self.betas[1], ge=0.0, lt=1.0),
        )
        self.eps = require_float("optimizer.eps", self.eps, gt=0.0)
        self.weight_decay = require_float("optimizer.weight_decay", self.weight_decay, ge=0.0)
        self.grad_clip = require_float("optimizer.grad_clip", self.grad_clip)
        self.trunk_lr_scale = require_float(
            "optimizer.trunk_lr_scale", self.trunk_lr_scale, gt=0.0, le=1e6
        )


@dataclass(kw_only=True)
class ScheduleConfig:
    """``[schedule]``: the shape of the learning rate over training.max_steps."""

    kind: ScheduleKind = "wsd"
    warmup_steps: int = 100
    decay_steps: int = 200  # wsd only
    decay_shape: DecayShape = "linear"  # wsd only

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(
                f"schedule.kind: must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        self.warmup_steps = require_int("schedule.warmup_steps", self.warmup_steps, minimum=0)
        self.decay_steps = require_int("schedule.decay_steps", self.decay_steps, minimum=0)
        if self.kind == "wsd" and self.decay_shape not in SHAPES:  # other kinds ignore it
            raise ConfigError(
                f"schedule.decay_shape: must be one of {', '.join(SHAPES)}, "
                f"got {self.decay_shape!r}"
            )
        if self.kind == "wsd" and self.decay_steps < 1:
            raise ConfigError("schedule.decay_steps: wsd needs at least 1 decay step")


#: training.dist_timeout_s at most a week: a collective that waits longer is a hang, and far
#: larger values overflow the process group's timeout (a datetime.timedelta) on every rank.
MAX_DIST_TIMEOUT_S = 7 * 24 * 3600


@dataclass(kw_only=True)
class TrainingConfig:
    """``[training]``: device, precision, the step budget and the loop's cadences."""

    device: Device = "cpu"
    precision: Precision = "fp32"
    max_steps: int = 1000
    grad_accum: int = 1
    compile: bool = False
    # CUDA: every step bit-exact, so a resume repeats its parent's straight run bit for bit
    # (deterministic kernels, cuBLAS workspace, Inductor's deterministic mode, no cuDNN
    # attention: train/determinism.py); false trades that for speed. No effect on the CPU,
    # whose steps are deterministic anyway.
    deterministic: bool = True
    eval_every: int = 100
    checkpoint_every: int = 500
    keep_last: int = 3  # 0 keeps every checkpoint
    log_every: int = 10
    # Peak FLOP/s (in TFLOP/s) for MFU in the train records; 0 = the built-in table
    # (A100/H100/H200, by precision; none for CPUs, so no MFU there).
    peak_tflops: float = 0.0
    # Several ranks (torchrun): how long any collective (and joining the group) may wait for
    # the other ranks before this rank gives up with one line (exit 1). Rank 0 digests every
    # data file before a resume while the others wait, so this bounds that too.
    dist_timeout_s: int = 1800
    # Several ranks: "ddp" replicates the model and optimizer on every rank (checkpoints hold
    # them once, in safetensors); "fsdp" shards parameters, gradients and optimizer state over
    # the ranks (FSDP2 fully_shard) and checkpoints them with torch.distributed.checkpoint,
    # which reshards on load at any world size. One process trains unsharded either way; the
    # checkpoint format follows this key.
    parallel: Parallel = "ddp"
    # Early stopping: end the attempt (checkpoint, manifest, exit 0) after this many
    # validations in a row without an improvement larger than early_stop_min_delta over the
    # best so far; 0 = off.
    early_stop_patience: int = 0
    early_stop_min_delta: float = 0.0
    # A torch.profiler trace of optimizer steps a..b (inclusive, numbered 1.. as the records
    # number them) into <attempt>/profile/, with a CUDA memory snapshot on CUDA; None = off.
    # Not evidence: it changes nothing a record or checkpoint holds (docs/design.md "Live
    # views and the profiler").
    profile_steps: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        require_str("training.device", self.device, DEVICES)
        require_str("training.precision", self.precision, PRECISIONS)
        if self.precision == "bf16" and self.device != "cuda":
            raise ConfigError("training.precision: bf16 requires training.device = 'cuda'")
        self.max_steps = require_int("training.max_steps", self.max_steps, minimum=1)
        self.grad_accum = require_int("training.grad_accum", self.grad_accum, minimum=1)
        require_bool("training.compile", self.compile)
        require_bool("training.deterministic", self.deterministic)
        self.eval_every = require_int("training.eval_every", self.eval_every, minimum=1)
        self.checkpoint_every = require_int(
            "training.checkpoint_every", self.checkpoint_every, minimum=1
        )
        self.keep_last = require_int("training.keep_last", self.keep_last, minimum=0)
        self.log_every = require_int("training.log_every", self.log_every, minimum=1)
        self.peak_tflops = require_float("training.peak_tflops", self.peak_tflops, ge=0.0)
        self.dist_timeout_s = require_int(
            "training.dist_timeout_s", self.dist_timeout_s, minimum=1, maximum=MAX_DIST_TIMEOUT_S
        )
        require_str("training.parallel", self.parallel, PARALLEL)
        self.early_stop_patience = require_int(
            "training.early_stop_patience", self.early_stop_patience, minimum=0
        )
        self.early_stop_min_delta = require_float(
            "training.early_stop_min_delta", self.early_stop_min_delta, ge=0.0
        )
        if self.profile_steps is not None:
            self.profile_steps = _step_range("training.profile_steps", self.profile_steps)
            if self.profile_steps[1] > self.max_steps:
                raise ConfigError(
                    f"training.profile_steps: ends at step {self.profile_steps[1]}, after "
                    f"training.max_steps ({self.max_steps})"
                )


def _step_range(key: str, value: object) -> tuple[int, int]:
    """``[a, b]``: two integers with ``1 <= a <= b`` (steps are numbered from 1)."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        raise ConfigError(f"{key}: must be two step numbers [first, last], got {value!r}")
    first = require_int(f"{key}[0]", value[0], minimum=1)
    last = require_int(f"{key}[1]", value[1], minimum=1)
    if last < first:
        raise ConfigError(f"{key}: the last step must be >= the first, got {list(value)}")
    return first, last


#: ``[probe] synthetic_annotations``: at most this many (a typo's cost is bounded, not a use).
MAX_SYNTHETIC_ANNOTATIONS = 100_000


@dataclass(kw_only=True)
class ProbeConfig:
    """``[probe]``: a linear probe during training (``iqtrain probe``'s measurement, written as
    ``probe`` records). ``every`` counts validations (0 = off); ``data`` are labelled SigMF
    recordings (paths or globs, resolved like data.train; empty = the validation recordings,
    or, with synthetic data and ``synthetic_annotations`` > 0, a generated labelled probe set
    of that many annotations spread evenly over the classes), labelled by ``label_key``. It
    reads the model and nothing else: the training stream and RNG are untouched."""

    every: int = 0
    data: list[str] = field(default_factory=list)
    folds: int = 5
    # Accuracy per bin of a numeric annotation field (``iqtrain probe --by``); "" = off.
    by: str = ""
    # ``--bins``: a width, or the edges (at least two, increasing).
    bins: float | list[float] = 5.0
    # Label efficiency (``iqtrain probe --shots``): K labelled annotations per class drawn from
    # each training fold, ``seeds`` draws per K; [] = off.
    shots: list[int] = field(default_factory=list)
    seeds: int = 5
    # With synthetic data and probe.data empty: a labelled probe set of this many annotations
    # (0 = probe the validation recordings).
    synthetic_annotations: int = 0
    # The annotation field whose value is a window's class (a field name, or a path into its
    # objects: "signal:detail.mod_class"), as data.label_key.
    label_key: str = "core:label"

    def __post_init__(self) -> None:
        self.every = require_int("probe.every", self.every, minimum=0)
        if not isinstance(self.shots, list | tuple):
            raise ConfigError(f"probe.shots: must be a list of integers >= 1, got {self.shots!r}")
        self.shots = [
            require_int(f"probe.shots[{i}]", k, minimum=1) for i, k in enumerate(self.shots)
        ]
        if len(set(self.shots)) != len(self.shots):
            raise ConfigError(f"probe.shots: each K once, got {self.shots}")
        self.seeds = require_int("probe.seeds", self.seeds, minimum=1)
        self.synthetic_annotations = require_int(
            "probe.synthetic_annotations",
            self.synthetic_annotations,
            minimum=0,
            maximum=MAX_SYNTHETIC_ANNOTATIONS,
        )
        require_str("probe.by", self.by)
        if isinstance(self.bins, list):
            edges = [require_float(f"probe.bins[{i}]", v) for i, v in enumerate(self.bins)]
            if len(edges) < 2 or any(b <= a for a, b in zip(edges, edges[1:], strict=False)):
                raise ConfigError(
                    f"probe.bins: edges must be at least two, strictly increasing, got {self.bins}"
                )
            self.bins = edges
        else:
            self.bins = require_float("probe.bins", self.bins, gt=0.0)
        self.data = [
            require_path(f"probe.data[{i}]", p)
            for i, p in enumerate(require_str_list("probe.data", self.data))
        ]
        self.folds = require_int("probe.folds", self.folds, minimum=2)
        if not require_str("probe.label_key", self.label_key).strip():
            raise ConfigError("probe.label_key: must not be empty")


#: A checkpoint's name as a user gives it (``step_300``, ``step_00000300``); ASCII digits only.
STEP_NAME = re.compile(r"step_[0-9]+")


def check_which(which: object, key: str, error: type[ValueError] = ConfigError) -> str:
    """``latest``, ``best`` or ``step_N`` (ASCII digits), else ``error`` naming ``key``
    (ConfigError for a config key or a flag, ValueError for a Python argument)."""
    if not isinstance(which, str) or not (
        which in ("latest", "best") or STEP_NAME.fullmatch(which)
    ):
        raise error(f"{key}: expected latest, best or step_N, got {which!r}")
    return str(which)


@dataclass(kw_only=True)
class InitConfig:
    """``[init]``: start a new attempt (a new lineage) from the weights of a verified
    checkpoint: ``from`` an attempt directory (resolved like data.train) and ``which`` of its
    checkpoints (``latest``, ``best``, ``step_N``; unset: ``best``), or a checkpoint directory
    (``<attempt>/checkpoints/step_N``: then ``which``, if set, must name it too). Optimizer,
    schedule, stream and step start fresh; every architecture key of ``[model]`` must match the
    source's. ``from = ""`` (the default): random initialisation. The TOML key is ``from``; the
    field ``from_``."""

    from_: str = field(default="", metadata={"toml": "from"})
    which: str | None = None

    def __post_init__(self) -> None:
        if require_str("init.from", self.from_):
            self.from_ = require_path("init.from", self.from_)
        if self.which is not None:
            check_which(self.which, "init.which")
            if not self.from_:
                raise ConfigError("init.which: needs init.from (the attempt to start from)")


@dataclass(kw_only=True)
class WandbConfig:
    """``[logging.wandb]`` (``wandb = {project = "...", entity = "...", name = "..."}``): log
    the records to a Weights & Biases run (the optional ``iqtrain[wandb]`` extra). Only
    ``project`` is required; ``entity`` None = the account's default, ``name`` None = the run
    directory's name. The run's id is kept in attempt.json, so a resume continues the run."""

    # Typed as __post_init__ leaves it: a missing project is refused there.
    project: str = None  # type: ignore[assignment]
    entity: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.project is None:
            raise ConfigError("logging.wandb.project: required (the W&B project to log to)")
        for key in ("project", "entity", "name"):
            value = getattr(self, key)
            if value is not None and not require_str(f"logging.wandb.{key}", value).strip():
                raise ConfigError(f"logging.wandb.{key}: must not be empty")


@dataclass(kw_only=True)
class LoggingConfig:
    """``[logging]``: live views of a run while it trains (rank 0), none of them evidence.

    ``tensorboard``: TensorBoard event files in ``<attempt>/tensorboard/``, the scalars of
    ``iqtrain report --tensorboard``; ``wandb``: a W&B run (:class:`WandbConfig`), None = off.
    A resume may change any of it (it is not part of the experiment)."""

    tensorboard: bool = False
    wandb: WandbConfig | None = None

    def __post_init__(self) -> None:
        require_bool("logging.tensorboard", self.tensorboard)
        if self.wandb is not None and not isinstance(self.wandb, WandbConfig):
            raise ConfigError(f"logging.wandb: must be a table, got {self.wandb!r}")

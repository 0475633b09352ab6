"""iqtrain: compiled next-patch-prediction pretraining on IQ radio recordings.

The Rust extension (``iqtrain._native``) is private; this module re-exports the public API.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from iqtrain.attempt import AttemptResult, ParentRef, run_pretraining_attempt, verify_attempt
from iqtrain.config import Config, build_config, load_config
from iqtrain.data import IQDataset, Recording, TrainStream
from iqtrain.errors import (
    CheckpointError,
    ConfigError,
    CursorMismatchError,
    DataError,
    IQTrainError,
    NonFiniteError,
    TrainingError,
)
from iqtrain.model import ModelConfig, NextPatchModel, next_patch_loss
from iqtrain.prepare import prepare_iq_input, prepare_iq_input_reference
from iqtrain.schedule import Plan, ScheduleConfig, lr_at
from iqtrain.step import OptimizerConfig, StepResult, TrainStep
from iqtrain.synth import synthesize

try:
    __version__ = _version("iqtrain")
except _PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

__all__ = [
    "AttemptResult",
    "CheckpointError",
    "Config",
    "ConfigError",
    "CursorMismatchError",
    "DataError",
    "IQDataset",
    "IQTrainError",
    "ModelConfig",
    "NextPatchModel",
    "NonFiniteError",
    "OptimizerConfig",
    "ParentRef",
    "Plan",
    "Recording",
    "ScheduleConfig",
    "StepResult",
    "TrainStep",
    "TrainStream",
    "TrainingError",
    "__version__",
    "build_config",
    "load_config",
    "lr_at",
    "next_patch_loss",
    "prepare_iq_input",
    "prepare_iq_input_reference",
    "run_pretraining_attempt",
    "synthesize",
    "verify_attempt",
]

"""iqtrain: compiled next-patch-prediction pretraining on IQ radio recordings.

The Rust extension (``iqtrain._native``) is private; this module re-exports the public API.

The re-exports are lazy (PEP 562): ``import iqtrain`` loads no submodule, so neither torch nor
the extension; ``iqtrain.X`` or ``from iqtrain import X`` imports the module that defines ``X``
on first use, and ``__version__`` reads the package metadata on first use. The torch-free
subpackages (``config``, ``data``, ``checkpoint``, ``evidence``, ``report``, ``cli``) import no
torch either, so the commands that only read or check (``iqtrain --help``, ``verify``,
``report``, ``synth``) start without it. The layout: docs/design.md "Architecture and
data flow".
"""

import typing as _typing
from importlib import import_module as _import_module
from importlib.util import find_spec as _find_spec

# Public name -> the submodule that defines it.
_EXPORTS: dict[str, str] = {
    "AttemptResult": "iqtrain.train.attempt",
    "ParentRef": "iqtrain.evidence.lineage",
    "run_pretraining_attempt": "iqtrain.train.attempt",
    "verify_attempt": "iqtrain.evidence.verify",
    "Config": "iqtrain.config.schema",
    "ModelConfig": "iqtrain.config.sections",
    "OptimizerConfig": "iqtrain.config.sections",
    "ScheduleConfig": "iqtrain.config.sections",
    "build_config": "iqtrain.config.schema",
    "load_config": "iqtrain.config.schema",
    "IQDataset": "iqtrain.data.dataset",
    "Recording": "iqtrain.data.sigmf",
    "TrainStream": "iqtrain.data.dataset",
    "CheckpointError": "iqtrain.errors",
    "ConfigError": "iqtrain.errors",
    "CursorMismatchError": "iqtrain.errors",
    "DataError": "iqtrain.errors",
    "IQTrainError": "iqtrain.errors",
    "NonFiniteError": "iqtrain.errors",
    "TrainingError": "iqtrain.errors",
    "NextPatchModel": "iqtrain.model.transformer",
    "next_patch_loss": "iqtrain.model.transformer",
    "prepare_iq_input": "iqtrain.model.prepare",
    "prepare_iq_input_reference": "iqtrain.model.prepare",
    "InputError": "iqtrain.errors",
    "Pretrained": "iqtrain.pretrained.load",
    "SampleRateWarning": "iqtrain.pretrained.load",
    "load_pretrained": "iqtrain.pretrained.load",
    "ProbeResult": "iqtrain.eval.probe",
    "run_probe": "iqtrain.eval.probe",
    "Plan": "iqtrain.train.schedule",
    "lr_at": "iqtrain.train.schedule",
    "StepResult": "iqtrain.train.step",
    "TrainStep": "iqtrain.train.step",
    "synthesize": "iqtrain.data.synth",
    "convert_radioml2016": "iqtrain.data.convert",
    "convert_radioml2018": "iqtrain.data.convert",
    "classical_features": "iqtrain.eval.classical",
    "objective_loss": "iqtrain.model.objectives",
    "dumps_toml": "iqtrain.config.schema",
    "LabelledSet": "iqtrain.data.windows",
    "labelled_windows": "iqtrain.data.windows",
    "classical_matrix": "iqtrain.eval.features",
    "cross_validate": "iqtrain.eval.folds",
    "fit_logistic": "iqtrain.eval.logistic",
}

__all__ = [
    "AttemptResult",
    "CheckpointError",
    "Config",
    "ConfigError",
    "CursorMismatchError",
    "DataError",
    "IQDataset",
    "IQTrainError",
    "InputError",
    "LabelledSet",
    "ModelConfig",
    "NextPatchModel",
    "NonFiniteError",
    "OptimizerConfig",
    "ParentRef",
    "Plan",
    "Pretrained",
    "ProbeResult",
    "Recording",
    "SampleRateWarning",
    "ScheduleConfig",
    "StepResult",
    "TrainStep",
    "TrainStream",
    "TrainingError",
    "__version__",
    "build_config",
    "classical_features",
    "classical_matrix",
    "convert_radioml2016",
    "convert_radioml2018",
    "cross_validate",
    "dumps_toml",
    "fit_logistic",
    "labelled_windows",
    "load_config",
    "load_pretrained",
    "lr_at",
    "next_patch_loss",
    "objective_loss",
    "prepare_iq_input",
    "prepare_iq_input_reference",
    "run_pretraining_attempt",
    "run_probe",
    "synthesize",
    "verify_attempt",
]


def _package_version() -> str:
    # importlib.metadata costs more to import than the rest of `iqtrain --help`: only on use.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iqtrain")
    except PackageNotFoundError:  # running from a source tree without an install
        return "0.0.0+source"


def __getattr__(name: str) -> object:
    if name == "__version__":
        globals()[name] = value = _package_version()
        return value
    module = _EXPORTS.get(name)
    if module is not None:
        value = getattr(_import_module(module), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    # A submodule (``iqtrain.config.schema`` after a bare ``import iqtrain``), as when every one was
    # imported eagerly; importing it binds it as an attribute of this package.
    if not name.startswith("__") and _find_spec(f"iqtrain.{name}") is not None:
        return _import_module(f"iqtrain.{name}")
    raise AttributeError(f"module 'iqtrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# What type checkers and IDEs see: the names the lazy re-exports above resolve to.
if _typing.TYPE_CHECKING:
    from iqtrain.config.schema import Config, build_config, dumps_toml, load_config
    from iqtrain.config.sections import ModelConfig, OptimizerConfig, ScheduleConfig
    from iqtrain.data.convert import convert_radioml2016, convert_radioml2018
    from iqtrain.data.dataset import IQDataset, TrainStream
    from iqtrain.data.sigmf import Recording
    from iqtrain.data.synth import synthesize
    from iqtrain.data.windows import LabelledSet, labelled_windows
    from iqtrain.errors import (
        CheckpointError,
        ConfigError,
        CursorMismatchError,
        DataError,
        InputError,
        IQTrainError,
        NonFiniteError,
        TrainingError,
    )
    from iqtrain.eval.classical import classical_features
    from iqtrain.eval.features import classical_matrix
    from iqtrain.eval.folds import cross_validate
    from iqtrain.eval.logistic import fit_logistic
    from iqtrain.eval.probe import ProbeResult, run_probe
    from iqtrain.evidence.lineage import ParentRef
    from iqtrain.evidence.verify import verify_attempt
    from iqtrain.model.objectives import objective_loss
    from iqtrain.model.prepare import prepare_iq_input, prepare_iq_input_reference
    from iqtrain.model.transformer import NextPatchModel, next_patch_loss
    from iqtrain.pretrained.load import Pretrained, SampleRateWarning, load_pretrained
    from iqtrain.train.attempt import AttemptResult, run_pretraining_attempt
    from iqtrain.train.schedule import Plan, lr_at
    from iqtrain.train.step import StepResult, TrainStep

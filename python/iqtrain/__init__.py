"""iqtrain: compiled next-patch-prediction pretraining on IQ radio recordings.

``import iqtrain`` holds the product and nothing else: the names of ``_EXPORTS`` below (a
trained model, running, resuming and verifying an attempt, the config, the data path a loop of
one's own can use, the errors a caller catches) and ``__version__``.

Everything else lives in the submodule that defines it and is imported from there: the trainer's
parts in :mod:`iqtrain.train` (``train.step``, ``train.schedule``, ...), the model in
:mod:`iqtrain.model`, the config sections in :mod:`iqtrain.config.sections`, the labelled
windows, the synthetic generator and the converters in :mod:`iqtrain.data`, the probe and its
parts in :mod:`iqtrain.eval`, every error class in :mod:`iqtrain.errors`. The Rust extension
(``iqtrain._native``) is private.

The names are lazy (PEP 562): ``import iqtrain`` loads no submodule, so neither torch nor the
extension; ``iqtrain.X`` or ``from iqtrain import X`` imports the module that defines ``X`` on
first use, and ``__version__`` reads the package metadata on first use. The torch-free
subpackages (``config``, ``data``, ``checkpoint``, ``evidence``, ``report``, ``cli``) import no
torch either, so the commands that only read or check (``iqtrain --help``, ``verify``,
``report``, ``synth``) start without it. The layout: docs/design.md "Architecture and
data flow".
"""

import typing as _typing
from importlib import import_module as _import_module
from importlib.util import find_spec as _find_spec

#: The public names, each with the submodule that defines it: the one list (``__all__`` is
#: these and ``__version__``; the TYPE_CHECKING imports below restate it for type checkers, and
#: a test holds the two equal).
_EXPORTS: dict[str, str] = {
    # a trained model
    "load_pretrained": "iqtrain.pretrained.load",
    "Pretrained": "iqtrain.pretrained.load",
    "SampleRateWarning": "iqtrain.pretrained.load",
    # an attempt: run, resume, verify
    "run_attempt": "iqtrain.train.attempt",
    "ParentRef": "iqtrain.evidence.lineage",
    "AttemptResult": "iqtrain.train.attempt",
    "verify_attempt": "iqtrain.evidence.verify",
    # the config
    "load_config": "iqtrain.config.schema",
    "Config": "iqtrain.config.schema",
    # the data path
    "IQDataset": "iqtrain.data.dataset",
    "TrainStream": "iqtrain.data.dataset",
    "prepare_iq_input": "iqtrain.model.prepare",
    # the errors
    "IQTrainError": "iqtrain.errors",
    "ConfigError": "iqtrain.errors",
    "DataError": "iqtrain.errors",
    "CheckpointError": "iqtrain.errors",
}

__all__ = [*_EXPORTS, "__version__"]


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


# What type checkers and IDEs see: the names of _EXPORTS, each from its module (``X as X``: an
# explicit re-export). tests/e2e/test_imports.py holds this block equal to _EXPORTS.
if _typing.TYPE_CHECKING:
    from iqtrain.config.schema import Config as Config
    from iqtrain.config.schema import load_config as load_config
    from iqtrain.data.dataset import IQDataset as IQDataset
    from iqtrain.data.dataset import TrainStream as TrainStream
    from iqtrain.errors import CheckpointError as CheckpointError
    from iqtrain.errors import ConfigError as ConfigError
    from iqtrain.errors import DataError as DataError
    from iqtrain.errors import IQTrainError as IQTrainError
    from iqtrain.evidence.lineage import ParentRef as ParentRef
    from iqtrain.evidence.verify import verify_attempt as verify_attempt
    from iqtrain.model.prepare import prepare_iq_input as prepare_iq_input
    from iqtrain.pretrained.load import Pretrained as Pretrained
    from iqtrain.pretrained.load import SampleRateWarning as SampleRateWarning
    from iqtrain.pretrained.load import load_pretrained as load_pretrained
    from iqtrain.train.attempt import AttemptResult as AttemptResult
    from iqtrain.train.attempt import run_attempt as run_attempt

    __version__: str

"""The field's modulation datasets as labelled SigMF (``iqtrain convert radioml2016|radioml2018``;
docs/design.md "Converted datasets", docs/data.md "RadioML").

- :mod:`~iqtrain.data.convert.rml2016`: RadioML 2016.10A, a Python 2 pickle, read by the
  restricted unpickler of :mod:`~iqtrain.data.convert.unpickler` (numpy arrays only, built
  here; any other global refused, nothing of it run);
- :mod:`~iqtrain.data.convert.rml2018`: RadioML 2018.01A, HDF5, read in chunks (h5py imported
  only there, when it runs), its class list the paper's or a file's;
- :mod:`~iqtrain.data.convert.output`: the recordings (one capture and one annotation per
  example, ``cf32_le``) and ``convert.json``;
- :mod:`~iqtrain.data.convert.publish`: ``OUT_DIR`` checked before the source is read, written
  under ``OUT_DIR.tmp-<pid>`` and renamed onto it: all or nothing;
- :mod:`~iqtrain.data.convert.checks`: the checks and one-line messages the readers share.

The command's parsing and flag names are :mod:`iqtrain.cli.convert`'s. Imports no torch.
"""

from __future__ import annotations

from iqtrain.data.convert.checks import MAX_ABS_SNR_DB
from iqtrain.data.convert.output import MAX_RECORDING_SAMPLES, SAMPLE_RATE, ConvertResult
from iqtrain.data.convert.rml2016 import convert_radioml2016
from iqtrain.data.convert.rml2018 import (
    MAX_CLASSES_BYTES,
    RML2018_CHUNK,
    RML2018_CLASSES,
    ClassCountError,
    convert_radioml2018,
)

__all__ = [
    "MAX_ABS_SNR_DB",
    "MAX_CLASSES_BYTES",
    "MAX_RECORDING_SAMPLES",
    "RML2018_CHUNK",
    "RML2018_CLASSES",
    "SAMPLE_RATE",
    "ClassCountError",
    "ConvertResult",
    "convert_radioml2016",
    "convert_radioml2018",
]

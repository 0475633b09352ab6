"""The probe's features of labelled windows: a model's pooled hidden states at any layer
(the one forward path of a trained model), the classical AMC features, and both side by side
(docs/design.md "Linear probe", features). A window whose features are not finite is a DataError
naming its recording and sample.

Offers :func:`layer_features` and :func:`probe_features` (a model's), :func:`classical_matrix`
(the classical features of a :class:`~iqtrain.data.windows.LabelledSet`) and
:func:`combined_features` (both).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from iqtrain.config.sections import DataConfig
from iqtrain.data.windows import FEATURE_BATCH, LabelledSet
from iqtrain.errors import DataError
from iqtrain.model.transformer import IQTransformer
from iqtrain.pretrained.load import nonfinite_rows, window_features

__all__ = [
    "check_finite",
    "classical_matrix",
    "combined_features",
    "layer_features",
    "probe_features",
]


def probe_features(
    model: IQTransformer,
    labelled: LabelledSet,
    data: DataConfig,
    *,
    batch_size: int = FEATURE_BATCH,
) -> torch.Tensor:
    """``[len(labelled), dim]`` fp32 CPU: final hidden states mean-pooled over patches (see
    :func:`layer_features`)."""
    final = model.config.layers
    return layer_features(model, labelled, data, [final], batch_size=batch_size)[final]


def layer_features(
    model: IQTransformer,
    labelled: LabelledSet,
    data: DataConfig,
    layers: Sequence[int],
    *,
    batch_size: int = FEATURE_BATCH,
) -> dict[int, torch.Tensor]:
    """``{layer: [len(labelled), dim]}`` of ``layers``, mean-pooled over patches, from one
    forward per batch: :func:`iqtrain.pretrained.load.window_features` in fp32 (autocast off),
    the path ``Pretrained.embed`` takes. A window with non-finite features is a DataError
    naming its recording and sample."""
    features = window_features(model, data, labelled.batches(batch_size), layers)
    for f in features.values():
        check_finite(f, labelled)
    return features


def check_finite(features: torch.Tensor, labelled: LabelledSet) -> None:
    """A DataError naming the first window of ``labelled`` whose features are not finite."""
    bad = nonfinite_rows(features.numpy()).tolist()
    if bad:  # one such row would turn every standardised feature into NaN
        i = bad[0]
        rec = labelled.dataset.recordings[int(labelled.recordings[i])]
        raise DataError(
            f"{rec.data_path}: the window at sample {int(labelled.starts[i])} gives non-finite "
            f"features ({len(bad)} window(s) in all; non-finite samples in the recording?)"
        )


def combined_features(classical: torch.Tensor, model: torch.Tensor) -> torch.Tensor:
    """The classical features and a model's, side by side (float64, classical first): the
    classifier standardises every column by its training windows, so neither set's scale
    weighs on the other."""
    return torch.cat([classical.double(), model.double()], dim=1)


def classical_matrix(labelled: LabelledSet) -> torch.Tensor:
    """``[len(labelled), 12]`` float64: the classical features of every window (a window with
    non-finite samples is a DataError naming it)."""
    from iqtrain.eval.classical import labelled_classical_features

    features = torch.from_numpy(labelled_classical_features(labelled))
    check_finite(features, labelled)
    return features

"""The type every objective is (docs/design.md "Objectives").

An :class:`Objective` owns what differs between the things a model can be trained to do: its
head's width, its loss, the validation field the best checkpoint and early stopping follow (and
the rule, once), the uses a trained model of it has (``embed``, ``score``, ``predict``), the
config keys only it reads, and the lines ``inspect``, the loop and ``run`` print about it. The
trainer, the verifier, :mod:`iqtrain.pretrained`, :mod:`iqtrain.report` and :mod:`iqtrain.eval`
ask it; none of them compares ``model.objective`` with a name.

An objective module imports no torch when it is imported: the verifier, ``report`` and the
config parser ask objectives their rules without torch. The methods that take tensors import
torch in their bodies (inside a compiled step that is a dictionary look-up; dynamo traces it).
"""

from __future__ import annotations

import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

from iqtrain.errors import ObjectiveError

if TYPE_CHECKING:
    from torch import Tensor

    from iqtrain.config.sections import ModelConfig

__all__ = ["USES", "Objective", "Use", "fp32"]

#: What a trained model can be asked for (:class:`~iqtrain.pretrained.load.Pretrained`'s
#: methods and the commands of the same names).
Use = Literal["embed", "score", "predict"]
USES: tuple[Use, ...] = get_args(Use)


def fp32(device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The context a loss computes in: autocast off when the caller's is on (the loss is fp32
    whatever the autocast state), else none (a graph traced for export holds no autocast
    region then)."""
    import torch

    if torch.is_autocast_enabled(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


class Objective(ABC):
    """One ``model.objective``: a stateless singleton per name (the registry's,
    :data:`iqtrain.objectives.REGISTRY`). Class attributes say what it is; methods compute."""

    #: ``model.objective``: its name in configs, records and messages.
    name: ClassVar[str]
    #: Trained on labelled windows: the head's outputs are the classes of a whole window (the
    #: data are ``data.label_key`` annotations, state.json and attempt.json record ``classes``,
    #: validation records an accuracy). Otherwise every patch's output is about the next patch.
    labelled: ClassVar[bool]
    #: The validation record field the best checkpoint and early stopping follow, and its
    #: direction.
    monitor: ClassVar[str]
    higher_is_better: ClassVar[bool]
    #: The train loss is a negative log-likelihood in nats (spikes are judged on that scale:
    #: :func:`~iqtrain.train.loop.spike_update`).
    nll: ClassVar[bool]
    #: The unit of the ``loss`` its records hold.
    loss_unit: ClassVar[str]
    #: What a trained model of this objective answers.
    uses: ClassVar[frozenset[Use]]
    #: Config keys (``section.key``) some objectives read and others do not, each with the value
    #: that means "off": a key of any objective's ``reads`` is refused at any other value under
    #: an objective that does not list it (:func:`iqtrain.objectives.check_keys`).
    reads: ClassVar[Mapping[str, object]] = {}

    def __repr__(self) -> str:
        return f"<objective {self.name!r}>"

    # ------------------------------------------------------------------ the monitored value

    def value_of(self, record: Mapping[str, Any]) -> float | None:
        """The monitored value of a validation record; None when it has none (a loss is a
        float, as JSON writes every loss; an accuracy any number)."""
        value = record.get(self.monitor)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return None
        if self.monitor == "loss" and not isinstance(value, float):
            return None
        return float(value)

    def improves(self, value: float, best: float | None) -> bool:
        """Whether a validation's monitored ``value`` is a new best: strictly better than
        ``best`` (the first of equal values stays best)."""
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    def beats(self, value: float, ref: float | None, min_delta: float) -> bool:
        """Early stopping: whether ``value`` improves on the reference ``ref`` by more than
        ``min_delta`` (``training.early_stop_min_delta``; Keras' and Lightning's rule)."""
        if ref is None:
            return True
        return value > ref + min_delta if self.higher_is_better else value < ref - min_delta

    def best_record(self, records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
        """The best of validation ``records``: the first of the best monitored value (what the
        loop marks ``best`` and the manifest's ``best`` names); None without records. A record
        without its monitored value is a ValueError naming its step."""
        best: Mapping[str, Any] | None = None
        best_value: float | None = None
        for record in records:
            value = self.value_of(record)
            if value is None or math.isnan(value):
                raise ValueError(
                    f"a val record lacks its {self.monitor}: step {record.get('step')!r}, "
                    f"{self.monitor} {record.get(self.monitor)!r}"
                )
            if self.improves(value, best_value):
                best, best_value = record, value
        return best

    # ------------------------------------------------------------------ uses

    def require(self, use: Use, source: object) -> None:
        """ObjectiveError (exit 2) naming ``source`` (the attempt or package) unless a model of
        this objective gives ``use``; the message names the objectives that do."""
        if use in self.uses:
            return
        from iqtrain.objectives import REGISTRY

        givers = " or ".join(repr(o.name) for o in REGISTRY.values() if use in o.uses)
        raise ObjectiveError(
            f"{source}: model.objective is {self.name!r}, which gives no {use}: {use} needs a "
            f"model trained with model.objective = {givers}"
        )

    # ------------------------------------------------------------------ the head and the loss

    def check_classes(self, classes: object) -> int:
        """The ``classes`` a model of this objective is built with: 0 unless :attr:`labelled`
        (then an int >= 2). ValueError otherwise."""
        if self.labelled:
            if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
                raise ValueError(f"a {self.name!r} model needs classes >= 2, got {classes!r}")
            return classes
        if classes:
            raise ValueError(f"a {self.name!r} model has no classes, got {classes!r}")
        return 0

    @abstractmethod
    def head_width(self, config: ModelConfig, classes: int) -> int:
        """The output head's width: per patch position, or (:attr:`labelled`) per window."""

    def outputs_per_value(self, config: ModelConfig) -> int:
        """Head outputs per predicted I/Q value of a next-patch head (1: the value itself)."""
        return 1

    @abstractmethod
    def loss(
        self,
        out: Tensor,
        patches: Tensor,
        labels: Tensor | None,
        config: ModelConfig,
        squared_error: bool = False,
    ) -> tuple[Tensor, Tensor, int, Tensor]:
        """``(mean, sum, count, extra)`` of the model output ``out`` in fp32 whatever the
        autocast state: ``mean = sum / count`` is what training minimises; ``sum`` lets
        validation form exact means over a partial last batch; ``extra`` is the objective's
        (the summed squared error of the predicted mean for a next-patch objective when
        ``squared_error``, each window's predicted class for a labelled one)."""

    def window_losses(self, out: Tensor, patches: Tensor, config: ModelConfig) -> Tensor:
        """``[B]`` fp32: each window's own mean loss (what ``score`` gives); only for the
        objectives whose :attr:`uses` hold "score"."""
        self.require("score", f"model.objective {self.name!r}")
        raise AssertionError("unreachable")  # pragma: no cover

    # ------------------------------------------------------------------ what is printed

    @abstractmethod
    def validation_note(self, record: Mapping[str, Any]) -> str:
        """The loop's progress line of a validation record (after ``val step N:``)."""

    @abstractmethod
    def summary_lines(self, result: Any) -> list[str]:
        """What ``iqtrain run`` prints of a finished attempt's final and best validation
        (``result``: an :class:`~iqtrain.train.attempt.AttemptResult`)."""

    @abstractmethod
    def untrained_line(
        self,
        loss_sum: float,
        squared: float,
        count: int,
        zero: float,
        config: ModelConfig,
        classes: int,
    ) -> str:
        """``inspect``'s line of the untrained model's loss on one batch (``count`` targets,
        ``squared`` the predicted mean's summed squared error, ``zero`` the zero-prediction's
        mean; a labelled objective's targets are windows and ``config`` gives nothing more)."""

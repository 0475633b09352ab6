"""The window classifier (model.objective = "classify"): the pretraining trunk with a pooled
linear head over the classes, its loss, and its FLOPs."""

from __future__ import annotations

import pytest
import torch

from iqtrain.config.sections import ModelConfig
from iqtrain.errors import ConfigError
from iqtrain.model.transformer import IQTransformer
from iqtrain.objectives.classify import classify_loss


def _config(**kw) -> ModelConfig:
    return ModelConfig(dim=16, layers=2, heads=2, patch_len=4, max_patches=8, **kw)


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_a_classifier_gives_one_logit_per_class_and_shares_the_trunk(pool):
    torch.manual_seed(0)
    clf = IQTransformer(_config(objective="classify", pool=pool), classes=5)
    x = torch.randn(3, 8, 8)
    assert clf(x).shape == (3, 5)
    # The trunk is the pretraining model's: its weights load into the pretraining model.
    pre = IQTransformer(_config(objective="categorical"))
    trunk = clf.trunk_state(clf.state_dict())
    missing, unexpected = pre.load_state_dict(trunk, strict=False)
    assert unexpected == [] and sorted(missing) == ["head.bias", "head.weight"]
    torch.testing.assert_close(pre.hidden_states(x), clf.hidden_states(x), rtol=0, atol=0)
    heads = sorted(n for n, _ in clf.named_parameters() if clf.is_head(n))
    want = ["head.bias", "head.weight"] + (["pool.query"] if pool == "attention" else [])
    assert heads == want
    assert not any(pre.is_head(n) for n, _ in pre.named_parameters())


def test_the_attention_pool_starts_as_the_mean_and_pools_by_softmax_weights():
    torch.manual_seed(0)
    clf = IQTransformer(_config(objective="classify", pool="attention"), classes=3)
    states = torch.randn(2, 8, 16)
    torch.testing.assert_close(clf.pool(states), states.mean(dim=1))
    with torch.no_grad():
        clf.pool.query.copy_(torch.randn(16))
    w = (states @ clf.pool.query / 4.0).softmax(dim=1)
    torch.testing.assert_close(clf.pool(states), (w.unsqueeze(-1) * states).sum(dim=1))


def test_classes_must_fit_the_objective():
    with pytest.raises(ValueError, match="classes >= 2"):
        IQTransformer(_config(objective="classify"), classes=1)
    with pytest.raises(ValueError, match="'mse' model has no classes"):
        IQTransformer(_config(objective="mse"), classes=3)
    with pytest.raises(ConfigError, match="model.pool"):
        _config(objective="classify", pool="max")
    with pytest.raises(ConfigError, match="model.freeze_trunk"):
        _config(objective="mse", freeze_trunk=True)


def test_the_classify_loss_is_cross_entropy_per_window_with_predictions():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0], [1.0, 1.0, 5.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2, 2, 1])
    mean, total, count, predicted = classify_loss(logits, labels)
    want = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    assert count == 4 and float(total) == pytest.approx(float(want))
    assert float(mean) == pytest.approx(float(want) / 4)
    assert predicted.tolist() == [0, 1, 2, 0]
    bad = logits.clone()
    bad[1, 0] = float("inf")
    assert not torch.isfinite(classify_loss(bad, labels)[0])
    with pytest.raises(ValueError, match="labels"):
        classify_loss(logits, labels[:3])


def test_the_classifiers_flops_count_its_head_per_window_and_a_frozen_trunk_once():
    d, n, c = 16, 8, 5
    pre = IQTransformer(_config(objective="mse"))
    clf = IQTransformer(_config(objective="classify"), classes=c)
    frozen = IQTransformer(_config(objective="classify", freeze_trunk=True), classes=c)
    att = IQTransformer(_config(objective="classify", pool="attention"), classes=c)
    w = 8
    trunk = pre.forward_flops_per_patch(n) - 2 * w * d  # without the mse head
    assert pre.train_flops_per_window(n) == pre.train_flops_per_patch(n) * n
    assert clf.train_flops_per_window(n) == 3 * (trunk * n + 2 * d * c)
    assert frozen.train_flops_per_window(n) == trunk * n + 3 * 2 * d * c
    assert att.train_flops_per_window(n) == 3 * (trunk * n + 4 * n * d + 2 * d * c)


def test_keys_only_a_fine_tune_reads_are_refused_where_they_would_do_nothing():
    from iqtrain.config.schema import Config
    from iqtrain.config.sections import DataConfig, OptimizerConfig

    with pytest.raises(ConfigError, match="model.pool: only model.objective = 'classify'"):
        _config(objective="categorical", pool="attention")
    with pytest.raises(ConfigError, match="data.label_key: only model.objective = 'classify'"):
        Config(data=DataConfig(label_key="x:class"))
    frozen = _config(objective="classify", freeze_trunk=True)
    with pytest.raises(ConfigError, match="optimizer.trunk_lr_scale: model.freeze_trunk"):
        Config(
            model=frozen,
            data=DataConfig(patch_len=4, seq_patches=8),
            optimizer=OptimizerConfig(trunk_lr_scale=0.1),
        )
    Config(
        model=_config(objective="classify"),
        data=DataConfig(patch_len=4, seq_patches=8, label_key="x:class"),
    )

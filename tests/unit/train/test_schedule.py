"""Learning-rate schedules: the docs/design.md "Learning-rate schedule" formulas, and plan changes
on resume."""

from __future__ import annotations

import math

import pytest

from iqtrain.config.sections import ScheduleConfig
from iqtrain.errors import ConfigError
from iqtrain.train.schedule import Plan, lr_at


def _plan(kind="wsd", S=100, W=10, D=20, shape="linear", lr=1e-3, lo=1e-4):
    return Plan(
        kind=kind, max_steps=S, warmup_steps=W, decay_steps=D, decay_shape=shape, lr=lr, min_lr=lo
    )


@pytest.mark.parametrize("shape", ["linear", "cosine", "sqrt"])
def test_wsd_formula(shape):
    p = _plan(shape=shape)
    f = {
        "linear": lambda q: 1 - q,
        "cosine": lambda q: 0.5 * (1 + math.cos(math.pi * q)),
        "sqrt": lambda q: 1 - math.sqrt(q),
    }[shape]
    for s in range(100):
        if s < 10:
            want = 1e-3 * (s + 1) / 10
        elif s < 80:
            want = 1e-3
        else:
            want = 1e-4 + (1e-3 - 1e-4) * f((s - 80 + 1) / 20)
        assert lr_at(s, p) == pytest.approx(want, rel=1e-15, abs=0)
    assert lr_at(99, p) == 1e-4  # the last step runs at exactly min_lr
    assert lr_at(9, p) == 1e-3  # warmup reaches the peak on its last step


def test_cosine_and_constant():
    c = _plan(kind="cosine", D=0)
    assert lr_at(0, c) == pytest.approx(1e-4 * 1)  # 1e-3 * 1/10
    assert lr_at(10, c) < 1e-3 and lr_at(10, c) > 9.9e-4
    assert lr_at(99, c) == pytest.approx(1e-4)
    vals = [lr_at(s, c) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(vals, vals[1:], strict=False))
    k = _plan(kind="constant", D=0)
    assert [lr_at(s, k) for s in (0, 9, 10, 99)] == [1e-4, 1e-3, 1e-3, 1e-3]


def test_zero_warmup_and_bounds():
    p = _plan(W=0)
    assert lr_at(0, p) == 1e-3
    with pytest.raises(ValueError):
        lr_at(100, p)


def test_extend_only_before_the_decay_start():
    p = _plan()  # decay starts at step 80
    longer = p.extend(200, completed_steps=50)
    assert longer.max_steps == 200 and longer.decay_start == 180
    # steps already run keep their learning rate
    assert all(lr_at(s, longer) == lr_at(s, p) for s in range(50))
    with pytest.raises(ConfigError, match="training.max_steps"):
        p.extend(200, completed_steps=90)
    with pytest.raises(ConfigError, match="training.max_steps"):
        p.extend(60, completed_steps=50)  # new decay start 40 < 50 completed
    with pytest.raises(ConfigError, match="training.max_steps"):
        p.extend(25, completed_steps=5)  # shorter than warmup + decay


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"kind": "linear"}, "schedule.kind"),
        ({"warmup_steps": -1}, "schedule.warmup_steps"),
        ({"decay_shape": "exp"}, "schedule.decay_shape"),
        ({"decay_steps": 0}, "schedule.decay_steps"),
        ({"warmup_steps": 1.5}, "schedule.warmup_steps"),
    ],
)
def test_schedule_config_errors_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=key):
        ScheduleConfig(**kwargs)


@pytest.mark.parametrize("kind", ["cosine", "constant"])
def test_decay_steps_belongs_to_wsd_only(kind):
    # The wsd-only default decay_steps (200) must not shape a short cosine or constant plan.
    cfg = ScheduleConfig(kind=kind, warmup_steps=10)
    assert cfg.decay_steps == 200
    plan = Plan.from_config(cfg, max_steps=50, lr=1e-3, min_lr=1e-4)
    assert plan.decay_steps == 0
    lrs = [lr_at(s, plan) for s in range(50)]
    assert lrs[9] == 1e-3  # warmup ends at the peak
    assert lrs[-1] == pytest.approx(1e-4 if kind == "cosine" else 1e-3)
    assert plan.extend(40, completed_steps=5).max_steps == 40  # no phantom decay in the way
    assert ScheduleConfig(kind=kind, decay_steps=0).decay_steps == 0  # 0 is fine off wsd


def test_every_schedule_name_the_config_accepts_is_one_the_schedule_runs():
    from iqtrain.config import sections

    assert sections.ScheduleConfig.__module__ == "iqtrain.config.sections"
    for kind in sections.KINDS:
        for shape in sections.SHAPES:
            cfg = ScheduleConfig(kind=kind, warmup_steps=10, decay_steps=20, decay_shape=shape)
            plan = Plan.from_config(cfg, max_steps=100, lr=1e-3, min_lr=1e-4)
            assert lr_at(9, plan) == 1e-3, (kind, shape)
            assert lr_at(99, plan) == pytest.approx(1e-3 if kind == "constant" else 1e-4)
    # A name it does not run is refused in one line that lists the ones it does.
    with pytest.raises(ConfigError, match=r"^schedule\.kind: must be one of wsd, cosine, constant"):
        ScheduleConfig(kind="step")
    shapes = r"^schedule\.decay_shape: must be one of linear, cosine, sqrt, got 'exp'$"
    with pytest.raises(ConfigError, match=shapes):
        ScheduleConfig(decay_shape="exp")

"""The warmup sweep: the stored file is what the recipe makes now, the
stable-rate rule on a sweep built by hand, bad input."""
import math

import pytest

from course_lib.experiments import warmup_sweep as ws
from course_lib.experiments.sweeps import Sweep, load_sweep


def _close(a, b):
    if isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y)
    else:
        assert a == pytest.approx(b, rel=1e-3, abs=1e-6)


def test_stored_cell_is_what_the_recipe_makes():
    # a traced run: every metric, the per-step trace included
    lr, w = ws.TRACED[1]
    stored = load_sweep("warmup_sweep").cell(0, lr=lr, warmup_steps=w,
                                             trace=True)
    fresh = ws.warmup_run(lr=lr, warmup_steps=w, seed=0, trace=True)
    assert sorted(fresh) == sorted(stored)
    for key in fresh:
        _close(fresh[key], stored[key])


def test_stored_sweep_covers_the_grid():
    sweep = load_sweep("warmup_sweep")
    for lr in ws.LEARNING_RATES:
        for w in (0, ws.WARMUP):
            values = sweep.values("final_val_loss", lr=lr, warmup_steps=w)
            # the traced runs repeat seed 0 of their grid cell exactly
            assert len(values) == len(ws.SEEDS) + sum(
                (lr, w) == t for t in ws.TRACED)
    for lr, w in ws.TRACED:
        runs = sweep.select(lr=lr, warmup_steps=w)
        seed0 = [r["metrics"] for r in runs if r["seed"] == 0]
        assert seed0[0]["final_val_loss"] == seed0[1]["final_val_loss"]


def _sweep(finals):
    runs = [{"setting": {"lr": lr, "warmup_steps": w}, "seed": s,
             "metrics": {"final_val_loss": v}}
            for (lr, w), vs in finals.items() for s, v in enumerate(vs)]
    return Sweep("t", "", [0, 1], runs)


def test_largest_stable_rate_by_hand():
    m = ws.STABLE_MARGIN        # best mean 1.0 (lr 0.01, warmup)
    sweep = _sweep({(0.001, 0): [1.2, 1.0], (0.01, 0): [1.0, 1 + 1.8 * m],
                    (0.1, 0): [1 + 2 * m, 1 + 2.2 * m],
                    (0.001, 30): [1.1, 1.1], (0.01, 30): [0.9, 1.1],
                    (0.1, 30): [1.0, 1 + 2 * m], (1.0, 30): [math.nan, 2.0]})
    assert ws.largest_stable_rate(sweep, 0) == 0.01    # mean 1 + 0.9 m
    assert ws.largest_stable_rate(sweep, 30) == 0.1    # mean 1 + m
    with pytest.raises(ValueError, match="warmup_steps=5"):
        ws.largest_stable_rate(sweep, 5)


def test_bad_input():
    with pytest.raises(ValueError, match="lr"):
        ws.warmup_run(lr=-1.0, warmup_steps=0, seed=0)
    with pytest.raises(TypeError, match="lr"):
        ws.warmup_run(lr="0.1", warmup_steps=0, seed=0)
    with pytest.raises(TypeError, match="warmup_steps"):
        ws.warmup_run(lr=0.1, warmup_steps=1.5, seed=0)
    with pytest.raises(ValueError, match="steps"):
        ws.warmup_run(lr=0.1, warmup_steps=30, seed=0, steps=10)
    with pytest.raises(ValueError, match="seed"):
        ws.warmup_run(lr=0.1, warmup_steps=0, seed=-1)
    with pytest.raises(TypeError, match="sweep"):
        ws.largest_stable_rate({"runs": []}, 0)


def test_grid_summary_leaves_out_the_traced_rerun():
    runs = [{"setting": {"lr": 0.1, "warmup_steps": 0}, "seed": s,
             "metrics": {"final_val_loss": v}} for s, v in ((0, 1.0),
                                                           (1, 2.0))]
    runs.append({"setting": {"lr": 0.1, "warmup_steps": 0, "trace": True},
                 "seed": 0, "metrics": {"final_val_loss": 1.0}})
    summary = ws.grid_summary(Sweep("t", "", [0, 1], runs),
                              "final_val_loss", lr=0.1, warmup_steps=0)
    assert (summary.mean, summary.lo, summary.hi, summary.n) == \
        (1.5, 1.0, 2.0, 2)
    with pytest.raises(ValueError, match="lr=0.2"):
        ws.grid_summary(Sweep("t", "", [0], runs), "final_val_loss",
                        lr=0.2, warmup_steps=0)

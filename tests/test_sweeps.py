"""course_lib.experiments.sweeps: a seeded sweep survives the round trip
to JSON, and its summaries are the mean and range of the runs."""
import math
import statistics

import pytest

from course_lib.experiments import sweeps


def toy(*, width, seed):
    # a deterministic "experiment": a metric, a curve and a non-finite value
    return {"loss": 1.0 / width + seed * 0.01 + 1e-9 / 3,
            "curve": [width * 0.1 * i for i in range(3)],
            "diverged": float("inf") if width == 4 else 0.5}


def test_round_trip_and_summaries(tmp_path):
    sweep = sweeps.run_sweep("toy", toy, [{"width": 2}, {"width": 4}],
                             [0, 1, 2], description="a toy", meta={"n": 3})
    path = sweeps.save_sweep(sweep, tmp_path / "toy.json")
    back = sweeps.load_sweep("toy", path)
    assert back.runs == sweep.runs and back.seeds == [0, 1, 2]
    assert back.meta == {"n": 3} and back.description == "a toy"
    assert back.settings() == [{"width": 2}, {"width": 4}]
    # the stored values are the experiment's, to the 6 digits kept
    for run in back.runs:
        ref = toy(**run["setting"], seed=run["seed"])
        assert math.isclose(run["metrics"]["loss"], ref["loss"],
                            rel_tol=1e-6)
        assert run["metrics"]["curve"] == pytest.approx(ref["curve"])
    assert math.isinf(back.cell(0, width=4)["diverged"])
    losses = [toy(width=2, seed=s)["loss"] for s in (0, 1, 2)]
    mean, lo, hi, n = back.summary("loss", width=2)
    assert n == 3 and lo == pytest.approx(min(losses))
    assert hi == pytest.approx(max(losses))
    assert mean == pytest.approx(statistics.fmean(losses))
    assert back.values("loss", width=2) == [r["metrics"]["loss"]
                                           for r in back.select(width=2)]


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="setting"):
        sweeps.run_sweep("toy", toy, [{"width": 2}], [0],
                         description="").values("loss", width=3)
    with pytest.raises(ValueError, match="values"):
        sweeps.seed_summary([])
    with pytest.raises(TypeError, match="experiment"):
        sweeps.run_sweep("toy", 3, [{"width": 2}], [0], description="")
    with pytest.raises(ValueError, match="make checkpoints"):
        sweeps.load_sweep("no_such_sweep")

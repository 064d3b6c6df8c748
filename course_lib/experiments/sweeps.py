r"""Seeded sweeps whose results the chapters ship.

Some claims need training runs longer than a chapter's 60-second budget:
"ALiBi extrapolates and learned positions do not", "the MoE beats a dense
model of the same active width". Such an experiment is a function of a
*setting* (a dict of hyperparameters) and a *seed* that returns a dict of
metrics. A sweep runs it over a grid of settings and seeds and writes one
JSON file to ``course_lib/data/experiments/<name>.json``; the chapter loads
the file and reports, for each setting, the mean and the range over seeds
(:func:`seed_summary`).

The files are made by ``make checkpoints`` (``scripts/run_experiments.py``
runs every module of :mod:`course_lib.experiments` that defines
``make_sweep()``), and each sweep has a unit test that reruns one cell of
its grid and compares it with the stored cell, so a changed recipe makes
``make test`` fail until the file is remade.

Every run is seeded (``torch.manual_seed(seed)`` before anything random)
and runs on one torch thread, so it repeats bit for bit on one machine; on
another CPU the last bits of the rounding differ, and the test allows for
that with a tolerance.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, NamedTuple

from .._util.validation import check_type

__all__ = ["EXPERIMENTS_DIR", "Sweep", "SeedSummary", "seed_summary",
           "run_sweep", "save_sweep", "load_sweep"]

EXPERIMENTS_DIR = Path(__file__).resolve().parent.parent / "data" / \
    "experiments"


class SeedSummary(NamedTuple):
    """Mean and range of one metric over seeds."""
    mean: float
    lo: float
    hi: float
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.3g} (range {self.lo:.3g}-{self.hi:.3g}, " \
               f"{self.n} seeds)"


def seed_summary(values) -> SeedSummary:
    """Mean, minimum and maximum of a list of numbers (one per seed)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must not be empty")
    return SeedSummary(statistics.fmean(values), min(values), max(values),
                       len(values))


@dataclass
class Sweep:
    """The results of an experiment over a grid of settings and seeds.

    Attributes:
        name: the file name, ``<name>.json``.
        description: one sentence: what was trained and measured.
        seeds: the seeds every setting was run with.
        runs: one dict per (setting, seed): ``{"setting": {...}, "seed": s,
            "metrics": {...}}``; metrics are numbers or lists of numbers.
        meta: anything else worth keeping (step counts, model sizes).
    """
    name: str
    description: str
    seeds: list[int]
    runs: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def settings(self) -> list[dict]:
        """The distinct settings, in the order they were run."""
        out = []
        for run in self.runs:
            if run["setting"] not in out:
                out.append(run["setting"])
        return out

    def select(self, **setting) -> list[dict]:
        """The runs whose setting contains every ``key=value`` given."""
        return [r for r in self.runs
                if all(r["setting"].get(k) == v for k, v in setting.items())]

    def values(self, metric: str, **setting) -> list:
        """``metric`` of each seed's run of the setting, in seed order."""
        runs = self.select(**setting)
        if not runs:
            raise ValueError(f"no run of {self.name} has setting {setting}")
        return [r["metrics"][metric] for r in runs]

    def summary(self, metric: str, **setting) -> SeedSummary:
        """Mean and range over seeds of a scalar ``metric``."""
        return seed_summary(self.values(metric, **setting))

    def cell(self, seed: int, **setting) -> dict:
        """The metrics of one run: one setting, one seed."""
        for run in self.select(**setting):
            if run["seed"] == seed:
                return run["metrics"]
        raise ValueError(f"no run of {self.name} has setting {setting} "
                         f"and seed {seed}")


def _clean(value):
    """Floats rounded to 6 significant digits (the file stays small and
    readable); nan and inf kept as strings JSON can hold."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _restore(value):
    if value in ("nan", "inf", "-inf"):
        return float(value)
    if isinstance(value, dict):
        return {k: _restore(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore(v) for v in value]
    return value


def run_sweep(name: str, experiment: Callable[..., dict],
              settings: list[dict], seeds, *, description: str,
              meta: dict | None = None, progress: bool = False) -> Sweep:
    """Run ``experiment(**setting, seed=seed)`` for every setting and seed.

    Args:
        name: the sweep's file name.
        experiment: returns a dict of metrics (numbers or lists of numbers).
        settings: a list of dicts of keyword arguments.
        seeds: an iterable of ints.
        description: one sentence for the file and the chapter.
        meta: extra facts to store with the results.
        progress: print one line per run.
    """
    check_type("name", name, str, "a str")
    if not callable(experiment):
        raise TypeError(f"experiment must be callable, got "
                        f"{type(experiment).__name__}")
    seeds = [int(s) for s in seeds]
    if not settings or not seeds:
        raise ValueError("settings and seeds must not be empty")
    sweep = Sweep(name, description, seeds, meta=dict(meta or {}))
    for setting in settings:
        for seed in seeds:
            metrics = experiment(**setting, seed=seed)
            sweep.runs.append({"setting": dict(setting), "seed": seed,
                               "metrics": _restore(_clean(metrics))})
            if progress:
                print(f"{name}: {setting} seed {seed}: "
                      f"{ {k: v for k, v in metrics.items() if not isinstance(v, (list, tuple))} }",
                      flush=True)
    return sweep


def save_sweep(sweep: Sweep, path: Path | None = None) -> Path:
    """Write ``sweep`` as JSON (to ``EXPERIMENTS_DIR/<name>.json`` unless
    ``path`` is given) and return the path."""
    check_type("sweep", sweep, Sweep, "a Sweep")
    path = Path(path) if path is not None else \
        EXPERIMENTS_DIR / f"{sweep.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"name": sweep.name, "description": sweep.description,
            "seeds": sweep.seeds, "meta": _clean(sweep.meta),
            "runs": _clean(sweep.runs)}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_sweep(name: str, path: Path | None = None) -> Sweep:
    """Read the sweep ``name`` (or the file ``path``) written by
    :func:`save_sweep`."""
    check_type("name", name, str, "a str")
    path = Path(path) if path is not None else EXPERIMENTS_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"no stored sweep {name!r} at {path}: run "
                         f"`make checkpoints`")
    data = _restore(json.loads(path.read_text()))
    return Sweep(data["name"], data["description"], data["seeds"],
                 data["runs"], data.get("meta", {}))

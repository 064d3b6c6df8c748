"""Rerun the course's seeded sweeps and write their results: part of
`make checkpoints`.

Every module of ``course_lib.experiments`` that defines ``make_sweep()``
(returning a :class:`course_lib.experiments.sweeps.Sweep`) is run, and its
result written to ``course_lib/data/experiments/<name>.json``, which the
chapters load. Each runs on one torch thread, seeded, so a rerun on the
same machine writes the same file.

Usage: ``python scripts/run_experiments.py [MODULE ...]`` (module names
without the package, e.g. ``length_extrapolation``; default: all).
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import time

# The kernels `make` pins (see the Makefile): the unit tests that rerun a
# sweep's cell run under them, and a training run rounds differently on
# AVX-512 kernels, enough to move a sensitive run's final loss by 2 %.
# Set before torch is imported, so a direct run writes what `make
# checkpoints` writes.
for _name, _value in (("ATEN_CPU_CAPABILITY", "avx2"),
                      ("MKL_CBWR", "AVX2,STRICT"),
                      ("ONEDNN_MAX_CPU_ISA", "AVX2")):
    os.environ.setdefault(_name, _value)

import torch  # noqa: E402

import course_lib.experiments as experiments  # noqa: E402
from course_lib.experiments.sweeps import save_sweep  # noqa: E402


def sweep_modules() -> list[str]:
    names = []
    for info in pkgutil.iter_modules(experiments.__path__):
        module = importlib.import_module(f"course_lib.experiments.{info.name}")
        if callable(getattr(module, "make_sweep", None)):
            names.append(info.name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", help="default: all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.modules or sweep_modules()
    for name in names:
        module = importlib.import_module(f"course_lib.experiments.{name}")
        start = time.perf_counter()
        sweep = module.make_sweep()
        path = save_sweep(sweep)
        print(f"{name}: wrote {path} ({path.stat().st_size / 1e3:.1f} kB, "
              f"{len(sweep.runs)} runs) in {time.perf_counter() - start:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()

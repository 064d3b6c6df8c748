"""Wall-clock timing for the chapters' measurements and the benchmarks.

Timings change from run to run and machine to machine, so chapters print
them only in cells that nbval does not compare, and ``benchmarks/run.py``
records them as ratios measured in one run.
"""
from __future__ import annotations

import time
from typing import Callable

from .validation import check_int

__all__ = ["best_time"]


def best_time(fn: Callable[[], object], repeats: int, *,
              warmup: Callable[[], object] | None = None) -> float:
    """Seconds of the fastest of ``repeats`` calls of ``fn()``.

    One untimed warm-up call comes first (first calls allocate buffers and
    pick kernels). The minimum is the least noisy estimate of the cost:
    other processes can only make a call slower, never faster.

    Args:
        fn: the work to time, called with no arguments.
        repeats: number of timed calls (>= 1).
        warmup: called once, untimed, instead of ``fn`` (a cheaper call
            that touches the same kernels); default ``fn``.
    """
    check_int("repeats", repeats, minimum=1)
    if warmup is not None and not callable(warmup):
        raise ValueError(f"warmup must be None or a callable, got "
                         f"{type(warmup).__name__}")
    (fn if warmup is None else warmup)()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best

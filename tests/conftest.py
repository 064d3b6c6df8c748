"""Shared fixtures for the unit tests."""
import pytest


class FakeClock:
    """A stand-in for ``time``: ``perf_counter()`` returns ``now``, which
    moves only when a test calls :meth:`advance`. Timing code measured
    with it gives exact, load-independent durations, so a test knows
    which path took which time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock(monkeypatch):
    """Replace ``time`` in every course_lib module that reads the clock:
    ``timing`` (``best_time``, which every measurement uses, e.g.
    ``decoding.decode_throughput``) and ``training``."""
    from course_lib import timing, training
    clock = FakeClock()
    for module in (timing, training):
        monkeypatch.setattr(module, "time", clock)
    return clock

"""best_time: a warm-up call, then the minimum of the timed calls."""
import time

import pytest

from course_lib.timing import best_time


def test_best_time_warms_up_then_keeps_the_fastest_call():
    durations = iter([0.05, 0.03, 0.01, 0.02])   # warm-up, then 3 timed
    calls = []

    def work():
        d = next(durations)
        calls.append(d)
        time.sleep(d)

    best = best_time(work, repeats=3)
    assert calls == [0.05, 0.03, 0.01, 0.02]
    assert 0.01 <= best < 0.02


def test_best_time_rejects_bad_repeats():
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        best_time(lambda: None, 0)

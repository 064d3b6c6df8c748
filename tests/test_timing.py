"""best_time: a warm-up call, then the minimum of the timed calls."""
import pytest

from course_lib._util.timing import best_time


def test_best_time_warms_up_then_keeps_the_fastest_call(fake_clock):
    durations = iter([0.05, 0.03, 0.01, 0.02])   # warm-up, then 3 timed
    calls = []

    def work():
        d = next(durations)
        calls.append(d)
        fake_clock.advance(d)

    best = best_time(work, repeats=3)
    assert calls == [0.05, 0.03, 0.01, 0.02]
    # the warm-up (0.05) is not timed; the minimum of the timed calls
    assert best == pytest.approx(0.01, abs=1e-15)


def test_best_time_measures_only_the_call(fake_clock):
    def work():
        fake_clock.advance(2.0)

    fake_clock.advance(100.0)                    # time before the call
    assert best_time(work, repeats=1) == 2.0


def test_best_time_rejects_bad_repeats():
    with pytest.raises(ValueError, match="repeats must be >= 1, got 0"):
        best_time(lambda: None, 0)

"""Chapter 14: the alpha-beta model of a collective's time
(course_lib.distributed.comm_model), and the bytes that really cross the
wire, counted on the loopback interface.
"""
import math

import pytest

from course_lib.distributed import comm_model
from course_lib.distributed.comm_model import (AlphaBeta, all_to_all_seconds,
                                               collective_cost_run,
                                               fit_alpha_beta,
                                               ring_all_reduce_seconds)


def test_fit_recovers_a_line_exactly():
    x = [1e3, 1e4, 1e5, 1e6, 1e7]
    t = [2e-5 + 3e-10 * v for v in x]
    a, b = fit_alpha_beta(x, t)
    assert a == pytest.approx(2e-5, rel=1e-9)
    assert b == pytest.approx(3e-10, rel=1e-9)


def test_fit_weighs_relative_error():
    """One size 10% off: relative weighting keeps the small sizes' latency
    (an unweighted fit would let the largest time set everything)."""
    x = [1e2, 1e3, 1e4, 1e7]
    t = [1e-4 + 1e-9 * v for v in x]
    t[-1] *= 1.1
    a, _ = fit_alpha_beta(x, t)
    assert a == pytest.approx(1e-4, rel=0.05)


@pytest.mark.parametrize("args, error, match", [
    (([1.0], [1.0]), ValueError, "two distinct sizes"),
    (([1.0, 1.0], [1.0, 2.0]), ValueError, "two distinct sizes"),
    (([1.0, 2.0], [1.0]), ValueError, "same length"),
    (([1.0, 2.0], [1.0, 0.0]), ValueError, "seconds"),
    (([1.0, "2"], [1.0, 2.0]), TypeError, "x")])
def test_fit_rejects_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        fit_alpha_beta(*args)


def test_ring_all_reduce_and_all_to_all_times_are_the_closed_forms():
    link = AlphaBeta(alpha=5e-6, beta=1 / 50e9)
    assert link.bandwidth == pytest.approx(50e9)
    n, W = 64 * 2**20, 8
    assert ring_all_reduce_seconds(n, W, link) == pytest.approx(
        14 * 5e-6 + 14 / 8 * n / 50e9)
    assert ring_all_reduce_seconds(n, 1, link) == 0.0   # nothing to send
    assert all_to_all_seconds(1e6, 4, link) == pytest.approx(
        3 * 5e-6 + 1e6 / 50e9)
    assert AlphaBeta(1.0, 0.0).bandwidth == math.inf
    with pytest.raises(TypeError, match="link must be an AlphaBeta"):
        ring_all_reduce_seconds(n, W, (5e-6, 2e-11))


def test_loopback_bytes_is_none_without_proc(monkeypatch, tmp_path):
    monkeypatch.setattr(comm_model, "_NET_DEV", tmp_path / "missing")
    assert comm_model.loopback_bytes() is None
    (tmp_path / "dev").write_text(
        "Inter-|   Receive\n face |bytes packets\n"
        "    lo: 100 2 0 0 0 0 0 0 123 4 0 0 0 0 0 0\n")
    monkeypatch.setattr(comm_model, "_NET_DEV", tmp_path / "dev")
    assert comm_model.loopback_bytes() == 123


@pytest.mark.distributed
@pytest.mark.skipif(comm_model.loopback_bytes() is None,
                    reason="needs /proc/net/dev (Linux)")
def test_the_wire_carries_what_the_ring_formula_says():
    """Gloo's all-reduce puts 2(W-1) payloads on the wire in all (each
    rank 2(W-1)/W of its n bytes: a ring's, the least any all-reduce can
    send), an all-to-all (W-1) payloads. Measured on the loopback
    interface for a 4 MiB payload: TCP headers add well under 1 %."""
    from course_lib.distributed.launch import run
    size = 4 * 2**20
    for W in (2, 3):
        res = run(collective_cost_run, W, [size], 3, timeout=120)[0]
        ring = res["all_reduce_wire"][0] / (2 * (W - 1) * size)
        a2a = res["all_to_all_wire"][0] / ((W - 1) * size)
        assert 1.0 <= ring < 1.03, (W, ring)
        assert 1.0 <= a2a < 1.03, (W, a2a)
        assert all(t > 0 for t in res["all_reduce"] + res["all_to_all"])


@pytest.mark.distributed
def test_overlapped_micro_batches_give_the_serial_result():
    """course_lib.distributed.overlap: the two schedules run the same
    arithmetic in another order of events; every time is measured."""
    from course_lib.distributed.launch import run
    from course_lib.distributed.overlap import overlap_run
    for res in run(overlap_run, 2, 64, 32, 16, 2, timeout=120):
        assert res["max_diff"] == 0.0
        assert all(res[k] > 0 for k in ("serial", "overlapped", "compute",
                                         "communication"))

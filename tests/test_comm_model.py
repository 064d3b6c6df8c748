"""Chapter 14: the alpha-beta model of a collective's time
(course_lib.distributed.comm_model), the bytes that really cross the
wire, counted on the loopback interface, the model of communication
against computation for DeepSeek-V3's layers (checked against hand
computations), the overlap of two micro-batches, and torch's own
tensor-parallel API (DTensor) against the course's layers.
"""
import math

import pytest

from course_lib.distributed import comm_model
from course_lib.distributed.comm_model import (
    AlphaBeta, LayerCost, all_to_all_seconds, collective_cost_run,
    expert_parallel_cost, fit_alpha_beta, fit_collective, moe_layer_flops,
    ring_all_reduce_bytes, ring_all_reduce_seconds, tensor_parallel_cost)
from course_lib.sizing.configs import DEEPSEEK_V3, LLAMA2_7B


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


def test_ring_bytes_are_two_w_minus_one_over_w_payloads():
    # 4 MiB over 4 ranks: 2 * 3/4 * 4,194,304 = 6,291,456 bytes per rank,
    # 25,165,824 for the 4 ranks (the figure the wire test measures)
    assert ring_all_reduce_bytes(4 * 2**20, 4) == 6_291_456
    assert 4 * ring_all_reduce_bytes(4 * 2**20, 4) == 25_165_824
    assert ring_all_reduce_bytes(10_240, 8) == 17_920     # ch14-tp-bytes
    assert ring_all_reduce_bytes(1000, 1) == 0


@pytest.mark.parametrize("W", [2, 4, 8])
def test_fit_collective_recovers_the_link_of_either_collective(W):
    link = AlphaBeta(alpha=30e-6, beta=1 / 2e9)
    n = [2**10, 2**14, 2**18, 2**22]
    t_ar = [ring_all_reduce_seconds(v, W, link) for v in n]
    # an all-to-all of an n-byte tensor sends (W-1)/W of it
    t_a2a = [all_to_all_seconds(v * (W - 1) / W, W, link) for v in n]
    for collective, t in (("all_reduce", t_ar), ("all_to_all", t_a2a)):
        got = fit_collective(collective, n, t, W)
        assert got.alpha == pytest.approx(30e-6, rel=1e-9), collective
        assert got.beta == pytest.approx(0.5e-9, rel=1e-9), collective
    with pytest.raises(ValueError, match="collective"):
        fit_collective("broadcast", n, t_ar, W)
    with pytest.raises(ValueError, match="world_size"):
        fit_collective("all_reduce", n, t_ar, 1)


def test_moe_layer_flops_of_deepseek_v3_by_hand():
    """2 FLOPs per active weight of one MoE layer: MLA's projections,
    the router, 1 shared + 8 routed SwiGLU experts."""
    mla = (7168 * 1536 + 1536                 # q_a_proj, q_a_layernorm
           + 1536 * 128 * (128 + 64)          # q_b_proj
           + 7168 * (512 + 64) + 512          # kv_a_proj_with_mqa, norm
           + 512 * 128 * (128 + 128)          # kv_b_proj
           + 128 * 128 * 7168)                # o_proj
    assert mla == 187_107_328
    expected = 2 * (mla + 256 * 7168 + 9 * 3 * 7168 * 2048)
    assert moe_layer_flops(DEEPSEEK_V3) == expected == 1_170_608_128
    with pytest.raises(ValueError, match="MoE"):
        moe_layer_flops(LLAMA2_7B)


def test_layer_cost_crossover_is_where_the_two_times_meet():
    # f/F = 2 us per token, s beta = 1 us per token, m alpha = 10 us
    cost = LayerCost(flops_per_token=2e6, bytes_per_token=1e3, messages=5,
                     link=AlphaBeta(alpha=2e-6, beta=1e-9))
    F = 1e12
    assert cost.compute_seconds(10, F) == pytest.approx(20e-6)
    assert cost.comm_seconds(10) == pytest.approx(10e-6 + 10e-6)
    n_star = cost.comm_bound_below(F)
    assert n_star == pytest.approx(10.0)
    assert cost.comm_seconds(5) > cost.compute_seconds(5, F)
    assert cost.comm_seconds(20) < cost.compute_seconds(20, F)
    # as many seconds per byte as per FLOP: communication-bound at any N
    slow = LayerCost(2e6, 2e3, 5, AlphaBeta(2e-6, 1e-9))
    assert slow.comm_bound_below(F) == math.inf
    with pytest.raises(ValueError, match="flop_rate"):
        cost.comm_bound_below(0.0)


def test_tensor_and_expert_parallel_costs_of_v3_by_hand():
    nvlink = AlphaBeta(alpha=2e-6, beta=1 / 160e9)
    tp8 = tensor_parallel_cost(DEEPSEEK_V3, 8, nvlink)
    # two ring all-reduces of D * 2 bytes: 2 * 2 * 7/8 * 7168 * 2
    assert tp8.bytes_per_token == 50_176
    assert tp8.messages == 2 * 2 * 7
    assert tp8.flops_per_token == 1_170_608_128 / 8
    assert tensor_parallel_cost(DEEPSEEK_V3, 1, nvlink).bytes_per_token == 0
    ib = AlphaBeta(alpha=5e-6, beta=1 / 50e9)
    # k = 8 copies, FP8 out and bf16 back: chapter 14's 172,032 per token
    assert expert_parallel_cost(DEEPSEEK_V3, ib, copies=8
                                ).bytes_per_token == 172_032
    ep = expert_parallel_cost(DEEPSEEK_V3, ib, copies=4)   # 4 nodes
    assert ep.bytes_per_token == 4 * 7168 * 3 == 86_016
    assert (ep.messages, ep.flops_per_token) == (2, 1_170_608_128)
    # N* = 2 alpha / (f/F - s beta), by hand at F = 400 TFLOP/s
    F = 400e12
    n_star = 2 * 5e-6 / (1_170_608_128 / F - 86_016 / 50e9)
    assert ep.comm_bound_below(F) == pytest.approx(n_star)
    with pytest.raises(ValueError, match="copies"):
        expert_parallel_cost(DEEPSEEK_V3, ib, copies=0)
    with pytest.raises(TypeError, match="link must be an AlphaBeta"):
        tensor_parallel_cost(DEEPSEEK_V3, 4, (2e-6, 1e-11))


def test_loopback_bytes_is_none_without_proc(monkeypatch, tmp_path):
    monkeypatch.setattr(comm_model, "_NET_DEV", tmp_path / "missing")
    assert comm_model.loopback_bytes() is None
    (tmp_path / "dev").write_text(
        "Inter-|   Receive\n face |bytes packets\n"
        "    lo: 100 2 0 0 0 0 0 0 123 4 0 0 0 0 0 0\n")
    monkeypatch.setattr(comm_model, "_NET_DEV", tmp_path / "dev")
    assert comm_model.loopback_bytes() == 123


@pytest.fixture(scope="module")
def pool3():
    """One pool of 3 ranks for the distributed tests of this file: the
    ranks start once (seconds each), not once per test."""
    from course_lib.distributed.launch import Pool
    with Pool(3, timeout=120) as pool:
        yield pool


@pytest.mark.distributed
@pytest.mark.skipif(comm_model.loopback_bytes() is None,
                    reason="needs /proc/net/dev (Linux)")
def test_the_wire_carries_what_the_ring_formula_says(pool3):
    """Gloo's all-reduce puts 2(W-1) payloads on the wire in all (each
    rank 2(W-1)/W of its n bytes: a ring's, the least any all-reduce can
    send), an all-to-all (W-1) payloads. Measured on the loopback
    interface for a 4 MiB payload on 3 ranks: TCP headers add well under
    1 %; a naive all-reduce (everyone sends n to everyone) would put
    W(W-1) = 6 payloads there, not 4."""
    size, W = 4 * 2**20, 3
    res = pool3.run(collective_cost_run, [size], 3)[0]
    ring = res["all_reduce_wire"][0] / (W * ring_all_reduce_bytes(size, W))
    a2a = res["all_to_all_wire"][0] / ((W - 1) * size)
    assert 1.0 <= ring < 1.03, ring
    assert 1.0 <= a2a < 1.03, a2a
    assert all(t > 0 for t in res["all_reduce"] + res["all_to_all"])


@pytest.mark.distributed
def test_overlapped_micro_batches_give_the_serial_result(pool3):
    """course_lib.distributed.overlap: the two schedules run the same
    arithmetic in another order of events; every time is measured. On 2
    of 3 ranks: the third is left out of the group and returns None."""
    from course_lib.distributed.overlap import overlap_run
    res = pool3.run(overlap_run, 64, 32, 16, 2, 0, 2)        # size 2
    assert res[2] is None
    for r in res[:2]:
        assert r["max_diff"] == 0.0
        assert all(r[k] > 0 for k in ("serial", "overlapped", "compute",
                                       "communication"))


@pytest.mark.distributed
def test_torch_dtensor_tp_is_the_courses_tensor_parallel_swiglu(pool3):
    """torch's parallelize_module with ColwiseParallel/RowwiseParallel
    holds the same shards as TensorParallelSwiGLU and gives the same
    output and input gradient, both equal to one process."""
    from course_lib.distributed.dtensor_tp import dtensor_tp_run
    for r in pool3.run(dtensor_tp_run, d_model=32, d_ff=192):
        assert r["same_shards"]
        assert r["placements"] == {"gate_proj": "(Shard(dim=0),)",
                                   "up_proj": "(Shard(dim=0),)",
                                   "down_proj": "(Shard(dim=1),)"}
        assert r["local_shapes"]["gate_proj"] == (64, 32)    # (F/W, D)
        assert r["local_shapes"]["down_proj"] == (32, 64)    # (D, F/W)
        for key in ("out_vs_course", "out_vs_single", "grad_vs_course",
                    "grad_vs_single"):
            assert r[key] < 1e-5, key

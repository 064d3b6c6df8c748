"""Chapter 14: data parallelism, ZeRO and FSDP
(course_lib.distributed.data_parallel and the chapter's workers
data_parallel_run and fully_shard_run).

References: one process on the concatenated batch (the workers report
their differences), the ZeRO paper's own example, a ring all-reduce
simulated step by step, and the parameter layout of the model for the
bytes FSDP sends. The distributed results come from the session's
2-rank run of ``workers.check_parallel_layers`` (conftest fixture
``parallel_layers``), so start-up is shared with the TP/EP/SP tests.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_lib.distributed.data_parallel import (count_collectives,
                                                  record_gradient_buckets,
                                                  ring_bytes_per_rank,
                                                  zero_model_state_bytes,
                                                  zero_traffic_bytes)
from errors import error_for


def test_zero_bytes_match_the_papers_example():
    """Rajbhandari et al. 2020, fig. 1: 7.5 B parameters, 64 GPUs,
    mixed-precision Adam (K = 12): 120, 31.4, 16.6 and 1.9 GB per GPU."""
    psi, W = 7_500_000_000, 64
    totals = [zero_model_state_bytes(psi, W, s).total / 1e9
              for s in range(4)]
    assert [round(t, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]
    # what each stage shards: optimizer states, then gradients, then
    # parameters
    z = [zero_model_state_bytes(psi, W, s) for s in range(4)]
    assert z[0].optimizer_states == 12 * psi and z[1].optimizer_states == \
        12 * psi / W
    assert z[1].grads == 2 * psi and z[2].grads == 2 * psi / W
    assert z[2].params == 2 * psi and z[3].params == 2 * psi / W


def _simulated_ring_all_reduce(data: list[list[float]]):
    """A ring all-reduce run step by step over W ranks of W chunks
    (one number per chunk): W - 1 reduce-scatter steps, in which rank r
    sends chunk (r - s) mod W to rank r + 1, which adds it to its own;
    then W - 1 all-gather steps passing the summed chunks on. Returns
    the ranks' final chunks and the chunks each rank sent."""
    W = len(data)
    chunks = [list(d) for d in data]
    sent = [0] * W
    for step in range(W - 1):                       # reduce-scatter
        msgs = [(r, (r - step) % W, chunks[r][(r - step) % W])
                for r in range(W)]
        for r, c, value in msgs:
            chunks[(r + 1) % W][c] += value
            sent[r] += 1
    for step in range(W - 1):                       # all-gather
        msgs = [(r, (r + 1 - step) % W, chunks[r][(r + 1 - step) % W])
                for r in range(W)]
        for r, c, value in msgs:
            chunks[(r + 1) % W][c] = value
            sent[r] += 1
    return chunks, sent


@pytest.mark.parametrize("W", [1, 2, 3, 4, 8])
def test_ring_bytes_equal_a_ring_run_step_by_step(W):
    gen = torch.Generator().manual_seed(W)
    data = torch.randint(0, 100, (W, W), generator=gen).tolist()
    chunks, sent = _simulated_ring_all_reduce(data)
    total = [sum(col) for col in zip(*data)]
    assert all(c == total for c in chunks)          # a correct all-reduce
    chunk_bytes = 1024
    n = W * chunk_bytes                             # the full tensor
    for r in range(W):
        assert sent[r] * chunk_bytes == ring_bytes_per_rank(
            "all_reduce", n, W)
        # its two halves: reduce-scatter, then all-gather
        assert ring_bytes_per_rank("reduce_scatter", n, W) + \
            ring_bytes_per_rank("all_gather", n, W) == sent[r] * chunk_bytes


def test_zero_traffic_is_dp_traffic_until_stage_3():
    """Sec. 7 of the paper: 2 Psi values per step for DP, ZeRO-1 and
    ZeRO-2, 3 Psi for ZeRO-3 (ring, W large)."""
    psi, W = 10**9, 1024
    for stage in (0, 1, 2):
        assert zero_traffic_bytes(psi, W, stage) == pytest.approx(
            2 * psi * 2, rel=2 / W)
    assert zero_traffic_bytes(psi, W, 3) == pytest.approx(3 * psi * 2,
                                                          rel=2 / W)


TOL = 1e-6


@pytest.mark.distributed
def test_ddp_gradients_equal_one_process_on_the_whole_batch(
        parallel_layers):
    """Each of 2 ranks takes 4 of the 8 rows; DDP's averaged gradients
    equal one process's on all 8 (mean cross-entropy), and the buckets
    carry every gradient once per backward."""
    for r in parallel_layers(2):
        ddp = r["ddp"]
        assert ddp["grad_diff"] < TOL
        first, rebuilt = ddp["buckets"]
        # every gradient all-reduced once: 4 bytes x parameters
        assert sum(first) == sum(rebuilt) == ddp["param_bytes"] \
            == 4 * ddp["n_params"]
        # first backward: one bucket (torch's first bucket holds up to
        # 1 MB); then rebuilt in arrival order, capped at 0.05 MB
        assert len(first) == 1 and len(rebuilt) > 1
        # a ring sends 2 (W - 1) / W of the payload: at W = 2 one copy
        assert ring_bytes_per_rank("all_reduce", sum(rebuilt), 2) == \
            ddp["param_bytes"]


@pytest.mark.distributed
def test_fsdp_step_equals_one_process_and_shards_the_states(
        parallel_layers):
    results = parallel_layers(2)
    for r in results:
        sgd, adam = r["fsdp"]["sgd"], r["fsdp"]["adam"]
        for run in (sgd, adam):
            assert run["grad_diff"] < TOL
        # SGD: p - lr g, as exact as the gradients
        assert sgd["step_diff"] < 1e-7
        # Adam's first step is lr g / (|g| + eps): blind to the gradient's
        # scale (the gradients are checked above) and with a slope
        # eps / (|g| + eps)^2 near 1/eps where |g| ~ eps = 1e-8, so float
        # rounding moves those entries' steps: one process summing two
        # half-batch gradients instead of one full batch differs from
        # itself by 8.4e-6 at the same entry. Within 1% of lr = 1e-2
        assert adam["step_diff"] < 1e-4
        # each rank keeps half of the parameters, gradients and moments
        psi = adam["n_params"]
        assert adam["param_bytes"] * 2 == adam["param_bytes_full"] == 4 * psi
        assert adam["grad_bytes"] == adam["param_bytes"]
        assert adam["optimizer_bytes"] * 2 == adam["optimizer_bytes_full"] \
            == 2 * 4 * psi                           # momentum, variance
        assert sgd["optimizer_bytes"] == 0           # plain SGD: no state
        # ZeRO-3 in float32 without master weights: p = g = 4, K = 8
        z3 = zero_model_state_bytes(psi, 2, 3, param_bytes=4, grad_bytes=4,
                                    optimizer_bytes=8)
        assert adam["param_bytes"] + adam["grad_bytes"] + \
            adam["optimizer_bytes"] == z3.total
    assert results[0]["fsdp"]["adam"]["param_bytes"] == \
        results[1]["fsdp"]["adam"]["param_bytes"]


@pytest.mark.distributed
def test_fsdp_sends_zero_3_traffic(parallel_layers):
    """The collectives FSDP2 made in one forward and backward: every
    parameter reduce-scattered once; gathered once for the forward and
    the blocks' parameters once more for the backward (the root unit,
    embedding and final norm, stays gathered between the two): ZeRO-3's
    3 Psi less the root's second gather."""
    run = parallel_layers(2)[0]["fsdp"]["sgd"]
    calls = run["collectives"]
    psi_bytes = run["param_bytes_full"]
    root_bytes = 4 * (64 * 32 + 32)          # embedding (V, D), final norm
    gathered = sum(c.n_bytes for c in calls if c.op == "all_gather")
    reduced = sum(c.n_bytes for c in calls if c.op == "reduce_scatter")
    assert {c.op for c in calls} == {"all_gather", "reduce_scatter"}
    assert reduced == psi_bytes
    assert gathered == psi_bytes + (psi_bytes - root_bytes)
    sent = sum(c.ring_bytes for c in calls)
    assert sent == zero_traffic_bytes(run["n_params"], 2, 3,
                                      element_bytes=4) \
        - ring_bytes_per_rank("all_gather", root_bytes, 2)


def test_count_collectives_puts_torch_back():
    original = dist.all_reduce
    with pytest.raises(RuntimeError, match="inside"):
        with count_collectives() as calls:
            assert dist.all_reduce is not original
            raise RuntimeError("inside")
    assert dist.all_reduce is original and calls == []


@pytest.mark.parametrize("call, match", [
    (lambda: zero_model_state_bytes(10, 2, 4), "stage must be one of"),
    (lambda: zero_model_state_bytes(10, 0, 1), "world_size must be >= 1"),
    (lambda: zero_model_state_bytes(10.5, 2, 1), "n_params must be an int"),
    (lambda: ring_bytes_per_rank("broadcast", 8, 2), "collective must be"),
    (lambda: ring_bytes_per_rank("all_reduce", -1, 2),
     "n_bytes must be >= 0"),
    (lambda: zero_traffic_bytes(10, 2, 1, element_bytes=0),
     "element_bytes must be >= 1"),
    (lambda: record_gradient_buckets(nn.Linear(2, 2)),
     "model must be a torch.nn.parallel.DistributedDataParallel"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(error_for(match), match=match):
        call()

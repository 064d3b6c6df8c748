"""Chapter 14: expert parallelism (course_lib.distributed.expert_parallel), and its
cross-node byte counter.

The distributed comparisons run in ``parallel_checks.check_expert_parallel``
on 2 and 4 spawned processes (the ``parallel_layers`` fixture, conftest):
each rank's outputs and gradients against the single-process MoE, and the
byte counters against the closed form.
"""
import pytest
import torch

from course_lib.distributed.expert_parallel import (ExpertParallelMoE,
                                                    ExpertParallelStats,
                                                    all_to_all_bytes,
                                                    bytes_sent_per_rank)
from course_lib.model.moe import MoE, moe_infos
from workers import _moe
from errors import error_for

TOL = 1e-5
CASES = ["topk_shared0", "topk_shared1", "deepseek_v3_shared0",
         "deepseek_v3_shared1", "skewed_shared1"]


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_expert_parallel_equals_single_process(parallel_layers, world_size):
    """Both routers, shared experts on and off: outputs, input gradients,
    gradients of the local experts (slots of every rank), of the router
    and shared experts (this rank's tokens), routing and aux loss."""
    for rank, res in enumerate(parallel_layers(world_size)):
        # with 4 processes also two groups of 2 ranks side by side
        for key in ["ep"] + (["ep_pairs"] if world_size == 4 else []):
            _check_ep_case(rank, res[key])


def _check_ep_case(rank, ep):
    assert sorted(ep) == sorted(CASES)
    for case, r in ep.items():
        assert r["same_routing"], (rank, case)
        for name in ("out", "grad_x", "grad_experts", "grad_router",
                     "aux_loss") + (("grad_shared",) if "shared1" in
                                    case else ()):
            assert r[name] < TOL, (rank, case, name, r[name])


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_byte_counters_equal_the_closed_form(parallel_layers, world_size):
    results = parallel_layers(world_size)
    _check_bytes([res["ep"] for res in results])
    if world_size == 4:                        # two groups of 2 ranks
        _check_bytes([res["ep_pairs"] for res in results[:2]])
        _check_bytes([res["ep_pairs"] for res in results[2:]])


def _check_bytes(group_results):
    """The counters of one process group's ranks (one dict per rank)."""
    W, D, k, b = len(group_results), 16, 2, 4  # d_model, top_k, float32
    n = [ep[CASES[0]]["n_tokens"] for ep in group_results]
    for case in CASES:
        stats = [ep[case]["stats"] for ep in group_results]
        for rank, s in enumerate(stats):
            assert isinstance(s, ExpertParallelStats) and s.rank == rank
            assert s.row_bytes == D * b
            # own tokens: N_r k D b out at dispatch, as much back at combine
            assert s.dispatch_sent == all_to_all_bytes(n[rank], k, D, b) / 2
            # what rank r sends to s is what s receives from r
            for other, t in enumerate(stats):
                assert s.send_splits[other] == t.recv_splits[rank]
            assert s.bytes_received == s.bytes_sent
            local = s.send_splits[rank] + s.recv_splits[rank]
            assert s.remote_bytes_sent == s.bytes_sent - local * D * b
            assert s.expert_seconds >= 0 and s.forward_seconds >= \
                s.expert_seconds
        # all ranks together: 2 N k D b, N every rank's tokens
        assert sum(s.bytes_sent for s in stats) == \
            all_to_all_bytes(sum(n), k, D, b)
    # the skewed router sends every slot to rank 0: the others serve none
    skewed = [ep["skewed_shared1"]["stats"] for ep in group_results]
    assert all(s.recv_splits == [0] * W for s in skewed[1:])
    assert skewed[0].recv_splits == [k * m for m in n]


def test_all_to_all_bytes_formula():
    # DeepSeek-V3: D = 7168, k = 8, bf16, 4096 tokens
    assert all_to_all_bytes(4096, 8, 7168, 2) == 2 * 4096 * 8 * 7168 * 2
    assert all_to_all_bytes(10, 2, 16, 4, world_size=4) == 2 * 10 * 2 * 16 \
        * 4 * 3 / 4
    assert all_to_all_bytes(0, 2, 16, 4) == 0
    with pytest.raises(ValueError, match="top_k must be >= 1, got 0"):
        all_to_all_bytes(10, 0, 16, 4)


@pytest.mark.parametrize("router", ["topk", "deepseek_v3"])
def test_one_rank_equals_the_moe_in_process(router):
    """W = 1 needs no process group: the same steps, exchanges skipped."""
    torch.manual_seed(0)
    moe = _moe(router, 1)
    ep = ExpertParallelMoE(moe)
    x = torch.randn(2, 5, 16)
    (y, info), (y_ref, info_ref) = ep.forward_with_info(x), \
        moe.forward_with_info(x)
    assert y.shape == x.shape and torch.allclose(y, y_ref, atol=TOL)
    assert torch.equal(info.load, info_ref.load)
    assert info.aux_loss.item() == pytest.approx(info_ref.aux_loss.item())
    s = ep.stats
    assert s.send_splits == s.recv_splits == [20]
    assert s.bytes_sent == all_to_all_bytes(10, 2, 16, 4)
    assert s.remote_bytes_sent == 0
    assert len(ep.experts) == 8 and ep.expert_offset == 0


def test_forward_returns_the_output_and_keeps_the_info():
    """As MoE: the call returns a tensor, forward_with_info the pair, and
    last_info is what moe_infos collects."""
    torch.manual_seed(0)
    ep = ExpertParallelMoE(_moe("deepseek_v3", 1))
    assert ep.last_info is None
    x = torch.randn(2, 5, 16)
    y = ep(x)
    out, info = ep.forward_with_info(x)
    assert isinstance(y, torch.Tensor) and torch.equal(y, out)
    got = ep.last_info
    assert torch.equal(got.indices, info.indices)
    assert torch.equal(got.load, info.load)
    assert got.aux_loss.item() == info.aux_loss.item()
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), ep)
    model(x)
    (only,) = moe_infos(model)
    assert only is ep.last_info
    only.aux_loss.backward()                  # the router learns from it
    assert ep.gate.weight.grad.abs().sum() > 0


def test_each_rank_keeps_its_contiguous_block_of_experts():
    torch.manual_seed(0)
    moe = _moe("topk", 1)
    ep = ExpertParallelMoE(moe, rank=2, world_size=4)
    assert ep.expert_offset == 4 and len(ep.experts) == 2
    for i, e in enumerate(ep.experts):
        assert torch.equal(e.down_proj.weight,
                           moe.experts[4 + i].down_proj.weight)
        assert e.down_proj.weight is not moe.experts[4 + i].down_proj.weight
    assert torch.equal(ep.gate.weight, moe.gate.weight)
    assert "experts 4..5 of 8" in repr(ep)


@pytest.mark.parametrize("kwargs, match", [
    ({"rank": 0, "world_size": 3},
     "world_size=3 must divide the moe's n_experts, got 8"),
    ({"rank": 4, "world_size": 4}, "rank must be < world_size=4, got 4"),
    ({"rank": 0}, "pass rank and world_size together"),
    ({"rank": 0, "world_size": 0}, "world_size must be >= 1, got 0"),
])
def test_expert_parallel_rejects_bad_sizes(kwargs, match):
    with pytest.raises(error_for(match), match=match):
        ExpertParallelMoE(_moe("topk", 0), **kwargs)


def test_expert_parallel_rejects_capacity_and_other_modules():
    moe = MoE(8, n_experts=4, top_k=2, d_expert=4, capacity_factor=1.25)
    with pytest.raises(ValueError, match="capacity_factor must be None"):
        ExpertParallelMoE(moe)
    with pytest.raises(TypeError, match="moe must be a course_lib MoE, "
                       "got Linear"):
        ExpertParallelMoE(torch.nn.Linear(2, 2))
    ep = ExpertParallelMoE(_moe("topk", 0), rank=0, world_size=2)
    with pytest.raises(RuntimeError, match="no process group"):
        ep(torch.randn(3, 16))
    ep = ExpertParallelMoE(_moe("topk", 0))
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 16\)"):
        ep(torch.randn(3, 8))


def test_cross_node_bytes_counts_splits_to_other_nodes():
    s = ExpertParallelStats(rank=1, row_bytes=10,
                            send_splits=[1, 2, 3, 4],
                            recv_splits=[5, 6, 7, 8])
    # nodes of 2 ranks: rank 1 is on node 0 with rank 0
    assert s.cross_node_bytes(2) == 10 * (3 + 4 + 7 + 8)
    # one rank per node: everything but the rank itself
    assert s.cross_node_bytes(1) == s.remote_bytes_sent
    assert s.cross_node_bytes(4) == 0
    with pytest.raises(ValueError, match="ranks_per_node must be >= 1"):
        s.cross_node_bytes(0)


def _bytes_sent_loop(counts, placement, d_model, b_d, b_c):
    """bytes_sent_per_rank by plain loops over every slot group."""
    W, E = counts.shape
    out = [0] * W
    for s in range(W):
        for e in range(E):
            r = int(placement[e])
            if r != s:
                c = int(counts[s, e])
                out[s] += c * d_model * b_d          # dispatch, s -> r
                out[r] += c * d_model * b_c          # combine, r -> s
    return out


@pytest.mark.parametrize("W,E,seed", [(1, 4, 0), (2, 8, 1), (4, 8, 2),
                                      (3, 7, 3), (8, 16, 4)])
def test_bytes_sent_per_rank_equals_a_loop(W, E, seed):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 20, (W, E), generator=gen)
    placement = torch.randint(0, W, (E,), generator=gen)   # any placement
    got = bytes_sent_per_rank(counts, placement, 24, 1, 2)
    assert got.dtype == torch.int64 and got.shape == (W,)
    assert got.tolist() == _bytes_sent_loop(counts, placement, 24, 1, 2)
    with torch.device("meta"):          # no tensor made without device=
        again = bytes_sent_per_rank(counts, placement, 24, 1, 2)
    assert torch.equal(again, got)


def test_bytes_sent_per_rank_equals_the_stats_of_the_moe_layer():
    """Contiguous placement, one element size: each rank's
    ExpertParallelStats.remote_bytes_sent, built from the same splits."""
    W, E, D, b = 4, 8, 16, 4
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 9, (W, E), generator=gen)
    placement = torch.arange(E) // (E // W)
    slots = counts.reshape(W, W, E // W).sum(-1)            # (W, W) s -> r
    got = bytes_sent_per_rank(counts, placement, D, b, b)
    for r in range(W):
        stats = ExpertParallelStats(rank=r, row_bytes=D * b,
                                    send_splits=slots[r].tolist(),
                                    recv_splits=slots[:, r].tolist())
        assert got[r].item() == stats.remote_bytes_sent


def test_bytes_sent_per_rank_sums_to_the_uniform_formula():
    # every rank sends c slots to every expert: exactly uniform routing
    W, E, k, c, D, b = 4, 8, 2, 3, 32, 2
    counts = torch.full((W, E), c)
    placement = torch.arange(E) // (E // W)
    n_tokens = W * E * c // k
    total = bytes_sent_per_rank(counts, placement, D, b, b).sum().item()
    assert total == all_to_all_bytes(n_tokens, k, D, b, world_size=W)


@pytest.mark.parametrize("args,error,match", [
    ((torch.ones(2, 4), torch.zeros(4, dtype=torch.long)), TypeError,
     "counts must be an integer tensor"),
    ((torch.ones(2, 4, dtype=torch.long), torch.zeros(3, dtype=torch.long)),
     ValueError, "one entry per expert"),
    ((torch.ones(2, 4, dtype=torch.long), torch.full((4,), 2)),
     ValueError, r"ranks in \[0, 2\)"),
    ((-torch.ones(2, 4, dtype=torch.long), torch.zeros(4, dtype=torch.long)),
     ValueError, "counts must be >= 0"),
    ((torch.ones(4, dtype=torch.long), torch.zeros(4, dtype=torch.long)),
     ValueError, "counts must be 2-D"),
])
def test_bytes_sent_per_rank_rejects_bad_inputs(args, error, match):
    with pytest.raises(error, match=match):
        bytes_sent_per_rank(*args, 8, 1, 2)

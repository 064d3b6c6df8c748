"""Chapter 14: cross-node traffic (course_lib.node_routing), the
cross-node byte counter of ExpertParallelStats, and the chapter's
workers (course_lib.scaling_experiments) on a pool of 2 ranks.

References are loops over tokens and slots, and the single-process
modules (inside the workers).
"""
import time

import pytest
import torch

from course_lib import scaling_experiments as X
from course_lib.expert_parallel import ExpertParallelStats
from course_lib.node_routing import cross_node_traffic, expert_nodes
from course_lib.parallel_pool import Pool
from course_lib.routing import DeepSeekV3Router


def _loop_traffic(indices, token_node, E, n_nodes):
    per = E // n_nodes
    slots, nodes, used = [], [], []
    for t in range(indices.shape[0]):
        where = {int(e) // per for e in indices[t]}
        home = int(token_node[t])
        slots.append(sum(int(e) // per != home for e in indices[t]))
        nodes.append(len(where - {home}))
        used.append(len(where))
    return slots, nodes, used


@pytest.mark.parametrize("E, n_nodes, k", [(16, 4, 4), (256, 8, 8),
                                           (6, 3, 1)])
def test_cross_node_traffic_equals_a_loop(E, n_nodes, k):
    gen = torch.Generator().manual_seed(E)
    N = 50
    indices = torch.rand(N, E, generator=gen).topk(k, -1).indices
    home = torch.randint(0, n_nodes, (N,), generator=gen)
    t = cross_node_traffic(indices, home, n_experts=E, n_nodes=n_nodes,
                           row_bytes=3)
    slots, nodes, used = _loop_traffic(indices, home, E, n_nodes)
    assert t.remote_slots.tolist() == slots
    assert t.remote_nodes.tolist() == nodes
    assert t.nodes_per_token.tolist() == used
    assert t.slot_bytes == 3 * sum(slots) and t.node_bytes == 3 * sum(nodes)
    assert (t.remote_nodes <= t.remote_slots).all()


def test_group_limited_routing_bounds_the_nodes_per_token():
    """V3's shape: 256 experts on 8 nodes, k = 8, at most 4 nodes."""
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    for limit, bound in ((4, 4), (2, 2)):
        router = DeepSeekV3Router(16, 256, 8, n_group=8, topk_group=limit)
        router.e_score_correction_bias.normal_(0, 0.1)
        idx = router(x).indices
        t = cross_node_traffic(idx, torch.zeros(512, dtype=torch.long),
                               n_experts=256, n_nodes=8)
        assert int(t.nodes_per_token.max()) <= bound
    free = DeepSeekV3Router(16, 256, 8)(x).indices
    t = cross_node_traffic(free, torch.zeros(512, dtype=torch.long),
                           n_experts=256, n_nodes=8)
    assert int(t.nodes_per_token.max()) > 4          # the limit matters


def test_node_routing_rejects_bad_arguments():
    idx = torch.zeros(3, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="n_nodes must divide "
                       "n_experts=8, got 3"):
        expert_nodes(idx, 8, 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        expert_nodes(idx.float(), 8, 2)
    with pytest.raises(ValueError, match=r"token_node must be a tensor of "
                       r"shape \(3,\)"):
        cross_node_traffic(idx, torch.zeros(4, dtype=torch.long),
                           n_experts=8, n_nodes=2)


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


@pytest.mark.distributed
def test_chapter_workers_on_a_pool_of_two():
    """The chapter's workers against the single-process modules (the
    diffs they report) and the byte formulas, in one pool."""
    with Pool(2, timeout=90) as pool:          # generous start-up
        start = time.monotonic()
        tp = pool.run(X.tensor_parallel_run, 2)
        for r in tp:
            for block in ("ffn", "attention"):
                b = r[block]
                assert b["out_diff"] < 1e-5 and b["grad_diff"] < 1e-5
                # one all-reduce of B T D float32 numbers each way
                assert b["forward_all_reduce"] == [2 * 16 * 64 * 4]
                assert b["backward_all_reduce"] == [2 * 16 * 64 * 4]
        assert tp[0]["ffn"]["params"] * 2 == tp[0]["ffn"]["params_full"]
        ep = pool.run(X.expert_parallel_run, 2, n_tokens=16)
        assert all(r["max_diff"] < 1e-5 for r in ep)
        sent = sum(r["stats"][0].bytes_sent for r in ep)
        assert sent == 2 * (2 * 16) * 2 * 32 * 4       # 2 N k D b
        # a sub-group of size 1 inside the pool: rank 1 sits out
        assert pool.run(X.expert_parallel_run, 1, n_tokens=8)[1] is None
        nl = pool.run(X.node_limited_run, 2, limited=True, topk_group=1)
        assert all(r["max_diff"] < 1e-5 for r in nl)
        assert all(int(r["traffic"].remote_nodes.max()) <= 1 for r in nl)
        assert sum(r["cross_node_bytes"] for r in nl) == \
            2 * sum(r["traffic"].slot_bytes for r in nl)
        imb = pool.run(X.imbalance_run, 2, skew=3.0, steps=30, gamma=0.01,
                       repeats=1, n_tokens=128, d_model=32, d_expert=16)
        before = [r["before"]["served"] for r in imb]
        after = [r["after"]["served"] for r in imb]
        assert before[0] > 2 * before[1]               # rank 0 overloaded
        assert max(after) / min(after) < max(before) / min(before)
        assert sum(before) == sum(after) == 2 * 128 * 2
        assert torch.equal(imb[0]["bias"], imb[1]["bias"])  # same update
        assert time.monotonic() - start < 30   # the calls, not start-up


def test_workers_reject_a_size_larger_than_the_world():
    with pytest.raises(ValueError, match="size must be <= world_size=1, "
                       "got 2"):
        X.tensor_parallel_run(0, 1, 2)

"""Chapter 14: cross-node traffic (course_lib.distributed.node_routing), against a
loop over tokens and slots.
"""
import pytest
import torch

from course_lib.distributed.node_routing import (cross_node_traffic,
                                                 expert_nodes)
from course_lib.model.routing import DeepSeekV3Router


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


@pytest.mark.parametrize("bad", [8, -1])
def test_expert_ids_must_exist(bad):
    indices = torch.tensor([[0, bad], [3, 1]])
    with pytest.raises(ValueError, match="indices"):
        expert_nodes(indices, 8, 2)


def test_token_nodes_must_exist():
    indices = torch.tensor([[0, 5], [3, 1]])
    with pytest.raises(ValueError, match="token_node"):
        cross_node_traffic(indices, torch.tensor([0, 2]), n_experts=8,
                           n_nodes=2)

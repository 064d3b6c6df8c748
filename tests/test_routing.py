"""Tests for course_lib.model.routing (chapter 11)."""
import itertools

import pytest
import torch

from course_lib.model.load_balancing import expert_load
from course_lib.model.routing import (DeepSeekV3Router, Routing, TopKRouter,
                                      group_limited_mask, select_top_k)

torch.manual_seed(123)


# ------------------------------------------------------------ top-k
def test_notes_worked_example_top2_renormalised():
    idx, w = select_top_k(torch.tensor([0.6, 0.3, 0.1]), 2)
    assert idx.tolist() == [0, 1]
    torch.testing.assert_close(w, torch.tensor([2 / 3, 1 / 3]))
    # mixing expert outputs [3, 0] and [0, 6] with these gates -> [2, 2]
    outs = torch.tensor([[3.0, 0.0], [0.0, 6.0], [50.0, 50.0]])
    mixed = (w[:, None] * outs[idx]).sum(0)
    torch.testing.assert_close(mixed, torch.tensor([2.0, 2.0]))


def test_select_top_k_without_normalisation_keeps_raw_probs():
    idx, w = select_top_k(torch.tensor([0.6, 0.3, 0.1]), 1, normalize=False)
    assert idx.tolist() == [0] and w.tolist() == pytest.approx([0.6])


def test_select_top_k_matches_brute_force():
    torch.manual_seed(123)
    probs = torch.rand(20, 6).softmax(-1)
    k = 3
    idx, w = select_top_k(probs, k)
    for t in range(20):
        # brute force: the subset of size k with the largest total
        best = max(itertools.combinations(range(6), k),
                   key=lambda s: sum(probs[t, list(s)]))
        assert sorted(idx[t].tolist()) == sorted(best)
        expect = probs[t, list(idx[t])] / probs[t, list(best)].sum()
        torch.testing.assert_close(w[t], expect)
    torch.testing.assert_close(w.sum(-1), torch.ones(20))


def test_select_top_k_bad_input():
    with pytest.raises(ValueError, match="k must be <= E=3, got 4"):
        select_top_k(torch.rand(3), 4)
    with pytest.raises(ValueError, match="k must be >= 1"):
        select_top_k(torch.rand(3), 0)
    with pytest.raises(ValueError, match="probs must be a tensor"):
        select_top_k([0.5, 0.5], 1)


# ------------------------------------------------------ softmax router
def test_topk_router_is_softmax_then_topk():
    torch.manual_seed(123)
    r = TopKRouter(8, 5, 2)
    x = torch.randn(2, 3, 8)
    out = r(x)
    assert isinstance(out, Routing)
    assert out.indices.shape == (6, 2) and out.probs.shape == (6, 5)
    logits = x.reshape(6, 8) @ r.weight.T
    torch.testing.assert_close(out.logits, logits)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(out.probs, p)
    top = p.topk(2, -1)
    assert torch.equal(out.indices, top.indices)
    torch.testing.assert_close(out.weights,
                               top.values / top.values.sum(-1, keepdim=True))
    dense = out.dense_gates()
    assert (dense > 0).sum(-1).tolist() == [2] * 6
    torch.testing.assert_close(dense.sum(-1), torch.ones(6))


def test_topk_router_bad_input():
    with pytest.raises(ValueError, match="top_k must be <= n_experts=4"):
        TopKRouter(8, 4, 5)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 8\)"):
        TopKRouter(8, 4, 2)(torch.randn(3, 7))


# ------------------------------------------------------ DeepSeek-V3
def _v3(E=8, k=2, **kw):
    torch.manual_seed(123)
    return DeepSeekV3Router(6, E, k, **kw)


def test_v3_router_equations():
    r = _v3(routed_scaling_factor=2.5)
    x = torch.randn(10, 6)
    out = r(x)
    s = torch.sigmoid(x @ r.weight.T)
    torch.testing.assert_close(out.scores, s)
    idx = s.topk(2, -1).indices
    assert torch.equal(out.indices, idx)
    g = s.gather(1, idx)
    torch.testing.assert_close(out.weights,
                               2.5 * g / g.sum(-1, keepdim=True))
    torch.testing.assert_close(out.probs, s / s.sum(-1, keepdim=True))


def test_v3_bias_changes_choice_but_not_gate_values():
    r = _v3(E=4, k=1)
    x = torch.randn(50, 6)
    before = r(x)
    # a large bias on expert 3 makes every token choose it ...
    r.e_score_correction_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 5.0]))
    after = r(x)
    assert (after.indices == 3).all()
    assert not (before.indices == 3).all()
    # ... but the scores the gates come from are unchanged (unbiased s)
    torch.testing.assert_close(after.scores, before.scores)
    rn = _v3(E=4, k=2, norm_topk_prob=False)
    rn.e_score_correction_bias.copy_(torch.tensor([0.0, 0.0, 3.0, 5.0]))
    o = rn(x)
    torch.testing.assert_close(o.weights, o.scores.gather(1, o.indices))
    assert set(o.indices.flatten().tolist()) == {2, 3}


def test_v3_router_computes_in_float32_in_a_bfloat16_model():
    torch.manual_seed(0)
    r16 = DeepSeekV3Router(16, 8, 2, n_group=4, topk_group=2,
                           routed_scaling_factor=2.5).to(torch.bfloat16)
    r32 = DeepSeekV3Router(16, 8, 2, n_group=4, topk_group=2,
                           routed_scaling_factor=2.5)
    r32.weight.data = r16.weight.data.float()     # the same rounded centroids
    u = torch.randn(256, 16).to(torch.bfloat16)
    a, b = r16(u), r32(u.float())
    assert a.logits.dtype == a.scores.dtype == a.weights.dtype == torch.float32
    assert torch.equal(a.indices, b.indices)
    assert torch.equal(a.weights, b.weights)
    # in bfloat16 the affinities would tie or swap for some tokens
    s16 = (u @ r16.weight.T).sigmoid()
    assert not torch.equal(s16.float(), b.scores)


def test_v3_bias_is_a_buffer_not_a_parameter():
    r = _v3()
    names = [n for n, _ in r.named_parameters()]
    assert names == ["weight"]
    assert "e_score_correction_bias" in r.state_dict()
    x = torch.randn(5, 6)
    r(x).weights.sum().backward()
    assert r.e_score_correction_bias.grad is None
    assert r.weight.grad is not None


def test_group_limited_routing_stays_in_chosen_groups():
    torch.manual_seed(123)
    r = DeepSeekV3Router(6, 16, 4, n_group=4, topk_group=2)
    r.e_score_correction_bias.normal_(0, 0.1)
    x = torch.randn(200, 6)
    out = r(x)
    choice = out.scores + r.e_score_correction_bias
    groups = choice.view(200, 4, 4)
    gscore = groups.topk(2, -1).values.sum(-1)               # (N, G)
    for t in range(200):
        kept = set(gscore[t].topk(2).indices.tolist())
        used = {e // 4 for e in out.indices[t].tolist()}
        assert used <= kept
        # and the choice is the top-4 of the eligible experts
        eligible = [e for e in range(16) if e // 4 in kept]
        best = sorted(eligible, key=lambda e: -choice[t, e])[:4]
        assert sorted(out.indices[t].tolist()) == sorted(best)


def test_group_limited_mask_example():
    scores = torch.tensor([[0.9, 0.1, 0.2, 0.3, 0.5, 0.5]])
    m = group_limited_mask(scores, n_group=3, topk_group=1)
    # group sums of top-2: 1.0, 0.5, 1.0 -> first of the tied maximum kept
    assert m.sum().item() == 2
    m2 = group_limited_mask(scores, n_group=3, topk_group=2)
    assert m2.tolist() == [[True, True, False, False, True, True]]
    with pytest.raises(ValueError, match="n_group must divide E=6, got 4"):
        group_limited_mask(scores, n_group=4, topk_group=1)
    with pytest.raises(ValueError, match="topk_group must be <= n_group=3"):
        group_limited_mask(scores, n_group=3, topk_group=4)


def test_v3_router_bad_input():
    with pytest.raises(ValueError, match="n_group must divide"):
        DeepSeekV3Router(6, 8, 2, n_group=3)
    with pytest.raises(ValueError, match="top_k must be <= experts in the"):
        DeepSeekV3Router(6, 8, 3, n_group=4, topk_group=1)
    with pytest.raises(ValueError, match="routed_scaling_factor must be > 0"):
        DeepSeekV3Router(6, 8, 2, routed_scaling_factor=0.0)


# ------------------------------------------------------------ bias update
def test_router_update_bias_in_place_rebalances():
    torch.manual_seed(123)
    r = DeepSeekV3Router(6, 4, 1)
    with torch.no_grad():
        r.weight[0] += 2.0                          # expert 0 dominates
    x = torch.randn(256, 6).abs()
    first = expert_load(r(x).indices, 4)
    for _ in range(300):
        r.update_bias(expert_load(r(x).indices, 4), gamma=0.01)
    last = expert_load(r(x).indices, 4)
    assert first.max() > 2 * last.max()
    assert r.e_score_correction_bias[0] < 0




# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.routing survived the ones above.
# (The messages in full: tests/pins/test_routing_messages.py.)
def _v3_with_scores(s, **kw):
    """A V3 router whose sigmoid affinities for the one-hot token e_0 are
    ``s``: d_model = 1, weight = logit(s)."""
    r = DeepSeekV3Router(1, len(s), **kw)
    with torch.no_grad():
        r.weight.copy_(torch.logit(torch.tensor(s))[:, None])
    return r


def test_v3_two_groups_keep_the_best_group_by_hand():
    # groups {0..3}, {4..7}; group score = sum of its two best affinities:
    # 0.9 + 0.1 = 1.0 against 0.8 + 0.7 = 1.5, so only group 1 is kept
    s = [0.9, 0.1, 0.1, 0.1, 0.8, 0.7, 0.6, 0.5]
    r = _v3_with_scores(s, top_k=2, n_group=2, topk_group=1)
    out = r(torch.ones(1, 1))
    assert sorted(out.indices[0].tolist()) == [4, 5]
    free = _v3_with_scores(s, top_k=2)                  # one group: no limit
    assert sorted(free(torch.ones(1, 1)).indices[0].tolist()) == [0, 4]


def test_router_argument_edges():
    TopKRouter(1, 1, 1)(torch.ones(3, 1))              # smallest sizes
    r = TopKRouter(4, 3, 1)
    assert r(torch.randn(4)).indices.shape == (1, 1)   # one token, 1-D
    for args, name in (((0, 3, 1), "d_model"), ((4, 0, 1), "n_experts")):
        with pytest.raises(ValueError, match=name):
            TopKRouter(*args)
    for x in (torch.zeros(2, 3), [1.0], torch.tensor(1.0)):
        with pytest.raises(ValueError, match=r"^x must have shape"):
            r(x)
    p = torch.tensor([[0.5, 0.3, 0.2]])
    idx, _ = select_top_k(p, 3)                        # k = E is allowed
    assert idx.tolist() == [[0, 1, 2]]


def test_router_init_scale_and_unnormalised_gates():
    torch.manual_seed(0)
    for router in (TopKRouter(256, 64, 2), DeepSeekV3Router(256, 64, 2)):
        assert router.weight.std().item() == pytest.approx(0.02, rel=0.05)
    r = TopKRouter(8, 5, 2, normalize=False)
    x = torch.randn(3, 8)
    out = r(x)
    probs = (x @ r.weight.T).softmax(-1)               # by hand
    top = probs.topk(2, dim=-1)
    torch.testing.assert_close(out.weights, top.values)
    assert torch.equal(out.indices, top.indices)


def test_group_limited_mask_and_v3_edges():
    s = torch.rand(2, 8)
    assert group_limited_mask(s, n_group=1, topk_group=1).all()
    assert group_limited_mask(s, n_group=4, topk_group=4).all()
    with pytest.raises(ValueError, match="scores must be a tensor"):
        group_limited_mask([1], n_group=1, topk_group=1)
    for kw, name in ((dict(n_group=0, topk_group=1), "n_group"),
                     (dict(n_group=2, topk_group=0), "topk_group")):
        with pytest.raises(ValueError, match=name):
            group_limited_mask(s, **kw)
        with pytest.raises(ValueError, match=name):
            DeepSeekV3Router(4, 8, 2, **kw)
    DeepSeekV3Router(4, 8, 4, n_group=4, topk_group=2)  # top_k = 2 * 2
    with pytest.raises(ValueError, match="top_k must be <= experts in the "
                       "kept groups"):
        DeepSeekV3Router(4, 8, 5, n_group=4, topk_group=2)


def test_group_limited_mask_one_expert_per_group_and_device(device_spy):
    # groups of one expert: a group's score is that expert's score
    s = torch.tensor([[0.1, 0.9, 0.3, 0.8]])
    keep = group_limited_mask(s, n_group=4, topk_group=2)
    assert keep.tolist() == [[False, True, False, True]]
    # the mask is built on the scores' device (a spy: only a CPU here)
    from course_lib.model import routing as R
    asked = device_spy(R, "zeros")
    group_limited_mask(s, n_group=2, topk_group=1)
    assert asked == [s.device]


# ------------------------------------------- flags, sizes and bad scores
def test_routers_reject_string_flags_and_huge_sizes():
    p = torch.tensor([[0.6, 0.3, 0.1]])
    with pytest.raises(TypeError, match="normalize"):
        select_top_k(p, 2, normalize="False")
    with pytest.raises(TypeError, match="normalize"):
        TopKRouter(8, 6, 2, normalize="False")
    with pytest.raises(TypeError, match="norm_topk_prob"):
        DeepSeekV3Router(8, 6, 2, norm_topk_prob="False")
    with pytest.raises(ValueError, match="d_model"):
        TopKRouter(10**9, 6, 2)


@pytest.mark.parametrize("bad", [float("nan"), -0.1])
def test_select_top_k_rejects_nan_and_negative_probs(bad):
    with pytest.raises(ValueError, match="probs"):
        select_top_k(torch.tensor([[0.5, bad, 0.2, 0.3]]), 2)


def test_group_limited_mask_rejects_nan_scores():
    with pytest.raises(ValueError, match="scores"):
        group_limited_mask(torch.tensor([[float("nan"), .1, .2, .3]]),
                           n_group=2, topk_group=1)


# ------------------------------------------------------------ as functions
@pytest.mark.parametrize("E,k,n_group,topk_group,scale", [
    (8, 2, 1, 1, 1.0), (8, 2, 4, 2, 2.5), (16, 4, 8, 4, 2.5),
    (6, 3, 3, 3, 1.0)])
def test_deepseek_v3_gates_equal_the_router(E, k, n_group, topk_group,
                                            scale):
    from course_lib.model.routing import deepseek_v3_gates
    torch.manual_seed(E + k)
    router = DeepSeekV3Router(12, E, k, n_group=n_group,
                              topk_group=topk_group,
                              routed_scaling_factor=scale)
    router.e_score_correction_bias.copy_(0.3 * torch.randn(E))
    r = router(torch.randn(20, 12))
    got = deepseek_v3_gates(r.scores, router.e_score_correction_bias, k,
                            n_group, topk_group, scale)
    torch.testing.assert_close(got, r.dense_gates())
    # the gates come from the unbiased scores: each row sums to scale
    torch.testing.assert_close(got.sum(-1), torch.full((20,), scale))


def test_deepseek_v3_gates_loop_form():
    """Group scores, group choice and top-k written out token by token."""
    from course_lib.model.routing import deepseek_v3_gates
    gen = torch.Generator().manual_seed(3)
    s, b = torch.rand(7, 12, generator=gen), torch.randn(12, generator=gen)
    got = deepseek_v3_gates(s, b, 3, 4, 2, 2.0)
    for t in range(7):
        c = (s[t] + b).tolist()
        groups = [sorted(c[3 * g:3 * g + 3], reverse=True)[:2]
                  for g in range(4)]
        best = sorted(range(4), key=lambda g: -sum(groups[g]))[:2]
        pool = [i for i in range(12) if i // 3 in best]
        chosen = sorted(pool, key=lambda i: -c[i])[:3]
        total = sum(s[t, i].item() for i in chosen)
        want = [2.0 * s[t, i].item() / total if i in chosen else 0.0
                for i in range(12)]
        assert got[t].tolist() == pytest.approx(want, abs=1e-6)


def test_deepseek_v3_gates_bad_input():
    from course_lib.model.routing import deepseek_v3_gates
    s, b = torch.rand(3, 8), torch.zeros(8)
    with pytest.raises(ValueError):
        deepseek_v3_gates(s[0], b, 2, 1, 1, 1.0)          # not (N, E)
    with pytest.raises(ValueError):
        deepseek_v3_gates(s, torch.zeros(7), 2, 1, 1, 1.0)
    with pytest.raises(ValueError):
        deepseek_v3_gates(s, b, 2, 3, 1, 1.0)             # 3 does not divide 8
    with pytest.raises(ValueError):
        deepseek_v3_gates(s, b, 5, 4, 2, 1.0)             # k > 2 groups x 2
    with pytest.raises((TypeError, ValueError)):
        deepseek_v3_gates(s, b, 2, 1, 1, "2.5")


def test_expert_choice_gates_loop_form():
    from course_lib.model.routing import expert_choice_gates
    gen = torch.Generator().manual_seed(5)
    probs = torch.rand(2, 9, 4, generator=gen).softmax(-1)
    got = expert_choice_gates(probs, 3)
    for b in range(2):
        for i in range(4):
            col = probs[b, :, i].tolist()
            top = sorted(range(9), key=lambda t: -col[t])[:3]
            want = [col[t] if t in top else 0.0 for t in range(9)]
            assert got[b, :, i].tolist() == pytest.approx(want)
    # every expert takes exactly `capacity` tokens; none overflows
    assert ((got > 0).sum(-2) == 3).all()


def test_expert_choice_gates_edges():
    from course_lib.model.routing import expert_choice_gates
    probs = torch.rand(5, 3).softmax(-1)
    torch.testing.assert_close(expert_choice_gates(probs, 5), probs)
    one = expert_choice_gates(probs, 1)
    assert ((one > 0).sum(0) == 1).all()
    assert one.argmax(0).tolist() == probs.argmax(0).tolist()
    for bad in (0, 6):
        with pytest.raises(ValueError):
            expert_choice_gates(probs, bad)
    with pytest.raises(ValueError):
        expert_choice_gates(probs[0], 1)                  # not (..., N, E)
    with pytest.raises(ValueError):
        expert_choice_gates(torch.full((3, 2), float("nan")), 1)
    with pytest.raises((TypeError, ValueError)):
        expert_choice_gates(probs, 1.5)

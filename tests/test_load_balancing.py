"""Tests for course_lib.model.load_balancing (chapter 11)."""
import pytest
import torch

from course_lib.model.load_balancing import (expert_load, load_balancing_loss,
                                             update_bias)

torch.manual_seed(123)


def test_expert_load_counts_slots():
    idx = torch.tensor([[0, 1], [1, 2], [1, 0]])
    assert expert_load(idx, 4).tolist() == [2, 3, 1, 0]
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 2\)"):
        expert_load(idx, 2)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        expert_load(idx.float(), 4)


def test_load_balancing_loss_hand_computed():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]])
    idx = torch.tensor([[0, 1], [1, 2]])
    # f = [1, 2, 1] / 4 ; P = [0.4, 0.4, 0.2]
    expect = 3 * (0.25 * 0.4 + 0.5 * 0.4 + 0.25 * 0.2)
    assert load_balancing_loss(probs, idx, 3).item() == pytest.approx(expect)
    # top-1, everything on expert 0 with probability 1: loss = E
    p1 = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    i1 = torch.tensor([[0], [0]])
    assert load_balancing_loss(p1, i1, 2).item() == pytest.approx(2.0)


def test_load_balancing_loss_is_one_for_uniform_router():
    torch.manual_seed(123)
    E = 8
    probs = torch.full((64, E), 1 / E)
    for k in (1, 2, 3):
        idx = torch.stack([torch.randperm(E)[:k] for _ in range(64)])
        assert load_balancing_loss(probs, idx, E).item() == pytest.approx(1.0)


def test_load_balancing_loss_per_sequence_mean_and_gradient():
    torch.manual_seed(123)
    logits = torch.randn(2, 5, 4, requires_grad=True)
    probs = logits.softmax(-1)
    idx = probs.topk(2, -1).indices
    loss = load_balancing_loss(probs, idx, 4)
    each = [load_balancing_loss(probs[b], idx[b], 4) for b in range(2)]
    torch.testing.assert_close(loss, (each[0] + each[1]) / 2)
    loss.backward()
    assert logits.grad.abs().sum() > 0


def test_load_balancing_loss_bad_input():
    with pytest.raises(ValueError, match=r"probs must have shape \(N, 3\)"):
        load_balancing_loss(torch.rand(4, 2), torch.zeros(4, 1).long(), 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        load_balancing_loss(torch.rand(4, 3), torch.zeros(5, 1).long(), 3)


def test_update_bias_sign_rule():
    b = torch.zeros(4)
    load = torch.tensor([10, 2, 4, 4])            # mean 5
    new = update_bias(b, load, gamma=0.1)
    torch.testing.assert_close(new, torch.tensor([-0.1, 0.1, 0.1, 0.1]))
    assert b.tolist() == [0.0] * 4                 # input not modified
    balanced = update_bias(b, torch.tensor([3, 3, 3, 3]), gamma=0.1)
    assert balanced.tolist() == [0.0] * 4


def test_update_bias_bad_input():
    with pytest.raises(ValueError, match="gamma must be >= 0, got -1"):
        update_bias(torch.zeros(3), torch.zeros(3), gamma=-1.0)
    with pytest.raises(ValueError, match=r"load must have shape \(3,\)"):
        update_bias(torch.zeros(3), torch.zeros(4), gamma=0.1)


# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.load_balancing survived the
# ones above. (The messages in full:
# tests/pins/test_load_balancing_messages.py.)
def test_expert_load_edges():
    # the highest expert id, E - 1, is valid; leading dims are flattened
    idx = torch.tensor([[[2], [2]], [[0], [2]]])               # (2, 2, 1)
    assert expert_load(idx, 3).tolist() == [1, 0, 3]
    assert expert_load(torch.zeros(0, 2, dtype=torch.long), 1).tolist() \
        == [0]                                   # no tokens, E = 1 allowed
    with pytest.raises(ValueError, match="indices must lie in"):
        expert_load(torch.tensor([[2], [-1]]), 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        expert_load([0, 1], 3)
    with pytest.raises(ValueError, match="n_experts"):
        expert_load(torch.tensor([0]), 0)


def test_load_balancing_loss_no_tokens_and_one_expert():
    z = load_balancing_loss(torch.zeros(0, 3), torch.zeros(0, 2,
                                                           dtype=torch.long), 3)
    assert z.shape == () and z.item() == 0.0
    zb = load_balancing_loss(torch.zeros(2, 0, 3),
                             torch.zeros(2, 0, 1, dtype=torch.long), 3)
    assert zb.shape == () and zb.item() == 0.0
    # E = 1: every slot on the only expert, probability 1: loss 1 * 1 * 1
    one = load_balancing_loss(torch.ones(4, 1), torch.zeros(4, 1,
                                                            dtype=torch.long), 1)
    assert one.item() == 1.0
    with pytest.raises(ValueError, match="probs must have shape"):
        load_balancing_loss(torch.rand(2, 3, 4, 3),
                            torch.zeros(2, 3, 4, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="probs must have shape"):
        load_balancing_loss(torch.rand(4), torch.zeros(4, 1,
                                                       dtype=torch.long), 3)
    with pytest.raises(ValueError, match="probs must have shape"):
        load_balancing_loss("p", torch.zeros(4, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        load_balancing_loss(torch.rand(2, 4, 3),
                            torch.zeros(2, 5, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        load_balancing_loss(torch.rand(4, 3), torch.zeros(4, 1), 3)
    with pytest.raises(ValueError, match="indices must be a long tensor"):
        load_balancing_loss(torch.rand(4, 3), "i", 3)
    with pytest.raises(ValueError, match=r"^indices must lie in \[0, 3\)"):
        load_balancing_loss(torch.rand(1, 3), torch.tensor([[3]]), 3)
    with pytest.raises(ValueError, match="n_experts"):
        load_balancing_loss(torch.rand(1, 3), torch.tensor([[0]]), 0)


def test_load_balancing_loss_by_hand_per_sequence():
    # (B, T, E) = (2, 2, 2), k = 1: E sum_i f_i P_i per sequence, then mean
    probs = torch.tensor([[[0.9, 0.1], [0.8, 0.2]],
                          [[0.5, 0.5], [0.3, 0.7]]], dtype=torch.float64)
    idx = torch.tensor([[[0], [0]], [[0], [1]]])
    seq0 = 2 * (1.0 * 0.85 + 0.0 * 0.15)
    seq1 = 2 * (0.5 * 0.4 + 0.5 * 0.6)
    loss = load_balancing_loss(probs, idx, 2)
    assert loss.item() == pytest.approx((seq0 + seq1) / 2, abs=1e-12)


def test_update_bias_gamma_zero_and_dtypes():
    b = torch.tensor([0.5, -0.5, 0.0], dtype=torch.float64)
    load = torch.tensor([1, 7, 1])                      # long, mean 3
    assert torch.equal(update_bias(b, load, gamma=0.0), b)
    new = update_bias(b, load, gamma=0.25)
    assert new.dtype == torch.float64
    assert new.tolist() == [0.75, -0.75, 0.25]
    # a load whose mean is not an integer: 1, 2 -> mean 1.5, not 1
    assert update_bias(torch.zeros(2), torch.tensor([1, 2]),
                       gamma=1.0).tolist() == [1.0, -1.0]
    with pytest.raises(TypeError, match=r"^gamma must be a real number"):
        update_bias(b, load, gamma="0.1")
    with pytest.raises(ValueError, match="bias must be a 1-D tensor"):
        update_bias(torch.zeros(1, 1), torch.zeros(1), gamma=0.1)
    with pytest.raises(ValueError, match="load must be a 1-D tensor"):
        update_bias(torch.zeros(2), [1, 2], gamma=0.1)
    with pytest.raises(ValueError, match="load must have shape"):
        update_bias(torch.zeros(3), torch.zeros(4), gamma=0.1)


def test_load_balancing_loss_counts_every_expert_even_unchosen_ones():
    # all slots on expert 0 of E = 3, probability spread: f = (1, 0, 0),
    # P = (0.5, 0.3, 0.2), loss = 3 * 1 * 0.5
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]])
    idx = torch.tensor([[0], [0]])
    assert load_balancing_loss(probs, idx, 3).item() == pytest.approx(1.5)


@pytest.mark.parametrize("bad", [float("nan"), -1.0])
def test_update_bias_rejects_nan_and_negative_loads(bad):
    from course_lib.model.routing import DeepSeekV3Router
    load = torch.tensor([3.0, bad, 0.0, 2.0])
    with pytest.raises(ValueError, match="load"):
        update_bias(torch.zeros(4), load, gamma=0.01)
    router = DeepSeekV3Router(8, 4, 2)
    with pytest.raises(ValueError, match="load"):
        router.update_bias(load, gamma=0.01)


def test_load_balancing_loss_needs_a_chosen_expert_per_token():
    probs = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="indices"):
        load_balancing_loss(probs, torch.zeros(3, 0, dtype=torch.long), 4)


@pytest.mark.parametrize("shape", [(4, 0), (2, 3, 0)])
def test_loss_refuses_tokens_that_choose_no_expert(shape):
    # f_i would be 0 / 0; (B, T, k) batches are refused like (N, k) ones
    probs = torch.full(shape[:-1] + (5,), 0.2)
    with pytest.raises(ValueError, match="k >= 1"):
        load_balancing_loss(probs, torch.zeros(shape, dtype=torch.long), 5)

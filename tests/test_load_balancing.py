"""Tests for course_lib.load_balancing (chapter 11)."""
import pytest
import torch

from course_lib.load_balancing import (expert_load, load_balancing_loss,
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

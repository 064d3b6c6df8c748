"""Pins: the exact wording of error messages of
course_lib.model.load_balancing. They keep messages from changing by
accident; the behaviour itself is specified in
tests/test_load_balancing.py.

Found by mutation testing (benchmarks/mutation.md, "load_balancing
survivors and why"): a mutant that changes only a message is killed
here, so `make mutation` runs this file with the behaviour tests
([tool.mutmut] in pyproject.toml). Each test is the message part of a
test in tests/test_load_balancing.py, which checks the same calls with a
short match.
"""
import pytest
import torch

from course_lib.model.load_balancing import (expert_load, load_balancing_loss,
                                             update_bias)


# from test_expert_load_edges (formerly test_expert_load_edges_and_messages)
def test_expert_load_messages():
    with pytest.raises(ValueError, match=r"^indices must lie in \[0, 3\), got "
                       r"values in \[-1, 2\]$"):
        expert_load(torch.tensor([[2], [-1]]), 3)
    with pytest.raises(ValueError, match=r"^indices must be a long tensor, got "
                       r"\[0, 1\]$"):
        expert_load([0, 1], 3)
    with pytest.raises(ValueError, match=r"^n_experts must be >= 1, got 0$"):
        expert_load(torch.tensor([0]), 0)


# from test_load_balancing_loss_no_tokens_and_one_expert (formerly
# test_load_balancing_loss_no_tokens_one_expert_and_messages)
def test_load_balancing_loss_messages():
    with pytest.raises(ValueError, match=r"^probs must have shape \(N, 3\) or "
                       r"\(B, T, 3\), got \(2, 3, 4, 3\)$"):
        load_balancing_loss(torch.rand(2, 3, 4, 3),
                            torch.zeros(2, 3, 4, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"^probs must have shape \(N, 3\) or "
                       r"\(B, T, 3\), got \(4,\)$"):
        load_balancing_loss(torch.rand(4), torch.zeros(4, 1,
                                                       dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"^probs must have shape .* got "
                       r"'p'$"):
        load_balancing_loss("p", torch.zeros(4, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"^indices must be a long tensor of "
                       r"shape \(2, 4\) \+ \(k,\), got \(2, 5, 1\)$"):
        load_balancing_loss(torch.rand(2, 4, 3),
                            torch.zeros(2, 5, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"^indices must be a long tensor of "
                       r"shape \(4,\) \+ \(k,\), got \(4, 1\)$"):
        load_balancing_loss(torch.rand(4, 3), torch.zeros(4, 1), 3)
    with pytest.raises(ValueError, match=r"^indices must be a long tensor of "
                       r"shape \(4,\) \+ \(k,\), got 'i'$"):
        load_balancing_loss(torch.rand(4, 3), "i", 3)
    with pytest.raises(ValueError, match=r"^n_experts must be >= 1, got 0$"):
        load_balancing_loss(torch.rand(1, 3), torch.tensor([[0]]), 0)


# from test_update_bias_gamma_zero_and_dtypes (formerly
# test_update_bias_gamma_zero_dtypes_and_messages)
def test_update_bias_messages():
    with pytest.raises(ValueError, match=r"^bias must be a 1-D tensor \(E,\), "
                       r"got tensor\(\[\[0\.\]\]\)$"):
        update_bias(torch.zeros(1, 1), torch.zeros(1), gamma=0.1)
    with pytest.raises(ValueError, match=r"^load must be a 1-D tensor \(E,\), "
                       r"got \[1, 2\]$"):
        update_bias(torch.zeros(2), [1, 2], gamma=0.1)
    with pytest.raises(ValueError, match=r"^load must have shape \(3,\), got "
                       r"\(4,\)$"):
        update_bias(torch.zeros(3), torch.zeros(4), gamma=0.1)

"""Pins: the exact wording of error messages of course_lib.model.moe.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_moe.py.

Found by mutation testing (benchmarks/mutation.md, "MoE survivors and
why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.model.moe import (MoE, expected_fraction_touched,
                                  expert_capacity)
from test_moe import _moe


@pytest.mark.parametrize("call, message", [
    (lambda: expert_capacity(-1, 4, 2, 1.0), "n_tokens must be >= 0, got -1"),
    (lambda: expert_capacity(4, 0, 2, 1.0), "n_experts must be >= 1, got 0"),
    (lambda: expert_capacity(4, 4, 0, 1.0), "top_k must be >= 1, got 0"),
    (lambda: expected_fraction_touched(-1, 4, 2),
     "n_tokens must be >= 0, got -1"),
    (lambda: expected_fraction_touched(4, 0, 1),
     "n_experts must be >= 1, got 0"),
    (lambda: MoE(0, n_experts=4, top_k=2, d_expert=4),
     "d_model must be >= 1, got 0"),
    (lambda: MoE(16, n_experts=4, top_k=2, d_expert=0),
     "d_expert must be >= 1, got 0"),
])
def test_size_messages_name_the_argument(call, message):
    with pytest.raises(ValueError, match="^" + message + "$"):
        call()


@pytest.mark.parametrize("x, got", [
    ([1.0, 2.0], r"\[1.0, 2.0\]"),                  # not a tensor
    (torch.randn(16), r"\(16,\)"),                  # no token axis
    (torch.randn(3, 5, 15), r"\(3, 5, 15\)"),       # wrong width
])
def test_bad_x_message_shows_what_was_given(x, got):
    with pytest.raises(ValueError, match=r"^x must have shape \(B, T, 16\) "
                       r"or \(N, 16\), got " + got + "$"):
        _moe()(x)

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


def test_config_and_layer_messages_in_full():
    from course_lib.model.moe import moe_from_config, moe_infos
    from course_lib.sizing.configs import DEEPSEEK_V3
    with pytest.raises(ValueError, match=r"^n_experts must be >= 1, got 0$"):
        MoE(16, n_experts=0, top_k=1, d_expert=4)
    with pytest.raises(ValueError, match=r"^\(n_experts \+ "
                       r"n_shared_experts\) \* 3 \* d_model \* d_expert asks "
                       r"for 320,000,096 values \(1.2 GiB as float32\), more "
                       r"than the 268,435,456 one call may allocate$"):
        MoE(8, n_experts=4, top_k=2, d_expert=10**7 // 3 + 1)

    class Bad:
        hidden_size, n_routed_experts, num_experts_per_tok = 0, 4, 2
        moe_intermediate_size = 8

    with pytest.raises(ValueError, match=r"^config.hidden_size must be >= 1,"
                       r" got 0$"):
        moe_from_config(Bad())
    # DeepSeek-V3: 257 SwiGLUs of 3 x 7168 x 2048 plus the 256 x 7168 router
    with pytest.raises(ValueError, match=r"^config describes an MoE layer "
                       r"of 11,320,164,352 parameters \(42.2 GiB in "
                       r"float32\), more than the 268,435,456 one layer may "
                       r"allocate; "):
        moe_from_config(DEEPSEEK_V3)
    with pytest.raises(ValueError, match=r"^the MoE layers model have not "
                       r"run a forward yet: call model\(x\) first$"):
        moe_infos(MoE(16, n_experts=4, top_k=2, d_expert=4))

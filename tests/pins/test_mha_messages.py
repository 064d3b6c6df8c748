"""Pins: the exact wording of error messages of course_lib.model.mha.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_mha.py.

Found by mutation testing (benchmarks/mutation.md, "mha survivors and
why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.model.mha import MultiHeadAttention
from course_lib.model.rope import RotaryEmbedding
from errors import whole_message


def test_mha_messages_in_full():
    from course_lib.model.kv_cache import LayerKVCache

    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    for call, message in (
            (lambda: mha(torch.randn(2, 5, 8)),
             "x must have shape (B, T, d_model=16), got (2, 5, 8)"),
            (lambda: mha(x, context=torch.randn(3, 4, 16)),
             "context must have shape (B=2, S, d_model=16), got (3, 4, 16)"),
            (lambda: mha(x, context=x, cache=LayerKVCache()),
             "cache is for self-attention: pass context=None with a cache")):
        with pytest.raises(ValueError, match=whole_message(message)):
            call()
    with pytest.raises(ValueError, match=r"^rope.head_dim must be 4, got 8$"):
        MultiHeadAttention(8, 2, rope=RotaryEmbedding(8))


def test_flag_rope_and_mask_messages_in_full():
    with pytest.raises(TypeError, match=whole_message(
            "bias must be a bool, got str 'no'")):
        MultiHeadAttention(16, 2, bias="no")
    with pytest.raises(TypeError, match=whole_message(
            "rope must be a RotaryEmbedding, got str")):
        MultiHeadAttention(16, 2, rope="r")
    mha = MultiHeadAttention(16, 2)
    with pytest.raises(ValueError, match=whole_message(
            "mask of shape (3, 5, 5) does not broadcast to (2, 2, 5, 5); "
            "expected (T, S), (B, 1, S), (B, T, S) or (B, H, T, S)")):
        mha(torch.randn(2, 5, 16), mask=torch.ones(3, 5, 5, dtype=torch.bool))

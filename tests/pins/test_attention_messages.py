"""Pins: the exact wording of error messages of course_lib.model.attention.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_attention.py.

Found by mutation testing (benchmarks/mutation.md, "attention survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.model import attention
from errors import whole_message


# Split from test_attention.py's
# test_fused_attention_checks_its_mask_and_scale_without_gqa.
def test_fused_attention_unbatched_mask_message():
    q, k, v = torch.randn(5, 8), torch.randn(7, 8), torch.randn(7, 6)
    # an unbatched call: a batched mask would silently add a batch axis
    with pytest.raises(ValueError, match=whole_message(
            "mask of shape (3, 5, 7) does not broadcast to the scores "
            "(..., Lq, Lk) = (5, 7)")):
        attention.fused_attention(q, k, v, torch.ones(3, 5, 7, dtype=torch.bool))

"""mha.grouped_query_attention against torch's GQA kernel, a loop over
query heads, and MultiHeadAttention with n_kv_heads."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.model.masks import causal_mask
from course_lib.model.mha import MultiHeadAttention, grouped_query_attention


def _loop(q, k, v, mask):
    B, H, T, d = q.shape
    r = H // k.shape[1]
    out = torch.empty(B, H, T, v.shape[-1], dtype=q.dtype)
    for i in range(H):
        s = q[:, i] @ k[:, i // r].transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        out[:, i] = torch.softmax(s, -1) @ v[:, i // r]
    return out


@pytest.mark.parametrize("B,H,G,T,S,masked", [
    (2, 8, 2, 5, 5, True), (1, 4, 1, 3, 7, True), (3, 6, 6, 4, 4, False),
    (2, 6, 3, 1, 9, False), (1, 2, 1, 1, 1, False)])
def test_grouped_query_attention_references(B, H, G, T, S, masked):
    gen = torch.Generator().manual_seed(H * 100 + G * 10 + T)
    q = torch.randn(B, H, T, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(B, G, S, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(B, G, S, 5, generator=gen, dtype=torch.float64)
    mask = causal_mask(T, S) if masked else None
    got = grouped_query_attention(q, k, v, mask)
    assert got.shape == (B, H, T, 5)
    torch.testing.assert_close(got, _loop(q, k, v, mask))
    torch.testing.assert_close(got, F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True))


def test_grouped_query_attention_is_the_module():
    torch.manual_seed(0)
    layer = MultiHeadAttention(32, 8, n_kv_heads=2, bias=False)
    x = torch.randn(2, 6, 32)
    from course_lib.model.mha import merge_heads, split_heads
    q = split_heads(layer.q_proj(x), 8)
    k, v = split_heads(layer.k_proj(x), 2), split_heads(layer.v_proj(x), 2)
    out = layer.o_proj(merge_heads(
        grouped_query_attention(q, k, v, causal_mask(6))))
    torch.testing.assert_close(out, layer(x, causal_mask(6)))


def test_grouped_query_attention_rejects_bad_groups():
    q = torch.randn(1, 6, 3, 4)
    with pytest.raises(ValueError, match="multiple"):
        grouped_query_attention(q, torch.randn(1, 4, 3, 4),
                                torch.randn(1, 4, 3, 4))
    with pytest.raises(TypeError, match="k"):
        grouped_query_attention(q, None, q)

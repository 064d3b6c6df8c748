"""block.rms_norm and qk_norm.qk_norm_attention against torch's own
F.rms_norm and fused attention, and against a loop over heads."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.model import block
from course_lib.model.masks import causal_mask
from course_lib.model.qk_norm import qk_norm_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_torch(dtype):
    gen = torch.Generator().manual_seed(0)
    x = (3 * torch.randn(2, 5, 16, generator=gen) + 0.5).to(dtype)
    w = (1 + torch.randn(16, generator=gen)).to(dtype)
    got = block.rms_norm(x, w, 1e-5)
    ref = F.rms_norm(x, (16,), w, eps=1e-5)
    assert got.dtype == dtype
    torch.testing.assert_close(got, ref)


def test_rms_norm_is_the_module_forward():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = (300 * torch.randn(3, 8, generator=gen)).to(dtype)
        norm = block.RMSNorm(8, eps=1e-6).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(1 + torch.randn(8, generator=gen))
            assert torch.equal(block.rms_norm(x, norm.weight, 1e-6), norm(x))
        assert torch.isfinite(block.rms_norm(x, norm.weight)).all()


def test_rms_norm_zero_vector_and_errors():
    out = block.rms_norm(torch.zeros(2, 4), torch.ones(4), 1e-6)
    assert torch.equal(out, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="weight"):
        block.rms_norm(torch.randn(2, 4), torch.ones(3))
    with pytest.raises(ValueError, match="eps"):
        block.rms_norm(torch.randn(2, 4), torch.ones(4), 0.0)
    with pytest.raises(TypeError, match="x"):
        block.rms_norm([1.0, 2.0], torch.ones(2))


def _loop_reference(q, k, v, gq, gk, mask, eps):
    """Head by head, row by row, from the formula."""
    B, H, T, d = q.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=q.dtype)
    for b in range(B):
        for h in range(H):
            for t in range(T):
                qh = gq * q[b, h, t] / torch.sqrt(q[b, h, t].pow(2).mean()
                                                  + eps)
                kh = gk * k[b, h] / torch.sqrt(
                    k[b, h].pow(2).mean(-1, keepdim=True) + eps)
                s = kh @ qh / math.sqrt(d)                       # (S,)
                if mask is not None:
                    s = s.masked_fill(~mask[t], float("-inf"))
                out[b, h, t] = torch.softmax(s, -1) @ v[b, h]
    return out


@pytest.mark.parametrize("T,S,masked", [(4, 4, False), (3, 6, True),
                                        (1, 1, False), (5, 5, True)])
def test_qk_norm_attention_matches_loop_and_fused(T, S, masked):
    gen = torch.Generator().manual_seed(T * 10 + S)
    B, H, d = 2, 3, 8
    q = 4 * torch.randn(B, H, T, d, generator=gen, dtype=torch.float64)
    k = 4 * torch.randn(B, H, S, d, generator=gen, dtype=torch.float64)
    v = torch.randn(B, H, S, 5, generator=gen, dtype=torch.float64)
    gq = 1 + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64)
    gk = 1 + 0.3 * torch.randn(d, generator=gen, dtype=torch.float64)
    mask = causal_mask(T, S) if masked else None
    got = qk_norm_attention(q, k, v, gq, gk, mask, eps=1e-6)
    torch.testing.assert_close(
        got, _loop_reference(q, k, v, gq, gk, mask, 1e-6))
    fused = F.scaled_dot_product_attention(
        F.rms_norm(q, (d,), gq, eps=1e-6), F.rms_norm(k, (d,), gk, eps=1e-6),
        v, attn_mask=mask)
    torch.testing.assert_close(got, fused)


def test_qk_norm_bounds_the_scores():
    """Unit gains: scores within [-sqrt(d_k), sqrt(d_k)] at any input size,
    so scaling q and k up changes nothing."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = torch.randn(3, 1, 2, 6, 16, generator=gen,
                          dtype=torch.float64).unbind(0)
    ones = torch.ones(16, dtype=torch.float64)
    a = qk_norm_attention(q, k, v, ones, ones, eps=1e-12)
    b = qk_norm_attention(1000 * q, 1000 * k, v, ones, ones, eps=1e-12)
    torch.testing.assert_close(a, b)
    unit = block.rms_norm(1000 * q, ones, 1e-12)
    assert torch.allclose(unit.norm(dim=-1), torch.tensor(4.0,
                                                          dtype=unit.dtype))


def test_qk_norm_attention_rejects_bad_gains():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="q_weight"):
        qk_norm_attention(q, q, q, torch.ones(3), torch.ones(4))
    with pytest.raises(TypeError, match="k_weight"):
        qk_norm_attention(q, q, q, torch.ones(4), [1.0] * 4)

"""Tests for course_lib.model.online_softmax (chapter 3), and the memory
profile of chapter 3's cost section (course_lib.experiments.attention_cost).

References used: the explicit softmax(Q K^T / sqrt(d_k)) V written out here,
course_lib's explicit path with causal_mask,
torch.nn.functional.scaled_dot_product_attention (is_causal when Lq == Lk),
and a plain Python loop over the scores of one row for the running
statistics.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.experiments import attention_cost
from course_lib.model import attention, masks
from course_lib.model.online_softmax import tiled_attend, tiled_attention
from errors import whole_message


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(321)


def _qkv(*batch, lq=7, lk=7, d_k=8, d_v=5, dtype=torch.float64):
    return (torch.randn(*batch, lq, d_k, dtype=dtype),
            torch.randn(*batch, lk, d_k, dtype=dtype),
            torch.randn(*batch, lk, d_v, dtype=dtype))


def _explicit(q, k, v, mask=None):
    """softmax(Q K^T / sqrt(d_k) + M) V, written out."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# block sizes that divide L = 12, that do not, and >= L
@pytest.mark.parametrize("block_size", [1, 3, 4, 5, 7, 12, 13, 100])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_explicit_and_torch_float64(block_size, is_causal):
    q, k, v = _qkv(2, 3, lq=12, lk=12)
    out = tiled_attention(q, k, v, block_size, is_causal=is_causal)
    mask = masks.causal_mask(12) if is_causal else None
    torch.testing.assert_close(out, _explicit(q, k, v, mask),
                               rtol=0, atol=1e-12)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("block_size", [16, 50, 256])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_torch_float32(block_size, is_causal):
    q, k, v = _qkv(2, 4, lq=200, lk=200, d_k=32, d_v=32,
                   dtype=torch.float32)
    out = tiled_attention(q, k, v, block_size, is_causal=is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=2e-6)
    lib, _ = attention.scaled_dot_product_attention(
        q, k, v, masks.causal_mask(200) if is_causal else None)
    torch.testing.assert_close(out, lib, rtol=0, atol=2e-6)


@pytest.mark.parametrize("is_causal", [False, True])
def test_length_one(is_causal):
    q, k, v = _qkv(2, lq=1, lk=1)
    out = tiled_attention(q, k, v, 4, is_causal=is_causal)
    torch.testing.assert_close(out, v, rtol=0, atol=1e-15)  # weight 1


@pytest.mark.parametrize("block_size", [1, 2, 3, 9])
def test_causal_is_end_aligned_for_fewer_queries(block_size):
    """Lq < Lk (new queries against a longer history): the mask is
    causal_mask's, aligned to the end of the keys."""
    q, k, v = _qkv(3, lq=4, lk=9)
    out = tiled_attention(q, k, v, block_size, is_causal=True)
    ref = _explicit(q, k, v, masks.causal_mask(4, 9))
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    # one query against 9 keys sees them all
    q1 = q[..., -1:, :]
    torch.testing.assert_close(
        tiled_attention(q1, k, v, block_size, is_causal=True),
        _explicit(q1, k, v), rtol=0, atol=1e-12)


def test_causal_future_keys_do_not_matter():
    q, k, v = _qkv(2, lq=8, lk=8)
    k2, v2 = k.clone(), v.clone()
    k2[..., 5:, :] += 100.0
    v2[..., 5:, :] = 1e6                  # a weight of 0 times this is 0
    a = tiled_attention(q, k, v, 3, is_causal=True)
    b = tiled_attention(q, k2, v2, 3, is_causal=True)
    torch.testing.assert_close(a[..., :5, :], b[..., :5, :], rtol=0, atol=0)


def test_broadcast_batch_scale_and_half_precision():
    q = torch.randn(2, 3, 6, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 10, 4, dtype=torch.float64)
    v = torch.randn(10, 5, dtype=torch.float64)
    out = tiled_attention(q, k, v, 4, scale=0.7)
    ref = F.scaled_dot_product_attention(q, k, v.expand(1, 3, 10, 5),
                                         scale=0.7)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    # large scores would overflow float16's exp; the loop runs in float32
    qh, kh, vh = (t.to(torch.float16) for t in _qkv(lq=5, lk=9))
    outh = tiled_attention(qh * 30, kh * 30, vh, 2)
    assert outh.dtype == torch.float16 and torch.isfinite(outh).all()
    torch.testing.assert_close(
        outh.double(), _explicit(qh.double() * 30, kh.double() * 30,
                                 vh.double()), rtol=0, atol=2e-3)


@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_running_statistics_equal_the_loop_form(block_size, is_causal):
    """The final m is the row maximum of the scores, and l the sum of
    exp(score - m), computed here one score at a time."""
    q, k, v = _qkv(2, lq=6, lk=11)
    scale = 1 / math.sqrt(q.shape[-1])
    _, m, l = tiled_attend(q, k, v, block_size, is_causal, scale)
    assert m.shape == l.shape == (2, 6, 1)
    offset = 11 - 6
    for b in range(2):
        for i in range(6):
            scores = [float(q[b, i] @ k[b, j]) * scale for j in range(11)
                      if not is_causal or j <= i + offset]
            row_max = max(scores)
            row_sum = sum(math.exp(s - row_max) for s in scores)
            assert float(m[b, i, 0]) == pytest.approx(row_max, abs=1e-12)
            assert float(l[b, i, 0]) == pytest.approx(row_sum, rel=1e-12)


def test_bad_input():
    q, k, v = _qkv(lq=4, lk=6)
    with pytest.raises(ValueError, match=whole_message(
            "block_size must be >= 1, got 0")):
        tiled_attention(q, k, v, 0)
    with pytest.raises(TypeError, match="block_size must be an int, got "
                                        "float"):
        tiled_attention(q, k, v, 2.0)
    with pytest.raises(TypeError, match="block_size must be an int, got "
                                        "bool"):
        tiled_attention(q, k, v, True)
    with pytest.raises(TypeError, match="is_causal must be a bool, got "
                                        "int"):
        tiled_attention(q, k, v, 2, is_causal=1)
    with pytest.raises(ValueError, match="q and k must share d_k"):
        tiled_attention(q, k[..., :3], v, 2)
    with pytest.raises(ValueError, match="k and v must share the length Lk"):
        tiled_attention(q, k, v[:5], 2)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        tiled_attention(q.tolist(), k, v, 2)
    with pytest.raises(ValueError, match="scale must be > 0"):
        tiled_attention(q, k, v, 2, scale=-1.0)
    with pytest.raises(ValueError, match=whole_message(
            "is_causal needs Lq <= Lk (every query must see a key), got "
            "Lq=6, Lk=4")):
        tiled_attention(k, q, q[..., :1], 2, is_causal=True)


def test_profile_memory_counts_allocations():
    """Two allocations of known size held together, then freed."""
    def two_tensors():
        a = torch.empty(1000, dtype=torch.float32)    # 4000 bytes
        b = torch.empty(3000, dtype=torch.float32)    # 12000 bytes
        return a, b
    prof = attention_cost.profile_memory(two_tensors)
    assert prof.largest >= 12000 and prof.peak >= 16000
    assert prof.peak < 16000 + 1024                   # allocator rounding
    with pytest.raises(TypeError, match="fn must be callable, got int"):
        attention_cost.profile_memory(3)


def test_tiled_path_never_allocates_the_score_matrix():
    """The explicit path allocates the (Lq, Lk) scores; the tiled one
    nothing larger than an (Lq, block) tile or the output."""
    q, k, v = (t.float() for t in _qkv(1, 2, lq=256, lk=256, d_k=16,
                                       d_v=16))
    explicit = attention_cost.profile_memory(
        lambda: attention.scaled_dot_product_attention(q, k, v))
    tiled = attention_cost.profile_memory(
        lambda: tiled_attention(q, k, v, 32))
    assert explicit.largest == 2 * 256 * 256 * 4       # (1, 2, L, L) float32
    assert tiled.largest == 2 * 256 * 32 * 4           # (1, 2, L, b)
    assert tiled.peak < explicit.peak / 2


# -- merge_states: two key blocks' states into one (chapter 3's transfer) --
from course_lib.model.online_softmax import merge_states  # noqa: E402


def _state(q, k, v, scale):
    """(m, l, o) of every query row over the keys k, written out."""
    s = q @ k.transpose(-2, -1) * scale                    # (..., Lq, Lk)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    return m, p.sum(-1, keepdim=True), p @ v


@pytest.mark.parametrize("split", [1, 5, 11])
def test_merge_states_is_attention_over_both_blocks(split):
    q, k, v = _qkv(2, 3, lq=4, lk=12)
    scale = 1 / math.sqrt(8)
    m, l, o = merge_states(*_state(q, k[..., :split, :], v[..., :split, :],
                                   scale),
                           *_state(q, k[..., split:, :], v[..., split:, :],
                                   scale))
    torch.testing.assert_close(o / l, _explicit(q, k, v), rtol=0, atol=1e-12)
    want_m, want_l, _ = _state(q, k, v, scale)
    torch.testing.assert_close(m, want_m)
    torch.testing.assert_close(l, want_l)
    _, m_t, l_t = tiled_attend(q, k, v, split, False, scale)
    torch.testing.assert_close(m, m_t)
    torch.testing.assert_close(l, l_t)


def test_merge_states_is_associative_and_commutative():
    q, k, v = _qkv(3, lq=2, lk=9)
    parts = [_state(q, k[..., i:i + 3, :], v[..., i:i + 3, :], 0.5)
             for i in (0, 3, 6)]
    left = merge_states(*merge_states(*parts[0], *parts[1]), *parts[2])
    right = merge_states(*parts[0], *merge_states(*parts[1], *parts[2]))
    swapped = merge_states(*parts[2], *merge_states(*parts[1], *parts[0]))
    for a, b, c in zip(left, right, swapped):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def test_merge_states_masked_block_and_large_offsets():
    q, k, v = _qkv(lq=3, lk=6)
    s1, s2 = _state(q, k[:3], v[:3], 1.0), _state(q, k[3:], v[3:], 1.0)
    empty = (torch.full_like(s1[0], -math.inf), torch.zeros_like(s1[1]),
             torch.zeros_like(s1[2]))
    for got, want in zip(merge_states(*empty, *s2), s2):
        torch.testing.assert_close(got, want)
    # scores of block 2 shifted by +900: exp(900) overflows float64
    far = (s2[0] + 900, s2[1], s2[2])
    m, l, o = merge_states(*s1, *far)
    assert torch.isfinite(o).all() and torch.isfinite(l).all()
    torch.testing.assert_close(o / l, s2[2] / s2[1])


def test_merge_states_bad_input():
    t = torch.zeros(2, 1)
    with pytest.raises(TypeError, match="m1"):
        merge_states([0.0], t, t, t, t, t)
    with pytest.raises(ValueError, match="l2 must have shape"):
        merge_states(t, t, t, t, torch.zeros(2, 3), t)
    with pytest.raises(ValueError, match="broadcast"):
        merge_states(t, t, torch.zeros(2, 4), torch.zeros(3, 1), t,
                     torch.zeros(3, 4))
    with pytest.raises(ValueError, match="seen a key"):
        inf = torch.full((2, 1), -math.inf)
        merge_states(inf, t, t, inf, t, t)

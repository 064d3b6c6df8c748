"""Tests for course_lib.model.attention (chapter 3).

References used: torch.nn.functional.scaled_dot_product_attention (with
explicit boolean attn_mask, and is_causal when Lq == Lk), a python double
loop over queries and keys. The softmax Jacobian and the saturation
statistics (course_lib.experiments.score_scaling) have their own tests in
test_score_scaling.py.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.model import attention, masks
from course_lib.experiments import attention_cost, score_scaling
from errors import whole_message


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def _qkv(*batch, lq=5, lk=7, d_k=8, d_v=6, dtype=torch.float32):
    return (torch.randn(*batch, lq, d_k, dtype=dtype),
            torch.randn(*batch, lk, d_k, dtype=dtype),
            torch.randn(*batch, lk, d_v, dtype=dtype))


# ------------------------------------------------- against torch's kernel
@pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
def test_matches_torch_without_mask(batch):
    q, k, v = _qkv(*batch)
    out, w = attention.scaled_dot_product_attention(q, k, v)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert out.shape == (*batch, 5, 6) and w.shape == (*batch, 5, 7)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_matches_torch_is_causal_when_square():
    q, k, v = _qkv(2, 4, lq=9, lk=9)
    out, _ = attention.scaled_dot_product_attention(q, k, v, masks.causal_mask(9))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_end_aligned_causal_differs_from_torch_is_causal():
    # torch's is_causal is top-left aligned; ours is end aligned (caching).
    q, k, v = _qkv(2, lq=3, lk=7)
    mask = masks.causal_mask(3, 7)
    ours, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert not torch.allclose(ours, top_left, atol=1e-3)


def test_matches_torch_with_padding_and_combined_masks_multihead():
    B, H, L = 3, 4, 6
    q, k, v = _qkv(B, H, lq=L, lk=L)
    pad = masks.padding_mask([6, 4, 2], L)[:, None]              # (B, 1, 1, L)
    mask = masks.combine_masks(masks.causal_mask(L), pad)            # (B, 1, L, L)
    assert mask.shape == (B, 1, L, L)
    explicit, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    for out in (explicit, attention.fused_attention(q, k, v, mask)):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_explicit_and_fused_agree_with_custom_scale():
    q, k, v = _qkv(2, 3)
    mask = torch.rand(2, 3, 5, 7) > 0.3
    mask[..., 0] = True                                      # no dead rows
    a, _ = attention.scaled_dot_product_attention(q, k, v, mask, scale=0.37)
    b = attention.fused_attention(q, k, v, mask, scale=0.37)
    c = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.37)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-5)


def test_matches_python_double_loop():
    q, k, v = _qkv(lq=4, lk=5, d_k=3, d_v=2, dtype=torch.float64)
    mask = torch.rand(4, 5) > 0.4
    mask[:, 2] = True
    out, w = attention.scaled_dot_product_attention(q, k, v, mask)
    for i in range(4):
        s = [sum(q[i, c].item() * k[j, c].item() for c in range(3))
             / math.sqrt(3) if mask[i, j] else -math.inf for j in range(5)]
        e = [math.exp(x - max(s)) for x in s]
        for j in range(5):
            assert math.isclose(w[i, j].item(), e[j] / sum(e), abs_tol=1e-12)
        for c in range(2):
            o = sum(e[j] / sum(e) * v[j, c].item() for j in range(5))
            assert math.isclose(out[i, c].item(), o, abs_tol=1e-12)


# ----------------------------------------------------------- properties
def test_weights_sum_to_one_over_allowed_keys_and_zero_elsewhere():
    q, k, v = _qkv(2, lq=6, lk=6)
    mask = masks.combine_masks(masks.causal_mask(6), masks.padding_mask([6, 3], 6))
    _, w = attention.scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(w[~mask.expand_as(w)] == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 6))


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = (t.requires_grad_() for t in _qkv(2, lq=4, lk=4))
    mask = masks.padding_mask([3, 0], 4)                 # batch 1: no key at all
    for attend in (lambda *a: attention.scaled_dot_product_attention(*a)[0],
                   attention.fused_attention):
        out = attend(q, k, v, mask)
        assert torch.isfinite(out).all()
        assert torch.all(out[1] == 0)
        out.sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all()
            t.grad = None
    _, w = attention.scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(w[1] == 0) and torch.allclose(w[0].sum(-1),
                                                   torch.ones(4))
    # Rows of a short causal mask (Lq > Lk) with no visible key.
    q2, k2, v2 = _qkv(lq=5, lk=3)
    out, _ = attention.scaled_dot_product_attention(q2, k2, v2, masks.causal_mask(5, 3))
    assert torch.all(out[:2] == 0) and torch.all(out[2:].abs().sum(-1) > 0)


def test_permutation_equivariance_without_positions():
    x = torch.randn(2, 7, 8)
    perm = torch.randperm(7)
    out, _ = attention.scaled_dot_product_attention(x, x, x)
    out_p, _ = attention.scaled_dot_product_attention(x[:, perm], x[:, perm],
                                              x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm])
    # Permuting keys and values together (not queries) changes nothing.
    q = torch.randn(2, 3, 8)
    torch.testing.assert_close(
        attention.scaled_dot_product_attention(q, x[:, perm], x[:, perm])[0],
        attention.scaled_dot_product_attention(q, x, x)[0])


def test_scaling_preserves_ranking_and_default_scale():
    q, k, v = _qkv(lq=4, lk=9, d_k=64)
    _, w1 = attention.scaled_dot_product_attention(q, k, v)
    _, w2 = attention.scaled_dot_product_attention(q, k, v, scale=1.0)
    assert torch.equal(w1.argsort(-1), w2.argsort(-1))
    _, w3 = attention.scaled_dot_product_attention(q, k, v, scale=1 / 8)
    torch.testing.assert_close(w1, w3)


def test_single_allowed_key_copies_its_value():
    q, k, v = _qkv(lq=3, lk=4)
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[:, 2] = True
    out, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, v[2].expand(3, -1))


# ----------------------------------------------------------------- masks
def test_causal_mask_end_aligned():
    assert torch.equal(masks.causal_mask(3),
                       torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]],
                                    dtype=torch.bool))
    assert masks.causal_mask(1, 5).all()
    m = masks.causal_mask(2, 4)
    assert torch.equal(m, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]],
                                       dtype=torch.bool))
    for i in range(4):
        for j in range(6):
            assert masks.causal_mask(4, 6)[i, j].item() == (j <= i + 2)


def test_cached_decoding_row_equals_last_row_of_full_causal():
    q, k, v = _qkv(lq=6, lk=6)
    full, _ = attention.scaled_dot_product_attention(q, k, v, masks.causal_mask(6))
    last, _ = attention.scaled_dot_product_attention(q[-1:], k, v,
                                             masks.causal_mask(1, 6))
    torch.testing.assert_close(last, full[-1:])


def test_sliding_window_mask():
    m = masks.sliding_window_mask(5, window=2)
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0],
                             [0, 1, 1, 0, 0], [0, 0, 1, 1, 0],
                             [0, 0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(m, expected)
    assert torch.equal(masks.sliding_window_mask(6, window=6), masks.causal_mask(6))
    assert torch.equal(masks.sliding_window_mask(2, 5, window=3),
                       torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]],
                                    dtype=torch.bool))


def test_padding_mask_shape_and_values():
    m = masks.padding_mask([3, 1, 0], 4)
    assert m.shape == (3, 1, 4) and m.dtype == torch.bool
    assert m[:, 0].tolist() == [[True, True, True, False],
                                [True, False, False, False],
                                [False] * 4]
    assert torch.equal(masks.padding_mask(torch.tensor([3, 1, 0]), 4), m)


def test_combine_masks():
    c, p = masks.causal_mask(3), masks.padding_mask([2, 3], 3)
    m = masks.combine_masks(None, c, None, p)
    assert m.shape == (2, 3, 3)
    assert torch.equal(m, c[None] & p)
    assert masks.combine_masks(None, None) is None
    assert masks.combine_masks() is None
    assert masks.combine_masks(c) is c


# --------------------------------------------------------------- the cost
def test_attention_weights_bytes_closed_form_and_measured():
    assert attention_cost.attention_weights_bytes(512) == 512 * 512 * 4
    assert attention_cost.attention_weights_bytes(10, batch=2, n_heads=3,
                                     dtype=torch.float16) == 2 * 3 * 100 * 2
    q, k, v = _qkv(2, 3, lq=10, lk=10)
    _, w = attention.scaled_dot_product_attention(q, k, v)
    assert w.element_size() * w.nelement() == attention_cost.attention_weights_bytes(
        10, batch=2, n_heads=3)


def test_time_attention_rows(fake_clock, monkeypatch):
    # Fake clock: each explicit call "costs" 3 s and each fused call 0.5 s
    # (any two different numbers do), so each column must hold the time
    # of its own path, whatever the machine's load.
    cost = {"explicit": 3.0, "fused": 0.5}
    calls = []

    def spy(path, real):
        def timed(q, *args, **kw):
            calls.append((q.shape[-2], path))
            fake_clock.advance(cost[path])
            return real(q, *args, **kw)
        return timed

    monkeypatch.setattr(attention_cost, "scaled_dot_product_attention",
                        spy("explicit", attention.scaled_dot_product_attention))
    monkeypatch.setattr(attention_cost, "fused_attention",
                        spy("fused", attention.fused_attention))
    rows = attention_cost.time_attention([16, 32], d_k=8, n_heads=2, repeats=2)
    assert [r.length for r in rows] == [16, 32]
    for r in rows:
        assert (r.explicit_seconds, r.fused_seconds) == (3.0, 0.5)
        assert r.ratio == 6.0
        assert r.weights_bytes == 4 * 2 * r.length ** 2 == \
            attention_cost.attention_weights_bytes(r.length, n_heads=2)
    # per length: one explicit call for the weights' size, then for each
    # path a warm-up and `repeats` timed calls
    for L in (16, 32):
        assert calls.count((L, "explicit")) == 1 + 3
        assert calls.count((L, "fused")) == 3
    assert len(calls) == 14


# ------------------------------------------------------------ bad inputs
def test_bad_inputs_attention():
    q, k, v = _qkv(2)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        attention.scaled_dot_product_attention(q, k, v, torch.ones(5, 7))
    with pytest.raises(ValueError, match=r"mask of shape \(5, 6\) does not"):
        attention.scaled_dot_product_attention(q, k, v, torch.ones(5, 6).bool())
    with pytest.raises(ValueError, match=r"mask of shape \(3, 5, 7\)"):
        # Unbatched q, k, v: a batched mask would silently add a batch.
        attention.scaled_dot_product_attention(q[0], k[0], v[0],
                                       torch.ones(3, 5, 7).bool())
    with pytest.raises(ValueError, match=r"mask of shape \(4, 2, 5, 7\)"):
        attention.scaled_dot_product_attention(q, k, v, torch.ones(4, 2, 5, 7).bool())
    with pytest.raises(ValueError, match="q and k must share d_k"):
        attention.scaled_dot_product_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="k and v must share the length Lk"):
        attention.scaled_dot_product_attention(q, k, v[:, :4])
    with pytest.raises(ValueError, match="q must have shape"):
        attention.scaled_dot_product_attention(torch.ones(3), k, v)
    with pytest.raises(TypeError, match="k must be floating point"):
        attention.scaled_dot_product_attention(q, k.long(), v)
    with pytest.raises(ValueError, match="leading dims"):
        attention.scaled_dot_product_attention(q, torch.randn(3, 7, 8), v)
    with pytest.raises(ValueError, match="scale must be > 0, got 0.0"):
        attention.scaled_dot_product_attention(q, k, v, scale=0.0)
    with pytest.raises(TypeError, match="scale must be a real number"):
        attention.scaled_dot_product_attention(q, k, v, scale="big")
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        attention.fused_attention(q, k, v, enable_gqa=1)
    with pytest.raises(ValueError, match=r"enable_gqa=True needs q \(B, H, "
                       r"Lq, d_k\)"):
        attention.fused_attention(q, k, v, enable_gqa=True)
    q4, k4 = torch.randn(1, 3, 5, 8), torch.randn(1, 2, 7, 8)
    with pytest.raises(ValueError, match="with H a multiple of G"):
        attention.fused_attention(q4, k4, k4, enable_gqa=True)
    with pytest.raises(ValueError, match="q and k must share d_k"):
        attention.fused_attention(q, k[..., :3], v)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        attention.fused_attention(q4, k4[:, :1], k4[:, :1], torch.ones(5, 7),
                          enable_gqa=True)


def test_bad_inputs_masks_and_helpers():
    with pytest.raises(ValueError, match="q_len must be >= 1, got 0"):
        masks.causal_mask(0)
    with pytest.raises(TypeError, match="k_len must be an int"):
        masks.causal_mask(3, 2.5)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        masks.sliding_window_mask(4, window=0)
    with pytest.raises(ValueError, match="each of lengths must be <= 4"):
        masks.padding_mask([5], 4)
    with pytest.raises(ValueError, match="each of lengths must be >= 0"):
        masks.padding_mask([-1], 4)
    with pytest.raises(TypeError, match="each of lengths must be an int"):
        masks.padding_mask(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(ValueError, match="lengths must be a non-empty list"):
        masks.padding_mask([], 4)
    with pytest.raises(TypeError, match="masks must be a bool tensor"):
        masks.combine_masks(masks.causal_mask(3), torch.ones(3, 3))
    with pytest.raises(ValueError, match=r"masks of shapes \[\(3, 3\), "):
        masks.combine_masks(masks.causal_mask(3), masks.causal_mask(4))
    with pytest.raises(TypeError, match="z must be a floating tensor"):
        score_scaling.softmax_jacobian(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="d_k must be >= 1, got 0"):
        score_scaling.score_variance_mc(0, 100)
    with pytest.raises(ValueError, match="sigma_q must be > 0, got -1.0"):
        score_scaling.score_variance_mc(4, 100, sigma_q=-1.0)
    with pytest.raises(ValueError, match="n_keys must be >= 2"):
        score_scaling.saturation_stats(4, n_keys=1)
    with pytest.raises(ValueError, match="length must be >= 1"):
        attention_cost.attention_weights_bytes(0)
    with pytest.raises(ValueError, match="lengths must be a non-empty list"):
        attention_cost.time_attention([])
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        attention_cost.time_attention([8], repeats=0)


def test_padding_mask_accepts_numpy_lengths_and_device():
    import numpy as np
    expected = masks.padding_mask([3, 1], 4)
    assert torch.equal(masks.padding_mask(np.array([3, 1]), 4), expected)
    assert masks.padding_mask([3, 1], 4, device="cpu").device.type == "cpu"
    with pytest.raises(ValueError, match="lengths must be a non-empty"):
        masks.padding_mask(np.array([]), 4)


def test_half_precision_scores_above_fp16_max_stay_finite():
    # |q| = |k| = 100 per entry, d_k = 64 gives scores of
    # 8e4 > 65504: the explicit path returned NaN, the fused one did not.
    h = torch.full((1, 1, 4, 64), 100.0, dtype=torch.float16)
    v = torch.randn(1, 1, 4, 64, generator=torch.Generator().manual_seed(0))
    mask = masks.causal_mask(4)
    out, w = attention.scaled_dot_product_attention(h, h, v.half(), mask)
    ref, _ = attention.scaled_dot_product_attention(h.double(), h.double(),
                                            v.double(), mask)
    assert out.dtype == w.dtype == torch.float16
    torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=2e-3)


def test_profile_fused_attention_finds_kernel_and_small_memory(capfd):
    kernels, allocated = attention_cost.profile_fused_attention(1024, n_heads=2, d_k=32)
    assert "aten::scaled_dot_product_attention" in kernels
    # the CPU dispatcher picks a tiled (flash) kernel, not the math path
    assert any("flash" in name for name in kernels)
    out_bytes = 2 * 1024 * 32 * 4
    assert out_bytes <= allocated < attention_cost.attention_weights_bytes(1024,
                                                              n_heads=2)
    assert "profiler_start" not in capfd.readouterr().err  # silenced
    with pytest.raises(ValueError, match="length"):
        attention_cost.profile_fused_attention(0)


# ---- found by mutation testing: details a mutant could change unseen
# Tests added because a mutant of course_lib.model.attention survived the ones
# above (benchmarks/mutation.md, "attention survivors and why").
# (The messages in full: tests/pins/test_attention_messages.py.)
def test_attention_inputs_rejected_naming_the_argument():
    q, k, v = _qkv(2)
    sdpa = attention.scaled_dot_product_attention
    for call, error, name in (
            (lambda: sdpa(torch.ones(3), k, v), ValueError, "q"),
            (lambda: sdpa([1.0], k, v), TypeError, "q"),
            (lambda: sdpa(q, k, torch.ones(3)), ValueError, "v"),
            (lambda: sdpa(q, k, v.long()), TypeError, "v"),
            (lambda: sdpa(q, k[..., :3], v), ValueError, "q and k"),
            (lambda: sdpa(q, k, v[:, :4]), ValueError, "k and v"),
            (lambda: sdpa(q, torch.randn(3, 7, 8), v), ValueError,
             "leading dims"),
            (lambda: attention_cost.attention_weights_bytes(4, batch=0),
             ValueError, "batch"),
            (lambda: attention_cost.attention_weights_bytes(4, n_heads=0),
             ValueError, "n_heads")):
        with pytest.raises(error, match=f"^{name} "):
            call()
    q4 = torch.randn(1, 4, 5, 8)
    for qq, kk, error in (
            ([1.0], k, TypeError),
            (q4, [1.0], TypeError),
            # no K/V head at all: a ValueError, not a ZeroDivisionError
            (q4, torch.randn(1, 0, 7, 8), ValueError),
            # 3-D q and k whose second sizes divide: still not (B, H, L, d)
            (torch.randn(2, 6, 8), torch.randn(2, 3, 8), ValueError)):
        with pytest.raises(error, match="^q |^k |^enable_gqa=True needs"):
            attention.fused_attention(qq, kk, kk, enable_gqa=True)


# Leading (batch) dims that do not broadcast, each with one axis more or
# fewer somewhere: the reference (torch.broadcast_shapes) refuses them too.
@pytest.mark.parametrize("qs,ks,vs", [
    ((2, 5, 8), (2, 5, 7, 8), (2, 5, 7, 6)),
    ((2, 3, 5, 8), (2, 7, 8), (2, 7, 6)),
    ((2, 5, 8), (3, 7, 8), (3, 7, 6)),
    ((2, 7, 5, 8), (2, 7, 8), (2, 7, 7, 6)),
    ((2, 5, 8), (2, 3, 7, 8), (2, 7, 6)),
    ((2, 5, 8), (2, 7, 8), (3, 7, 6)),
    ((2, 7, 5, 8), (2, 7, 7, 8), (2, 7, 6)),
    ((2, 5, 8), (2, 7, 8), (2, 3, 7, 6))])
def test_leading_dims_that_do_not_broadcast_are_refused(qs, ks, vs):
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes(qs[:-2], ks[:-2], vs[:-2])
    q, k, v = torch.randn(qs), torch.randn(ks), torch.randn(vs)
    for attend in (attention.scaled_dot_product_attention, attention.fused_attention):
        with pytest.raises(ValueError, match="^leading dims do not "
                           "broadcast: "):
            attend(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_batch_dims_of_any_one_input_admit_a_full_batched_mask(which):
    # Only one of q, k, v has a batch axis (3,): the scores are (3, 5, 7),
    # so a (3, 5, 7) mask is allowed and a (2, 3, 5, 7) one is not.
    shapes = {"q": (5, 8), "k": (7, 8), "v": (7, 6)}
    shapes[which] = (3, *shapes[which])
    q, k, v = (torch.randn(shapes[n]) for n in "qkv")
    mask = torch.rand(3, 5, 7) > 0.4
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(
        q.expand(3, 5, 8), k.expand(3, 7, 8), v.expand(3, 7, 6),
        attn_mask=mask)
    out, w = attention.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert w.shape == (3, 5, 7)
    torch.testing.assert_close(attention.fused_attention(q, k, v, mask), ref,
                               atol=1e-5, rtol=1e-5)
    for attend in (attention.scaled_dot_product_attention, attention.fused_attention):
        with pytest.raises(ValueError, match=r"^mask of shape \(2, 3, 5, 7\)"
                           r" does not broadcast to the scores"):
            attend(q, k, v, torch.ones(2, 3, 5, 7, dtype=torch.bool))


def test_fused_attention_mask_with_batch_axes_only_v_has():
    # Bug found by the test above (v's case): torch's kernel adds the mask
    # to Q K^T in place, so a mask with a batch axis that only v has
    # raised torch's RuntimeError ("output with shape [5, 7] doesn't
    # match the broadcast shape [3, 5, 7]"). Also with GQA.
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 7, 8)
    v = torch.randn(3, 2, 7, 6)
    mask = torch.rand(3, 4, 5, 7) > 0.4
    mask[..., 0] = True
    ref = F.scaled_dot_product_attention(
        q.expand(3, -1, -1, -1), k.repeat_interleave(2, 1).expand(3, -1, -1,
                                                                  -1),
        v.repeat_interleave(2, 1), attn_mask=mask)
    out = attention.fused_attention(q, k, v, mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_fused_attention_checks_its_mask_and_scale_without_gqa():
    q, k, v = torch.randn(5, 8), torch.randn(7, 8), torch.randn(7, 6)
    with pytest.raises(TypeError, match="^mask must be a bool tensor"):
        attention.fused_attention(q, k, v, torch.ones(5, 7))
    # an unbatched call: a batched mask would silently add a batch axis
    # (the message in full: tests/pins/test_attention_messages.py)
    with pytest.raises(ValueError, match=r"^mask of shape \(3, 5, 7\) does "
                       r"not broadcast"):
        attention.fused_attention(q, k, v, torch.ones(3, 5, 7, dtype=torch.bool))


def test_fused_attention_custom_scale_without_mask_and_with_gqa():
    q, k, v = _qkv(2, 3)
    torch.testing.assert_close(
        attention.fused_attention(q, k, v, scale=0.37),
        F.scaled_dot_product_attention(q, k, v, scale=0.37),
        atol=1e-5, rtol=1e-5)
    # GQA: 6 query heads, 2 K/V heads, each serving 3 query heads
    q6 = torch.randn(2, 6, 5, 8)
    k2, v2 = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 6)
    mask = masks.causal_mask(5, 7)
    for m in (None, mask):
        ref = F.scaled_dot_product_attention(
            q6, k2.repeat_interleave(3, 1), v2.repeat_interleave(3, 1),
            attn_mask=m, scale=0.37)
        out = attention.fused_attention(q6, k2, v2, m, scale=0.37, enable_gqa=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="^scale must be > 0, got -1.0"):
        attention.fused_attention(q6, k2, v2, scale=-1.0, enable_gqa=True)


def test_fused_attention_zeroes_dead_rows_whatever_the_kernel_does(
        monkeypatch):
    # torch 2.13's kernel returns zeros for a query row with no allowed
    # key by itself; older kernels (the math path before torch 2.5)
    # returned NaN. A stand-in kernel written by hand that does the
    # latter: fused_attention must still zero exactly the dead rows.
    def nan_kernel(q, k, v, attn_mask=None, scale=None, enable_gqa=False):
        s = (q @ k.transpose(-2, -1)) * scale
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v          # NaN in dead rows
    monkeypatch.setattr(F, "scaled_dot_product_attention", nan_kernel)
    q, k, v = _qkv(2, lq=4, lk=4)
    mask = torch.ones(2, 4, 4, dtype=torch.bool)
    mask[1] = False                                   # batch 1: no key
    mask[0, 2] = False                                # and one row of 0
    out = attention.fused_attention(q, k, v, mask)
    assert torch.all(out[1] == 0) and torch.all(out[0, 2] == 0)
    live = [0, 1, 3]
    s = q[0, live] @ k[0].T / math.sqrt(8)            # every key allowed
    torch.testing.assert_close(out[0, live], torch.softmax(s, -1) @ v[0])


def test_profile_fused_attention_defaults_arguments_and_sum(monkeypatch):
    from types import SimpleNamespace

    import torch.profiler
    seen = {}

    class FakeProfile:
        """torch.profiler.profile with known events."""
        def __init__(self, **kw):
            seen["profile"] = kw

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def key_averages(self):
            return [SimpleNamespace(key=key, self_cpu_memory_usage=mem)
                    for key, mem in (("aten::zeros", -40), ("b_attention", 0),
                                     ("a_attention", 100), ("aten::mm", 250))]

    real = F.scaled_dot_product_attention

    def kernel(q, k, v, *a, **kw):
        seen["shapes"] = (q.shape, k.shape, v.shape)
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(F, "scaled_dot_product_attention", kernel)
    kernels, allocated = attention_cost.profile_fused_attention(3)
    # docstring: (1, H, L, d_k) with H = 8 and d_k = 64 by default
    assert seen["shapes"] == (torch.Size([1, 8, 3, 64]),) * 3
    assert seen["profile"] == {
        "activities": [torch.profiler.ProfilerActivity.CPU],
        "profile_memory": True}
    assert kernels == ["a_attention", "b_attention"]
    assert allocated == 100 + 250                    # freed bytes count 0
    attention_cost.profile_fused_attention(1, n_heads=1, d_k=1)   # smallest arguments
    assert seen["shapes"] == (torch.Size([1, 1, 1, 1]),) * 3
    for kw, message in (({"length": 0}, "length must be >= 1, got 0"),
                        ({"n_heads": 0}, "n_heads must be >= 1, got 0"),
                        ({"d_k": 0}, "d_k must be >= 1, got 0")):
        kw = {"length": 2, **kw}
        with pytest.raises(ValueError, match=whole_message(message)):
            attention_cost.profile_fused_attention(kw.pop("length"), **kw)


def _spy_attention_calls(monkeypatch, fake_clock):
    """Replace both attention paths in course_lib.model.attention with spies on
    the fake clock (explicit 3 s, fused 0.5 s a call); returns the list
    of (path, q, k, v, mask) calls."""
    calls = []

    def spy(path, real, cost):
        def timed(q, k, v, mask=None, **kw):
            calls.append((path, q, k, v, mask))
            fake_clock.advance(cost)
            return real(q, k, v, mask, **kw)
        return timed
    monkeypatch.setattr(attention_cost, "scaled_dot_product_attention",
                        spy("explicit", attention.scaled_dot_product_attention, 3.0))
    monkeypatch.setattr(attention_cost, "fused_attention",
                        spy("fused", attention.fused_attention, 0.5))
    return calls


def test_time_attention_defaults_by_hand(fake_clock, monkeypatch):
    calls = _spy_attention_calls(monkeypatch, fake_clock)
    (row,) = attention_cost.time_attention([3])
    # defaults: B 1, H 8, d_k 64, seed 0, no mask, 3 repeats (+ warm-up)
    expected = torch.randn(3, 1, 8, 3, 64,
                           generator=torch.Generator().manual_seed(0))
    assert [c[0] for c in calls] == ["explicit"] * 5 + ["fused"] * 4
    for _, q, k, v, mask in calls:
        for got, want in zip((q, k, v), expected):
            assert torch.equal(got, want)
        assert mask is None
    assert (row.length, row.explicit_seconds, row.fused_seconds) == \
        (3, 3.0, 0.5)
    assert row.weights_bytes == 1 * 8 * 3 * 3 * 4


def test_time_attention_causal_and_seed_by_hand(fake_clock, monkeypatch):
    calls = _spy_attention_calls(monkeypatch, fake_clock)
    rows = attention_cost.time_attention([1, 4], d_k=2, batch=2, n_heads=1, repeats=1,
                            causal=True, seed=5)
    assert [r.length for r in rows] == [1, 4]
    g = torch.Generator().manual_seed(5)
    for L in (1, 4):
        qkv = torch.randn(3, 2, 1, L, 2, generator=g)  # in order, one draw
        tril = torch.tensor([[j <= i for j in range(L)] for i in range(L)])
        mine = [c for c in calls if c[1].shape[-2] == L]
        assert [c[0] for c in mine] == ["explicit"] * 3 + ["fused"] * 2
        for i, (_, q, k, v, mask) in enumerate(mine):
            assert torch.equal(torch.stack([q, k, v]), qkv)
            if i > 0:    # the timed calls (the first only sizes the weights)
                assert mask.dtype == torch.bool and torch.equal(mask, tril)
    with pytest.raises(ValueError, match=whole_message(
            "each of lengths must be >= 1, got 0")):
        attention_cost.time_attention([0])
    for name in ("d_k", "batch", "n_heads", "repeats"):
        with pytest.raises(ValueError, match=whole_message(
                f"{name} must be >= 1, got 0")):
            attention_cost.time_attention([2], **{name: 0})


def test_time_attention_causal_must_be_a_bool():
    with pytest.raises(TypeError, match="causal"):
        attention_cost.time_attention([8], causal="False")

"""Tests for course_lib.model.mha (chapter 5).

References used: torch.nn.MultiheadAttention with copied weights (self- and
cross-attention, with boolean masks converted to torch's True = blocked
convention), the explicit loop over heads, an MHA whose K/V weights are the
GQA weights duplicated per group, closed-form parameter counts and
published KV-cache sizes.
"""
import pytest
import torch
from torch import nn

from course_lib.model.masks import causal_mask, padding_mask
from course_lib.model.mha import MultiHeadAttention, mha_param_count
from course_lib.model.rope import RotaryEmbedding
from course_lib.model import attention, mha
from errors import error_for

ATOL = 1e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def torch_twin(mha: MultiHeadAttention) -> nn.MultiheadAttention:
    """torch's MultiheadAttention holding exactly the weights of ``mha``."""
    bias = mha.q_proj.bias is not None
    ref = nn.MultiheadAttention(mha.d_model, mha.n_heads, bias=bias,
                                batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat(
            [mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.out_proj.weight.copy_(mha.o_proj.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat(
                [mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
            ref.out_proj.bias.copy_(mha.o_proj.bias)
    return ref


# ---------------------------------------------------- against torch's MHA
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention_matches_torch_no_mask(bias):
    mha = MultiHeadAttention(32, 4, bias=bias)
    ref = torch_twin(mha)
    x = torch.randn(3, 7, 32)
    out, w = mha.forward_with_weights(x)
    ref_out, ref_w = ref(x, x, x, average_attn_weights=False)
    assert out.shape == (3, 7, 32) and w.shape == (3, 4, 7, 7)
    assert torch.allclose(out, ref_out, atol=ATOL)
    assert torch.allclose(w, ref_w, atol=ATOL)


def test_causal_mask_matches_torch():
    mha = MultiHeadAttention(24, 3)
    ref = torch_twin(mha)
    x = torch.randn(2, 6, 24)
    mask = causal_mask(6)                                   # True = attend
    out, w = mha.forward_with_weights(x, mask=mask)
    ref_out, ref_w = ref(x, x, x, attn_mask=~mask,          # True = blocked
                         average_attn_weights=False)
    assert torch.allclose(out, ref_out, atol=ATOL)
    assert torch.allclose(w, ref_w, atol=ATOL)
    assert torch.all(w.masked_select(~mask) == 0)


def test_padding_mask_matches_torch_key_padding():
    mha = MultiHeadAttention(16, 2)
    ref = torch_twin(mha)
    x = torch.randn(3, 5, 16)
    mask = padding_mask([5, 3, 1], 5)                       # (B, 1, S)
    out = mha(x, mask=mask)
    ref_out, _ = ref(x, x, x, key_padding_mask=~mask[:, 0])
    assert torch.allclose(out, ref_out, atol=ATOL)


def test_per_example_and_per_head_masks_match_torch():
    B, T, H = 2, 5, 4
    mha = MultiHeadAttention(16, H)
    ref = torch_twin(mha)
    x = torch.randn(B, T, 16)
    m4 = torch.rand(B, H, T, T) > 0.4
    m4[..., 0] = True                                       # no empty rows
    ref_out, ref_w = ref(x, x, x, attn_mask=~m4.reshape(B * H, T, T),
                         average_attn_weights=False)
    out, w = mha.forward_with_weights(x, mask=m4)
    assert torch.allclose(out, ref_out, atol=ATOL)
    assert torch.allclose(w, ref_w, atol=ATOL)
    # A (B, T, S) mask is per example and shared by the heads.
    m3 = m4[:, 0]
    ref_out3, _ = ref(x, x, x, attn_mask=~m3.repeat_interleave(H, dim=0))
    assert torch.allclose(mha(x, mask=m3), ref_out3, atol=ATOL)


def test_cross_attention_matches_torch():
    mha = MultiHeadAttention(32, 8)
    ref = torch_twin(mha)
    x, ctx = torch.randn(2, 4, 32), torch.randn(2, 9, 32)
    mask = padding_mask([9, 6], 9)
    out, w = mha.forward_with_weights(x, context=ctx, mask=mask)
    ref_out, ref_w = ref(x, ctx, ctx, key_padding_mask=~mask[:, 0],
                         average_attn_weights=False)
    assert out.shape == (2, 4, 32) and w.shape == (2, 8, 4, 9)
    assert torch.allclose(out, ref_out, atol=ATOL)
    assert torch.allclose(w, ref_w, atol=ATOL)


# ------------------------------------------------ loop form, fused path
@pytest.mark.parametrize("n_kv_heads", [None, 4, 2, 1])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding", "4d"])
def test_loop_equals_batched(n_kv_heads, mask_kind):
    mha = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads)
    x = torch.randn(2, 6, 32)
    mask = {"none": None, "causal": causal_mask(6),
            "padding": padding_mask([6, 2], 6),
            "4d": torch.rand(2, 4, 6, 6) > 0.5}[mask_kind]
    out, w = mha.forward_with_weights(x, mask=mask)
    out_loop, w_loop = mha.forward_loop(x, mask=mask)
    assert torch.allclose(out, out_loop, atol=ATOL)
    assert torch.allclose(w, w_loop, atol=ATOL)
    # forward (no weights) is the same output as forward_with_weights
    assert torch.equal(mha(x, mask=mask), out)


def test_loop_equals_batched_cross_attention_gqa():
    mha = MultiHeadAttention(24, 6, n_kv_heads=2)
    x, ctx = torch.randn(2, 3, 24), torch.randn(2, 8, 24)
    assert torch.allclose(mha(x, context=ctx),
                          mha.forward_loop(x, context=ctx)[0], atol=ATOL)


def test_fused_path_agrees():
    mha = MultiHeadAttention(32, 4, n_kv_heads=2)
    fused = MultiHeadAttention(32, 4, n_kv_heads=2, fused=True)
    fused.load_state_dict(mha.state_dict())
    x = torch.randn(2, 6, 32)
    for mask in (None, causal_mask(6), padding_mask([6, 3], 6)):
        assert torch.allclose(fused(x, mask=mask), mha(x, mask=mask),
                              atol=ATOL)


# ------------------------------------------------------------- GQA / MQA
def test_gqa_with_all_kv_heads_equals_torch_mha():
    mha = MultiHeadAttention(32, 4, n_kv_heads=4)
    assert mha.n_rep == 1
    x = torch.randn(2, 5, 32)
    ref_out, _ = torch_twin(mha)(x, x, x)
    assert torch.allclose(mha(x), ref_out, atol=ATOL)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 3])
def test_gqa_equals_mha_with_duplicated_kv_weights(n_kv_heads):
    H, d_k = 6, 4
    D = H * d_k
    gqa = MultiHeadAttention(D, H, n_kv_heads=n_kv_heads)
    mha = MultiHeadAttention(D, H)
    rep = H // n_kv_heads
    with torch.no_grad():
        mha.q_proj.load_state_dict(gqa.q_proj.state_dict())
        mha.o_proj.load_state_dict(gqa.o_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            # query head i reads K/V head i // rep: duplicate each block
            w = src.weight.view(n_kv_heads, d_k, D)
            dst.weight.copy_(w.repeat_interleave(rep, dim=0).reshape(D, D))
            b = src.bias.view(n_kv_heads, d_k)
            dst.bias.copy_(b.repeat_interleave(rep, dim=0).reshape(D))
    x = torch.randn(2, 5, D)
    mask = causal_mask(5)
    assert torch.allclose(gqa(x, mask=mask), mha(x, mask=mask), atol=ATOL)


def test_mqa_shapes_and_shared_kv():
    mha = MultiHeadAttention(64, 8, n_kv_heads=1)
    assert mha.k_proj.weight.shape == (8, 64)               # one head, d_k=8
    assert mha.v_proj.weight.shape == (8, 64)
    x = torch.randn(2, 5, 64)
    out, w = mha.forward_with_weights(x)
    assert out.shape == (2, 5, 64) and w.shape == (2, 8, 5, 5)
    # With one shared K, heads differ only through their queries: heads
    # whose queries are equal attend identically.
    with torch.no_grad():
        mha.q_proj.weight[8:16] = mha.q_proj.weight[0:8]
        mha.q_proj.bias[8:16] = mha.q_proj.bias[0:8]
    _, w = mha.forward_with_weights(x)
    assert torch.equal(w[:, 0], w[:, 1])
    assert not torch.allclose(w[:, 0], w[:, 2])


# ------------------------------------------------------- parameter counts
@pytest.mark.parametrize("d_model,n_heads,n_kv_heads,bias", [
    (512, 8, None, True), (512, 8, None, False), (64, 8, 2, True),
    (64, 8, 1, False), (48, 6, 3, True)])
def test_param_count_formula(d_model, n_heads, n_kv_heads, bias):
    mha = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads,
                             bias=bias)
    n = sum(p.numel() for p in mha.parameters())
    assert n == mha_param_count(d_model=d_model, n_heads=n_heads,
                                n_kv_heads=n_kv_heads, bias=bias)


def test_param_count_with_a_head_width_of_its_own():
    # A published model may choose d_k != D / h (chapter 12): W^Q and W^O
    # are D x h d_k, W^K and W^V D x g d_k; counted by hand here.
    assert mha_param_count(d_model=64, n_heads=4, n_kv_heads=2, bias=False,
                           head_dim=32) == 2 * 64 * 4 * 32 + 2 * 64 * 2 * 32
    assert mha_param_count(d_model=64, n_heads=4, n_kv_heads=2,
                           head_dim=32) == (2 * 64 * 4 * 32 + 2 * 64 * 2 * 32
                                            + 4 * 32 + 64 + 2 * 2 * 32)


def test_param_count_paper_values():
    d = 512
    assert mha_param_count(d_model=d, n_heads=8) == 4 * d * d + 4 * d
    assert mha_param_count(d_model=d, n_heads=8) == 1_050_624
    assert mha_param_count(d_model=d, n_heads=8, bias=False) == 1_048_576
    # MQA: K and V shrink from d x d to d x d_k each.
    assert mha_param_count(d_model=d, n_heads=8, n_kv_heads=1,
                           bias=False) == 2 * d * d + 2 * d * 64
    # torch's module agrees on the MHA count.
    ref = nn.MultiheadAttention(d, 8, batch_first=True)
    assert sum(p.numel() for p in ref.parameters()) == 1_050_624


# ------------------------------------------------------------- properties
def test_permutation_equivariance_self_attention():
    mha = MultiHeadAttention(32, 4, n_kv_heads=2)
    x = torch.randn(2, 7, 32)
    perm = torch.randperm(7)
    assert torch.allclose(mha(x[:, perm]), mha(x)[:, perm], atol=ATOL)


def test_cross_attention_invariant_to_context_order():
    mha = MultiHeadAttention(32, 4)
    x, ctx = torch.randn(2, 3, 32), torch.randn(2, 6, 32)
    perm = torch.randperm(6)
    assert torch.allclose(mha(x, context=ctx[:, perm]), mha(x, context=ctx),
                          atol=ATOL)


def test_causal_future_never_changes_past():
    mha = MultiHeadAttention(32, 4, n_kv_heads=1)
    x = torch.randn(1, 8, 32)
    y = x.clone()
    y[:, 5:] = torch.randn(1, 3, 32) * 10
    mask = causal_mask(8)
    assert torch.allclose(mha(x, mask=mask)[:, :5], mha(y, mask=mask)[:, :5],
                          atol=ATOL)
    assert not torch.allclose(mha(x, mask=mask)[:, 5:],
                              mha(y, mask=mask)[:, 5:], atol=ATOL)


def test_weights_rows_sum_to_one_and_empty_rows_are_zero():
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(1, 4, 16)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False                                         # query 2: no key
    out, w = mha.forward_with_weights(x, mask=mask)
    sums = w.sum(-1)
    assert torch.allclose(sums[:, :, [0, 1, 3]], torch.ones(1, 2, 3))
    assert torch.all(w[:, :, 2] == 0)
    # The attention output of row 2 is zero, so only o_proj's bias remains.
    assert torch.allclose(out[0, 2], mha.o_proj.bias, atol=ATOL)
    assert not torch.isnan(out).any()


def test_gradients_reach_every_projection():
    mha = MultiHeadAttention(16, 4, n_kv_heads=2)
    mha(torch.randn(2, 5, 16), mask=causal_mask(5)).square().sum().backward()
    for name, p in mha.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


# -------------------------------------------------------------- bad input
@pytest.mark.parametrize("args,kwargs,match", [
    ((30, 4), {}, r"d_model must be divisible by n_heads, got d_model=30"),
    ((32, 4), {"n_kv_heads": 3}, r"n_heads must be divisible by n_kv_heads"),
    ((32, 0), {}, r"n_heads must be >= 1, got 0"),
    ((32.0, 4), {}, r"d_model must be an int, got float"),
    ((32, 4), {"n_kv_heads": 0}, r"n_kv_heads must be >= 1"),
    ((32, True), {}, r"n_heads must be an int, got bool"),
])
def test_bad_constructor_arguments(args, kwargs, match):
    with pytest.raises(error_for(match), match=match):
        MultiHeadAttention(*args, **kwargs)


def test_bad_forward_inputs():
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"x must have shape .* got \(2, 5, 8\)"):
        mha(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match=r"x must have shape .* got \(5, 16\)"):
        mha(torch.randn(5, 16))
    with pytest.raises(ValueError, match=r"context must have shape \(B=2"):
        mha(x, context=torch.randn(3, 4, 16))
    with pytest.raises(ValueError, match=r"context must have shape .*got "
                                         r"\(2, 4, 12\)"):
        mha(x, context=torch.randn(2, 4, 12))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        mha(x, mask=torch.ones(5, 5))
    with pytest.raises(ValueError, match=r"mask of shape \(4, 5\) does not "
                                         r"broadcast to \(2, 2, 5, 5\)"):
        mha(x, mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 5\)"):
        mha(x, mask=torch.ones(3, 1, 5, dtype=torch.bool))   # B = 3 != 2
    with pytest.raises(ValueError, match=r"mask of shape \(5,\)"):
        mha(x, mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(TypeError, match="fused must be a bool"):
        MultiHeadAttention(16, 2, fused=1)
    with pytest.raises(ValueError, match=r"x must have shape"):
        mha.forward_loop(torch.randn(2, 5, 8))


# ------------------------------------------------------ the RoPE hook
def rope_attention(d_model, n_heads, **kw):
    """MultiHeadAttention with its position hook set to RoPE."""
    return MultiHeadAttention(d_model, n_heads, bias=False, rope=RotaryEmbedding(
        d_model // n_heads), **kw)

def test_rope_attention_matches_complex_reference():
    attn = rope_attention(16, 2, n_kv_heads=1)
    x = torch.randn(1, 5, 16)
    T, d = 5, attn.head_dim
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(T, d // 2, dtype=torch.float64),
                      torch.arange(T)[:, None] * theta)      # e^{i m theta}

    def rope(z):  # halves pairing: feature i with i + d/2
        zc = torch.complex(z[..., : d // 2].double(), z[..., d // 2:].double())
        zc = zc * rot
        return torch.cat([zc.real, zc.imag], -1).float()

    q = attn.q_proj(x).view(1, T, 2, d).transpose(1, 2)
    k = attn.k_proj(x).view(1, T, 1, d).transpose(1, 2)
    v = attn.v_proj(x).view(1, T, 1, d).transpose(1, 2)
    s = rope(q) @ rope(k).transpose(-1, -2) / d ** 0.5
    s = s.masked_fill(~causal_mask(T), float("-inf"))
    heads = torch.softmax(s, -1) @ v                         # (1, 2, T, d)
    expected = attn.o_proj(heads.transpose(1, 2).reshape(1, T, 16))
    assert torch.allclose(attn(x, mask=causal_mask(T)), expected, atol=1e-5)


def test_rope_attention_is_shift_invariant():
    attn = rope_attention(16, 4)
    x = torch.randn(2, 6, 16)
    mask = causal_mask(6)
    a = attn(x, mask=mask)
    b = attn(x, mask=mask, positions=torch.arange(6) + 37)
    assert torch.allclose(a, b, atol=1e-4)
    # without positions it would be permutation-equivariant; with RoPE not
    perm = torch.tensor([1, 0, 2, 3, 4, 5])
    c = attn(x[:, perm])[:, perm]
    assert not torch.allclose(attn(x), c, atol=1e-3)



def test_rope_hook_forward_loop_equals_forward():
    attn = rope_attention(16, 4, n_kv_heads=2)
    x, mask = torch.randn(2, 6, 16), causal_mask(6)
    pos = torch.arange(6) + 5
    torch.testing.assert_close(attn.forward_loop(x, mask, positions=pos)[0],
                               attn(x, mask, positions=pos),
                               atol=ATOL, rtol=ATOL)


def test_rope_hook_bad_inputs():
    with pytest.raises(ValueError, match="head_dim must be even"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="rope.head_dim must be 4"):
        MultiHeadAttention(8, 2, rope=RotaryEmbedding(8))


# ---- found by mutation testing: details a mutant could change unseen
# Tests added because a mutant of course_lib.model.mha survived the ones above
# (benchmarks/mutation.md, "mha survivors and why").
# (The messages in full: tests/pins/test_mha_messages.py.)
def _rope_mha_by_hand(attn, x, positions, mask):
    """attn's output and weights by hand: RoPE as complex numbers at the
    given positions (halves pairing, base 10000), each head's softmax in
    float64 (query head i reads K/V head i // (H/G)), then o_proj."""
    import math
    B, T, _ = x.shape
    H, G, d = attn.n_heads, attn.n_kv_heads, attn.head_dim
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    rot = torch.polar(torch.ones(T, d // 2, dtype=torch.float64),
                      positions.double()[:, None] * theta)

    def rope(z):
        zc = torch.complex(z[..., :d // 2].double(),
                           z[..., d // 2:].double()) * rot
        return torch.cat([zc.real, zc.imag], -1)
    q = attn.q_proj(x).view(B, T, H, d).transpose(1, 2)
    k = attn.k_proj(x).view(B, T, G, d).transpose(1, 2)
    v = attn.v_proj(x).view(B, T, G, d).transpose(1, 2).double()
    heads, weights = [], []
    for i in range(H):
        g = i // (H // G)
        s = rope(q[:, i]) @ rope(k[:, g]).transpose(-1, -2) / math.sqrt(d)
        w = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
        heads.append(w @ v[:, g])
        weights.append(w)
    out = attn.o_proj(torch.cat(heads, -1).float())
    return out, torch.stack(weights, 1).float()


def test_rope_positions_that_are_not_a_shifted_range():
    # RoPE depends on m - n only, so positions 5, 6, ... give the same
    # output as 0, 1, ...: the earlier tests could not tell if the given
    # positions were used. Gaps change the differences.
    attn = rope_attention(16, 4, n_kv_heads=2)
    x, mask = torch.randn(2, 6, 16), causal_mask(6)
    pos = torch.tensor([0, 3, 4, 9, 10, 30])
    ref_out, ref_w = _rope_mha_by_hand(attn, x, pos, mask)
    out, w = attn.forward_with_weights(x, mask, positions=pos)
    loop_out, loop_w = attn.forward_loop(x, mask, positions=pos)
    for o, ww in ((out, w), (loop_out, loop_w)):
        torch.testing.assert_close(o, ref_out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ww, ref_w, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attn(x, mask, positions=pos), ref_out,
                               atol=1e-5, rtol=1e-5)
    default = _rope_mha_by_hand(attn, x, torch.arange(6), mask)[0]
    assert not torch.allclose(default, ref_out, atol=1e-3)


def test_rope_default_positions_are_made_on_the_inputs_device(device_spy):
    # a spy, as for heads: only a CPU here, where device=None changes
    # no value
    attn = rope_attention(8, 2)
    x = torch.randn(1, 3, 8)
    asked = device_spy(mha, "arange")
    attn(x)
    assert asked == [x.device]
    attn.forward_loop(x)
    assert asked == [x.device] * 3                  # once per head


def test_forward_loop_picks_each_heads_mask():
    # 2 heads (a head index 1 that is not > 2), masks per head with T > 1
    # and T = 1, and per example (head axis 1): against torch's module.
    B, T, H = 2, 5, 2
    mha = MultiHeadAttention(8, H)
    ref = torch_twin(mha)
    x = torch.randn(B, T, 8)

    def rand_mask(*shape):
        m = torch.rand(*shape) > 0.4
        m[..., 0] = True                                # no empty rows
        return m
    per_head, per_head_keys = rand_mask(B, H, T, T), rand_mask(B, H, 1, T)
    per_example = rand_mask(B, T, T)
    for mask, full in ((per_head, per_head),
                       (per_head_keys, per_head_keys.expand(B, H, T, T)),
                       (per_example, per_example[:, None].expand(B, H, T,
                                                                 T))):
        ref_out, ref_w = ref(x, x, x, attn_mask=~full.reshape(B * H, T, T),
                             average_attn_weights=False)
        out, w = mha.forward_loop(x, mask)
        torch.testing.assert_close(out, ref_out, atol=ATOL, rtol=ATOL)
        torch.testing.assert_close(w, ref_w, atol=ATOL, rtol=ATOL)


def test_forward_with_weights_uses_the_cache():
    # prefill 3 tokens, then 2 more through the cache: the last 2 rows of
    # torch's module over all 5 positions, causal
    from course_lib.model.kv_cache import LayerKVCache
    mha = MultiHeadAttention(16, 4)
    ref = torch_twin(mha)
    x = torch.randn(2, 5, 16)
    ref_out, ref_w = ref(x, x, x, attn_mask=~causal_mask(5),
                         average_attn_weights=False)
    cache = LayerKVCache()
    mha.forward_with_weights(x[:, :3], causal_mask(3), cache=cache)
    out, w = mha.forward_with_weights(x[:, 3:], causal_mask(2, 5),
                                      cache=cache)
    assert len(cache) == 5 and w.shape == (2, 4, 2, 5)
    torch.testing.assert_close(out, ref_out[:, 3:], atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(w, ref_w[:, :, 3:], atol=ATOL, rtol=ATOL)


def test_fused_flag_picks_the_kernel_for_forward_only(monkeypatch):
    ran = []

    def spy(path, real):
        def call(*args, **kw):
            ran.append(path)
            return real(*args, **kw)
        return call
    monkeypatch.setattr(mha, "fused_attend",
                        spy("fused", attention.fused_attend))
    monkeypatch.setattr(mha, "attend", spy("explicit", attention.attend))
    fused = MultiHeadAttention(16, 4, fused=True)
    assert fused.fused is True and MultiHeadAttention(16, 4).fused is False
    ref = torch_twin(fused)
    x, mask = torch.randn(2, 5, 16), causal_mask(5)
    ref_out, ref_w = ref(x, x, x, attn_mask=~mask,
                         average_attn_weights=False)
    torch.testing.assert_close(fused(x, mask), ref_out, atol=ATOL, rtol=ATOL)
    assert ran == ["fused"]
    out, w = fused.forward_with_weights(x, mask)     # needs the weights
    assert ran == ["fused", "explicit"]
    torch.testing.assert_close(w, ref_w, atol=ATOL, rtol=ATOL)
    fused.fused = False
    fused(x, mask)
    assert ran == ["fused", "explicit", "explicit"]


def test_smallest_model_width_and_integer_param_count():
    mha = MultiHeadAttention(1, 1)                   # d_model = 1 is fine
    x = torch.randn(2, 3, 1)
    ref_out, _ = torch_twin(mha)(x, x, x)
    torch.testing.assert_close(mha(x), ref_out, atol=ATOL, rtol=ATOL)
    assert mha_param_count(d_model=1, n_heads=1) == 8
    for kw in ({"d_model": 64, "n_heads": 8, "n_kv_heads": 2},
               {"d_model": 1, "n_heads": 1, "bias": False}):
        assert type(mha_param_count(**kw)) is int


def test_a_cache_is_for_self_attention_only():
    # (this and the other messages in full: tests/pins/test_mha_messages.py)
    from course_lib.model.kv_cache import LayerKVCache
    mha = MultiHeadAttention(16, 2)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match="cache is for self-attention"):
        mha(x, context=x, cache=LayerKVCache())

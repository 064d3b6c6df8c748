"""The whole pre-norm block, its variants, and the stored sweeps of
chapter 6 (``block_variants.json``, ``block_stats.json``)."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.experiments import block_stats
from course_lib.experiments import block_variants as bv
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.block import DecoderBlock, FeedForward
from course_lib.model.masks import causal_mask
from course_lib.model.mha import MultiHeadAttention

D, H = 32, 4


def _block(norm="layer", seed=0):
    torch.manual_seed(seed)
    b = DecoderBlock(D, attention=MultiHeadAttention(D, H),
                     ffn=FeedForward(D, 4 * D, activation="gelu"),
                     norm=norm).eval()
    with torch.no_grad():                   # non-trivial gains and biases
        for p in b.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    return b


def _torch_attention(mha):
    """torch's nn.MultiheadAttention with the weights of ``mha``."""
    ref = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat(
            [mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat(
            [mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        ref.out_proj.load_state_dict(mha.o_proj.state_dict())
    T = 7
    return lambda h: ref(h, h, h, attn_mask=~causal_mask(T),
                         need_weights=False)[0]


def _ln(norm, x):
    return F.layer_norm(x, (D,), norm.weight, norm.bias, norm.eps)


# ------------------------------------------------------ the whole block
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_block_forward_is_the_block(norm):
    b = _block(norm)
    x = torch.randn(2, 7, D)
    mask = causal_mask(7)
    with torch.no_grad():
        assert torch.equal(bv.block_forward(b, x, mask), b(x, mask))
        assert torch.equal(bv.block_forward(b, x), b(x))


# ------------------------------------------------------------- variants
def test_parallel_block_against_torch_modules():
    b = _block()
    par = bv.ParallelBlock(D, attention=b.attention, ffn=b.ffn).eval()
    par.norm = b.norm1
    x = torch.randn(2, 7, D)
    attn = _torch_attention(b.attention)
    f = b.ffn
    with torch.no_grad():
        h = _ln(b.norm1, x)
        ffn = F.linear(F.gelu(F.linear(h, f.linear1.weight, f.linear1.bias)),
                       f.linear2.weight, f.linear2.bias)
        ref = x + attn(h) + ffn                  # x + Attn(LN x) + FFN(LN x)
        out = par(x, causal_mask(7))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_sandwich_block_against_torch_modules():
    b = _block()
    sw = bv.SandwichBlock(D, attention=b.attention, ffn=b.ffn).eval()
    sw.norm1, sw.norm2 = b.norm1, b.norm2
    with torch.no_grad():
        for n in (sw.post_attention_layernorm, sw.post_feedforward_layernorm):
            n.weight.uniform_(0.5, 1.5)
            n.bias.normal_()
    x = torch.randn(2, 7, D)
    attn = _torch_attention(b.attention)
    with torch.no_grad():
        x1 = x + _ln(sw.post_attention_layernorm, attn(_ln(b.norm1, x)))
        ref = x1 + _ln(sw.post_feedforward_layernorm,
                       b.ffn(_ln(b.norm2, x1)))
        out = sw(x, causal_mask(7))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_qk_norm_attention_against_a_loop_over_heads():
    torch.manual_seed(3)
    a = bv.QKNormAttention(D, H)
    with torch.no_grad():
        a.q_norm.weight.uniform_(0.5, 2.0)
        a.k_norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    a = a.double()
    d_k = D // H
    rms_q, rms_k = nn.RMSNorm(d_k, eps=1e-6).double(), \
        nn.RMSNorm(d_k, eps=1e-6).double()
    rms_q.weight.data.copy_(a.q_norm.weight)
    rms_k.weight.data.copy_(a.k_norm.weight)
    heads = []
    with torch.no_grad():
        for i in range(H):                         # one head at a time
            rows = slice(i * d_k, (i + 1) * d_k)
            q = rms_q(F.linear(x, a.q_proj.weight[rows], a.q_proj.bias[rows]))
            k = rms_k(F.linear(x, a.k_proj.weight[rows], a.k_proj.bias[rows]))
            v = F.linear(x, a.v_proj.weight[rows], a.v_proj.bias[rows])
            s = q @ k.transpose(-2, -1) / math.sqrt(d_k)
            s = s.masked_fill(~causal_mask(6), float("-inf"))
            heads.append(torch.softmax(s, -1) @ v)
        ref = a.o_proj(torch.cat(heads, -1))
        out = a(x, causal_mask(6))
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_qk_norm_bounds_the_logits_and_plain_attention_does_not():
    torch.manual_seed(0)
    mha = MultiHeadAttention(D, H)
    qk = bv.QKNormAttention(D, H)
    qk.load_state_dict(mha.state_dict(), strict=False)
    h = torch.randn(2, 9, D)
    with torch.no_grad():
        small = bv.attention_logits(mha, h).abs().max()
        for m in (mha, qk):
            m.q_proj.weight.mul_(30.0)
            m.k_proj.weight.mul_(30.0)
        big = bv.attention_logits(mha, h).abs().max()
        bounded = bv.attention_logits(qk, h).abs().max()
    assert big > 100 * small                # grows like the scale squared
    assert bounded <= math.sqrt(D // H) + 1e-5   # unit gains: |s| <= sqrt(d_k)
    assert bounded > 0.5


def test_attention_logits_give_the_modules_weights():
    """softmax of the masked logits = the weights MHA used."""
    torch.manual_seed(1)
    mha = MultiHeadAttention(D, H)
    h = torch.randn(2, 5, D)
    with torch.no_grad():
        _, weights = mha.forward_with_weights(h, causal_mask(5))
        s = bv.attention_logits(mha, h).masked_fill(~causal_mask(5),
                                                    float("-inf"))
    torch.testing.assert_close(torch.softmax(s, -1), weights)


def test_max_attention_logit_of_a_one_block_model():
    model = bv.to_variant(bv.variant_lm(seed=0, n_layers=1), "qk_norm")
    idx = torch.randint(16, (3, 10))
    b = model.layers[0]
    with torch.no_grad():
        h = b.norm1(model.embed_tokens(idx)
                    + model.embed_positions.weight[:10])
        s = bv.attention_logits(b.attention, h)          # (B, H, T, T)
    expect = s.abs().masked_fill(~causal_mask(10), 0).max().item()
    assert bv.max_attention_logit(model, idx) == pytest.approx(expect)
    assert expect <= math.sqrt(16) + 1e-5                # d_k = 16


def test_variants_share_weights_and_count_parameters():
    idx = torch.randint(16, (2, 12))
    base = bv.variant_lm(seed=4)
    n = {v: sum(p.numel() for p in bv.to_variant(bv.variant_lm(seed=4), v)
                .parameters()) for v in bv.VARIANTS}
    Dm, N, d_k = 64, 4, 16
    # biases: q, k, v, o (4D) + FFN (4D + D) + 2 LayerNorms (2D) per
    # block, and the final LayerNorm (D)
    assert n["pre_norm"] - n["no_bias"] == N * (4 + 5 + 2) * Dm + Dm
    assert n["pre_norm"] - n["parallel"] == N * 2 * Dm     # one LN fewer
    assert n["sandwich"] - n["pre_norm"] == N * 2 * 2 * Dm  # two LNs more
    assert n["qk_norm"] - n["pre_norm"] == N * 2 * d_k      # two gains
    nb = bv.to_variant(bv.variant_lm(seed=4), "no_bias")
    assert not [k for k, _ in nb.named_parameters() if k.endswith("bias")]
    with torch.no_grad():        # GPT-2's init has zero biases: same model
        assert torch.equal(nb(idx), base(idx))


# ------------------------------------------------------- stored sweeps
def test_stored_variant_sweep_is_what_the_recipe_makes():
    """Rerun the first 50 steps of one cell (pre-norm, lr 3e-3, seed 0)
    of the same schedule: a prefix of the stored run."""
    sweep = load_sweep("block_variants")
    assert sweep.seeds == [0, 1, 2]
    assert [s["variant"] for s in sweep.settings()[:5]] == list(bv.VARIANTS)
    stored = sweep.cell(0, variant="pre_norm", lr=3e-3)
    assert len(stored["val_curve"]) == sweep.meta["steps"] // 25
    assert stored["val_loss"] == stored["val_curve"][-1]
    fresh = bv.train_variant("pre_norm", seed=0, lr=3e-3, stop_at=50)
    assert set(fresh) == set(stored)
    assert fresh["params"] == stored["params"]
    for key in ("val_curve", "max_logit_curve"):
        assert fresh[key] == pytest.approx(stored[key][:2], rel=1e-3), key
    assert fresh["max_logit_init"] == pytest.approx(
        stored["max_logit_init"], rel=1e-3)


def test_stored_init_sweep_is_what_the_recipe_makes():
    sweep = load_sweep("block_stats")
    assert sweep.seeds == [0, 1, 2, 3, 4]
    assert [s["kind"] for s in sweep.settings()] == \
        list(block_stats.INIT_KINDS)
    for kind, seed in (("scaled", 3), ("plain_ffn", 1)):
        fresh = block_stats.init_stats(kind, seed=seed)
        stored = sweep.cell(seed, kind=kind)
        assert set(fresh) == set(stored)
        for key, value in fresh.items():
            assert value == pytest.approx(stored[key], rel=1e-3), key


# ------------------------------------------------------------ bad input
def test_bad_input_is_refused():
    b = _block()
    with pytest.raises(TypeError, match="block"):
        bv.block_forward(nn.Linear(2, 2), torch.zeros(1, 2, D))
    swiglu = bv.to_variant(bv.variant_lm(seed=0), "parallel").layers[0]
    with pytest.raises(TypeError, match="block"):
        bv.block_forward(swiglu, torch.zeros(1, 2, 64))
    with pytest.raises(TypeError, match="x"):
        bv.block_forward(b, [[0.0]])
    with pytest.raises(ValueError, match="variant"):
        bv.train_variant("post_norm")
    with pytest.raises(TypeError, match="seed"):
        bv.train_variant("pre_norm", seed=0.5)
    with pytest.raises(ValueError, match="stop_at"):
        bv.train_variant("pre_norm", steps=40, stop_at=41)
    with pytest.raises(ValueError, match="variant"):
        bv.to_variant(bv.variant_lm(seed=0), "gpt-j")
    with pytest.raises(TypeError, match="model"):
        bv.to_variant(nn.Linear(2, 2), "parallel")
    with pytest.raises(TypeError, match="attention"):
        bv.ParallelBlock(D, attention="attn", ffn=nn.Identity())
    with pytest.raises(ValueError, match="d_model"):
        bv.QKNormAttention(30, 4)
    with pytest.raises(ValueError, match="cache"):
        bv.QKNormAttention(D, H)(torch.zeros(1, 2, D), cache=object())
    with pytest.raises(TypeError, match="attention"):
        bv.attention_logits(nn.Linear(2, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError, match="variants"):
        bv.step_times(["pre_norm", "moe"])
    with pytest.raises(ValueError, match="kind"):
        block_stats.init_stats("deepnet", seed=0)
    with pytest.raises(TypeError, match="seed"):
        block_stats.init_stats("pre", seed="0")

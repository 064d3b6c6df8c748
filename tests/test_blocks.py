"""Tests for course_lib.model.block (chapter 6).

References: torch.nn.TransformerEncoderLayer / TransformerDecoderLayer
(post-norm, ReLU, batch_first) with copied weights in eval mode; the
pre-norm block written out by hand; causality.
"""
import pytest
import torch
from torch import nn

from course_lib.model.masks import causal_mask, padding_mask
from course_lib.model.block import DecoderBlock
from course_lib.model.transformer import DecoderLayer, EncoderLayer
from course_lib.model.block import FeedForward, RMSNorm, SwiGLU
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.moe import MoE

ATOL = 1e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def copy_mha(ref: nn.MultiheadAttention, mha: MultiHeadAttention) -> None:
    """torch's packed in_proj -> our q/k/v_proj; out_proj -> o_proj."""
    with torch.no_grad():
        for proj, w, b in zip((mha.q_proj, mha.k_proj, mha.v_proj),
                              ref.in_proj_weight.chunk(3),
                              ref.in_proj_bias.chunk(3)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        mha.o_proj.weight.copy_(ref.out_proj.weight)
        mha.o_proj.bias.copy_(ref.out_proj.bias)


def copy_common(ref, ours, n_norms):
    copy_mha(ref.self_attn, ours.self_attn)
    with torch.no_grad():
        for name in ("linear1", "linear2"):
            getattr(ours.ffn, name).load_state_dict(
                getattr(ref, name).state_dict())
        for i in range(1, n_norms + 1):
            getattr(ours, f"norm{i}").load_state_dict(
                getattr(ref, f"norm{i}").state_dict())
            # non-trivial affine parameters, so a swapped norm would show
            getattr(ours, f"norm{i}").weight.mul_(1.5)
            getattr(ref, f"norm{i}").weight.mul_(1.5)
            getattr(ours, f"norm{i}").bias.add_(0.1 * i)
            getattr(ref, f"norm{i}").bias.add_(0.1 * i)


def test_encoder_layer_matches_torch():
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.1,
                                     batch_first=True).eval()
    ours = EncoderLayer(32, 4, 64).eval()
    copy_common(ref, ours, 2)
    x = torch.randn(3, 7, 32)
    keep = padding_mask([7, 5, 2], 7)                       # (B, 1, S)
    with torch.no_grad():
        expected = ref(x, src_key_padding_mask=~keep[:, 0])  # True = ignore
        got = ours(x, mask=keep)
        assert torch.allclose(ours(x), ref(x), atol=ATOL)
    # torch's fast path leaves padded rows as zeros; compare real rows
    for b, n in enumerate([7, 5, 2]):
        assert torch.allclose(got[b, :n], expected[b, :n], atol=ATOL)


def test_decoder_layer_matches_torch():
    ref = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.1,
                                     batch_first=True).eval()
    ours = DecoderLayer(32, 4, 64).eval()
    copy_common(ref, ours, 3)
    copy_mha(ref.multihead_attn, ours.cross_attn)
    x, memory = torch.randn(2, 6, 32), torch.randn(2, 9, 32)
    keep = padding_mask([9, 4], 9)
    with torch.no_grad():
        expected = ref(x, memory, tgt_mask=~causal_mask(6),
                       memory_key_padding_mask=~keep[:, 0])
        got, w = ours.forward_with_weights(x, memory, causal_mask(6), keep)
    assert torch.allclose(got, expected, atol=ATOL)
    assert w.shape == (2, 4, 6, 9)
    assert torch.allclose(w.sum(-1), torch.ones(2, 4, 6), atol=ATOL)
    assert w[1, :, :, 4:].abs().max() == 0          # padded source keys


def test_decoder_layer_is_causal_in_target():
    layer = DecoderLayer(16, 2, 32).eval()
    x, memory = torch.randn(1, 6, 16), torch.randn(1, 5, 16)
    out = layer(x, memory, causal_mask(6))
    x2 = x.clone()
    x2[:, 4:] = torch.randn(1, 2, 16)
    out2 = layer(x2, memory, causal_mask(6))
    assert torch.allclose(out[:, :4], out2[:, :4], atol=1e-6)
    assert not torch.allclose(out[:, 4:], out2[:, 4:], atol=1e-3)


def test_dropout_active_in_training_only():
    layer = EncoderLayer(16, 2, 32, dropout=0.5)
    x = torch.randn(2, 4, 16)
    assert not torch.equal(layer(x), layer(x))
    layer.eval()
    assert torch.equal(layer(x), layer(x))


# ---------------------------------------------------------- DecoderBlock
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_decoder_block_is_pre_norm(norm):
    attn, ffn = MultiHeadAttention(16, 4), SwiGLU(16, 40)
    block = DecoderBlock(16, attention=attn, ffn=ffn, norm=norm).eval()
    x = torch.randn(2, 5, 16)
    mask = causal_mask(5)
    h = x + attn(block.norm1(x), mask=mask)
    expected = h + ffn(block.norm2(h))
    out = block(x, mask=mask)
    assert isinstance(out, torch.Tensor)
    assert torch.allclose(out, expected, atol=1e-6)
    assert isinstance(block.norm1, RMSNorm if norm == "rms" else nn.LayerNorm)


class Zeros(nn.Module):
    """A sub-layer whose output is exactly zero (any signature)."""

    def forward(self, h, *args, **kw):
        return torch.zeros_like(h)


def test_decoder_block_dropout_never_touches_the_residual_stream():
    # x + Drop(0) = x exactly, in training mode too. Dropout on the
    # residual stream (x = Drop(x + a)) would zero about half of x here
    # and double the rest.
    block = DecoderBlock(16, attention=Zeros(), ffn=Zeros(), dropout=0.5)
    assert block.training
    x = torch.randn(4, 8, 16)
    assert torch.equal(block(x), x)


def test_decoder_block_dropout_matches_hand_built_block():
    # Same seed, same order of dropout draws: the block must equal
    # x + Drop(Attn(N1 x)), then + Drop(FFN(N2 x)), written out here.
    attn, ffn = MultiHeadAttention(16, 4), SwiGLU(16, 40)
    block = DecoderBlock(16, attention=attn, ffn=ffn, dropout=0.3)
    x, mask = torch.randn(2, 5, 16), causal_mask(5)
    torch.manual_seed(7)
    got = block(x, mask=mask)
    torch.manual_seed(7)
    drop = nn.functional.dropout
    h = x + drop(attn(block.norm1(x), mask=mask), 0.3, training=True)
    want = h + drop(ffn(block.norm2(h)), 0.3, training=True)
    assert torch.equal(got, want)
    # and dropout does act in training mode
    assert not torch.allclose(block.eval()(x, mask=mask), got, atol=1e-3)


def test_decoder_block_with_moe_returns_x_and_the_moe_keeps_its_info():
    # an MoE FFN returns a tensor like any FFN; its routing stays on it
    torch.manual_seed(0)
    moe = MoE(16, n_experts=4, top_k=2, d_expert=8)
    block = DecoderBlock(16, attention=MultiHeadAttention(16, 2),
                         ffn=moe).eval()
    x = torch.randn(2, 3, 16)
    out = block(x)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3, 16)
    h = x + block.attention(block.norm1(x))
    f, info = moe.forward_with_info(block.norm2(h))
    torch.testing.assert_close(out, h + f)
    assert torch.equal(moe.last_info.indices, info.indices)
    assert torch.equal(moe.last_info.load, info.load)


def test_decoder_block_zero_sublayers_is_identity():
    attn, ffn = MultiHeadAttention(8, 2), FeedForward(8, 16)
    for lin in (attn.o_proj, ffn.linear2):
        nn.init.zeros_(lin.weight)
        nn.init.zeros_(lin.bias)
    block = DecoderBlock(8, attention=attn, ffn=ffn, norm="layer")
    x = torch.randn(2, 3, 8)
    assert torch.equal(block(x), x)


def test_bad_inputs():
    with pytest.raises(TypeError, match="attention must be an nn.Module"):
        DecoderBlock(8, attention=lambda h, mask=None: h,
                     ffn=FeedForward(8, 16))
    with pytest.raises(ValueError, match="norm must be one of"):
        DecoderBlock(8, attention=MultiHeadAttention(8, 2),
                     ffn=FeedForward(8, 16), norm="batch")
    with pytest.raises(ValueError, match="d_model must be divisible"):
        EncoderLayer(10, 4, 16)
    with pytest.raises(ValueError, match=r"x must have shape"):
        EncoderLayer(8, 2, 16)(torch.randn(2, 3, 9))
    with pytest.raises(ValueError, match=r"context must have shape"):
        DecoderLayer(8, 2, 16)(torch.randn(2, 3, 8), torch.randn(3, 4, 8))

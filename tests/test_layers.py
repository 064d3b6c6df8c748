"""Tests for course_lib.model.block (chapter 6).

References: torch.nn.RMSNorm and torch.nn.LayerNorm, the FFN and SwiGLU
formulas written out with raw matrix products, the FFN of
torch.nn.TransformerEncoderLayer, closed-form parameter counts and Llama's
published hidden widths.
"""
import pytest
import torch
from torch import nn

from course_lib.model.block import (FeedForward, RMSNorm, SwiGLU,
                                    ffn_param_count, llama_hidden_dim,
                                    make_norm, swiglu_param_count)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------------------------ FeedForward
@pytest.mark.parametrize("activation,fn", [
    ("relu", torch.relu), ("gelu", nn.functional.gelu)])
def test_feedforward_matches_formula(activation, fn):
    ffn = FeedForward(16, 40, activation=activation)
    x = torch.randn(3, 5, 16)
    w1, b1 = ffn.linear1.weight.T, ffn.linear1.bias
    w2, b2 = ffn.linear2.weight.T, ffn.linear2.bias
    expected = fn(x @ w1 + b1) @ w2 + b2
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_feedforward_is_position_wise():
    ffn = FeedForward(8, 32)
    x = torch.randn(2, 6, 8)
    out = ffn(x)
    perm = torch.randperm(6)
    assert torch.allclose(ffn(x[:, perm]), out[:, perm], atol=1e-6)
    assert torch.allclose(ffn(x[:, 2]), out[:, 2], atol=1e-6)


def test_feedforward_matches_torch_encoder_layer_ffn():
    ref = nn.TransformerEncoderLayer(16, 2, 48, dropout=0.0,
                                     batch_first=True).eval()
    ffn = FeedForward(16, 48)
    missing = ffn.load_state_dict(
        {k: v for k, v in ref.state_dict().items()
         if k.startswith(("linear1", "linear2"))})
    assert not missing.missing_keys
    x = torch.randn(2, 4, 16)
    assert torch.allclose(ffn(x), ref._ff_block(x), atol=1e-6)


def test_feedforward_param_count():
    for bias in (True, False):
        ffn = FeedForward(512, 2048, bias=bias)
        n = sum(p.numel() for p in ffn.parameters())
        assert n == ffn_param_count(d_model=512, d_ff=2048, bias=bias)
    assert ffn_param_count(d_model=512, d_ff=2048) == 2_099_712


def test_feedforward_dropout_only_in_training():
    ffn = FeedForward(8, 64, dropout=0.5)
    x = torch.randn(4, 8)
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))
    ffn.train()
    assert not torch.equal(ffn(x), ffn(x))


# ------------------------------------------------------------------ SwiGLU
def test_swiglu_matches_hand_formula():
    m = SwiGLU(12, 20)
    x = torch.randn(2, 3, 12)
    g, u, d = m.gate_proj.weight, m.up_proj.weight, m.down_proj.weight
    z = x @ g.T
    expected = ((z * torch.sigmoid(z)) * (x @ u.T)) @ d.T
    assert torch.allclose(m(x), expected, atol=1e-6)


def test_swiglu_has_no_bias_and_three_matrices():
    m = SwiGLU(64, 176)
    assert all(p.dim() == 2 for p in m.parameters())
    assert sum(p.numel() for p in m.parameters()) == \
        swiglu_param_count(d_model=64, d_ff=176) == 3 * 64 * 176


@pytest.mark.parametrize("d,hidden", [(4096, 11008), (5120, 13824),
                                      (8192, 22016)])
def test_llama_hidden_dim_published(d, hidden):
    # Llama (1 and 2) 7B, 13B; Llama-1 65B uses multiple_of=256 too.
    assert llama_hidden_dim(d) == hidden


def test_llama_hidden_dim_keeps_params_close_to_4d_ffn():
    d = 4096
    ratio = swiglu_param_count(d_model=d, d_ff=llama_hidden_dim(d)) / \
        ffn_param_count(d_model=d, d_ff=4 * d, bias=False)
    assert 1.0 <= ratio < 1.01


# ----------------------------------------------------------------- RMSNorm
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_rmsnorm_matches_torch(eps):
    ours, ref = RMSNorm(24, eps=eps), nn.RMSNorm(24, eps=eps)
    with torch.no_grad():
        w = torch.rand(24) + 0.5
        ours.weight.copy_(w)
        ref.weight.copy_(w)
    x = 3 * torch.randn(4, 5, 24) + 1
    assert torch.allclose(ours(x), ref(x), atol=1e-6)


def test_rmsnorm_equals_layernorm_on_zero_mean_input():
    x = torch.randn(6, 32)
    x = x - x.mean(-1, keepdim=True)
    ln = nn.LayerNorm(32, eps=1e-6, bias=False)
    assert torch.allclose(RMSNorm(32, eps=1e-6)(x), ln(x), atol=1e-5)
    y = x + 2.0                                       # nonzero mean: differ
    assert not torch.allclose(RMSNorm(32)(y), ln(y), atol=1e-2)


def test_rmsnorm_half_precision_and_unit_rms():
    x = 100 * torch.randn(3, 64)
    out = RMSNorm(64).to(torch.bfloat16)(x.to(torch.bfloat16))
    assert out.dtype == torch.bfloat16
    rms = out.float().pow(2).mean(-1).sqrt()
    assert torch.allclose(rms, torch.ones(3), atol=1e-2)


@pytest.mark.parametrize("dtype, ulp", [(torch.bfloat16, 2.0 ** -8),
                                        (torch.float16, 2.0 ** -11)])
def test_rmsnorm_half_precision_statistic_is_computed_in_float32(dtype, ulp):
    # Reference by hand in float32, rounded to the half type at the same
    # two points as the module (normalised x, then times gamma). With the
    # float32 statistic the results agree to at most one half-precision
    # ulp (a float32 rounding tie can flip the last bit; in practice they
    # are equal); a statistic computed in the half type is 3-4 ulps off.
    torch.manual_seed(123)
    norm = RMSNorm(512)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    norm = norm.to(dtype)
    x = (3 * torch.randn(16, 512) + 1).to(dtype)
    xf = x.float()
    unit = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (unit.to(dtype).float() * norm.weight.float()).to(dtype).float()
    out = norm(x)
    assert out.dtype == dtype
    assert ((out.float() - want).abs() <= ulp * want.abs()).all()


def test_rmsnorm_float16_input_whose_square_overflows():
    # |x| = 300: x^2 = 9e4 > 65504, the float16 maximum. In float16 the
    # mean square is inf and the output 0; in float32 it is fine.
    x = torch.tensor([[300.0, -300.0, 300.0, -300.0]], dtype=torch.float16)
    out = RMSNorm(4).to(torch.float16)(x)
    assert torch.equal(out, torch.tensor([[1.0, -1.0, 1.0, -1.0]],
                                         dtype=torch.float16))


def test_make_norm():
    assert isinstance(make_norm("rms", 8), RMSNorm)
    ln = make_norm("layer", 8, bias=False)
    assert isinstance(ln, nn.LayerNorm) and ln.bias is None
    assert make_norm("layer", 8).eps == 1e-5 and make_norm("rms", 8).eps == 1e-6


# --------------------------------------------------------------- bad input
def test_bad_inputs():
    with pytest.raises(ValueError, match="activation must be one of"):
        FeedForward(8, 16, activation="tanh")
    with pytest.raises(ValueError, match="d_ff must be >= 1, got 0"):
        FeedForward(8, 0)
    with pytest.raises(TypeError, match="d_model must be an int"):
        SwiGLU(8.0, 16)
    with pytest.raises(ValueError, match="dropout must be"):
        FeedForward(8, 16, dropout=1.5)
    with pytest.raises(ValueError, match="eps must be > 0"):
        RMSNorm(8, eps=0)
    with pytest.raises(ValueError, match="norm must be one of"):
        make_norm("batch", 8)
    with pytest.raises(ValueError, match="multiple_of must be >= 1"):
        llama_hidden_dim(64, multiple_of=0)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("eps", [0, -1e-5, float("inf"), float("nan")])
def test_norm_epsilon_must_be_finite_and_positive(kind, eps):
    # LayerNorm's eps was once unchecked (eps = 0 gave
    # NaN on a constant input), RMSNorm accepted inf (all zeros).
    with pytest.raises(ValueError, match="eps must be"):
        make_norm(kind, 4, eps=eps)
    with pytest.raises(ValueError, match="d_model must be >= 1, got 0"):
        make_norm(kind, 0)


def test_encoder_and_decoder_layers_validate_eps():
    from course_lib.model.transformer import DecoderLayer, EncoderLayer
    for layer in (EncoderLayer, DecoderLayer):
        with pytest.raises(ValueError, match="eps must be > 0, got 0"):
            layer(8, 2, 16, eps=0)

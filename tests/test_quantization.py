"""Tests for course_lib.serving.quantization (chapter 15): weight-only int8
and 4-bit (Q4_1) linear layers, quantize_model, weight_bytes,
quantization_error and perplexity.

References: the closed forms (s = max|w|/127, q = round(w/s)); llama.cpp's
Q4_1 as ``gguf.quants`` writes it (bytes) and as chapter 13's
``requantize.q4_1_roundtrip`` and ``gguf_file.dequantize_q4_1_block``
decode it; ``F.linear`` on the dequantized weight; torch.ao's dynamic
int8 Linear (a bound: it also quantizes the activations); the parameter
count in closed form; a hand loop of ``F.cross_entropy``.
"""
import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from gguf.quants import quantize as gguf_quantize
from torch import nn

from course_lib.model.decoder_lm import (DecoderLM, DecoderLMConfig,
                                         decoder_lm_param_count)
from course_lib.pretrained.gguf_file import dequantize_q4_1_block
from course_lib.pretrained.requantize import q4_1_roundtrip
from course_lib.serving.quantization import (
    Int8Embedding, WeightOnlyInt4Linear, WeightOnlyInt8Linear,
    dequantize_q4_1, pack_int4, perplexity, quantization_error,
    quantize_model, quantize_weight_int8, quantize_weight_q4_1, unpack_int4,
    weight_bytes)

BF16_U = 2.0 ** -8       # bfloat16 rounding moves a value <= 2^-8 of it


def gen(seed):
    return torch.Generator().manual_seed(seed)


def tiny_lm(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = DecoderLMConfig(vocab_size=96, hidden_size=64,
                          num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=2, max_position_embeddings=64,
                          **kw)
    return DecoderLM(cfg).eval()


# ------------------------------------------------------------------ int8

def test_int8_is_the_closed_form_per_channel_within_half_a_step():
    w = torch.randn(24, 80, generator=gen(0)) * torch.logspace(-3, 1, 24)[:,
                                                                        None]
    w[5] = 0.0                                        # a row of zeros
    q, s = quantize_weight_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32
    expected_s = w.abs().amax(1) / 127                               # (N,)
    expected_s[5] = 1.0                               # any scale is exact
    assert torch.equal(s, expected_s)
    assert torch.equal(q, torch.round(w / expected_s[:, None]).to(torch.int8))
    w_hat = q.float() * s[:, None]
    assert w_hat[5].eq(0).all()
    # |w - s q| <= s/2 (+ one float32 rounding of w/s)
    assert ((w - w_hat).abs() <= s[:, None] * (0.5 + 1e-6)).all()
    assert q.abs().amax(1)[torch.arange(24) != 5].eq(127).all()


def test_int8_linear_forward_equals_f_linear_of_the_dequantized_weight():
    lin = nn.Linear(80, 24)
    with torch.no_grad():
        lin.bias.normal_(generator=gen(1))
    x = torch.randn(3, 5, 80, generator=gen(2))
    layer = WeightOnlyInt8Linear.from_linear(lin)
    s = lin.weight.abs().amax(1) / 127
    w_hat = torch.round(lin.weight / s[:, None]) * s[:, None]  # closed form
    torch.testing.assert_close(layer(x), F.linear(x, w_hat, lin.bias),
                               rtol=1e-6, atol=1e-6)
    # against the float layer: |dy_o| <= ||x||_1 s_o / 2
    dy = (layer(x) - lin(x)).abs()
    assert (dy <= x.abs().sum(-1, keepdim=True) * s / 2 + 1e-6).all()
    # the module holds int8 weights, float32 scales and bias: N K + 8 N
    assert layer.weight.dtype == torch.int8
    assert layer.nbytes == 24 * 80 + 4 * 24 + 4 * 24
    assert weight_bytes(layer) == {"int8": 24 * 80, "float32": 8 * 24}


def _bf16_bound(x, w_hat):
    """|kernel - F.linear(x, w_hat)| for bf16 activations and a bf16
    result with float32 sums: each of x's values moves by <= 2^-8 of
    itself, the sum by <= 2^-8 of itself, so <= 2^-7 sum_i |x_i||w_i|."""
    return 2 * BF16_U * 1.01 * (x.abs() @ w_hat.abs().t()) + 1e-6


def test_int8_kernel_path_is_within_bfloat16_rounding():
    lin = nn.Linear(96, 40)
    x = torch.randn(7, 96, generator=gen(3))
    ref = WeightOnlyInt8Linear.from_linear(lin)
    fast = WeightOnlyInt8Linear.from_linear(lin, kernel=True)
    assert torch.equal(fast.weight, ref.weight)
    assert torch.equal(fast.scales, ref.scales)        # same W_hat = s q
    w_hat = ref.dequantize()
    err = (fast(x) - F.linear(x, w_hat, lin.bias)).abs()
    assert (err <= _bf16_bound(x, w_hat)).all()
    assert err.max() > 0                   # bf16: not the float32 result
    assert fast(x[None]).shape == (1, 7, 40)


def test_int8_approximates_torch_ao_dynamic_linear_with_the_same_weights():
    """torch.ao's dynamic int8 Linear holds the same int8 weight (given as
    a per-channel quantized tensor) and also rounds the activations to an
    8-bit (or 7-bit, reduce_range) grid over [min(x, 0), max(x, 0)], of
    step at most range/127; that moves y_o by <= ||W_hat_o||_1 * step
    (half a step of rounding, half a step of zero-point rounding)."""
    dynamic = pytest.importorskip("torch.ao.nn.quantized.dynamic")
    lin = nn.Linear(64, 32)
    layer = WeightOnlyInt8Linear.from_linear(lin)
    with warnings.catch_warnings():          # quantized tensors: deprecated
        warnings.simplefilter("ignore")
        try:
            qw = torch._make_per_channel_quantized_tensor(
                layer.weight, layer.scales.double(),
                torch.zeros(32, dtype=torch.long), 0)
            ao = dynamic.Linear(64, 32, dtype=torch.qint8)
            ao.set_weight_bias(qw, lin.bias.detach())
        except (RuntimeError, NotImplementedError) as exc:
            pytest.skip(f"torch.ao dynamic int8 unavailable: {exc}")
        assert torch.equal(ao.weight().dequantize(), layer.dequantize())
        x = torch.randn(6, 64, generator=gen(4))
        got = ao(x)
    ours = layer(x)
    step = (x.max().clamp(min=0) - x.min().clamp(max=0)) / 127
    bound = layer.dequantize().abs().sum(1) * step + 1e-5            # (N,)
    assert ((got - ours).abs() <= bound).all()
    assert not torch.equal(got, ours)            # activations quantized too


# ----------------------------------------------------------------- 4-bit

def _gguf_bytes(packed, d, m):
    """Our (packed, d, m) as GGUF Q4_1 blocks: fp16 d, fp16 m, 16 bytes."""
    blocks = torch.cat([d[..., None].view(torch.uint8),
                        m[..., None].view(torch.uint8), packed], dim=-1)
    return blocks.reshape(-1).numpy()                # (N K/32 * 20,)


@pytest.mark.parametrize("scale,shift", [(1e-3, 0.0), (0.1, 0.5),
                                         (3.0, -2.0)])
def test_q4_1_bytes_are_what_gguf_quants_writes(scale, shift):
    w = scale * torch.randn(16, 128, generator=gen(5)) + shift
    w[0, :32] = 0.25                                  # d = 0: all at m
    w[1, 32:64] = torch.tensor([0.5, -0.5] * 16)      # ties
    packed, d, m = quantize_weight_q4_1(w)
    assert packed.shape == (16, 4, 16) and packed.dtype == torch.uint8
    assert d.dtype == m.dtype == torch.float16
    expected = gguf_quantize(w.numpy(), GGMLQuantizationType.Q4_1)
    assert np.array_equal(_gguf_bytes(packed, d, m), expected.reshape(-1))
    # decoded three ways: ours, chapter 13's round trip, the block reader
    w_hat = dequantize_q4_1(packed, d, m)
    assert torch.equal(w_hat, q4_1_roundtrip(w))
    block = _gguf_bytes(packed[3:4, 2:3], d[3:4, 2:3], m[3:4, 2:3])
    assert torch.equal(dequantize_q4_1_block(block), w_hat[3, 64:96])


def test_pack_int4_layout_and_round_trip():
    q = torch.arange(16)                              # one group of G = 16
    assert pack_int4(q).tolist() == [j | (j + 8) << 4 for j in range(8)]
    codes = torch.randint(0, 16, (3, 5, 32), generator=gen(6),
                          dtype=torch.uint8)
    packed = pack_int4(codes)
    assert packed.shape == (3, 5, 16) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), codes)
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(every_byte)), every_byte)


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_linear_bytes_error_bound_and_forward(group_size):
    N, K = 48, 128
    lin = nn.Linear(K, N)
    lin.weight.data = torch.randn(N, K, generator=gen(7)) * 0.05 + 0.01
    layer = WeightOnlyInt4Linear.from_linear(lin, group_size=group_size)
    groups = N * K // group_size
    # half a byte per weight, fp16 d and m per group, float32 bias
    assert layer.nbytes == N * K // 2 + 2 * 2 * groups + 4 * N
    assert weight_bytes(layer) == {"uint8": N * K // 2,
                                   "float16": 4 * groups, "float32": 4 * N}
    w_hat = layer.dequantize()
    if group_size == 32:
        assert torch.equal(w_hat, q4_1_roundtrip(lin.weight))
    # |w - w_hat| <= d/2 + 15 |d - fp16(d)| + |m - fp16(m)|
    blocks = lin.weight.detach().reshape(N, -1, group_size)
    m32 = blocks.amin(-1)
    d32 = (blocks.amax(-1) - m32) / 15
    slack = 15 * (d32 - d32.half().float()).abs() + \
        (m32 - m32.half().float()).abs()
    err = (blocks - w_hat.reshape(blocks.shape)).abs()
    assert (err <= (d32 / 2 + slack)[..., None] * (1 + 1e-5) + 1e-7).all()
    x = torch.randn(2, 3, K, generator=gen(8))
    torch.testing.assert_close(layer(x), F.linear(x, w_hat, lin.bias),
                               rtol=1e-6, atol=1e-6)


def test_int4_kernel_path_uses_bfloat16_scale_and_zero():
    """torch's int4 kernel computes (q - 8) bf16(d) + bf16(m + 8 d) and
    multiplies bf16 activations; the same codes as the GGUF layout."""
    N, K = 32, 128
    lin = nn.Linear(K, N, bias=False)
    ref = WeightOnlyInt4Linear.from_linear(lin)
    fast = WeightOnlyInt4Linear.from_linear(lin, kernel=True)
    assert fast.nbytes == ref.nbytes             # 0.5 B + 2 x 2 B / 32
    q = unpack_int4(ref.weight).float()                       # (N, K/G, G)
    d, m = ref.scales.float()[..., None], ref.mins.float()[..., None]
    scale = d.bfloat16().float()
    zero = (m + 8 * d).bfloat16().float()
    w_kernel = ((q - 8) * scale + zero).reshape(N, K)
    torch.testing.assert_close(fast.dequantize(), w_kernel, rtol=1e-6,
                               atol=1e-7)
    # bf16 scale and zero move a weight by <= 2^-8 (|q - 8| d + |m + 8 d|)
    moved = (BF16_U * ((q - 8).abs() * d + (m + 8 * d).abs())
             ).reshape(N, K) * 1.01 + 1e-7
    assert ((w_kernel - ref.dequantize()).abs() <= moved).all()
    x = torch.randn(5, K, generator=gen(9))
    err = (fast(x) - F.linear(x, w_kernel)).abs()
    assert (err <= _bf16_bound(x, w_kernel)).all()


def test_quantization_error_relative_and_per_group():
    w = torch.randn(64, 256, generator=gen(10))
    e4 = quantization_error(w, 4)
    assert e4.relative == pytest.approx(
        float((w - q4_1_roundtrip(w)).norm() / w.norm()), rel=1e-6)
    assert e4.group_rms.shape == e4.group_step.shape == (64 * 256 // 32,)
    ratio4 = e4.group_rms / e4.group_step
    assert (ratio4 <= 0.5 + 1e-3).all()
    e8 = quantization_error(w, 8)
    assert e8.group_rms.shape == (64,)
    ratio8 = e8.group_rms / e8.group_step
    # uniform rounding error over [-step/2, step/2]: RMS = step / sqrt(12)
    assert ratio8.mean() == pytest.approx(1 / math.sqrt(12), rel=0.03)
    assert 0.2 < ratio4.mean() < 0.35
    assert e8.relative < e4.relative / 10
    zero = quantization_error(torch.zeros(4, 32), 8)
    assert zero.relative == 0.0


# ---------------------------------------------------------------- models

def test_quantize_model_copies_replaces_and_stays_close():
    """Measured bound on a random tiny model: the logits' relative error is
    about half the weights' (~0.006 for int8, ~0.08 for 4-bit: the residual
    stream also carries the float32 embedding), i.e. ~0.003 and ~0.035."""
    model = tiny_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 96, (2, 24), generator=gen(11))
    with torch.no_grad():
        ref = model(ids)
    errors = {}
    for bits in (8, 4):
        q = quantize_model(model, bits)
        linears = [m for m in q.layers.modules() if isinstance(m, nn.Linear)]
        kind = WeightOnlyInt8Linear if bits == 8 else WeightOnlyInt4Linear
        assert linears == []
        assert sum(isinstance(m, kind) for m in q.layers.modules()) == 2 * 7
        assert isinstance(q.lm_head, nn.Linear)           # kept, still tied
        assert q.lm_head.weight is q.embed_tokens.weight
        with torch.no_grad():
            out = q(ids)
            fast = quantize_model(model, bits, kernel=True)(ids)
        errors[bits] = float((out - ref).norm() / ref.norm())
        assert float((fast - out).norm() / ref.norm()) < 2e-3
    assert errors[8] < 0.01 and errors[4] < 0.1
    assert errors[8] < errors[4] / 5
    # the original is untouched: same modules, same numbers
    assert all(isinstance(m, nn.Linear) for m in
               (model.layers[0].attention.q_proj, model.layers[1].ffn.up_proj))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_quantize_model_int8_embedding_keeps_the_tie():
    model = tiny_lm()
    q = quantize_model(model, 4, embeddings=True)
    assert isinstance(q.lm_head, WeightOnlyInt8Linear)
    assert isinstance(q.embed_tokens, Int8Embedding)
    assert q.embed_tokens.weight is q.lm_head.weight       # one int8 table
    ids = torch.randint(0, 96, (1, 9), generator=gen(12))
    table = q.lm_head.dequantize()                          # (V, D)
    torch.testing.assert_close(q.embed_tokens(ids), table[ids], rtol=0,
                               atol=0)
    # bytes: V D int8 once, V float32 scales, the 4-bit layers, the norms
    D, V = 64, 96
    got = weight_bytes(q)
    assert got["int8"] == V * D
    layers = sum(m.weight.numel() for m in q.layers.modules()
                 if isinstance(m, WeightOnlyInt4Linear))
    assert got["uint8"] == layers
    norms = (2 * 2 + 1) * D
    assert got["float32"] == 4 * (V + norms)
    untied = tiny_lm(tie_word_embeddings=False)
    q2 = quantize_model(untied, 8, embeddings=True)
    assert q2.embed_tokens.weight is not q2.lm_head.weight
    assert weight_bytes(q2)["int8"] == 2 * V * D + sum(
        m.weight.numel() for m in q2.layers.modules()
        if isinstance(m, WeightOnlyInt8Linear))


def test_weight_bytes_counts_a_tied_matrix_once():
    model = tiny_lm()
    assert weight_bytes(model) == {
        "float32": 4 * decoder_lm_param_count(model.config)}


def test_smollm2_int8_linears_are_a_quarter_of_float32(smollm2):
    """SmolLM2's decoder layers: int8 codes are exactly a quarter of the
    float32 matrices' bytes (plus one float32 scale per output row); and
    its matrices, dequantized from the file's Q4_1, are a fixed point of
    the 4-bit format (so 4-bit at group 32 changes nothing here)."""
    model, _ = smollm2
    linears = [m for m in model.layers.modules() if isinstance(m, nn.Linear)]
    fp32 = sum(m.weight.nbytes for m in linears)
    q = quantize_model(model, 8)
    got = weight_bytes(q.layers)
    assert got["int8"] * 4 == fp32
    rows = sum(m.out_features for m in linears)
    norms = sum(p.nbytes for n, p in model.layers.named_parameters()
                if "norm" in n)
    assert got["float32"] == 4 * rows + norms
    assert weight_bytes(q)["float32"] - got["float32"] == \
        model.embed_tokens.weight.nbytes + model.norm.weight.nbytes
    w = model.layers[3].ffn.down_proj.weight
    assert torch.equal(WeightOnlyInt4Linear(w).dequantize(), w)


# ------------------------------------------------------------ perplexity

def test_perplexity_equals_a_hand_loop_over_chunks_and_windows():
    model = tiny_lm(1)
    model.train()                                 # restored afterwards
    ids = torch.randint(0, 96, (50,), generator=gen(13))
    C = 16
    # non-overlapping chunks: each chunk scores its tokens after the first
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, 50, C):
            chunk = ids[i:i + C]
            if len(chunk) > 1:
                logits = model.eval()(chunk[None])[0]
                total += float(F.cross_entropy(logits[:-1], chunk[1:],
                                               reduction="sum"))
                count += len(chunk) - 1
    model.train()
    got = perplexity(model, ids, context=C)
    assert model.training
    assert got.n_tokens == count == 50 - 4
    assert got.nll == pytest.approx(total / count, rel=1e-6)
    assert got.perplexity == pytest.approx(math.exp(total / count), rel=1e-6)
    # sliding window: token t is scored by the first window ending after t
    stride, total = 5, 0.0
    model.eval()
    with torch.no_grad():
        for t in range(1, 50):
            k = next(k for k in range(50) if k * stride + C > t)
            logits = model(ids[None, k * stride:t])[0, -1]
            total -= float(F.log_softmax(logits, -1)[ids[t]])
    got = perplexity(model, ids, context=C, stride=stride)
    assert got.n_tokens == 49
    assert got.nll == pytest.approx(total / 49, rel=1e-5)


# ------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    model = tiny_lm()
    w = torch.randn(16, 64)
    with pytest.raises(ValueError, match="bits must be one of"):
        quantize_model(model, 3)
    with pytest.raises(TypeError, match="bits must be an int"):
        quantize_model(model, "8")
    with pytest.raises(TypeError, match="model must be a DecoderLM"):
        quantize_model(nn.Linear(4, 4), 8)
    with pytest.raises(ValueError, match="group_size must divide"):
        quantize_model(model, 4, group_size=24)
    with pytest.raises(ValueError, match="group_size must divide"):
        WeightOnlyInt4Linear(w, group_size=48)
    with pytest.raises(ValueError, match="group_size must be even"):
        quantize_weight_q4_1(w, 7)
    with pytest.raises(ValueError, match="group_size must be one of"):
        WeightOnlyInt4Linear(w, group_size=16, kernel=True)
    with pytest.raises(ValueError, match="out_features a multiple of 16"):
        WeightOnlyInt4Linear(torch.randn(8, 64), kernel=True)
    with pytest.raises(ValueError, match="in_features a multiple of 16"):
        WeightOnlyInt8Linear(torch.randn(8, 40), kernel=True)
    for bad in (torch.ones(4, 32, dtype=torch.long), torch.ones(4, 32).bool()):
        with pytest.raises(TypeError, match="weight must be a floating"):
            WeightOnlyInt8Linear(bad)
        with pytest.raises(TypeError, match="weight must be a floating"):
            quantize_weight_q4_1(bad)
    with pytest.raises(ValueError, match="weight must have shape"):
        quantize_weight_int8(torch.randn(32))
    nan = w.clone()
    nan[3, 5] = float("nan")
    for f in (quantize_weight_int8, quantize_weight_q4_1):
        with pytest.raises(ValueError, match="weight must be finite"):
            f(nan)
    with pytest.raises(ValueError, match="fp16's range"):
        quantize_weight_q4_1(w * 1e6)
    with pytest.raises(ValueError, match="bias must have shape"):
        WeightOnlyInt8Linear(w, torch.zeros(3))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., "):
        WeightOnlyInt8Linear(w)(torch.randn(2, 63))
    with pytest.raises(ValueError, match="q must hold 4-bit codes"):
        pack_int4(torch.tensor([3, 16]))
    ids = torch.randint(0, 96, (40,))
    with pytest.raises(TypeError, match="ids must be an integer tensor"):
        perplexity(model, ids.float())
    with pytest.raises(ValueError, match="ids must be a 1-D stream"):
        perplexity(model, ids[None])
    with pytest.raises(ValueError, match=r"ids must hold token ids in \[0, "):
        perplexity(model, ids + 90)
    with pytest.raises(ValueError, match="context must be <= 64"):
        perplexity(model, ids, context=65)
    with pytest.raises(ValueError, match="stride must be <= 16"):
        perplexity(model, ids, context=16, stride=17)
    with pytest.raises(ValueError, match="stride must be >= 1"):
        perplexity(model, ids, context=16, stride=0)

"""Tests for course_lib.pretrained.requantize (chapter 13): Q4_0 and Q4_1
round trips in torch and re-quantizing a model's linear layers.

Reference: gguf.quants (llama.cpp's NumPy implementation) quantizing to
Q4_0 and dequantizing; the definition w = d q with |q| <= 8.
"""
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.pretrained.requantize import (q4_0_roundtrip,
                                              q4_1_roundtrip, requantized)


def gguf_roundtrip(w: torch.Tensor) -> torch.Tensor:
    t = GGMLQuantizationType.Q4_0
    return torch.from_numpy(dequantize(quantize(w.numpy(), t), t).copy())


@pytest.mark.parametrize("scale", [1e-3, 0.1, 3.0])
def test_equals_gguf_quants(scale):
    w = scale * torch.randn(48, 256, generator=torch.Generator()
                            .manual_seed(0))
    assert torch.equal(q4_0_roundtrip(w), gguf_roundtrip(w))


def test_ties_zero_blocks_and_layouts():
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    w[0, :32] = torch.linspace(-1, 1, 32)        # -1 first: |min| = max
    w[1, :32] = torch.linspace(1, -1, 32)        # +1 first
    w[2, :32] = 0.0                              # an all-zero block
    w[3, 32:] = torch.tensor([0.5, -0.5] * 16)   # ties everywhere
    assert torch.equal(q4_0_roundtrip(w), gguf_roundtrip(w))
    assert torch.equal(q4_0_roundtrip(w.t().contiguous().t()),
                       q4_0_roundtrip(w))
    assert q4_0_roundtrip(w)[2, :32].eq(0).all()


def test_levels_and_error_bound():
    w = torch.randn(8, 128, generator=torch.Generator().manual_seed(2))
    r = q4_0_roundtrip(w).reshape(-1, 32)
    b = w.reshape(-1, 32)
    d = b.gather(-1, b.abs().argmax(-1, keepdim=True)) / -8
    q = r / d.half().float()
    assert torch.equal(q, q.round()) and q.abs().max() <= 8
    assert len(torch.unique(r[0])) <= 16
    # nearest level: error at most half a step (plus the fp16 scale),
    # except where w/d > 7.5 is clipped to 7 (at most one step)
    err, step = (r - b).abs(), d.abs() * (1 + 1e-2) + 1e-6
    inside = b / d <= 7.5
    assert (err[inside] <= 0.5 * step.expand_as(b)[inside]).all()
    assert (err <= step).all()


def test_rejects_bad_weights():
    with pytest.raises(TypeError, match="weight"):
        q4_0_roundtrip(np.zeros((2, 32)))
    with pytest.raises(TypeError, match="weight"):
        q4_0_roundtrip(torch.zeros(2, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="weight"):
        q4_0_roundtrip(torch.zeros(2, 30))


def tiny() -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(DecoderLMConfig(
        vocab_size=40, hidden_size=64, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=2, intermediate_size=96,
        max_position_embeddings=32)).eval()


def test_requantized_swaps_block_linears_and_restores():
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with requantized(model):
        now = model.state_dict()
        for k, v in before.items():
            inside = k.startswith("layers.") and k.endswith("proj.weight")
            expected = q4_0_roundtrip(v) if inside else v
            assert torch.equal(now[k], expected), k
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_requantized_restores_after_an_error_and_checks_arguments():
    model = tiny()
    w = model.layers[0].attention.q_proj.weight.detach().clone()
    with pytest.raises(RuntimeError):
        with requantized(model, lambda t: t * 0):
            raise RuntimeError("inside")
    assert torch.equal(model.layers[0].attention.q_proj.weight, w)
    with pytest.raises(TypeError, match="model"):
        with requantized(torch.nn.Linear(2, 2)):
            pass
    with pytest.raises(TypeError, match="roundtrip"):
        with requantized(model, "q4_0"):
            pass
    with pytest.raises(ValueError, match="roundtrip"):
        with requantized(model, lambda t: t[:1]):
            pass
    assert torch.equal(model.layers[0].attention.q_proj.weight, w)


def test_real_weights_match_gguf_and_q4_1_is_a_fixed_point(smollm2):
    """On SmolLM2's dequantized Q4_1 matrices: the torch round trip equals
    gguf.quants, and quantizing to Q4_1 again returns the same weights
    (so a second Q4_1 step would measure nothing)."""
    model, _ = smollm2
    q41 = GGMLQuantizationType.Q4_1
    for w in (model.layers[0].ffn.gate_proj.weight,
              model.layers[29].attention.v_proj.weight):
        w = w.detach().contiguous()
        assert torch.equal(q4_0_roundtrip(w), gguf_roundtrip(w))
        again = dequantize(quantize(w.numpy(), q41), q41)
        assert np.array_equal(again, w.numpy())
        assert torch.equal(q4_1_roundtrip(w), w)


def gguf_q4_1(w: torch.Tensor) -> torch.Tensor:
    t = GGMLQuantizationType.Q4_1
    return torch.from_numpy(dequantize(quantize(w.numpy(), t), t).copy())


@pytest.mark.parametrize("scale,shift", [(1e-3, 0.0), (0.1, 0.5),
                                         (3.0, -2.0)])
def test_q4_1_equals_gguf_quants(scale, shift):
    w = scale * torch.randn(48, 256, generator=torch.Generator()
                            .manual_seed(2)) + shift
    assert torch.equal(q4_1_roundtrip(w), gguf_q4_1(w))


def test_q4_1_constant_blocks_layouts_and_dtypes():
    w = torch.randn(3, 2, 64, generator=torch.Generator().manual_seed(3))
    w[0, 0, :32] = 0.3                                  # d = 0: all at m
    w[1, 1, 32:] = 0.0
    got = q4_1_roundtrip(w)
    assert got.shape == w.shape and got.dtype == torch.float32
    assert torch.equal(got, gguf_q4_1(w.reshape(-1, 64)).reshape(w.shape))
    assert torch.equal(got[0, 0, :32], torch.full((32,), 0.3).half().float())
    assert torch.equal(q4_1_roundtrip(w.double()), got)
    # blocks run along the last axis, whatever the layout in memory
    assert torch.equal(q4_1_roundtrip(w.transpose(0, 1)).transpose(0, 1),
                       got)


def test_q4_1_levels_and_error_bound():
    """Every decoded weight is d q + m of its block with q in 0..15, and it
    lies within half a step (plus fp16 rounding) of the weight."""
    w = torch.randn(16, 128, generator=torch.Generator().manual_seed(4))
    got = q4_1_roundtrip(w).reshape(-1, 32)
    blocks = w.reshape(-1, 32)
    m = blocks.amin(-1, keepdim=True).half().float()
    d = ((blocks.amax(-1, keepdim=True) - blocks.amin(-1, keepdim=True))
         / 15).half().float()
    q = (got - m) / d
    assert torch.allclose(q, q.round(), atol=1e-3)
    assert q.round().min() >= 0 and q.round().max() <= 15
    assert ((got - blocks).abs() <= d / 2 + 1e-3 * d.abs() + 1e-3).all()


def test_q4_1_rejects_bad_weights():
    with pytest.raises(TypeError, match="weight must be a floating tensor"):
        q4_1_roundtrip(torch.ones(2, 32, dtype=torch.long))
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_1_roundtrip(torch.ones(2, 33))

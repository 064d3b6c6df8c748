"""Tests for course_lib.experiments.interpret (chapter 13): attention maps of a
DecoderLM.

Reference: the weights of one head recomputed by hand from the block's
input (captured with a forward hook on the model's own forward), its
rows of q_proj and k_proj, RoPE (chapter 2's apply_rope) and a masked
softmax; the logits must equal model(idx).
"""
import math

import pytest
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.experiments.interpret import attention_maps
from course_lib.model.rope import apply_rope


def tiny(**kw) -> DecoderLM:
    torch.manual_seed(0)
    cfg = dict(vocab_size=40, hidden_size=32, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=3,
               max_position_embeddings=32)
    cfg.update(kw)
    return DecoderLM(DecoderLMConfig(**cfg)).eval()


def block_inputs(model, idx):
    """The input x of every block during model(idx), by forward hooks."""
    seen = []
    hooks = [b.register_forward_pre_hook(
        lambda mod, args: seen.append(args[0].detach()))
        for b in model.layers]
    with torch.no_grad():
        logits = model(idx)
    for h in hooks:
        h.remove()
    return seen, logits


def head_by_hand(model, layer, head, x):
    """softmax(q_i k_g^T / sqrt(d_k) + causal) for one head, from x."""
    c = model.config
    block = model.layers[layer]
    attn = block.attention
    H, G = c.num_attention_heads, c.num_key_value_heads
    d_k = c.hidden_size // H
    g = head // (H // G)                          # the K/V head it reads
    h = block.norm1(x)                                       # (B, T, D)
    rq = slice(head * d_k, (head + 1) * d_k)
    rk = slice(g * d_k, (g + 1) * d_k)
    q = h @ attn.q_proj.weight[rq].T                         # (B, T, d_k)
    k = h @ attn.k_proj.weight[rk].T                         # (B, T, d_k)
    if attn.q_proj.bias is not None:
        q, k = q + attn.q_proj.bias[rq], k + attn.k_proj.bias[rk]
    T = x.shape[1]
    if c.position == "rope":
        pos = torch.arange(T)
        q = apply_rope(q, pos, base=c.rope_theta,
                       interleave=c.rope_interleave)
        k = apply_rope(k, pos, base=c.rope_theta,
                       interleave=c.rope_interleave)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_k)         # (B, T, T)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1)


@pytest.mark.parametrize("kw", [{}, {"rope_interleave": True},
                                {"position": "learned", "norm": "layer",
                                 "hidden_act": "gelu",
                                 "attention_bias": True, "mlp_bias": True,
                                 "num_key_value_heads": 4}])
def test_maps_equal_heads_by_hand_and_logits_unchanged(kw):
    model = tiny(**kw)
    idx = torch.randint(40, (2, 11), generator=torch.Generator()
                        .manual_seed(1))
    maps, logits = attention_maps(model, idx)
    c = model.config
    assert maps.shape == (c.num_hidden_layers, 2, c.num_attention_heads,
                          11, 11)
    inputs, ref_logits = block_inputs(model, idx)
    torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-5)
    with torch.no_grad():
        for layer in range(c.num_hidden_layers):
            for head in range(c.num_attention_heads):
                ref = head_by_hand(model, layer, head, inputs[layer])
                torch.testing.assert_close(maps[layer, :, head], ref,
                                           rtol=0, atol=1e-5)


def test_rows_are_causal_distributions():
    model = tiny()
    idx = torch.randint(40, (1, 9), generator=torch.Generator()
                        .manual_seed(2))
    maps, _ = attention_maps(model, idx)
    torch.testing.assert_close(maps.sum(-1), torch.ones(3, 1, 4, 9))
    assert (maps.triu(1) == 0).all()
    assert (maps[..., 0, 0] == 1).all()      # the first query sees itself


def test_bad_input():
    model = tiny()
    with pytest.raises(ValueError, match="model must be a DecoderLM"):
        attention_maps(torch.nn.Linear(2, 2), torch.zeros(1, 2).long())
    with pytest.raises(ValueError, match="idx"):
        attention_maps(model, torch.zeros(4).long())
    with pytest.raises(ValueError, match="idx"):
        attention_maps(model, torch.full((1, 3), 40))
    with pytest.raises(ValueError, match="idx"):
        attention_maps(model, torch.zeros(1, 33).long())

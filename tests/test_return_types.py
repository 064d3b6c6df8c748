"""Return types that do not change with flags.

A call returns one type, whatever its options: ``forward`` returns the
output tensor, and a sibling named for what it adds
(``forward_with_weights``, ``forward_with_info``, ``decode_with_weights``)
returns the tuple. The scan fails if a public function takes a
``return_*`` flag again (a private helper may take one); the
pairs below check that each sibling's first element is exactly what the
plain call returns, in eval mode (no dropout). A module that reports
something besides its output on every call keeps it as an attribute
(an MoE's ``last_info``, collected by ``moe_infos``), so the modules
around it (``DecoderBlock``, ``DecoderLM``) return tensors too.
"""
import ast
from pathlib import Path

import pytest
import torch

from course_lib.model.attention import (fused_attention,
                                        scaled_dot_product_attention)
from course_lib.model.transformer import DecoderLayer
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.experiments.head_analysis import TinyAttentionModel
from course_lib.model.mha import repeat_kv
from course_lib.experiments.interpret import attention_maps
from course_lib.model.block import SwiGLU
from course_lib.model.masks import causal_mask, padding_mask
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.mla import MultiHeadLatentAttention
from course_lib.model.mla import MLAConfig
from course_lib.model.block import DecoderBlock
from course_lib.model.moe import MoE, moe_infos
from course_lib.model.transformer import Transformer, TransformerConfig

LIB = Path(__file__).resolve().parents[1] / "course_lib"


def test_no_function_takes_a_return_flag():
    flags = []
    for path in sorted(LIB.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and not node.name.startswith("_"):     # public API
                a = node.args
                for arg in a.posonlyargs + a.args + a.kwonlyargs:
                    if arg.arg.startswith(("return_", "need_weights")):
                        flags.append(f"{path.name}:{node.lineno} "
                                     f"{node.name}({arg.arg})")
    assert flags == []


def _check_pair(plain, with_extra):
    """plain is a tensor, with_extra a 2-tuple starting with it."""
    assert isinstance(plain, torch.Tensor)
    assert isinstance(with_extra, tuple) and len(with_extra) == 2
    assert torch.equal(with_extra[0], plain)


@pytest.mark.parametrize("fused", [False, True])
def test_mha_forward_and_forward_with_weights(fused):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2, fused=fused).eval()
    x, mask = torch.randn(2, 5, 16), causal_mask(5)
    out, w = mha.forward_with_weights(x, mask)
    if fused:   # the fused kernel: same output up to rounding
        torch.testing.assert_close(mha(x, mask), out, atol=1e-6, rtol=1e-5)
    else:
        _check_pair(mha(x, mask), (out, w))
    assert w.shape == (2, 4, 5, 5)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 5))
    out_loop, w_loop = mha.forward_loop(x, mask)
    torch.testing.assert_close(out_loop, out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w_loop, w, atol=1e-6, rtol=1e-5)


def test_fused_attention_gqa_equals_explicit_with_repeated_heads():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 8, generator=g)                 # H = 6
    k, v = torch.randn(2, 2, 2, 7, 8, generator=g)           # G = 2
    mask = padding_mask([7, 3], 7)[:, None]                  # (B, 1, 1, S)
    ref, _ = scaled_dot_product_attention(
        q, repeat_kv(k, 3), repeat_kv(v, 3), mask)
    out = fused_attention(q, k, v, mask, enable_gqa=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_decoder_layer_pair():
    torch.manual_seed(0)
    layer = DecoderLayer(16, 2, 32).eval()
    x, memory = torch.randn(2, 4, 16), torch.randn(2, 6, 16)
    plain = layer(x, memory, causal_mask(4))
    both = layer.forward_with_weights(x, memory, causal_mask(4))
    _check_pair(plain, both)
    assert both[1].shape == (2, 2, 4, 6)


def test_transformer_pairs():
    torch.manual_seed(0)
    tr = Transformer(TransformerConfig(
        src_vocab_size=20, tgt_vocab_size=20, hidden_size=16,
        num_attention_heads=2, intermediate_size=32, num_hidden_layers=2,
        max_position_embeddings=12)).eval()
    src, tgt = torch.randint(3, 20, (2, 6)), torch.randint(3, 20, (2, 4))
    plain = tr(src, tgt, src_lengths=[6, 4])
    logits, weights = tr.forward_with_weights(src, tgt, src_lengths=[6, 4])
    _check_pair(plain, (logits, weights))
    assert len(weights) == 2 and weights[0].shape == (2, 2, 4, 6)
    memory = tr.encode(src)
    _check_pair(tr.decode(tgt, memory), tr.decode_with_weights(tgt, memory))


def test_tiny_attention_model_pair():
    torch.manual_seed(0)
    model = TinyAttentionModel(vocab_size=9, d_model=16, n_heads=2,
                               n_layers=2, max_len=8).eval()
    tokens = torch.randint(0, 9, (3, 8))
    plain = model(tokens)
    logits, weights = model.forward_with_weights(tokens)
    _check_pair(plain, (logits, weights))
    assert len(weights) == 2 and weights[1].shape == (3, 2, 8, 8)


@pytest.mark.parametrize("capacity_factor", [None, 0.5])
def test_moe_pair_and_its_loop_reference(capacity_factor):
    torch.manual_seed(0)
    moe = MoE(16, n_experts=4, top_k=2, d_expert=8, n_shared_experts=1,
              capacity_factor=capacity_factor).eval()
    x = torch.randn(2, 5, 16)
    _check_pair(moe(x), moe.forward_with_info(x))
    out_loop, info_loop = moe.forward_loop(x)
    torch.testing.assert_close(out_loop, moe(x), atol=1e-6, rtol=1e-5)
    assert info_loop.dropped == moe.last_info.dropped


def test_blocks_and_decoder_lm_return_tensors_dense_and_moe():
    torch.manual_seed(0)
    cfg = DecoderLMConfig(vocab_size=11, hidden_size=16, num_attention_heads=2,
                          num_hidden_layers=2, max_position_embeddings=16)
    idx = torch.randint(0, 11, (2, 6))
    dense = DecoderLM(cfg).eval()
    moe = DecoderLM(cfg, ffn_factory=lambda i: SwiGLU(16, 32) if i == 0
                    else MoE(16, n_experts=4, top_k=2, d_expert=8)).eval()
    for model in (dense, moe):
        assert isinstance(model(idx), torch.Tensor)
        assert not hasattr(model, "forward_with_aux")
        h = torch.randn(2, 6, 16)
        for block in model.layers:
            assert isinstance(block, DecoderBlock)
            assert isinstance(block(h, causal_mask(6)), torch.Tensor)
    moe(idx)
    assert moe_infos(dense) == []
    assert len(moe_infos(moe)) == 1            # one entry per MoE block


def test_attention_maps_returns_maps_and_the_models_logits():
    torch.manual_seed(0)
    cfg = DecoderLMConfig(vocab_size=11, hidden_size=16, num_attention_heads=2,
                          num_hidden_layers=2, max_position_embeddings=16)
    model = DecoderLM(cfg).eval()
    idx = torch.randint(0, 11, (1, 5))
    maps, logits = attention_maps(model, idx)
    assert maps.shape == (2, 1, 2, 5, 5)
    torch.testing.assert_close(logits, model(idx), atol=1e-6, rtol=1e-5)


def test_attention_maps_rejects_attention_without_weights():
    # MLA blocks have no forward_with_weights: a clear ValueError, not an
    # AttributeError from inside the loop.
    cfg = DecoderLMConfig(vocab_size=11, hidden_size=16, num_attention_heads=2,
                          num_hidden_layers=1, max_position_embeddings=16)
    model = DecoderLM(cfg)
    mla = MLAConfig(hidden_size=16, num_attention_heads=2, q_lora_rank=8,
                    kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
                    v_head_dim=4)
    model.layers[0].attention = MultiHeadLatentAttention(mla)
    with pytest.raises(ValueError, match="model must be a DecoderLM with "
                                         "MultiHeadAttention blocks"):
        attention_maps(model, torch.zeros(1, 3, dtype=torch.long))

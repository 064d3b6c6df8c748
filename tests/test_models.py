"""Tests of both chapter 6 models side by side, course_lib.model.transformer and
course_lib.model.decoder_lm: storage sharing of tied weights in each, and the
checks of bad input and of their configurations. Each model's own tests
are in test_transformer.py and test_decoder_lm.py.
"""
import pytest
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.model.transformer import (Transformer, TransformerConfig,
                                          greedy_decode)
from transformer_support import tiny_transformer
from errors import error_for


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------------------------- tying
def test_weight_tying_shares_storage():
    lm = DecoderLM(DecoderLMConfig(vocab_size=40))
    assert lm.lm_head.weight is lm.embed_tokens.weight
    assert lm.lm_head.weight.data_ptr() == lm.embed_tokens.weight.data_ptr()
    untied = DecoderLM(DecoderLMConfig(vocab_size=40,
                                       tie_word_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != \
        untied.embed_tokens.weight.data_ptr()
    tr = tiny_transformer()
    assert tr.out_proj.weight is tr.tgt_embed.weight is tr.src_embed.weight
    tr2 = tiny_transformer(share_src_tgt_embeddings=False)
    assert tr2.src_embed is not tr2.tgt_embed
    assert tr2.out_proj.weight is tr2.tgt_embed.weight


# ------------------------------------------------------------- bad input
def test_bad_inputs():
    with pytest.raises(ValueError, match="position must be one of"):
        DecoderLMConfig(vocab_size=10, position="alibi")
    with pytest.raises(ValueError, match="hidden_act must be one of"):
        DecoderLMConfig(vocab_size=10, hidden_act="moe")
    with pytest.raises(ValueError, match="share_src_tgt_embeddings needs"):
        Transformer(TransformerConfig(src_vocab_size=10, tgt_vocab_size=12))
    lm = DecoderLM(DecoderLMConfig(vocab_size=10, max_position_embeddings=8,
                                   num_hidden_layers=1))
    with pytest.raises(ValueError, match=r"idx must hold ids in \[0, 10\)"):
        lm(torch.tensor([[3, 10]]))
    with pytest.raises(ValueError,
                       match="more than max_position_embeddings=8"):
        lm(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(TypeError, match="idx must be an int64 tensor"):
        lm(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        greedy_decode(tiny_transformer(), torch.zeros(1, 3, dtype=torch.long),
                      max_len=0, bos_id=1, eos_id=2)
    with pytest.raises(ValueError, match=r"src must have shape \(B, T\)"):
        tiny_transformer().encode(torch.zeros(3, dtype=torch.long))


@pytest.mark.parametrize("config, overrides, match", [
    (DecoderLMConfig, dict(num_hidden_layers=-1),
     "num_hidden_layers must be >= 1, got -1"),
    (DecoderLMConfig, dict(dropout=1.5), "dropout must be < 1"),
    (DecoderLMConfig, dict(hidden_size=True), "hidden_size must be an int"),
    (DecoderLMConfig, dict(rope_theta=0.0), "rope_theta must be > 0"),
    (DecoderLMConfig, dict(rms_norm_eps=0.0), "rms_norm_eps must be > 0"),
    (DecoderLMConfig, dict(mlp_bias=1), "mlp_bias must be a bool"),
    (TransformerConfig, dict(num_hidden_layers=-1),
     "num_hidden_layers must be >= 1, got -1"),
    (TransformerConfig, dict(dropout=-0.1), "dropout must be >= 0"),
])
def test_configs_reject_nonsense(config, overrides, match):
    # num_hidden_layers=-1 used to build a model with no layers;
    # dropout=1.5 passed.
    base = dict(vocab_size=10) if config is DecoderLMConfig else {}
    with pytest.raises(error_for(match), match=match):
        config(**base, **overrides)

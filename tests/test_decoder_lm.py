"""Tests for course_lib.model.decoder_lm, the decoder-only language model
(chapter 6).

References: parameter counts in closed form, by building the model, and
against the published 124,439,808 of GPT-2 small (the count of the Hugging
Face checkpoint); causality (future tokens never change earlier logits);
the gradients of tied weights in one tensor; the loss at initialisation
against log V.
"""
import math

import pytest
import torch
from torch import nn

from course_lib.model.decoder_lm import (DecoderLM, DecoderLMConfig,
                                         decoder_lm_param_count)
from course_lib.sizing.params import num_parameters


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------------------ parameter counts
def test_gpt2_small_has_124439808_parameters():
    cfg = DecoderLMConfig.gpt2_small()
    assert decoder_lm_param_count(cfg) == 124_439_808
    with torch.device("meta"):                   # no memory, no init cost
        model = DecoderLM(cfg)
    assert num_parameters(model) == 124_439_808


@pytest.mark.parametrize("kw", [
    dict(), dict(position="learned", norm="layer", hidden_act="gelu",
                 attention_bias=True, mlp_bias=True),
    dict(num_key_value_heads=2, tie_word_embeddings=False, hidden_act="relu"),
    dict(norm="layer", intermediate_size=100),
    dict(attention_bias=True),
    dict(norm="layer", hidden_act="gelu", mlp_bias=True)])
def test_decoder_lm_count_formula(kw):
    cfg = DecoderLMConfig(vocab_size=50, hidden_size=32, num_attention_heads=4,
                          num_hidden_layers=2, max_position_embeddings=16,
                          **kw)
    assert num_parameters(DecoderLM(cfg)) == decoder_lm_param_count(cfg)


def test_swiglu_default_width():
    cfg = DecoderLMConfig(vocab_size=10, hidden_size=96)
    assert cfg.intermediate_size == 256          # int(8*96/3) = 256
    assert DecoderLMConfig(vocab_size=10, hidden_size=96,
                           hidden_act="gelu").intermediate_size == 384


# ------------------------------------------------------------- tying
def test_tied_gradients_accumulate_in_one_tensor():
    lm = DecoderLM(DecoderLMConfig(vocab_size=20, num_hidden_layers=1))
    lm(torch.randint(20, (2, 5))).sum().backward()
    # gradient from both uses lands in the single shared tensor
    g = lm.embed_tokens.weight.grad
    assert g is not None and g.abs().sum() > 0
    assert len([p for p in lm.parameters() if p.shape == (20, 128)]) == 1


# ------------------------------------------------------------- DecoderLM
@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_decoder_lm_is_causal(positions):
    lm = DecoderLM(DecoderLMConfig(vocab_size=30, hidden_size=32,
                                   num_attention_heads=4, num_hidden_layers=2,
                                   position=positions)).eval()
    idx = torch.randint(30, (2, 10))
    logits = lm(idx)
    assert logits.shape == (2, 10, 30)
    idx2 = idx.clone()
    idx2[:, 6:] = torch.randint(30, (2, 4))
    logits2 = lm(idx2)
    assert torch.allclose(logits[:, :6], logits2[:, :6], atol=1e-5)
    assert not torch.allclose(logits[:, 6:], logits2[:, 6:], atol=1e-3)


def test_decoder_lm_positions_hook():
    # learned positions: other positions, other logits
    lm = DecoderLM(DecoderLMConfig(vocab_size=30, hidden_size=32,
                                   num_attention_heads=4, num_hidden_layers=1,
                                   position="learned")).eval()
    idx = torch.randint(30, (1, 4))
    a = lm(idx)
    b = lm(idx, positions=torch.arange(4) + 3)
    assert not torch.allclose(a, b, atol=1e-4)
    # RoPE: a global shift of all positions changes nothing (relative)
    rope = DecoderLM(DecoderLMConfig(vocab_size=30, hidden_size=32,
                                     num_attention_heads=4,
                                     num_hidden_layers=2)).eval()
    assert torch.allclose(rope(idx), rope(idx, torch.arange(4) + 9),
                          atol=1e-4)


def test_decoder_lm_init_gives_uniformish_predictions():
    cfg = DecoderLMConfig(vocab_size=64)
    lm = DecoderLM(cfg).eval()
    idx, target = torch.randint(64, (2, 4, 32))
    loss = nn.functional.cross_entropy(lm(idx).flatten(0, 1),
                                       target.flatten())
    assert abs(loss.item() - math.log(64)) < 0.3
    # with tying, the logit of the INPUT token stands out at init:
    # lm_head(norm(E[x])) . E[x] ~ |E[x]| sqrt(D) while others ~ 0
    copy = nn.functional.cross_entropy(lm(idx).flatten(0, 1), idx.flatten())
    assert copy < loss - 1


def test_decoder_lm_returns_the_logits_only():
    lm = DecoderLM(DecoderLMConfig(vocab_size=20, num_hidden_layers=1))
    logits = lm(torch.randint(20, (1, 3)))
    assert isinstance(logits, torch.Tensor) and logits.shape == (1, 3, 20)
    assert not hasattr(lm, "forward_with_aux")


def test_logits_to_keep_is_the_last_positions_of_the_full_logits():
    lm = DecoderLM(DecoderLMConfig(vocab_size=20, num_hidden_layers=2)).eval()
    idx = torch.randint(20, (2, 7))
    full = lm(idx)                                            # (2, 7, 20)
    for n in (1, 3, 7, 9):          # n > T keeps all T, as h[:, -n:] does
        torch.testing.assert_close(lm(idx, logits_to_keep=n),
                                   full[:, -n:], rtol=1e-5, atol=1e-6)
    assert torch.equal(lm(idx, logits_to_keep=0), full)
    for bad, err in ((-1, ValueError), (1.0, TypeError), (True, TypeError)):
        with pytest.raises(err, match="logits_to_keep"):
            lm(idx, logits_to_keep=bad)

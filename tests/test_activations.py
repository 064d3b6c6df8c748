"""Tests for course_lib.sizing.activations (chapter 12).

References: the bytes autograd itself saves in the course's DecoderLM,
counted by storage with ``saved_tensors_hooks`` (``measure_saved_bytes``),
against the closed forms; gradients of the plain model against the
checkpointed one; Korthikanti et al.'s recomputation figure (2sbh).
"""
import pytest
import torch

from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.sizing.activations import (CheckpointedBlock, checkpointed,
                                           decoder_lm_extra_bytes,
                                           layer_activation_bytes,
                                           measure_saved_bytes,
                                           model_activation_bytes)

SHAPES = [  # B, S, D, H, N: batch, sequence and width varied
    (2, 16, 32, 4, 2),
    (3, 24, 48, 6, 3),
    (1, 40, 64, 4, 2),
]


def small_model(D, H, N, seed=0):
    torch.manual_seed(seed)
    return DecoderLM(DecoderLMConfig(
        vocab_size=50, hidden_size=D, num_attention_heads=H,
        num_hidden_layers=N, max_position_embeddings=64))


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("attention", ["explicit", "flash"])
@pytest.mark.parametrize("B,S,D,H,N", SHAPES)
def test_measured_bytes_are_formula_plus_listed_extras(B, S, D, H, N,
                                                       attention, recompute):
    """Every byte autograd keeps is accounted for: the formula, plus the
    course-specific tensors that ``decoder_lm_extra_bytes`` lists."""
    model = small_model(D, H, N)
    idx = torch.randint(0, 50, (B, S), generator=torch.Generator()
                        .manual_seed(1))
    measured = measure_saved_bytes(model, idx, attention=attention,
                                   recompute=recompute)
    kw = dict(batch=B, seq_len=S, hidden_size=D, num_attention_heads=H,
              num_hidden_layers=N, attention=attention, recompute=recompute)
    formula = model_activation_bytes(
        intermediate_size=model.config.intermediate_size,
        bytes_per_value=4, **kw)
    assert measured == formula + decoder_lm_extra_bytes(**kw)
    # the extras are a small part: the formula is the activation memory
    assert decoder_lm_extra_bytes(**kw) < 0.25 * formula


def test_recompute_keeps_less_and_flash_drops_the_scores():
    model = small_model(32, 4, 3)
    idx = torch.randint(0, 50, (2, 48), generator=torch.Generator()
                        .manual_seed(2))
    plain = measure_saved_bytes(model, idx)
    flash = measure_saved_bytes(model, idx, attention="flash")
    ckpt = measure_saved_bytes(model, idx, recompute=True)
    assert ckpt < flash < plain
    # recomputation: about one layer plus two more inputs, of three layers
    assert ckpt < 0.5 * plain


def test_checkpointed_gradients_equal_the_plain_ones():
    model = small_model(48, 6, 3, seed=3)
    ckpt = checkpointed(model)
    assert all(isinstance(b, CheckpointedBlock) for b in ckpt.layers)
    assert not any(isinstance(b, CheckpointedBlock) for b in model.layers)
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator()
                        .manual_seed(4))
    out_plain, out_ckpt = model(idx), ckpt(idx)
    torch.testing.assert_close(out_ckpt, out_plain, rtol=0, atol=0)
    (out_plain ** 2).mean().backward()
    (out_ckpt ** 2).mean().backward()
    grads = {name.replace(".block.", "."): p.grad
             for name, p in ckpt.named_parameters()}
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-6,
                                   atol=1e-8)


def test_closed_forms_by_hand_and_korthikanti():
    # Llama-2-7B, one 4K sequence, bf16: 10D + 4I values, 8 stat bytes,
    # H S softmax values per token
    D, I, H, S = 4096, 11008, 32, 4096
    per_token = 2 * (10 * D + 4 * I + H * S) + 8
    assert layer_activation_bytes(
        batch=1, seq_len=S, hidden_size=D, num_attention_heads=H,
        intermediate_size=I) == S * per_token
    flash = layer_activation_bytes(
        batch=1, seq_len=S, hidden_size=D, num_attention_heads=H,
        intermediate_size=I, attention="flash")
    assert flash == S * (2 * (11 * D + 4 * I) + 4 * H + 8)
    # the sbh coefficient at 16 bits: 20 + 8 I / h = 41.5 for Llama-2-7B
    assert (S * per_token - 2 * H * S * S - 8 * S) / (S * D) == 41.5
    # full recomputation keeps 2sbh per layer (Korthikanti et al.), plus
    # the layer being recomputed
    kw = dict(batch=2, seq_len=S, hidden_size=D, num_attention_heads=H,
              intermediate_size=I, num_hidden_layers=32)
    layer = layer_activation_bytes(**{k: v for k, v in kw.items()
                                      if k != "num_hidden_layers"})
    assert model_activation_bytes(**kw) == 32 * layer
    assert (model_activation_bytes(**kw, recompute=True)
            == 31 * 2 * 2 * S * D + layer)


#: a valid layer; each bad case changes one argument
LAYER = dict(batch=1, seq_len=4, hidden_size=8, num_attention_heads=2,
             intermediate_size=8)


@pytest.mark.parametrize("call,exc,match", [
    (lambda: layer_activation_bytes(**{**LAYER, "batch": 0}),
     ValueError, "batch"),
    (lambda: layer_activation_bytes(**{**LAYER, "seq_len": 4.0}),
     TypeError, "seq_len"),
    (lambda: layer_activation_bytes(**{**LAYER, "num_attention_heads": 3}),
     ValueError, "hidden_size"),
    (lambda: layer_activation_bytes(**LAYER, attention="sdpa"),
     ValueError, "attention"),
    (lambda: layer_activation_bytes(**LAYER, bytes_per_value=0),
     ValueError, "bytes_per_value"),
    (lambda: model_activation_bytes(**LAYER, num_hidden_layers=2,
                                    recompute=1),
     TypeError, "recompute"),
    (lambda: decoder_lm_extra_bytes(batch=1, seq_len=4, hidden_size=8,
                                    num_attention_heads=2,
                                    num_hidden_layers=0),
     ValueError, "num_hidden_layers"),
    (lambda: measure_saved_bytes("model", torch.zeros(1, 2)),
     TypeError, "model"),
    (lambda: measure_saved_bytes(small_model(8, 2, 1), [[1, 2]]),
     TypeError, "idx"),
    (lambda: checkpointed(torch.nn.Linear(2, 2)), TypeError, "model"),
    (lambda: CheckpointedBlock("block"), TypeError, "block"),
    (lambda: CheckpointedBlock(torch.nn.Identity())(
        torch.zeros(1, 2, 2), cache=object()), ValueError, "cache"),
])
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()

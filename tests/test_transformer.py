"""Tests for course_lib.model.transformer, the paper's encoder-decoder (chapter 6).

References: parameter counts in closed form, by building the model, and
against the paper's "65M"; torch.nn.TransformerEncoder/Decoder layers
stacked by hand with copied weights; causality of the target; padded
batches against each sequence alone; greedy decoding against a
step-by-step argmax loop.
"""
import math

import pytest
import torch
from torch import nn

from course_lib.model.masks import causal_mask
from course_lib.sizing.params import num_parameters
from course_lib.model.transformer import (Transformer, TransformerConfig,
                                          greedy_decode,
                                          transformer_param_count)
from course_lib.model.sinusoidal import sinusoidal_encoding
from test_blocks import copy_common, copy_mha
from transformer_support import tiny_transformer


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------------------ parameter counts
def test_base_transformer_count():
    cfg = TransformerConfig()
    with torch.device("meta"):
        model = Transformer(cfg)
    n = num_parameters(model)
    assert n == transformer_param_count(cfg) == 63_082_496
    assert abs(n - 65e6) / 65e6 < 0.04           # the paper's "65M"
    untied = TransformerConfig(share_src_tgt_embeddings=False,
                               tie_word_embeddings=False)
    assert transformer_param_count(untied) - n == 2 * 37000 * 512


@pytest.mark.parametrize("kw", [dict(), dict(tie_word_embeddings=False),
                                dict(share_src_tgt_embeddings=False)])
def test_transformer_count_formula(kw):
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=30,
                            hidden_size=32, num_attention_heads=4,
                            intermediate_size=64, num_hidden_layers=2,
                            max_position_embeddings=40, **kw)
    assert num_parameters(Transformer(cfg)) == transformer_param_count(cfg)


# ------------------------------------------------------------ Transformer
def test_transformer_matches_torch_layers():
    tr = tiny_transformer().eval()
    c = tr.config
    enc = [nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval()
           for _ in range(2)]
    dec = [nn.TransformerDecoderLayer(32, 4, 64, batch_first=True).eval()
           for _ in range(2)]
    for ref, ours in zip(enc, tr.encoder_layers):
        copy_common(ref, ours, 2)
    for ref, ours in zip(dec, tr.decoder_layers):
        copy_common(ref, ours, 3)
        copy_mha(ref.multihead_attn, ours.cross_attn)
    src, tgt = torch.randint(30, (2, 7)), torch.randint(30, (2, 5))
    with torch.no_grad():
        E = tr.src_embed.weight
        pe = sinusoidal_encoding(40, 32).float()
        h = E[src] * math.sqrt(32) + pe[:7]
        for layer in enc:
            h = layer(h)
        y = E[tgt] * math.sqrt(32) + pe[:5]
        for layer in dec:
            y = layer(y, h, tgt_mask=~causal_mask(5))
        expected = y @ E.T
        assert torch.allclose(tr(src, tgt), expected, atol=1e-4)
    assert c.hidden_size == 32


def test_transformer_padding_does_not_leak():
    tr = tiny_transformer().eval()
    src = torch.randint(3, 30, (1, 6))
    tgt = torch.randint(3, 30, (1, 4))
    alone = tr(src[:, :4], tgt)
    padded = torch.cat([src[:, :4], torch.zeros(1, 2, dtype=torch.long)], 1)
    assert torch.allclose(tr(padded, tgt, src_lengths=[4]), alone, atol=1e-5)
    logits, w = tr.forward_with_weights(padded, tgt, src_lengths=[4])
    assert len(w) == 2 and w[0].shape == (1, 4, 4, 6)
    assert w[0][..., 4:].abs().max() == 0


def test_transformer_target_is_causal():
    tr = tiny_transformer().eval()
    src, tgt = torch.randint(30, (2, 7)), torch.randint(30, (2, 6))
    tgt2 = tgt.clone()
    tgt2[:, 3:] = torch.randint(30, (2, 3))
    a, b = tr(src, tgt), tr(src, tgt2)
    assert torch.allclose(a[:, :3], b[:, :3], atol=1e-5)


def test_greedy_decode_matches_argmax_loop():
    tr = tiny_transformer().train()
    src = torch.randint(3, 30, (3, 6))
    out = greedy_decode(tr, src, max_len=5, bos_id=1, eos_id=2)
    assert tr.training                           # mode restored
    assert out.shape[0] == 3 and 2 <= out.shape[1] <= 6
    assert (out[:, 0] == 1).all()
    tr.eval()
    with torch.no_grad():
        for b in range(3):
            ys = torch.tensor([[1]])
            for _ in range(out.shape[1] - 1):
                nxt = tr(src[b:b + 1], ys)[0, -1].argmax()
                if ys[0, -1] == 2 and ys.shape[1] > 1:
                    nxt = torch.tensor(2)
                ys = torch.cat([ys, nxt.view(1, 1)], 1)
            assert torch.equal(ys[0], out[b])


# ------------------------------------------------- padded target batches
def _padded_batch():
    """Two right-padded source and target sequences (pad id 0)."""
    src = torch.randint(3, 30, (2, 6))
    tgt = torch.randint(3, 30, (2, 7))
    src_lengths, tgt_lengths = [6, 4], [7, 3]
    src[1, 4:] = 0
    tgt[1, 3:] = 0
    return src, tgt, src_lengths, tgt_lengths


def test_tgt_lengths_mask_padded_target_keys():
    # What tgt_lengths means: no target position attends to a padding
    # target key. The mask written out here: causal AND key j < length.
    tr = tiny_transformer().eval()
    src, tgt, src_lengths, tgt_lengths = _padded_batch()
    T = tgt.shape[1]
    mask = torch.zeros(2, T, T, dtype=torch.bool)
    for b, n in enumerate(tgt_lengths):
        for i in range(T):
            mask[b, i, :min(i + 1, n)] = True
    src_mask = torch.tensor([[[j < n for j in range(6)]]
                             for n in src_lengths])      # (B, 1, S)
    with torch.no_grad():
        got = tr(src, tgt, src_lengths=src_lengths, tgt_lengths=tgt_lengths)
        want = tr.decode(tgt, tr.encode(src, src_mask), src_mask, mask)
        # a padding query sees only the real tokens, so the other padding
        # tokens' ids cannot change its output
        tgt2 = tgt.clone()
        tgt2[1, 3:6] = torch.tensor([5, 6, 7])
        got2 = tr(src, tgt2, src_lengths=src_lengths,
                  tgt_lengths=tgt_lengths)
    assert torch.allclose(got, want, atol=1e-6)
    assert torch.allclose(got2[1, 6], got[1, 6], atol=1e-6)


def test_padded_batch_equals_each_sequence_alone():
    tr = tiny_transformer().eval()
    src, tgt, src_lengths, tgt_lengths = _padded_batch()
    with torch.no_grad():
        out = tr(src, tgt, src_lengths=src_lengths, tgt_lengths=tgt_lengths)
        for b in range(2):
            s, t = src_lengths[b], tgt_lengths[b]
            alone = tr(src[b:b + 1, :s], tgt[b:b + 1, :t])   # no padding
            assert torch.allclose(out[b, :t], alone[0], atol=1e-5)


def test_greedy_decode_stops_at_eos():
    tr = tiny_transformer().eval()
    with torch.no_grad():                        # make EOS always win
        tr.out_proj.weight.zero_()
    src = torch.randint(30, (2, 4))
    # all logits equal: argmax is id 0; use eos_id=0 to stop at once
    out = greedy_decode(tr, src, max_len=8, bos_id=1, eos_id=0)
    assert out.tolist() == [[1, 0], [1, 0]]


# ------------------------------------------------------------- bad input
def test_transformer_init_is_reproducible_with_separate_embeddings():
    cfg = TransformerConfig(src_vocab_size=11, tgt_vocab_size=13,
                            hidden_size=16, num_attention_heads=2,
                            intermediate_size=32, num_hidden_layers=1,
                            max_position_embeddings=8,
                            share_src_tgt_embeddings=False)
    states = []
    for _ in range(4):
        torch.manual_seed(0)
        states.append(Transformer(cfg).state_dict())
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in state)


def test_one_length_for_a_batch_is_an_error_not_a_broadcast():
    # Given src_lengths=[2] for a batch of 2, the model broadcast sequence
    # 0's padding over the batch.
    tr = tiny_transformer()
    src = torch.randint(3, 11, (2, 4))
    tgt = torch.randint(3, 11, (2, 4))
    for kw in (dict(src_lengths=[2]), dict(tgt_lengths=[2]),
               dict(src_lengths=[2, 3, 4])):
        name = next(iter(kw))
        with pytest.raises(ValueError, match=f"{name} must hold one length "
                           f"per sequence \\(B=2\\)"):
            tr(src, tgt, **kw)
    with pytest.raises(ValueError, match="src_lengths must hold one length"):
        greedy_decode(tr, src, max_len=3, bos_id=1, eos_id=2, src_lengths=[4])
    tr(src, tgt, src_lengths=[2, 4], tgt_lengths=torch.tensor([3, 4]))


# ------------------------------------------------- checks at construction
@pytest.mark.parametrize("field", ["max_position_embeddings",
                                   "num_hidden_layers"])
def test_transformer_checks_its_size_before_building(field):
    config = TransformerConfig(src_vocab_size=11, tgt_vocab_size=11,
                               hidden_size=16, num_attention_heads=2,
                               intermediate_size=32,
                               **{field: 10**9
                                  if field == "max_position_embeddings"
                                  else 10**6})
    with pytest.raises(ValueError, match=field):
        Transformer(config)


def test_transformer_layers_reject_bad_flags_and_a_missing_memory():
    from course_lib.model.transformer import DecoderLayer, EncoderLayer
    with pytest.raises(TypeError, match="memory"):
        DecoderLayer(8, 2, 16)(torch.randn(1, 3, 8), None)
    for layer in (EncoderLayer, DecoderLayer):
        with pytest.raises(TypeError, match="dropout"):
            layer(8, 2, 16, dropout=True)
    with pytest.raises(TypeError, match="tie_word_embeddings"):
        TransformerConfig(tie_word_embeddings="False")

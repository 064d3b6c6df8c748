"""The GRU encoder-decoder of chapter 1's bottleneck experiment."""
import math

import pytest
import torch

from course_lib.experiments.seq2seq_bottleneck import (
    GRUSeq2Seq, greedy_copy, make_copy_batch, run_bottleneck)
from course_lib.experiments.sweeps import load_sweep


def test_stored_sweep_is_what_the_recipe_makes():
    stored = load_sweep("seq2seq_bottleneck").cell(0, length=5,
                                                   attention=False)
    now = run_bottleneck(length=5, attention=False, seed=0)
    assert set(now) == set(stored)
    for key, value in now.items():
        assert value == pytest.approx(stored[key], rel=1e-3, abs=1e-6), key


def test_copy_batch_is_teacher_forcing_of_the_source():
    src, tgt_in, tgt_out = make_copy_batch(
        4, 6, vocab_size=8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(tgt_out, src)
    assert (tgt_in[:, 0] == 8).all() and torch.equal(tgt_in[:, 1:],
                                                     src[:, :-1])


@pytest.mark.parametrize("attention", [False, True])
def test_forward_matches_step_by_step_loop(attention):
    """Teacher forcing in one call = one decoder step at a time, with the
    attention read written as a loop over source positions."""
    torch.manual_seed(0)
    model = GRUSeq2Seq(vocab_size=5, hidden_size=8, attention=attention)
    src, tgt_in, _ = make_copy_batch(3, 7, vocab_size=5)
    logits = model(src, tgt_in)                               # (B, T, V)
    cell = torch.nn.GRUCell(8, 8)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        getattr(cell, name).data = getattr(model.decoder, name + "_l0").data
    enc, c = model.encode(src)
    s = c[0]
    for t in range(tgt_in.shape[1]):
        s = cell(model.tgt_embed(tgt_in[:, t]), s)            # (B, d_h)
        if attention:
            scores = torch.stack([(s * enc[:, j]).sum(-1) / math.sqrt(8)
                                  for j in range(enc.shape[1])], dim=1)
            w = torch.softmax(scores, dim=1)                  # (B, S)
            a = sum(w[:, j:j + 1] * enc[:, j] for j in range(enc.shape[1]))
            out = model.lm_head(torch.tanh(model.combine(
                torch.cat([s, a], dim=-1))))
        else:
            out = model.lm_head(s)
        torch.testing.assert_close(logits[:, t], out, atol=1e-5, rtol=1e-5)


def test_greedy_copy_feeds_back_its_own_output():
    torch.manual_seed(1)
    model = GRUSeq2Seq(vocab_size=5, hidden_size=8, attention=True)
    src, _, _ = make_copy_batch(3, 6, vocab_size=5)
    pred = greedy_copy(model, src)
    tgt_in = torch.cat([torch.full((3, 1), 5), pred[:, :-1]], dim=1)
    assert torch.equal(model(src, tgt_in).argmax(-1), pred)


def test_seq2seq_bad_input():
    with pytest.raises(TypeError, match="attention"):
        GRUSeq2Seq(vocab_size=5, attention=1)
    with pytest.raises(ValueError, match="length"):
        make_copy_batch(2, 0, vocab_size=5)
    with pytest.raises(TypeError, match="model"):
        greedy_copy(None, torch.zeros(1, 2, dtype=torch.long))
    model = GRUSeq2Seq(vocab_size=5, attention=False)
    with pytest.raises(ValueError, match="src"):
        greedy_copy(model, torch.zeros(2))
    with pytest.raises(TypeError, match="seed"):
        run_bottleneck(length=5, attention=True, seed=0.5)

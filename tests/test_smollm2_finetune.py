"""SmolLM2 fine-tuning: the stored run's first steps rerun, bits per
character against chapter 7's character-level scorer, the batches, bad
input."""
import copy

import pytest
import torch

from course_lib.experiments import smollm2_finetune as sf
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.tasks import char_lm, text_corpus
from course_lib.training import next_token_loss


class CharTokenizer:
    """Characters as tokens (a list-returning wrapper of CharVocab)."""

    def __init__(self):
        self.vocab = text_corpus.CharVocab()

    def encode(self, text):
        return self.vocab.encode(text).tolist()

    def decode(self, ids):
        return self.vocab.decode(list(ids))


def test_first_steps_rerun_the_stored_curve(smollm2):
    stored = load_sweep("smollm2_finetune").cell(0, steps=sf.STEPS)
    model = copy.deepcopy(smollm2[0])            # the fixture is shared
    tokenizer = smollm2[1]
    text = text_corpus.load_pydoc_corpus().train
    history = sf.finetune(model, tokenizer, text, steps=1, seed=0,
                          total_steps=sf.STEPS)
    assert history.loss[0] == pytest.approx(stored["loss"][0], rel=1e-3)
    assert history.grad_norm[0] == pytest.approx(stored["grad_norm"][0],
                                                 rel=1e-3)
    # the loss of the second batch after the first update
    batches = sf.manual_token_batches(tokenizer, text, batch_size=sf.BATCH,
                                      length=sf.LENGTH, seed=0)
    next(batches)
    with torch.no_grad():
        second = next_token_loss(model, next(batches)).item()
    assert second == pytest.approx(stored["loss"][1], rel=1e-3)
    assert len(stored["loss"]) == sf.STEPS
    assert stored["train_tokens"] == sf.STEPS * sf.BATCH * sf.LENGTH


def test_bits_per_char_equals_the_character_scorer():
    """With characters as tokens, the first token is one character, so
    token_bits_per_char is chapter 7's char_lm.bits_per_char (its own
    windowing code) on the same windows."""
    torch.manual_seed(0)
    model = DecoderLM(DecoderLMConfig(vocab_size=96, hidden_size=32,
                                      num_attention_heads=2,
                                      num_hidden_layers=1,
                                      max_position_embeddings=16))
    tok = CharTokenizer()
    text = text_corpus.load_pydoc_corpus().val[:150]
    for context in (16, 7, 2):
        ours = sf.token_bits_per_char(model, tok, text, context=context)
        ref = char_lm.bits_per_char(model, tok.vocab.encode(text),
                                    context=context)
        # char_lm sums float32 losses, token_bits_per_char float64 ones
        assert ours == pytest.approx(ref, rel=1e-6)


def test_batches_are_shifted_lines_of_the_text():
    tok = CharTokenizer()
    text = "first line\nsecond line here\nthird one\n" * 3
    a = list(zip(range(3), sf.manual_token_batches(tok, text, batch_size=4,
                                                   length=8, seed=1)))
    b = next(sf.manual_token_batches(tok, text, batch_size=4, length=8,
                                     seed=1))
    inputs, targets = a[0][1]
    assert torch.equal(inputs, b[0]) and torch.equal(targets, b[1])
    assert inputs.shape == targets.shape == (4, 8)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    for row, last in zip(inputs, targets[:, -1]):
        s = tok.decode(row.tolist() + [last.item()])
        i = text.index(s)
        assert i == 0 or text[i - 1] == "\n"


def test_bad_input():
    tok = CharTokenizer()
    with pytest.raises(TypeError, match="tokenizer"):
        sf.manual_token_batches(object(), "a\nb", batch_size=1, length=1,
                                seed=0)
    with pytest.raises(TypeError, match="text"):
        sf.manual_token_batches(tok, b"a\nb", batch_size=1, length=1, seed=0)
    with pytest.raises(ValueError, match="batch_size"):
        sf.manual_token_batches(tok, "a\nb", batch_size=0, length=1, seed=0)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="context"):
        sf.token_bits_per_char(model, tok, "abc", context=1)
    with pytest.raises(ValueError, match="text"):
        sf.token_bits_per_char(model, tok, "a")
    with pytest.raises(TypeError, match="model"):
        sf.token_bits_per_char("model", tok, "abc")
    with pytest.raises(TypeError, match="seed"):
        sf.finetune_smollm2(seed="0")

"""n-gram baselines against counts done by hand on a tiny text."""
import math

import pytest
import torch

from course_lib.tasks.ngram import NGramModel, ngram_counts

# "abab" + "ba" over {a: 0, b: 1, c: 2}
TEXT = torch.tensor([0, 1, 0, 1, 1, 0])


def test_counts_by_hand():
    uni = ngram_counts(TEXT, order=1, vocab_size=3)
    assert uni.tolist() == [[3, 3, 0]]
    bi = ngram_counts(TEXT, order=2, vocab_size=3)
    # pairs: ab, ba, ab, bb, ba
    assert bi.tolist() == [[0, 2, 0], [2, 1, 0], [0, 0, 0]]
    tri = ngram_counts(TEXT, order=3, vocab_size=3)
    # triples: aba, bab, abb, bba; context id = 3 * x_{t-2} + x_{t-1}
    expected = torch.zeros(9, 3)
    expected[0 * 3 + 1, 0] = 1      # ab -> a
    expected[1 * 3 + 0, 1] = 1      # ba -> b
    expected[0 * 3 + 1, 1] = 1      # ab -> b
    expected[1 * 3 + 1, 0] = 1      # bb -> a
    assert torch.equal(tri.float(), expected)
    assert ngram_counts(TEXT, order=2, vocab_size=3, start=3).sum() == 3


def test_bits_per_symbol_closed_form_by_hand():
    k = 0.5
    bigram = NGramModel(TEXT, order=2, vocab_size=3, k=k)
    # q(b|a) = (2 + .5) / (2 + 1.5); q(a|b) = 2.5/4.5; q(b|b) = 1.5/4.5
    assert bigram.log_probs[0, 1].item() == pytest.approx(math.log(2.5 / 3.5))
    assert bigram.log_probs[2].exp().tolist() == pytest.approx([1 / 3] * 3)
    val = torch.tensor([1, 1, 2, 0])          # targets: b|b, c|b, a|c
    expected = -(math.log2(1.5 / 4.5) + math.log2(0.5 / 4.5)
                 + math.log2(1 / 3)) / 3
    assert bigram.bits_per_symbol(val) == pytest.approx(expected, rel=1e-12)
    unigram = NGramModel(TEXT, order=1, vocab_size=3, k=1.0)
    # q = (3+1)/9, (3+1)/9, 1/9; targets from t = 0
    exp_uni = -(2 * math.log2(4 / 9) + math.log2(1 / 9) + math.log2(4 / 9)) / 4
    assert unigram.bits_per_symbol(val) == pytest.approx(exp_uni)
    # same targets for every order: start at 1
    assert unigram.bits_per_symbol(val, start=1) == pytest.approx(
        -(math.log2(4 / 9) + math.log2(1 / 9) + math.log2(4 / 9)) / 3)


def test_equals_a_loop_over_positions():
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 5, (300,), generator=g)
    val = torch.randint(0, 5, (80,), generator=g)
    for order in (1, 2, 3):
        model = NGramModel(train, order=order, vocab_size=5, k=0.1)
        total = 0.0
        for t in range(2, len(val)):
            ctx = tuple(val[t - order + 1:t].tolist())
            n_cx = sum(tuple(train[s - order + 1:s + 1].tolist())
                       == ctx + (val[t].item(),)
                       for s in range(order - 1, len(train)))
            n_c = sum(tuple(train[s - order + 1:s].tolist()) == ctx
                      for s in range(order - 1, len(train)))
            total -= math.log2((n_cx + 0.1) / (n_c + 0.5))
        assert model.bits_per_symbol(val, start=2) == pytest.approx(
            total / (len(val) - 2), rel=1e-10)


def test_probabilities_sum_to_one_and_errors():
    model = NGramModel(TEXT, order=3, vocab_size=3, k=0.01)
    assert model.log_probs.exp().sum(-1).tolist() == pytest.approx([1] * 9)
    with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=1"):
        NGramModel(TEXT, order=2, vocab_size=1)
    with pytest.raises(ValueError, match="k must be"):
        NGramModel(TEXT, order=2, vocab_size=3, k=0)
    with pytest.raises(ValueError, match="start must be >= 2"):
        model.bits_per_symbol(TEXT, start=1)
    with pytest.raises(ValueError, match="no target"):
        model.bits_per_symbol(TEXT, start=6)

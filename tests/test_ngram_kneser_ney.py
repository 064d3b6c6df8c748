"""Kneser-Ney n-grams: a hand-computed example, exact normalisation, and a
loop-form reference written from Chen and Goodman (1998)."""
import math
from fractions import Fraction

import pytest
import torch

from course_lib.tasks.ngram import KneserNeyModel

# "abab" + "ba" over {a: 0, b: 1, c: 2}
TEXT = torch.tensor([0, 1, 0, 1, 1, 0])


def test_hand_computed_bigram():
    # bigrams (t >= 1): ab, ba, ab, bb, ba -> N(ab) = 2, N(ba) = 2, N(bb) = 1
    # continuation counts N1+(. x): a <- {b}: 1, b <- {a, b}: 2, c: 0
    # D = 1/2 at both orders:
    # q1(a) = (1 - 1/2)/3 + (1/2)(2/3)(1/3) = 5/18, q1(b) = 11/18, q1(c) = 2/18
    # q2(x | a) = (max(N(ax) - 1/2, 0) + (1/2) * 1 * q1(x)) / 2
    model = KneserNeyModel(TEXT, order=2, vocab_size=3, discounts=[0.5, 0.5])
    q1 = [Fraction(5, 18), Fraction(11, 18), Fraction(2, 18)]
    q2a = [(Fraction(1, 2) * q) / 2 for q in q1]
    q2a[1] += Fraction(3, 2) / 2
    assert model.probs([]).tolist() == pytest.approx([float(q) for q in q1],
                                                     rel=1e-14)
    assert model.probs([0]).tolist() == pytest.approx([float(q) for q in q2a],
                                                      rel=1e-14)
    assert [q * 72 for q in q2a] == [5, 65, 2]
    # c never seen as a context: its prediction is the unigram's
    assert torch.equal(model.probs([2]), model.probs([]))
    # Ney's discounts n1 / (n1 + 2 n2): order 1 counts {1, 2}, order 2
    # counts {2, 2, 1}
    assert KneserNeyModel(TEXT, order=2, vocab_size=3).discounts == \
        pytest.approx((1 / 3, 1 / 5))


@pytest.mark.parametrize("order,V", [(1, 3), (3, 4), (4, 3)])
def test_every_context_sums_to_one(order, V):
    g = torch.Generator().manual_seed(order)
    ids = torch.randint(0, V, (200,), generator=g)
    model = KneserNeyModel(ids, order=order, vocab_size=V)
    for n_ctx in range(order):          # full and shorter contexts
        for ctx in range(V ** n_ctx):
            context = [(ctx // V ** j) % V for j in range(n_ctx)]
            q = model.probs(context)
            assert (q > 0).all()
            assert abs(q.sum().item() - 1.0) < 1e-14


def _loop_kneser_ney(train, order, V, D):
    """q(x | context) straight from the definitions, with dicts."""
    grams = [tuple(train[t - order + 1:t + 1]) for t in range(order - 1,
                                                               len(train))]
    counts = {order: {}}
    for g in grams:
        counts[order][g] = counts[order].get(g, 0) + 1
    for k in range(order - 1, 0, -1):   # distinct symbols before g
        before = {}
        for g in counts[k + 1]:
            before.setdefault(g[1:], set()).add(g[0])
        counts[k] = {g: len(s) for g, s in before.items()}

    def q(x, context):
        p = 1.0 / V
        for k in range(1, order + 1):
            if len(context) < k - 1:
                break
            c = tuple(context[len(context) - (k - 1):]) if k > 1 else ()
            total = sum(n for g, n in counts[k].items() if g[:-1] == c)
            if total == 0:
                continue
            seen = sum(1 for g, n in counts[k].items() if g[:-1] == c)
            a = counts[k].get(c + (x,), 0)
            p = (max(a - D[k - 1], 0) + D[k - 1] * seen * p) / total
        return p
    return q


def test_equals_the_loop_form():
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 4, (300,), generator=g)
    val = torch.randint(0, 4, (60,), generator=g)
    for order in (2, 3):
        model = KneserNeyModel(train, order=order, vocab_size=4)
        q = _loop_kneser_ney(train.tolist(), order, 4, model.discounts)
        v = val.tolist()
        for start in (order - 1, 1):
            bits = [-math.log2(q(v[t], v[max(0, t - order + 1):t]))
                    for t in range(start, len(v))]
            assert model.bits_per_symbol(val, start=start) == pytest.approx(
                sum(bits) / len(bits), rel=1e-12)


def test_bad_input():
    with pytest.raises(TypeError, match="ids"):
        KneserNeyModel([0, 1, 0], order=2, vocab_size=3)
    with pytest.raises(ValueError, match="ids"):
        KneserNeyModel(TEXT.float(), order=2, vocab_size=3)
    with pytest.raises(ValueError, match="order"):
        KneserNeyModel(TEXT, order=0, vocab_size=3)
    with pytest.raises(TypeError, match="vocab_size"):
        KneserNeyModel(TEXT, order=2, vocab_size=3.0)
    with pytest.raises(ValueError, match="vocab_size"):
        KneserNeyModel(torch.zeros(12, dtype=torch.long), order=10,
                       vocab_size=96)             # keys overflow int64
    with pytest.raises(ValueError, match="discounts"):
        KneserNeyModel(TEXT, order=2, vocab_size=3, discounts=[0.5])
    with pytest.raises(ValueError, match="discounts"):
        KneserNeyModel(TEXT, order=2, vocab_size=3, discounts=[0.5, 1.0])
    with pytest.raises(TypeError, match="discounts"):
        KneserNeyModel(TEXT, order=2, vocab_size=3, discounts="0.5")
    model = KneserNeyModel(TEXT, order=2, vocab_size=3)
    with pytest.raises(TypeError, match="context"):
        model.probs("ab")
    with pytest.raises(ValueError, match="context"):
        model.probs([3])
    with pytest.raises(ValueError, match="start"):
        model.bits_per_symbol(TEXT, start=6)
    with pytest.raises(ValueError, match="start"):
        model.bits_per_symbol(TEXT, start=0)

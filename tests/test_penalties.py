"""Tests for course_lib.generation.penalties (chapter 8) and generate's
logits_processor.

References: loop forms written here token by token, and Hugging Face's
RepetitionPenaltyLogitsProcessor and NoRepeatNGramLogitsProcessor where
transformers is installed (test-only reference).
"""
from functools import partial

import pytest
import torch

from course_lib.generation import sampling
from course_lib.generation.penalties import (frequency_presence_penalty,
                                             no_repeat_ngram_filter,
                                             repetition_penalty)


def _inputs(B=3, T=12, V=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, V, generator=g) * 3              # both signs
    ids = torch.randint(V, (B, T), generator=g)
    return logits, ids


# ---------------------------------------------------------- loop forms
def _repetition_loop(logits, ids, penalty):
    out = logits.clone()
    for b in range(ids.shape[0]):
        for j in set(ids[b].tolist()):
            z = logits[b, j]
            out[b, j] = z / penalty if z > 0 else z * penalty
    return out


def _ngram_loop(logits, ids, n):
    out = logits.clone()
    for b in range(ids.shape[0]):
        row = ids[b].tolist()
        T = len(row)
        if T < n:
            continue
        tail = row[T - n + 1:]
        for i in range(T - n + 1):
            if row[i:i + n - 1] == tail:
                out[b, row[i + n - 1]] = float("-inf")
    return out


@pytest.mark.parametrize("penalty", [0.5, 1.0, 1.3, 3.0])
def test_repetition_penalty_matches_the_loop(penalty):
    logits, ids = _inputs()
    got = repetition_penalty(logits, ids, penalty)
    torch.testing.assert_close(got, _repetition_loop(logits, ids, penalty))
    # a seen token never gains probability for penalty > 1, an unseen
    # one is untouched
    seen = torch.zeros_like(logits, dtype=torch.bool).scatter(1, ids, True)
    assert torch.equal(got[~seen], logits[~seen])
    if penalty > 1:
        assert (got[seen] < logits[seen]).all()


def test_frequency_and_presence_penalties_count_occurrences():
    logits, ids = _inputs()
    got = frequency_presence_penalty(logits, ids, frequency=0.4,
                                     presence=0.7)
    for b in range(ids.shape[0]):
        for j in range(logits.shape[1]):
            c = ids[b].tolist().count(j)
            want = logits[b, j] - 0.4 * c - 0.7 * (c > 0)
            assert torch.isclose(got[b, j], want, atol=1e-6)
    assert torch.equal(frequency_presence_penalty(logits, ids), logits)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 13])
def test_no_repeat_ngram_matches_the_loop(n):
    for seed in range(5):
        logits, ids = _inputs(T=12, V=3, seed=seed)           # many repeats
        assert torch.equal(no_repeat_ngram_filter(logits, ids, n),
                           _ngram_loop(logits, ids, n))


def test_no_repeat_ngram_bans_exactly_the_completing_token():
    logits = torch.zeros(1, 5)
    ids = torch.tensor([[0, 1, 2, 3, 0, 1]])                 # "0 1" seen
    out = no_repeat_ngram_filter(logits, ids, 3)
    assert out[0].isinf().tolist() == [False, False, True, False, False]
    assert torch.equal(no_repeat_ngram_filter(logits, ids, 7), logits)


def test_inputs_are_not_changed():
    logits, ids = _inputs()
    before = logits.clone()
    for f in (partial(repetition_penalty, penalty=2.0),
              partial(frequency_presence_penalty, frequency=1.0),
              partial(no_repeat_ngram_filter, n=2)):
        f(logits, ids)
    assert torch.equal(logits, before)


def test_against_transformers_processors():
    transformers = pytest.importorskip("transformers")
    logits, ids = _inputs(B=4, T=20, V=5, seed=3)
    for penalty in (1.2, 2.0):
        ref = transformers.RepetitionPenaltyLogitsProcessor(penalty)
        torch.testing.assert_close(repetition_penalty(logits, ids, penalty),
                                   ref(ids, logits.clone()))
    for n in (1, 2, 3):
        ref = transformers.NoRepeatNGramLogitsProcessor(n)
        assert torch.equal(no_repeat_ngram_filter(logits, ids, n),
                           ref(ids, logits.clone()))


@pytest.mark.parametrize("call, error, match", [
    (lambda l, i: repetition_penalty(l, i, 0.0), ValueError, "penalty"),
    (lambda l, i: repetition_penalty(l, i, "2"), TypeError, "penalty"),
    (lambda l, i: no_repeat_ngram_filter(l, i, 0), ValueError, "n must"),
    (lambda l, i: frequency_presence_penalty(l, i, frequency=float("nan")),
     ValueError, "frequency"),
    (lambda l, i: repetition_penalty(l.long(), i, 2.0), TypeError,
     "logits must be a floating tensor"),
    (lambda l, i: repetition_penalty(l[0], i, 2.0), ValueError,
     r"logits must have shape \(B, V\)"),
    (lambda l, i: repetition_penalty(l, i.float(), 2.0), TypeError,
     "ids must be a torch.long tensor"),
    (lambda l, i: repetition_penalty(l, i[:2], 2.0), ValueError,
     r"ids must have shape \(B, T\) with B = 3"),
    (lambda l, i: repetition_penalty(l, i + 7, 2.0), ValueError,
     r"ids must lie in \[0, 7\)"),
])
def test_bad_input_names_the_argument(call, error, match):
    logits, ids = _inputs()
    with pytest.raises(error, match=match):
        call(logits, ids)


# ------------------------------------------------------ generate's hook
class _Bigram(torch.nn.Module):
    """Next-token logits from the last token only: a fixed table."""

    def __init__(self, V=6):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.randn(V, V, generator=g)

    def forward(self, ids):                       # (B, T) -> (B, T, V)
        return self.table[ids]


def test_generate_passes_the_whole_sequence_and_uses_the_result():
    model, prompt = _Bigram(), torch.tensor([[1, 2], [3, 4]])
    seen = []

    def spy(z, ids):
        seen.append(ids.clone())
        return z

    plain = sampling.generate(model, prompt, 5, temperature=0)
    assert torch.equal(sampling.generate(model, prompt, 5, temperature=0,
                                         logits_processor=spy), plain)
    assert [s.shape[1] for s in seen] == [2, 3, 4, 5, 6]
    assert all(torch.equal(s, plain[:, :s.shape[1]]) for s in seen)
    # a processor that forbids token 0 and the argmax of the bigram table
    banned = {0, int(model.table[2].argmax())}

    def forbid(z, ids):
        return z.index_fill(1, torch.tensor(sorted(banned)), float("-inf"))

    out = sampling.generate(model, prompt, 8, temperature=0,
                            logits_processor=forbid)
    assert not set(out[:, 2:].flatten().tolist()) & banned


def test_greedy_with_no_repeat_ngram_never_repeats_a_bigram():
    model = _Bigram(V=6)
    out = sampling.generate(model, torch.tensor([[0]]), 20, temperature=0,
                            logits_processor=partial(no_repeat_ngram_filter,
                                                     n=2))[0].tolist()
    bigrams = list(zip(out, out[1:]))
    assert len(bigrams) == len(set(bigrams))


def test_generate_refuses_a_processor_that_is_not_callable():
    with pytest.raises(TypeError, match="logits_processor must be callable"):
        sampling.generate(_Bigram(), torch.tensor([[0]]), 2,
                          logits_processor=1.3)


def test_no_repeat_ngram_when_the_sequence_is_exactly_n_long():
    # one window, the whole sequence: "2 2" was followed by 2, and the
    # tail is "2 2" again, so a fourth 2 would repeat the 3-gram
    out = no_repeat_ngram_filter(torch.zeros(1, 4), torch.tensor([[2, 2, 2]]),
                                 3)
    assert out[0].isinf().tolist() == [False, False, True, False]


def test_ids_equal_to_the_vocabulary_size_are_refused():
    logits, ids = _inputs(V=7)
    ids[0, 0] = 7
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 7\)"):
        repetition_penalty(logits, ids, 2.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_penalties_keep_the_dtype_of_the_logits(dtype):
    logits, ids = _inputs()
    logits = logits.to(dtype)
    for out in (repetition_penalty(logits, ids, 1.5),
                frequency_presence_penalty(logits, ids, frequency=0.5,
                                           presence=0.5),
                no_repeat_ngram_filter(logits, ids, 2)):
        assert out.dtype == dtype

"""Tests for course_lib.generation.beam_search (chapter 8): beam search against greedy
decoding and against a brute-force search over every continuation; the
batched search against the one-prompt search, prompt by prompt."""
import itertools
import math

import pytest
import torch

from course_lib.generation import sampling
from course_lib.generation.beam_search import (Beam, batch_beam_search,
                                               beam_search,
                                               length_penalty_factor)
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from errors import error_for


def tiny_lm(vocab_size: int, seed: int) -> DecoderLM:
    """A random decoder LM: its logits depend on the whole prefix."""
    torch.manual_seed(seed)
    cfg = DecoderLMConfig(vocab_size=vocab_size, hidden_size=16,
                          num_attention_heads=2, num_hidden_layers=2,
                          max_position_embeddings=32)
    model = DecoderLM(cfg)
    with torch.no_grad():   # sharper distributions: fewer near-ties
        model.lm_head.weight.mul_(8.0)
    return model.eval()


class TableLM(torch.nn.Module):
    """Logits read from a table indexed by the number of generated tokens
    and the last token: ``table[t, last]``, a fixed, hand-made model."""

    def __init__(self, table: torch.Tensor, prompt_len: int):
        super().__init__()
        self.table, self.prompt_len = table, prompt_len

    def forward(self, idx):                                   # (B, T)
        B, T = idx.shape
        out = torch.zeros(B, T, self.table.shape[-1], dtype=torch.float64)
        t = T - self.prompt_len                 # tokens generated so far
        out[:, -1] = self.table[t, idx[:, -1]]
        return out                                            # (B, T, V)


def brute_force(model, prompt, n, *, eos_id=None, alpha=0.0):
    """Score every continuation of length <= n (stopping at eos) exactly:
    log P from sequence_log_prob, score = log P / ((5 + len) / 6)^alpha."""
    V = model(prompt[None])[0].shape[-1]
    best = None
    for length in range(1, n + 1):
        tails = [t for t in itertools.product(range(V), repeat=length)
                 # an end token ends a sequence; shorter ones end in it
                 if (eos_id is None or eos_id not in t[:-1])
                 and (length == n or t[-1] == eos_id)]
        if not tails:
            continue
        ids = torch.cat([prompt.expand(len(tails), -1),
                         torch.tensor(tails)], dim=1)        # (N, T)
        lps = sampling.sequence_log_prob(model, ids, prompt_len=len(prompt))
        for tail, lp in zip(tails, lps.tolist()):
            score = lp / ((5 + length) / 6) ** alpha
            if best is None or score > best[2] + 1e-12:
                best = (tail, lp, score)
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_width_one_is_greedy(seed):
    model = tiny_lm(7, seed)
    prompt = torch.tensor([1, 4, 2])
    greedy = sampling.generate(model, prompt, 12, temperature=0)
    (beam,) = beam_search(model, prompt, beam_width=1, max_new_tokens=12)
    assert torch.equal(beam.ids, greedy)
    lp = sampling.sequence_log_prob(model, greedy, prompt_len=3).item()
    assert beam.log_prob == pytest.approx(lp, abs=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_full_width_equals_exhaustive_search(seed):
    V, n = 3, 4
    model = tiny_lm(V, seed)
    prompt = torch.tensor([2, 0])
    tail, lp, _ = brute_force(model, prompt, n)
    beams = beam_search(model, prompt, beam_width=V ** (n - 1),
                        max_new_tokens=n)
    assert beams[0].ids[2:].tolist() == list(tail)
    assert beams[0].log_prob == pytest.approx(lp, abs=1e-5)
    # results sorted best first, each log P as sequence_log_prob scores it
    scores = [b.score for b in beams]
    assert scores == sorted(scores, reverse=True)
    for b in beams[:5]:
        ref = sampling.sequence_log_prob(model, b.ids, prompt_len=2).item()
        assert b.log_prob == pytest.approx(ref, abs=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("seed", [0, 5])
def test_full_width_with_eos_equals_exhaustive_search(seed, alpha):
    V, n, eos = 3, 4, 0
    model = tiny_lm(V, seed)
    prompt = torch.tensor([1])
    tail, lp, score = brute_force(model, prompt, n, eos_id=eos, alpha=alpha)
    best = beam_search(model, prompt, beam_width=V ** (n - 1),
                       max_new_tokens=n, eos_id=eos,
                       length_penalty=alpha)[0]
    assert best.ids[1:].tolist() == list(tail)
    assert best.log_prob == pytest.approx(lp, abs=1e-5)
    assert best.score == pytest.approx(score, abs=1e-5)


def test_narrow_beam_can_miss_the_mode_and_wider_finds_it():
    # step 0: token 1 (0.6) beats token 2 (0.4); after 1 everything is
    # flat (0.25 each of 4), after 2 token 3 is near-certain (0.97)
    V = 4
    flat = torch.zeros(V)
    sure = torch.tensor([0.01, 0.01, 0.01, 0.97]).log()
    first = torch.tensor([1e-9, 0.6, 0.4, 1e-9]).log()
    table = torch.zeros(2, V, V, dtype=torch.float64)
    table[0, :] = first
    table[1, 1] = flat
    table[1, 2] = sure
    model = TableLM(table, prompt_len=1)
    prompt = torch.tensor([0])
    one = beam_search(model, prompt, beam_width=1, max_new_tokens=2)[0]
    two = beam_search(model, prompt, beam_width=2, max_new_tokens=2)[0]
    assert one.ids.tolist() == [0, 1, 0]            # greedy: 0.6 * 0.25
    assert two.ids.tolist() == [0, 2, 3]            # mode: 0.4 * 0.97
    assert one.log_prob == pytest.approx(math.log(0.6 * 0.25))
    assert two.log_prob == pytest.approx(math.log(0.4 * 0.97))


def test_length_penalty_changes_the_winner():
    # end now with probability 0.5, or go on: 0.5 * 0.9 * 0.9 * 1.0
    # log P: short -0.693 > long -0.904; with alpha = 2 the long one wins:
    # -0.693 / ((5+1)/6)^2 = -0.693 < -0.904 / ((5+4)/6)^2 = -0.402
    V, eos = 3, 0
    table = torch.full((4, V, V), -30.0, dtype=torch.float64)
    table[0, :, 0] = table[0, :, 1] = math.log(0.5)
    table[1, :, 2] = table[2, :, 2] = math.log(0.9)
    table[1, :, 0] = table[2, :, 0] = math.log(0.1)
    table[3, :, 0] = 0.0
    model = TableLM(table, prompt_len=1)
    prompt = torch.tensor([1])
    plain = beam_search(model, prompt, beam_width=4, max_new_tokens=4,
                        eos_id=eos)[0]
    normed = beam_search(model, prompt, beam_width=4, max_new_tokens=4,
                         eos_id=eos, length_penalty=2.0)[0]
    assert plain.ids.tolist() == [1, 0]
    assert normed.ids.tolist() == [1, 1, 2, 2, 0]
    lp_long = math.log(0.5 * 0.9 * 0.9) + torch.log_softmax(
        table[3, 2], -1)[0].item()
    assert normed.log_prob == pytest.approx(lp_long, abs=1e-9)
    assert normed.score == pytest.approx(lp_long / (9 / 6) ** 2, abs=1e-9)
    assert plain.score == pytest.approx(math.log(0.5), abs=1e-9)


def test_length_penalty_factor_closed_form():
    assert length_penalty_factor(1, 0.7) == pytest.approx(1.0)
    assert length_penalty_factor(7, 0.5) == pytest.approx(math.sqrt(2.0))
    assert length_penalty_factor(13, 0.0) == 1.0


def test_result_types_and_restored_mode():
    model = tiny_lm(5, 0).train()
    beams = beam_search(model, torch.tensor([1, 2]), beam_width=3,
                        max_new_tokens=4)
    assert model.training
    assert len(beams) == 3 and all(isinstance(b, Beam) for b in beams)
    assert all(b.ids.shape == (6,) and b.ids.dtype == torch.long
               for b in beams)


@pytest.mark.parametrize("kwargs, match", [
    (dict(beam_width=0), "beam_width"),
    (dict(beam_width=2.0), "beam_width must be an int"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(length_penalty=-1.0), "length_penalty"),
    (dict(length_penalty="1"), "length_penalty must be a real number"),
    (dict(eos_id=-1), "eos_id"),
    (dict(eos_id=99), "eos_id"),
])
def test_bad_arguments_raise(kwargs, match):
    args = dict(beam_width=2, max_new_tokens=3) | kwargs
    with pytest.raises(error_for(match), match=match):
        beam_search(tiny_lm(5, 0), torch.tensor([1, 2]), **args)


def test_bad_prompt_raises():
    with pytest.raises(ValueError, match="prompt_ids"):
        beam_search(tiny_lm(5, 0), torch.tensor([[1, 2]]), beam_width=2,
                    max_new_tokens=2)
    with pytest.raises(TypeError, match="prompt_ids"):
        beam_search(tiny_lm(5, 0), torch.tensor([1.0]), beam_width=2,
                    max_new_tokens=2)


# ------------------------------------------------- several prompts at once
class ForcedEos(torch.nn.Module):
    """A DecoderLM whose next token after ``trigger`` can only be
    ``eos``: a prompt ending in it has nothing but finished candidates."""

    def __init__(self, lm: DecoderLM, trigger: int, eos: int):
        super().__init__()
        self.lm, self.config = lm, lm.config
        self.trigger, self.eos = trigger, eos

    def forward(self, idx, positions=None, **kwargs):
        logits = self.lm(idx, positions, **kwargs)          # (B, T, V)
        forced = torch.full_like(logits[0, 0], float("-inf"))
        forced[self.eos] = 0.0
        return torch.where((idx == self.trigger)[..., None], forced, logits)


PROMPTS = [[1, 4, 2], [3], [5, 1, 1, 2, 6, 4], [0, 2]]


def assert_same_beams(batched, single):
    assert len(batched) == len(single)
    for got, want in zip(batched, single):
        assert torch.equal(got.ids, want.ids)
        assert got.log_prob == pytest.approx(want.log_prob, abs=1e-5)
        assert got.score == pytest.approx(want.score, abs=1e-5)


@pytest.mark.parametrize("seed, width, eos, alpha", [
    (0, 1, None, 0.0), (1, 3, None, 0.0), (0, 4, 0, 0.0), (1, 4, 0, 1.5),
    (0, 7, 0, 0.6)])
def test_batched_equals_one_prompt_at_a_time(seed, width, eos, alpha):
    """Prompts of lengths 3, 1, 6, 2 in one padded batch with a KV cache:
    each prompt's beams are those of beam_search on it alone (no cache)."""
    model = tiny_lm(7, seed)
    prompts = [torch.tensor(p) for p in PROMPTS]
    kw = dict(beam_width=width, max_new_tokens=9, eos_id=eos,
              length_penalty=alpha)
    batched = batch_beam_search(model, prompts, pad_token_id=6, **kw)
    assert len(batched) == len(prompts)
    for prompt, beams in zip(prompts, batched):
        assert_same_beams(beams, beam_search(model, prompt, **kw))
    if eos is not None and alpha == 0:   # some hypotheses ended early
        assert any(len(b.ids) < len(p) + 9
                   for p, beams in zip(prompts, batched) for b in beams)


def test_batched_when_a_prompt_can_only_end():
    """After token 3 only the end token 0 is possible: the prompt [3]
    finishes at its first step while the others go on."""
    model = ForcedEos(tiny_lm(7, 2), trigger=3, eos=0).eval()
    prompts = [torch.tensor(p) for p in PROMPTS]
    kw = dict(beam_width=3, max_new_tokens=6, eos_id=0)
    batched = batch_beam_search(model, prompts, **kw)
    assert [b.ids.tolist() for b in batched[1]] == [[3, 0]]
    for prompt, beams in zip(prompts, batched):
        assert_same_beams(beams, beam_search(model, prompt, **kw))


@pytest.mark.parametrize("kwargs, match", [
    (dict(beam_width=0), "beam_width"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=40), "longest prompt \\+ max_new_tokens"),
    (dict(length_penalty=-0.5), "length_penalty"),
    (dict(eos_id=5), "eos_id"),
    (dict(pad_token_id=-1), "pad_token_id"),
    (dict(prompts=[]), "prompts"),
    (dict(prompts=[torch.tensor([[1, 2]])]), "prompts\\[0\\]"),
    (dict(model=lambda ids: ids), "model must be a torch.nn.Module"),
])
def test_batched_bad_arguments_raise(kwargs, match):
    args = dict(model=tiny_lm(5, 0), prompts=[torch.tensor([1, 2])],
                beam_width=2, max_new_tokens=3) | kwargs
    with pytest.raises(error_for(match), match=match):
        batch_beam_search(**args)
    with pytest.raises(TypeError, match="prompts must be a list"):
        batch_beam_search(tiny_lm(5, 0), torch.tensor([1, 2]),
                          beam_width=2, max_new_tokens=3)

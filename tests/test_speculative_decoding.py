"""Speculative decoding (chapter 15): greedy output is the target's greedy
output for any drafter; sampled output is distributed as the target's
(exactly, by enumerating one round's outcomes, and statistically, with a
broken rule shown to fail the same test); the caches hold what a fresh
prefill of the output computes; bad input fails at the call."""
import copy
import itertools

import pytest
import torch
import torch.nn.functional as F

from course_lib.generation.sampling import generate, sampling_distribution
from course_lib.generation.speculative import speculative_acceptance
from course_lib.model.decoder_lm import DecoderLM, DecoderLMConfig
from course_lib.model.kv_cache import KVCache
from course_lib.serving import speculative_decoding as sd
from course_lib.serving.speculative_decoding import (
    PromptLookup,
    early_exit_draft,
    expected_speedup,
    expected_tokens_per_call,
    rejection_greedy_sample,
    rejection_sample,
    rejection_sample_outcomes,
    speculative_generate,
    speculative_generate_with_stats,
)
from tiny_lm_support import MODELS, tiny_lm


def lively(model, seed, std=0.3):
    """Redraw the matrices with a larger std: an untrained model at the
    default init (0.02) repeats one token, and every drafter guesses it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def small_lm(vocab, seed, layers=1, hidden=16, max_pos=40):
    torch.manual_seed(seed)
    return lively(DecoderLM(DecoderLMConfig(
        vocab_size=vocab, hidden_size=hidden, num_attention_heads=2,
        num_hidden_layers=layers, max_position_embeddings=max_pos)), seed)


def perturbed(model, std, seed):
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return out


PROMPT = torch.tensor([3, 17, 5, 9, 3, 17, 11, 2])


# ---------------------------------------------------------------- greedy

@pytest.mark.parametrize("variant", ["mha-learned", "gqa-rope"])
def test_greedy_equals_target_greedy_for_every_drafter(variant):
    target = lively(tiny_lm(**MODELS[variant]), 1)
    ref = generate(target, PROMPT, 24, temperature=0, use_cache=True)
    drafters = {"copy": copy.deepcopy(target),
                "perturbed": perturbed(target, 0.1, 2),
                "random": small_lm(23, 3),
                "lookup": PromptLookup(),
                "early exit": early_exit_draft(target, 1)}
    for name, draft in drafters.items():
        for k in (1, 2, 5):
            out, st = speculative_generate_with_stats(target, draft,
                                                      PROMPT, 24, k=k)
            assert torch.equal(out, ref), (name, k)
            # each round emits its accepted drafts + one token
            assert st.new_tokens == 24 == st.accepted + st.rounds
            assert st.accepted <= st.drafted <= k * st.rounds
            if name == "copy":
                assert st.acceptance_rate == 1.0 and st.rejected == 0
            if name in ("perturbed", "random") and k == 2:
                assert st.rejected > 0, name   # a bad drafter was tested
    # a model in training mode runs in eval mode and is restored
    target.train()
    assert torch.equal(speculative_generate(target, drafters["perturbed"],
                                            PROMPT, 24, k=2), ref)
    assert target.training and drafters["perturbed"].training is False
    target.eval()
    # the batch form (1, T0) returns (1, T0 + n)
    assert torch.equal(speculative_generate(target, PromptLookup(),
                                            PROMPT[None], 24), ref[None])


def test_greedy_on_smollm2_self_draft_and_prompt_lookup(smollm2):
    model, tok = smollm2
    ids = torch.tensor(tok.encode(tok.apply_chat_template([{
        "role": "user", "content": "Add a docstring to this Python "
        "function:\n\ndef add(a, b):\n    return a + b"}])))
    ref = generate(model, ids, 8, temperature=0, use_cache=True)
    out = speculative_generate(model, early_exit_draft(model, 2), ids, 8,
                               k=2)
    assert torch.equal(out, ref)
    out, st = speculative_generate_with_stats(model, PromptLookup(), ids,
                                              8, k=4)
    assert torch.equal(out, ref)
    assert st.accepted > 0, st     # it copies the function: drafts pass


def test_rejection_greedy_sample_by_hand():
    z = torch.tensor([[0., 5, 1], [4., 0, 1], [0., 1, 3], [9., 0, 0]])
    # argmax per row: 1, 0, 2, 0
    assert rejection_greedy_sample(z, torch.tensor([1, 0, 2])) == (3, 0)
    assert rejection_greedy_sample(z, torch.tensor([1, 2, 2])) == (1, 0)
    assert rejection_greedy_sample(z, torch.tensor([0, 0, 2])) == (0, 1)
    assert rejection_greedy_sample(z[:1], torch.tensor([],
                                   dtype=torch.long)) == (0, 1)


# ------------------------------------------------------- sampling, exact

V = 6


def dists(model, ids, sampler):
    """The sampling distributions at every position of ids (R, T):
    (R, T, V)."""
    z = model(ids.long()).double()
    return sampling_distribution(z, **sampler)


def proposals(draft, ctx, k, sampler):
    """Every draft a round can make at ctx: xs (R, m), their
    probabilities (R,) and the drafter's q (R, m, V)."""
    if isinstance(draft, PromptLookup):           # one, deterministic
        xs = draft.propose(ctx, k)[None]
        return xs, torch.ones(1, dtype=torch.float64), \
            F.one_hot(xs, V).double()
    xs = torch.tensor(list(itertools.product(range(V), repeat=k)))
    seqs = torch.cat([ctx.expand(len(xs), -1), xs], dim=1)
    q = dists(draft, seqs, sampler)[:, len(ctx) - 1:-1]      # (R, k, V)
    w = q.gather(-1, xs[..., None])[..., 0].prod(-1)         # (R,)
    return xs[w > 0], w[w > 0], q[w > 0]


def round_tokens(target, draft, ctx, k, sampler, second=True):
    """Distribution of the first token, and of the first two, that
    speculative rounds starting at ctx emit, from
    rejection_sample_outcomes (no random draw). When a round emits one
    token the second comes from the next round, computed the same way."""
    one = torch.zeros(V, dtype=torch.float64)
    two = torch.zeros(V, V, dtype=torch.float64)
    after = {}                                    # y1 -> next round's
    xs_all, ws, qs = proposals(draft, ctx, k, sampler)
    m = xs_all.shape[1]
    seqs = torch.cat([ctx.expand(len(xs_all), -1), xs_all], dim=1)
    ps = dists(target, seqs, sampler)[:, -(m + 1):]          # (R, m+1, V)
    for xs, w, q, p in zip(xs_all, ws, qs, ps):
        prob_n, nxt = rejection_sample_outcomes(p, q, xs)
        torch.testing.assert_close(prob_n.sum().item(), 1.0)
        one += w * prob_n[0] * nxt[0]             # n = 0: the replacement
        if m:
            one[xs[0]] += w * (1 - prob_n[0])     # n >= 1: x_1
        if not second:
            continue
        for y1 in range(V):                       # n = 0: next round
            if nxt[0, y1] > 0:
                if y1 not in after:
                    after[y1] = round_tokens(
                        target, draft, torch.cat([ctx, torch.tensor([y1])]),
                        k, sampler, second=False)[0]
                two[y1] += w * prob_n[0] * nxt[0, y1] * after[y1]
        if m >= 1:                                # n = 1: x_1, then r_2
            two[xs[0]] += w * prob_n[1] * nxt[1]  # (or the bonus p_2)
        if m >= 2:                                # n >= 2: x_1, x_2
            two[xs[0], xs[1]] += w * prob_n[2:].sum()
    return one, two


def target_joint(target, ctx, sampler):
    """p(y1 | ctx) p(y2 | ctx, y1): (V,) and (V, V), by enumeration."""
    seqs = torch.cat([ctx.expand(V, -1), torch.arange(V)[:, None]], dim=1)
    p = dists(target, seqs, sampler)                         # (V, T, V)
    p1, p2 = p[0, -2], p[:, -1]                              # (V,), (V, V)
    return p1, p1[:, None] * p2


SAMPLERS = {"t1": dict(temperature=1.0),
            "t0.7-topk4": dict(temperature=0.7, top_k=4),
            "t1.3-topp0.8": dict(temperature=1.3, top_p=0.8)}
CTX = torch.tensor([1, 2, 3, 4, 1, 2])   # "1 2" recurs: lookup drafts 3 4


@pytest.fixture(scope="module")
def pair():
    return small_lm(V, 10), small_lm(V, 11)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("drafter,k", [("model", 1), ("model", 2),
                                       ("model", 3), ("lookup", 2),
                                       ("lookup", 3)])
def test_one_round_emits_the_targets_distribution(pair, drafter, k,
                                                  sampler):
    target, draft = pair
    draft = draft if drafter == "model" else PromptLookup()
    s = SAMPLERS[sampler]
    one, two = round_tokens(target, draft, CTX, k, s)
    p1, p12 = target_joint(target, CTX, s)
    torch.testing.assert_close(one, p1, atol=1e-6, rtol=0)
    torch.testing.assert_close(two, p12, atol=1e-6, rtol=0)
    if drafter == "model":                # p and q really differ
        assert (p1 - dists(draft, CTX[None], s)[0, -1]).abs().max() > 0.1


def accept_all(p, q, draft):
    """A broken rule: every draft is accepted."""
    return torch.ones(p.shape[:-1], dtype=p.dtype), p


def resample_from_p(p, q, draft):
    """A broken rule: the right acceptance, but replacements from p
    instead of the residual max(0, p - q)."""
    accept, _ = speculative_acceptance(p, q, draft)
    return accept, p


@pytest.mark.parametrize("broken", [accept_all, resample_from_p])
def test_the_exact_check_catches_a_wrong_rule(pair, broken, monkeypatch):
    target, draft = pair
    s = SAMPLERS["t1"]
    monkeypatch.setattr(sd, "speculative_acceptance", broken)
    one, _ = round_tokens(target, draft, CTX, 2, s, second=False)
    p1, _ = target_joint(target, CTX, s)
    assert (one - p1).abs().max() > 0.01


def test_rejection_sample_draws_from_its_outcome_distribution():
    """The random path draws (n, y) with the probabilities that
    rejection_sample_outcomes states, m = 3 drafts."""
    g = torch.Generator().manual_seed(0)
    p = torch.randn(4, 5, generator=g, dtype=torch.float64).softmax(-1)
    q = torch.randn(3, 5, generator=g, dtype=torch.float64).softmax(-1)
    draft = torch.tensor([0, 2, 4])
    prob_n, nxt = rejection_sample_outcomes(p, q, draft)
    joint = prob_n[:, None] * nxt                            # (4, 5)
    N = 3000
    counts = torch.zeros(4, 5, dtype=torch.float64)
    for _ in range(N):
        n, y = rejection_sample(p, q, draft, generator=g)
        counts[n, y] += 1
    assert chi2_pvalue(counts.flatten(), joint.flatten()) > 1e-3


# ------------------------------------------------- sampling, statistical

def chi2_pvalue(counts, probs):
    """Pearson's chi-square goodness of fit; cells expected below 5 are
    merged into one. P-value from the chi-square cdf (regularised upper
    incomplete gamma)."""
    N = counts.sum()
    expected = N * probs
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = keep.sum() - 1
    return torch.special.gammaincc(dof / 2, stat / 2).item()


def sampled_pairs(target, draft, ctx, runs, sampler, seed):
    """Counts (V * V,) of the two tokens of `runs` speculative runs."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V, dtype=torch.float64)
    for _ in range(runs):
        out = speculative_generate(target, draft, ctx, 2, k=2,
                                   generator=g, **sampler)
        counts[out[-2] * V + out[-1]] += 1
    return counts


@pytest.mark.parametrize("drafter,sampler,runs", [
    ("model", "t0.7-topk4", 800), ("lookup", "t1", 500)])
def test_sampled_pairs_fit_the_targets_joint(pair, drafter, sampler, runs,
                                             monkeypatch):
    target, draft = pair
    draft = draft if drafter == "model" else PromptLookup()
    s = SAMPLERS[sampler]
    _, p12 = target_joint(target, CTX, s)
    counts = sampled_pairs(target, draft, CTX, runs, s, seed=1)
    assert chi2_pvalue(counts, p12.flatten()) > 1e-3
    # the same test fails when the replacements are drawn from p instead
    # of the residual (a subtle error: the acceptance step is right)
    monkeypatch.setattr(sd, "speculative_acceptance", resample_from_p)
    counts = sampled_pairs(target, draft, CTX, 400, s, seed=1)
    assert chi2_pvalue(counts, p12.flatten()) < 1e-3


# ---------------------------------------------------------------- caches

@pytest.mark.parametrize("temperature,noise", [(0.0, 0.1), (1.0, 0.1),
                                               (0.0, 0.0)])
def test_caches_hold_a_fresh_prefill_of_the_output(temperature, noise):
    """noise 0: a copy of the target, every draft accepted, so the
    drafter's cache always lacks x_k and the bonus token after a round."""
    target = lively(tiny_lm(**MODELS["gqa-rope"]), 1)
    draft = perturbed(target, noise, 2)
    cache = KVCache(2, max_len=40)
    draft_cache = KVCache(2, max_len=40)
    out, st = speculative_generate_with_stats(
        target, draft, PROMPT, 25, k=3, temperature=temperature,
        generator=torch.Generator().manual_seed(0), cache=cache,
        draft_cache=draft_cache)
    assert (st.rejected > 0) == (noise > 0)  # rejected drafts: cropped
    assert cache.seq_len == len(out) - 1  # every token but the last
    assert 0 < draft_cache.seq_len <= len(out) - 1
    for model, c in ((target, cache), (draft, draft_cache)):
        fresh = KVCache(2, max_len=40)
        model(out[None, :c.seq_len], cache=fresh)
        for mine, ref in zip(c.layers, fresh.layers):
            for a, b in zip(mine.tensors, ref.tensors):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------- drafters

def test_early_exit_draft_shares_weights_and_computes_the_first_layers():
    model = lively(tiny_lm(**MODELS["mha-learned"]), 1)
    before = {id(p) for p in model.parameters()}
    draft = early_exit_draft(model, 1)
    assert {id(p) for p in draft.parameters()} <= before   # no copy
    assert not any(t.is_meta for t in [*draft.parameters(),
                                       *draft.buffers()])
    assert draft.config.num_hidden_layers == 1 and len(draft.layers) == 1
    assert model.config.num_hidden_layers == 2 and len(model.layers) == 2
    # reference: a one-layer model loaded with a copy of those weights
    ref = DecoderLM(draft.config).eval()
    ref.load_state_dict(model.state_dict(), strict=False)
    ids = PROMPT[None]
    torch.testing.assert_close(draft(ids), ref(ids))
    assert not torch.allclose(draft(ids), model(ids))


def lookup_loop(ids, k, max_ngram):
    """Prompt lookup written as plain loops over Python lists."""
    ids = ids.tolist()
    L = len(ids)
    for n in range(min(max_ngram, L - 1), 0, -1):
        for s in range(L - n - 1, -1, -1):          # most recent first
            if ids[s:s + n] == ids[L - n:]:
                return ids[s + n:s + n + k]
    return []


def test_prompt_lookup_matches_a_loop():
    assert PromptLookup().propose(torch.tensor([1, 2, 3, 4, 1, 2]),
                                  3).tolist() == [3, 4, 1]
    assert PromptLookup().propose(torch.tensor([5, 6, 7]), 2).tolist() == []
    assert PromptLookup().propose(torch.tensor([5]), 2).tolist() == []
    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        ids = torch.randint(0, 4, (int(torch.randint(1, 30, (1,),
                                                     generator=g)),),
                            generator=g)
        k, n = trial % 5 + 1, trial % 3 + 1
        assert PromptLookup(n).propose(ids, k).tolist() == \
            lookup_loop(ids, k, n), (ids, k, n)


# ---------------------------------------------------------------- formulas

def test_expected_tokens_per_call_matches_simulated_rounds():
    g = torch.Generator().manual_seed(0)
    for alpha, k in ((0.0, 3), (0.6, 4), (0.9, 2), (1.0, 5)):
        coins = torch.rand(200_000, k, generator=g) < alpha
        emitted = coins.long().cumprod(-1).sum(-1) + 1   # N + 1
        assert emitted.double().mean().item() == pytest.approx(
            expected_tokens_per_call(alpha, k), rel=5e-3)
    assert expected_tokens_per_call(0.5, 2) == 1.75      # 1 + .5 + .25


def test_expected_speedup():
    # Leviathan et al. Theorem 3.8: (1 - a^(k+1)) / ((1 - a)(k c + 1))
    assert expected_speedup(0.8, 4, 0.05) == pytest.approx(
        (1 - 0.8 ** 5) / (0.2 * 1.2))
    assert expected_speedup(0.0, 3, 0.1) < 1          # nothing accepted
    assert expected_speedup(0.5, 2, 0.0, verify_cost=1.75) == 1.0


# --------------------------------------------------------------- bad input

def test_bad_input_names_the_argument():
    target = tiny_lm()
    ok = dict(target=target, draft=PromptLookup(), prompt_ids=PROMPT,
              max_new_tokens=4)
    cases = [
        (dict(k=0), ValueError, "k must be >= 1"),
        (dict(draft=small_lm(7, 0)), ValueError,
         "draft must have the target's vocabulary size 23"),
        (dict(prompt_ids=torch.zeros(39, dtype=torch.long)), ValueError,
         r"prompt_ids \(39 tokens\) \+ max_new_tokens=4 = 43"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
        (dict(temperature=-0.5), ValueError, "temperature must be >= 0"),
        (dict(draft="ngram"), TypeError, "draft must be a DecoderLM or a "
                                         "PromptLookup"),
        (dict(target=PromptLookup()), TypeError, "target must be a "
                                                 "DecoderLM"),
        (dict(prompt_ids=PROMPT.float()), TypeError, "prompt_ids must be"),
        (dict(prompt_ids=torch.zeros(2, 5, dtype=torch.long)), ValueError,
         "prompt_ids must hold one sequence"),
        (dict(prompt_ids=torch.tensor([1, 99])), ValueError,
         r"prompt_ids must hold ids in \[0, 23\)"),
        (dict(draft_cache=KVCache(2)), ValueError,
         "draft_cache must be None for a PromptLookup"),
        (dict(generator=0), TypeError, "generator must be"),
    ]
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            speculative_generate(**{**ok, **change})
    shared = KVCache(2)
    with pytest.raises(ValueError, match="draft_cache must not be the "
                                         "target's cache"):
        speculative_generate(**{**ok, "draft": tiny_lm()}, cache=shared,
                             draft_cache=shared)
    full = KVCache(2)
    target(PROMPT[None], cache=full)
    with pytest.raises(ValueError, match="cache must be empty"):
        speculative_generate(**ok, cache=full)
    with pytest.raises(ValueError, match="n_layers must be <= 2"):
        early_exit_draft(target, 3)
    with pytest.raises(ValueError, match="max_ngram must be >= 1"):
        PromptLookup(0)
    with pytest.raises(ValueError, match="alpha must be <= 1"):
        expected_tokens_per_call(1.5, 2)
    with pytest.raises(ValueError, match=r"p must be a floating \(m \+ 1"):
        rejection_sample(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3,
                         torch.tensor([0, 1]))

"""Tests for generation with a KV cache (chapter 9): ``sampling.generate``
with ``use_cache=True`` (prefill once, then one token a call),
course_lib.generation.decoding's prefill, throughput, and the FLOPs and
bytes of a forward call.

References used: generation without a cache (the same tokens from the
same seeded generator), a model that records every call, a fake clock,
torch's FlopCounterMode and closed forms.
"""
import math
from types import SimpleNamespace

import pytest
import torch

from course_lib.generation import decoding, sampling
from course_lib.model.decoder_lm import DecoderLMConfig
from course_lib.generation.decoding import prefill
from course_lib.model.kv_cache import KVCache
from course_lib.sizing.kv_cache_size import kv_cache_bytes
from tiny_lm_support import MODELS, tiny_lm


def generate(model, prompt_ids, max_new_tokens, **kw):
    """Chapter 9's generation: ``sampling.generate`` with the cache unless
    ``use_cache=False`` is given."""
    kw.setdefault("use_cache", True)
    return sampling.generate(model, prompt_ids, max_new_tokens, **kw)


SAMPLERS = {
    "greedy": dict(temperature=0.0),
    "t1": dict(temperature=1.0),
    "t0.8-k5-p0.9": dict(temperature=0.8, top_k=5, top_p=0.9),
    "t1.3-minp0.2": dict(temperature=1.3, min_p=0.2),
}


class Recorder(torch.nn.Module):
    """Wraps a model; records the input shape and last-position logits of
    every call, so cached and uncached runs can be compared step by step."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config
        self.shapes, self.last = [], []

    def forward(self, idx, **kw):
        out = self.model(idx, **kw)
        self.shapes.append(tuple(idx.shape))
        self.last.append(out[:, -1].clone())
        return out


# every model greedy; seeded sampling (with and without top-k/top-p) on
# learned and RoPE positions, MHA, GQA and MQA
CASES = [(name, "greedy") for name in MODELS] + [
    ("mha-learned", "t1"), ("gqa-rope", "t1"),
    ("mha-rope", "t0.8-k5-p0.9"), ("mqa-rope", "t0.8-k5-p0.9"),
    ("gqa-rope", "t1.3-minp0.2")]


@pytest.mark.parametrize("name,sampler", CASES)
@pytest.mark.parametrize("prompt_len", [1, 4])
def test_generate_cached_equals_uncached_tokens(name, sampler, prompt_len):
    lm = tiny_lm(**MODELS[name])
    prompt = torch.randint(23, (2, prompt_len))
    n_new = 40 - prompt_len               # up to the last position max_len
    out = {}
    for use_cache in (True, False):
        gen = torch.Generator().manual_seed(7)
        out[use_cache] = generate(lm, prompt, n_new, use_cache=use_cache,
                                  generator=gen, **SAMPLERS[sampler])
    assert out[True].shape == (2, 40)
    assert torch.equal(out[True][:, :prompt_len], prompt)
    assert torch.equal(out[True], out[False])


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_min_p_one_is_greedy(use_cache):
    """min_p = 1 keeps only the most likely token: sampling at any
    temperature is then greedy decoding (so min_p reaches the sampler)."""
    lm = tiny_lm(**MODELS["gqa-rope"])
    prompt = torch.randint(23, (2, 3))
    greedy = generate(lm, prompt, 30, use_cache=use_cache, temperature=0.0)
    sampled = generate(lm, prompt, 30, use_cache=use_cache, temperature=1.5,
                       min_p=1.0, generator=torch.Generator().manual_seed(0))
    free = generate(lm, prompt, 30, use_cache=use_cache, temperature=1.5,
                    generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, greedy)
    assert not torch.equal(free, greedy)      # without min_p it is not


@pytest.mark.parametrize("name", ["mha-learned", "gqa-rope"])
def test_generate_step_logits_and_calls(name):
    rec = Recorder(tiny_lm(**MODELS[name]))
    prompt = torch.randint(23, (3, 5))
    cached = generate(rec, prompt, 20, use_cache=True, temperature=0.0)
    # one prefill call on the prompt, then one call per new token but the
    # last (which is returned, never fed back)
    assert rec.shapes == [(3, 5)] + [(3, 1)] * 19
    cached_logits, rec.shapes, rec.last = rec.last, [], []
    full = generate(rec, prompt, 20, use_cache=False, temperature=0.0)
    assert rec.shapes == [(3, 5 + t) for t in range(20)]
    assert torch.equal(cached, full)
    torch.testing.assert_close(torch.stack(cached_logits),
                               torch.stack(rec.last), atol=1e-5, rtol=1e-5)


def test_generate_restores_training_mode_and_1d_prompt():
    lm = tiny_lm(dropout=0.5).train()
    prompt = torch.randint(23, (3,))
    a = generate(lm, prompt, 10, temperature=0.0)
    assert lm.training
    b = generate(lm, prompt, 10, use_cache=False, temperature=0.0)
    assert a.shape == (13,) and torch.equal(a, b)
    assert torch.equal(generate(lm, prompt, 0), prompt)


def test_prefill_returns_last_logits():
    lm = tiny_lm(num_key_value_heads=1)
    ids = torch.randint(23, (2, 7))
    cache = KVCache(2)
    z = prefill(lm, ids, cache)
    assert cache.seq_len == 7
    torch.testing.assert_close(z, lm(ids)[:, -1], atol=1e-6, rtol=1e-6)
    # a further chunk continues the cache
    more = torch.randint(23, (2, 3))
    z2 = prefill(lm, more, cache)
    full = lm(torch.cat([ids, more], dim=1))
    torch.testing.assert_close(z2, full[:, -1], atol=1e-5, rtol=1e-5)
    assert prefill(lm, ids[0], KVCache(2)).shape == (23,)


@pytest.mark.parametrize("name", ["mha-learned", "gqa-rope"])
def test_prefix_reuse_with_fork_equals_from_scratch(name):
    lm = tiny_lm(**MODELS[name])
    system = torch.randint(23, (1, 9))
    shared = KVCache(2, max_len=40)
    prefill(lm, system, shared)
    before = [t.clone() for t in shared[1].tensors]
    for seed in range(3):
        user = torch.randint(23, (1, 1 + seed))
        reuse = generate(lm, user, 8, cache=shared.fork(),
                         generator=torch.Generator().manual_seed(seed))
        scratch = generate(lm, torch.cat([system, user], dim=1), 8,
                           generator=torch.Generator().manual_seed(seed))
        assert torch.equal(reuse, scratch[:, system.shape[1]:])
    assert shared.seq_len == 9              # forks left the prefix alone
    assert all(torch.equal(a, b) for a, b in zip(before, shared[1].tensors))


def test_generate_bad_input():
    lm = tiny_lm()
    prompt = torch.randint(23, (2, 5))
    with pytest.raises(ValueError, match="max_position_embeddings=40"):
        generate(lm, prompt, 36)                            # 41 > 40
    with pytest.raises(ValueError, match="max_len must be None"):
        generate(lm, prompt, 2, max_len=8)
    generate(lm, prompt, 35, temperature=0.0)               # 40 fits
    cache = KVCache(2)
    prefill(lm, torch.randint(23, (2, 30)), cache)
    with pytest.raises(ValueError, match="30 cached"):
        generate(lm, prompt, 6, cache=cache)
    with pytest.raises(ValueError, match="batch size 3"):
        generate(lm, torch.randint(23, (3, 2)), 2, cache=cache)
    with pytest.raises(ValueError, match="number of layers"):
        generate(lm, prompt, 2, cache=KVCache(3))
    with pytest.raises(ValueError, match="use_cache=False"):
        generate(lm, prompt, 2, use_cache=False, cache=KVCache(2))
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        generate(lm, prompt, 2, cache=[])
    with pytest.raises(TypeError, match="integer tensor"):
        generate(lm, prompt.float(), 2)
    with pytest.raises(ValueError, match=r"prompt_ids must have shape "
                       r"\(T,\) or \(B, T\) with T >= 1"):
        generate(lm, prompt[:, :0], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, prompt, -1)
    with pytest.raises(ValueError, match="config with num_hidden_layers"):
        generate(torch.nn.Identity(), prompt, 2)
    with pytest.raises(TypeError, match="cache must be a KVCache"):
        prefill(lm, prompt, None)


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=0),
                                 dict(top_p=1.5)])
def test_generate_rejects_bad_settings_before_touching_the_cache(bad):
    # The prompt was prefilled into the caller's cache
    # before temperature/top_k/top_p were checked, corrupting a prefix
    # cache kept for reuse; with max_new_tokens=0 they were not checked.
    lm = tiny_lm()
    cache = KVCache(lm.config.num_hidden_layers,
                    max_len=lm.config.max_position_embeddings)
    prompt = torch.randint(23, (1, 5))
    for n in (3, 0):
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate(lm, prompt, n, cache=cache, **bad)
        assert cache.seq_len == 0
        with pytest.raises(ValueError, match=next(iter(bad))):
            sampling.generate(lm, prompt, n, **bad)


class TokenClock(torch.nn.Module):
    """A stand-in language model: logs how many tokens each call reads
    and whether it got a cache, advances the fake clock by 1 s per token
    read, and returns uniform logits (greedy decoding picks id 0)."""

    def __init__(self, clock, vocab_size=11, max_len=64):
        super().__init__()
        self.config = SimpleNamespace(
            vocab_size=vocab_size, num_hidden_layers=1,
            max_position_embeddings=max_len)
        self.clock, self.calls = clock, []

    def forward(self, idx, cache=None, logits_to_keep=0):
        B, T = idx.shape
        self.calls.append((T, cache is not None))
        self.clock.advance(float(T))
        return torch.zeros(B, logits_to_keep or T, self.config.vocab_size)


@pytest.mark.parametrize("use_cache", [True, False])
def test_decode_throughput_runs_the_path_it_is_asked_for(fake_clock,
                                                          use_cache):
    rec = TokenClock(fake_clock)
    rate = decoding.decode_throughput(rec, prompt_len=5, new_tokens=6,
                                      use_cache=use_cache, repeats=2,
                                      batch_size=3)

    def run(n):                          # the calls one generation makes
        if use_cache:   # prefill reads the prompt once, then 1 token/step
            return [(5, True)] + [(1, True)] * (n - 1)
        # every step re-reads the whole growing sequence, without a cache
        return [(5 + i, False) for i in range(n)]

    assert rec.calls == run(4) + run(6) + run(6)   # warm-up, 2 timed runs
    seconds = sum(T for T, _ in run(6))            # fake clock: 1 s/token
    assert seconds == (10 if use_cache else 45)
    assert rate == 3 * 6 / seconds                 # B n_new / best time


def test_decode_throughput_runs():
    lm = tiny_lm()
    for use_cache in (True, False):
        rate = decoding.decode_throughput(lm, prompt_len=3, new_tokens=5,
                                          use_cache=use_cache, repeats=2)
        assert math.isfinite(rate) and rate > 0
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        decoding.decode_throughput(lm, prompt_len=3, new_tokens=5,
                                   use_cache=True, repeats=0)


# ======================================================== FLOPs and bytes
@pytest.mark.parametrize("name", MODELS)
def test_forward_cost_flops_match_torch_flop_counter(name):
    from torch.utils.flop_counter import FlopCounterMode
    lm = tiny_lm(**MODELS[name], tie_word_embeddings=(name != "mha-learned"))
    cache = KVCache(2)
    ids = torch.randint(23, (3, 7))
    for chunk, past in ((ids, 0), (ids[:, :1], 7)):    # prefill, decode
        with FlopCounterMode(display=False) as counter:
            lm(chunk, cache=cache)
        cost = decoding.forward_cost(lm.config, new_tokens=chunk.shape[1],
                                     cached_tokens=past, batch_size=3,
                                     bytes_per_value=4)
        assert cost["flops"] == counter.get_total_flops()
    # weight bytes: every parameter but norms (and learned positions)
    skip = ("norm", "embed_positions")
    n = sum(p.numel() for k, p in lm.named_parameters()
            if not any(s in k for s in skip) and not k.endswith("bias"))
    assert cost["weight_bytes"] == 4 * n
    assert cost["kv_bytes"] == 3 * kv_cache_bytes(lm.config, 8,
                                                  bytes_per_value=4)


def test_forward_cost_prefill_vs_decode_intensity():
    llama = DecoderLMConfig(vocab_size=32000, hidden_size=4096,
                            num_attention_heads=32, num_hidden_layers=32,
                            intermediate_size=11008,
                            max_position_embeddings=4096,
                            tie_word_embeddings=False)
    decode = decoding.forward_cost(llama, new_tokens=1, cached_tokens=1000)
    pre = decoding.forward_cost(llama, new_tokens=2000)
    # decode: about 2 FLOPs per weight and 2 bytes per weight -> ~1
    assert 0.5 < decode["intensity"] < 1.0
    assert pre["intensity"] > 500
    # 2 FLOPs per weight used in a matmul (all but the input embedding
    # and the norms), plus the scores and the weighted sum over S = 1001
    from course_lib.model.decoder_lm import decoder_lm_param_count
    n_matmul = decoder_lm_param_count(llama) - 32000 * 4096 - 65 * 4096
    assert decode["flops"] == 2 * n_matmul + 4 * 1001 * 4096 * 32
    batch = decoding.forward_cost(llama, new_tokens=1, cached_tokens=1000,
                                  batch_size=8)
    assert batch["flops"] == 8 * decode["flops"]
    assert batch["weight_bytes"] == decode["weight_bytes"]
    with pytest.raises(ValueError, match="new_tokens must be >= 1"):
        decoding.forward_cost(llama, new_tokens=0)
    with pytest.raises(ValueError, match="bytes_per_value must be > 0"):
        decoding.forward_cost(llama, new_tokens=1, bytes_per_value=0)


# ============================== mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.generation.decoding survived the ones
# above.
# (The messages in full: tests/pins/test_decoding_messages.py.)
class IdClock(torch.nn.Module):
    """A stand-in language model for decode_throughput: records the ids of
    every call, advances the fake clock by 1 s per token read, and returns
    logits whose largest entry is id 3 (greedy decoding always picks 3,
    sampling at temperature 1 picks it only about one time in five)."""

    def __init__(self, clock, vocab_size=11, max_len=64):
        super().__init__()
        self.config = SimpleNamespace(
            vocab_size=vocab_size, num_hidden_layers=1,
            max_position_embeddings=max_len)
        self.clock, self.ids = clock, []

    def forward(self, idx, cache=None, logits_to_keep=0):
        self.ids.append(idx.clone())
        self.clock.advance(float(idx.numel() / idx.shape[0]))
        logits = torch.zeros(*idx.shape, self.config.vocab_size)
        logits[..., 3] = 1.0
        return logits[:, -logits_to_keep:]


@pytest.mark.parametrize("seed", [None, 7])
def test_decode_throughput_defaults_prompt_and_greedy(fake_clock, seed):
    torch.manual_seed(0)
    rec = IdClock(fake_clock)
    kw = {} if seed is None else {"seed": seed}
    rate = decoding.decode_throughput(rec, prompt_len=5, new_tokens=6,
                                      use_cache=True, **kw)
    # default repeats = 1, batch_size = 1: a warm-up of 4 tokens and one
    # timed run of 6 (prefill 5 tokens + 5 one-token steps = 10 s)
    assert [tuple(i.shape) for i in rec.ids] == (
        [(1, 5)] + [(1, 1)] * 3 + [(1, 5)] + [(1, 1)] * 5)
    assert rate == 1 * 6 / 10
    # the prompt: seeded random ids, the default seed 0
    expected = torch.randint(11, (1, 5), generator=torch.Generator()
                             .manual_seed(0 if seed is None else seed))
    assert torch.equal(rec.ids[0], expected)
    assert torch.equal(rec.ids[4], expected)
    # greedy: every token fed back is the argmax, 3
    assert all(i.tolist() == [[3]] for i in rec.ids if i.shape[1] == 1)


def test_decode_throughput_rejects_sizes_below_1():
    # (the messages in full: tests/pins/test_decoding_messages.py)
    rec = IdClock(None)
    for name in ("prompt_len", "new_tokens", "repeats", "batch_size"):
        kw = dict(prompt_len=2, new_tokens=2, repeats=1, batch_size=1)
        kw[name] = 0
        with pytest.raises(ValueError, match=name):
            decoding.decode_throughput(rec, use_cache=True, **kw)


def test_forward_cost_default_has_nothing_cached():
    cfg = DecoderLMConfig(vocab_size=10, hidden_size=16,
                          num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=3, intermediate_size=32,
                          hidden_act="gelu", tie_word_embeddings=True)
    cost = decoding.forward_cost(cfg, new_tokens=4)
    # KV of the 4 new tokens only: 2 G d_h l values per token, 2 bytes each
    assert cost["kv_bytes"] == 4 * (2 * 2 * 4 * 3) * 2
    # S = T = 4: scores and weighted sum cost 4 T S H d_h per layer
    proj = 2 * 16 * 4 * 4 + 2 * 16 * 2 * 4 + 2 * 16 * 32   # Q,O + K,V + FFN
    assert cost["flops"] == 3 * (2 * 4 * proj + 4 * 4 * 4 * 16) \
        + 2 * 4 * 16 * 10


def test_forward_cost_keys_and_exact_integers():
    cfg = DecoderLMConfig(vocab_size=10, hidden_size=16,
                          num_attention_heads=4, num_hidden_layers=2)
    cost = decoding.forward_cost(cfg, new_tokens=3, cached_tokens=5)
    assert cost["bytes"] == cost["weight_bytes"] + cost["kv_bytes"]
    assert cost["intensity"] == cost["flops"] / cost["bytes"]
    # counts of multiply-adds are exact integers (no float rounding)
    assert all(isinstance(cost[k], int)
               for k in ("flops", "weight_bytes", "kv_bytes", "bytes"))
    with pytest.raises(ValueError, match=r"^cached_tokens must be >= 0, got "
                       r"-1$"):
        decoding.forward_cost(cfg, new_tokens=1, cached_tokens=-1)
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0$"):
        decoding.forward_cost(cfg, new_tokens=1, batch_size=0)


def test_decode_throughput_checks_sizes_and_flags_first():
    lm = tiny_lm()
    for kw in (dict(prompt_len=10**9), dict(prompt_len=4, batch_size=10**9)):
        with pytest.raises(ValueError, match="prompt_len"):
            decoding.decode_throughput(lm, new_tokens=2, use_cache=True,
                                       **kw)
    # a long generation from a short prompt is refused before it starts
    with pytest.raises(ValueError, match="new_tokens"):
        decoding.decode_throughput(lm, prompt_len=4, new_tokens=10**9,
                                   use_cache=True)
    with pytest.raises(TypeError, match="use_cache"):
        decoding.decode_throughput(lm, prompt_len=4, new_tokens=2,
                                   use_cache="False")
    with pytest.raises(TypeError, match="use_cache"):
        generate(lm, torch.randint(23, (1, 3)), 2, use_cache="False")

"""Tests for course_lib.kv_cache and the cache plumbing in mha/blocks/decoder_lm."""
from types import SimpleNamespace

import pytest
import torch

from course_lib.kv_cache import KVCache, LayerKVCache
from course_lib.decoder_lm import DecoderLM, DecoderLMConfig

torch.manual_seed(123)


def tiny_lm(**kw):
    torch.manual_seed(123)
    cfg = dict(vocab_size=23, d_model=32, n_heads=4, n_layers=2, max_len=40)
    return DecoderLM(DecoderLMConfig(**{**cfg, **kw})).eval()


MODELS = {
    "mha-learned": dict(positions="learned", norm="layer", ffn="gelu",
                        bias=True),
    "mha-rope": dict(),
    "gqa-rope": dict(n_kv_heads=2),
    "mqa-rope": dict(n_kv_heads=1),
}


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("prompt_len", [1, 5])
def test_cached_logits_equal_full_recomputation(name, prompt_len):
    lm = tiny_lm(**MODELS[name])
    ids = torch.randint(23, (3, prompt_len + 12))
    full = lm(ids)                                        # (B, T, V)
    cache = KVCache(2, max_len=40)
    steps = [lm(ids[:, :prompt_len], cache=cache)]        # prefill
    for t in range(prompt_len, ids.shape[1]):             # decode 1 by 1
        steps.append(lm(ids[:, t:t + 1], cache=cache))
    assert cache.seq_len == ids.shape[1]
    torch.testing.assert_close(torch.cat(steps, dim=1), full,
                               atol=1e-5, rtol=1e-5)


def test_cache_stores_kv_heads_not_query_heads():
    lm = tiny_lm(n_kv_heads=2)
    cache = KVCache(2)
    lm(torch.randint(23, (2, 7)), cache=cache)
    k, v = cache[0].tensors
    assert k.shape == v.shape == (2, 2, 7, 8)             # (B, G, S, d_k)
    assert cache.nbytes() == 2 * 2 * (2 * 2 * 7 * 8) * 4


def test_fork_is_independent_and_crop_keeps_prefix():
    lm = tiny_lm()
    ids = torch.randint(23, (1, 10))
    cache = KVCache(2)
    lm(ids[:, :6], cache=cache)
    other = cache.fork()
    lm(ids[:, 6:], cache=cache)
    assert cache.seq_len == 10 and other.seq_len == 6
    cache.crop(6)
    for a, b in zip(cache.layers, other.layers):
        for x, y in zip(a.tensors, b.tensors):
            assert torch.equal(x, y)


def test_positions_out_of_order_rejected():
    lm = tiny_lm()
    cache = KVCache(2)
    lm(torch.randint(23, (1, 4)), cache=cache)
    with pytest.raises(ValueError, match="positions must continue"):
        lm(torch.randint(23, (1, 1)), torch.tensor([6]), cache=cache)


def test_overflow_and_batch_mismatch_rejected():
    lm = tiny_lm()
    cache = KVCache(2, max_len=5)
    lm(torch.randint(23, (2, 4)), cache=cache)
    with pytest.raises(ValueError, match="cache overflow"):
        lm(torch.randint(23, (2, 2)), cache=cache)
    with pytest.raises(ValueError, match="batch size"):
        lm(torch.randint(23, (3, 1)), cache=cache)
    with pytest.raises(ValueError, match="n_layers"):
        lm(torch.randint(23, (2, 1)), cache=KVCache(3))


def test_layer_cache_update_checks():
    c = LayerKVCache(max_len=4)
    k = torch.zeros(1, 2, 3, 8)
    c.update(k, k)
    assert len(c) == 3
    with pytest.raises(ValueError, match="holds 2 tensors"):
        c.update(k[:, :, :1])
    with pytest.raises(ValueError, match="share batch and length"):
        c.update(k[:, :, :1], k[:, :, :2])
    with pytest.raises(ValueError, match="overflow"):
        c.update(k[:, :, :2], k[:, :, :2])
    with pytest.raises(ValueError, match="n must be <="):
        c.crop(5)


# ===================================================== generation (decoding)
import math  # noqa: E402

from course_lib import decoding, sampling  # noqa: E402
from course_lib.decoding import generate, prefill  # noqa: E402
from course_lib.kv_cache import (kv_cache_bytes,  # noqa: E402
                                 kv_values_per_token)

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


def test_generate_without_cache_is_chapter8_generate():
    lm = tiny_lm()
    prompt = torch.randint(23, (6,))
    # 50 tokens > max_len: chapter 8's generate crops the window
    a = generate(lm, prompt, 50, use_cache=False,
                 generator=torch.Generator().manual_seed(3))
    b = sampling.generate(lm, prompt, 50,
                          generator=torch.Generator().manual_seed(3))
    assert a.shape == (56,) and torch.equal(a, b)


def test_generate_restores_training_mode_and_1d_prompt():
    lm = tiny_lm(dropout=0.5).train()
    prompt = torch.randint(23, (3,))
    a = generate(lm, prompt, 10, temperature=0.0)
    assert lm.training
    b = generate(lm, prompt, 10, use_cache=False, temperature=0.0)
    assert a.shape == (13,) and torch.equal(a, b)
    assert torch.equal(generate(lm, prompt, 0), prompt)


def test_prefill_returns_last_logits():
    lm = tiny_lm(n_kv_heads=1)
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
    with pytest.raises(ValueError, match="max_len=40"):
        generate(lm, prompt, 36)                            # 41 > 40
    generate(lm, prompt, 35, temperature=0.0)               # 40 fits
    cache = KVCache(2)
    prefill(lm, torch.randint(23, (2, 30)), cache)
    with pytest.raises(ValueError, match="30 cached"):
        generate(lm, prompt, 6, cache=cache)
    with pytest.raises(ValueError, match="batch size 3"):
        generate(lm, torch.randint(23, (3, 2)), 2, cache=cache)
    with pytest.raises(ValueError, match="n_layers"):
        generate(lm, prompt, 2, cache=KVCache(3))
    with pytest.raises(ValueError, match="use_cache=False"):
        generate(lm, prompt, 2, use_cache=False, cache=KVCache(2))
    with pytest.raises(ValueError, match="cache must be a KVCache"):
        generate(lm, prompt, 2, cache=[])
    with pytest.raises(ValueError, match="integer tensor"):
        generate(lm, prompt.float(), 2)
    with pytest.raises(ValueError, match=r"prompt_ids must have shape "
                       r"\(T,\) or \(B, T\) with T >= 1"):
        generate(lm, prompt[:, :0], 2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(lm, prompt, -1)
    with pytest.raises(ValueError, match="config with n_layers"):
        generate(torch.nn.Identity(), prompt, 2)
    with pytest.raises(ValueError, match="cache must be a KVCache"):
        prefill(lm, prompt, None)


class TokenClock(torch.nn.Module):
    """A stand-in language model: logs how many tokens each call reads
    and whether it got a cache, advances the fake clock by 1 s per token
    read, and returns uniform logits (greedy decoding picks id 0)."""

    def __init__(self, clock, vocab_size=11, max_len=64):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size, n_layers=1,
                                      max_len=max_len)
        self.clock, self.calls = clock, []

    def forward(self, idx, cache=None):
        B, T = idx.shape
        self.calls.append((T, cache is not None))
        self.clock.advance(float(T))
        return torch.zeros(B, T, self.config.vocab_size)


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


# ============================================================ cache sizes
@pytest.mark.parametrize("name", MODELS)
def test_kv_cache_bytes_equals_actual_cache(name):
    lm = tiny_lm(**MODELS[name])
    for B, T in ((1, 1), (3, 11)):
        cache = KVCache(2)
        lm(torch.randint(23, (B, T)), cache=cache)
        expected = B * kv_cache_bytes(lm.config, T, bytes_per_value=4)
        assert cache.nbytes() == expected
    # closed form of the tiny model: 2 G d_h l with d_h = 32 / 4 = 8
    G = MODELS[name].get("n_kv_heads", 4)
    assert kv_values_per_token(lm.config) == 2 * G * 8 * 2


LLAMA2_7B = SimpleNamespace(num_hidden_layers=32, hidden_size=4096,
                            num_attention_heads=32, num_key_value_heads=32,
                            head_dim=None)
LLAMA2_70B = SimpleNamespace(num_hidden_layers=80, hidden_size=8192,
                             num_attention_heads=64, num_key_value_heads=8)
FALCON_7B = SimpleNamespace(num_hidden_layers=32, hidden_size=4544,
                            num_attention_heads=71, num_key_value_heads=1)
DEEPSEEK_V3 = SimpleNamespace(num_hidden_layers=61, hidden_size=7168,
                              num_attention_heads=128, head_dim=64,
                              num_key_value_heads=128, kv_lora_rank=512,
                              qk_rope_head_dim=64, q_lora_rank=1536)


def test_kv_cache_bytes_published_configs():
    KiB, GiB = 2 ** 10, 2 ** 30
    assert kv_cache_bytes(LLAMA2_7B, 1) == 512 * KiB
    assert kv_cache_bytes(LLAMA2_7B, 128 * 1024) == 64 * GiB
    assert kv_cache_bytes(LLAMA2_70B, 1) == 320 * KiB       # 2*8*128*80*2
    assert kv_cache_bytes(FALCON_7B, 1) == 8 * KiB          # 2*1*64*32*2
    # MLA: (d_c + d_h^R) l, the head_dim and kv heads are not used
    assert kv_cache_bytes(DEEPSEEK_V3, 1) == (512 + 64) * 61 * 2
    assert kv_cache_bytes(LLAMA2_7B, 10, bytes_per_value=0.5) == 10 * 128 * KiB
    assert kv_cache_bytes(LLAMA2_7B, 1, n_layers=1) == 16 * KiB
    assert kv_cache_bytes(LLAMA2_7B, 0) == 0


def test_kv_cache_bytes_attribute_rule():
    # Hugging Face names first; head_dim, when set, beats width // heads
    both = SimpleNamespace(num_hidden_layers=2, n_layers=5, hidden_size=64,
                           d_model=999, num_attention_heads=4, n_heads=3,
                           num_key_value_heads=None, n_kv_heads=2,
                           head_dim=32)
    assert kv_values_per_token(both) == 2 * 2 * 32 * 2
    course = DecoderLMConfig(vocab_size=10, d_model=48, n_heads=6,
                             n_kv_heads=3, n_layers=5)
    assert kv_values_per_token(course) == 2 * 3 * 8 * 5
    mla_layer = SimpleNamespace(kv_lora_rank=16, qk_rope_head_dim=4)
    assert kv_values_per_token(mla_layer, n_layers=3) == 60


def test_kv_cache_bytes_bad_input():
    with pytest.raises(ValueError, match="n_tokens must be >= 0, got -1"):
        kv_cache_bytes(LLAMA2_7B, -1)
    for bad in (0, -2, True, "2", float("inf")):
        with pytest.raises(ValueError, match="bytes_per_value"):
            kv_cache_bytes(LLAMA2_7B, 1, bytes_per_value=bad)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        kv_cache_bytes(SimpleNamespace(hidden_size=8), 1)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        kv_cache_bytes(SimpleNamespace(n_layers=2, kv_lora_rank=8), 1)
    with pytest.raises(ValueError, match="n_layers must be >= 0"):
        kv_cache_bytes(LLAMA2_7B, 1, n_layers=-1)
    with pytest.raises(ValueError, match="config.num_attention_heads"):
        kv_cache_bytes(SimpleNamespace(n_layers=2, n_heads=0, d_model=8), 1)


# ======================================================== FLOPs and bytes
@pytest.mark.parametrize("name", MODELS)
def test_forward_cost_flops_match_torch_flop_counter(name):
    from torch.utils.flop_counter import FlopCounterMode
    lm = tiny_lm(**MODELS[name], tie_embeddings=(name != "mha-learned"))
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
    llama = DecoderLMConfig(vocab_size=32000, d_model=4096, n_heads=32,
                            n_layers=32, d_ff=11008, max_len=4096,
                            tie_embeddings=False)
    decode = decoding.forward_cost(llama, new_tokens=1, cached_tokens=1000)
    pre = decoding.forward_cost(llama, new_tokens=2000)
    # decode: about 2 FLOPs per weight and 2 bytes per weight -> ~1
    assert 0.5 < decode["intensity"] < 1.0
    assert pre["intensity"] > 500
    # 2 FLOPs per weight used in a matmul (all but the input embedding
    # and the norms), plus the scores and the weighted sum over S = 1001
    from course_lib.decoder_lm import decoder_lm_param_count
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


def test_rope_attention_alone_continues_cache_positions():
    # Called directly (not through DecoderLM) with a cache and no
    # positions, attention with the RoPE hook must rotate the new token
    # by its true position, so one-at-a-time equals all-at-once.
    from course_lib.masking import causal_mask
    from course_lib.kv_cache import LayerKVCache
    from course_lib.mha import MultiHeadAttention
    from course_lib.positional import RotaryEmbedding
    torch.manual_seed(123)
    attn = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False,
                              rope=RotaryEmbedding(8)).eval()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        full = attn(x, causal_mask(6))
        cache = LayerKVCache()
        steps = [attn(x[:, t:t + 1], causal_mask(1, t + 1), cache=cache)
                 for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, 1), full,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["mha_rope", "mla"])
def test_layers_reject_positions_that_do_not_continue_their_cache(kind):
    # Probe finding 8: called directly with a cache, a layer rotated a new
    # token by whatever position it was given, e.g. 0 after 3 cached ones.
    from course_lib.kv_cache import LayerKVCache
    from course_lib.mha import MultiHeadAttention
    from course_lib.mla import MLAConfig, MultiHeadLatentAttention
    from course_lib.positional import RotaryEmbedding
    torch.manual_seed(0)
    if kind == "mla":
        layer = MultiHeadLatentAttention(MLAConfig(
            hidden_size=16, num_attention_heads=2, q_lora_rank=8,
            kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
            v_head_dim=4))
    else:
        layer = MultiHeadAttention(16, 2, rope=RotaryEmbedding(8))
    cache = LayerKVCache(max_len=5)
    layer(torch.randn(1, 3, 16), cache=cache)
    with pytest.raises(ValueError, match=r"positions must continue the "
                       r"cache, i.e. start at 3 and increase by 1, got \[0\]"):
        layer(torch.randn(1, 1, 16), cache=cache, positions=torch.tensor([0]))
    assert len(cache) == 3                       # nothing was appended
    with pytest.raises(ValueError, match="cache overflow: 3 cached"):
        layer(torch.randn(1, 3, 16), cache=cache,
              positions=torch.arange(3, 6))
    layer(torch.randn(1, 1, 16), cache=cache, positions=torch.tensor([3]))
    assert len(cache) == 4


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_k=0),
                                 dict(top_p=1.5)])
def test_generate_rejects_bad_settings_before_touching_the_cache(bad):
    # Probe finding 7: the prompt was prefilled into the caller's cache
    # before temperature/top_k/top_p were checked, corrupting a prefix
    # cache kept for reuse; with max_new_tokens=0 they were not checked.
    lm = tiny_lm()
    cache = KVCache(lm.config.n_layers, max_len=lm.config.max_len)
    prompt = torch.randint(23, (1, 5))
    for n in (3, 0):
        with pytest.raises(ValueError, match=next(iter(bad))):
            generate(lm, prompt, n, cache=cache, **bad)
        assert cache.seq_len == 0
        with pytest.raises(ValueError, match=next(iter(bad))):
            sampling.generate(lm, prompt, n, **bad)


# ============================== mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.kv_cache or course_lib.decoding
# survived the ones above.
def test_layer_cache_crop_by_hand():
    k = torch.arange(2 * 1 * 4 * 3.0).reshape(2, 1, 4, 3)    # (B, G, S, d)
    v = -k
    c = LayerKVCache()
    c.update(k, v)
    c.crop(4)                                   # n = len: keeps everything
    assert len(c) == 4 and torch.equal(c.tensors[0], k)
    c.crop(2)
    assert len(c) == 2
    assert torch.equal(c.tensors[0], k[:, :, :2])
    assert torch.equal(c.tensors[1], v[:, :, :2])
    c.crop(0)                                   # n = 0 empties the cache
    assert c.tensors == () and len(c) == 0 and c.batch_size is None
    c.update(torch.zeros(3, 1, 1, 3), torch.zeros(3, 1, 1, 3))  # new batch
    assert c.batch_size == 3
    with pytest.raises(ValueError, match=r"^n must be >= 0, got -1$"):
        c.crop(-1)
    with pytest.raises(ValueError, match=r"^n must be <= the 1 cached "
                       r"positions, got 2$"):
        c.crop(2)


def test_model_cache_crop_and_fork_keep_lengths_and_limit():
    lm = tiny_lm()
    cache = KVCache(2, max_len=12)
    lm(torch.randint(23, (1, 10)), cache=cache)
    other = cache.fork()
    assert other.max_len == 12 and [len(x) for x in other.layers] == [10, 10]
    with pytest.raises(ValueError, match="exceeds max_len=12"):
        lm(torch.randint(23, (1, 3)), cache=other)         # 13 > 12
    cache.crop(6)
    assert cache.seq_len == 6 and [len(x) for x in cache.layers] == [6, 6]


class IdClock(torch.nn.Module):
    """A stand-in language model for decode_throughput: records the ids of
    every call, advances the fake clock by 1 s per token read, and returns
    logits whose largest entry is id 3 (greedy decoding always picks 3,
    sampling at temperature 1 picks it only about one time in five)."""

    def __init__(self, clock, vocab_size=11, max_len=64):
        super().__init__()
        self.config = SimpleNamespace(vocab_size=vocab_size, n_layers=1,
                                      max_len=max_len)
        self.clock, self.ids = clock, []

    def forward(self, idx, cache=None):
        self.ids.append(idx.clone())
        self.clock.advance(float(idx.numel() / idx.shape[0]))
        logits = torch.zeros(*idx.shape, self.config.vocab_size)
        logits[..., 3] = 1.0
        return logits


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


def test_decode_throughput_bad_input_messages():
    rec = IdClock(None)
    for name in ("prompt_len", "new_tokens", "repeats", "batch_size"):
        kw = dict(prompt_len=2, new_tokens=2, repeats=1, batch_size=1)
        kw[name] = 0
        with pytest.raises(ValueError, match=rf"^{name} must be >= 1, got 0$"):
            decoding.decode_throughput(rec, use_cache=True, **kw)


def test_forward_cost_default_has_nothing_cached():
    cfg = DecoderLMConfig(vocab_size=10, d_model=16, n_heads=4, n_kv_heads=2,
                          n_layers=3, d_ff=32, ffn="gelu",
                          tie_embeddings=True)
    cost = decoding.forward_cost(cfg, new_tokens=4)
    # KV of the 4 new tokens only: 2 G d_h l values per token, 2 bytes each
    assert cost["kv_bytes"] == 4 * (2 * 2 * 4 * 3) * 2
    # S = T = 4: scores and weighted sum cost 4 T S H d_h per layer
    proj = 2 * 16 * 4 * 4 + 2 * 16 * 2 * 4 + 2 * 16 * 32   # Q,O + K,V + FFN
    assert cost["flops"] == 3 * (2 * 4 * proj + 4 * 4 * 4 * 16) \
        + 2 * 4 * 16 * 10


def test_forward_cost_keys_and_exact_integers():
    cfg = DecoderLMConfig(vocab_size=10, d_model=16, n_heads=4, n_layers=2)
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


def test_model_config_message_names_the_model():
    with pytest.raises(ValueError, match=r"^model must have a config with "
                       r"n_layers and max_len \(e\.g\. a DecoderLM\) to use a "
                       r"cache, got Identity$"):
        generate(torch.nn.Identity(), torch.tensor([1, 2]), 2)


def test_check_next_rejects_what_is_not_a_1d_tensor():
    c = LayerKVCache()
    with pytest.raises(ValueError, match=r"^positions must be a 1-D tensor "
                       r"\(T,\), got torch.Size\(\[1, 2\]\)$"):
        c.check_next(torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"^positions must be a 1-D tensor "
                       r"\(T,\), got \[0, 1\]$"):
        c.check_next([0, 1])
    c.check_next(torch.tensor([0, 1]))              # continues an empty cache


def test_check_next_message_shows_at_most_8_positions():
    c = LayerKVCache()
    with pytest.raises(ValueError, match=r"got \[1, 2, 3, 4, 5, 6, 7, 8\]$"):
        c.check_next(torch.arange(1, 9))                  # 8: all shown
    with pytest.raises(ValueError, match=r"^positions must continue the "
                       r"cache, i\.e\. start at 0 and increase by 1, got "
                       r"\[1, 2, 3, 4, 5, 6, 7, 8, '\.\.\.'\]$"):
        c.check_next(torch.arange(1, 10))                 # 9: cut after 8


def test_check_next_compares_on_the_positions_device(device_spy):
    # Only a CPU here: a spy checks that the expected run 0, 1, ... is
    # built on the device of the positions (else a GPU run would fail).
    import course_lib.kv_cache as kvc
    asked = device_spy(kvc, "arange")
    positions = torch.arange(2)
    LayerKVCache().check_next(positions)
    assert asked == [positions.device]


def test_layer_cache_empty_single_tensor_and_max_len():
    c = LayerKVCache()
    assert c.tensors == () and len(c) == 0 and c.nbytes() == 0
    c.update(torch.zeros(2, 5, 3))                # one tensor, e.g. a latent
    assert len(c) == 5 and c.batch_size == 2
    one = LayerKVCache(max_len=1)                 # the smallest limit
    one.update(torch.zeros(1, 1, 4))
    assert len(one) == 1
    with pytest.raises(ValueError, match=r"^max_len must be >= 1, got 0$"):
        LayerKVCache(max_len=0)


def test_kv_values_per_token_floors_the_head_width():
    # Hugging Face's rule when head_dim is unset: hidden_size // heads
    odd = SimpleNamespace(num_hidden_layers=3, hidden_size=10,
                          num_attention_heads=4, num_key_value_heads=4)
    n = kv_values_per_token(odd)
    assert n == 2 * 4 * 2 * 3 and isinstance(n, int)


def test_layer_cache_update_needs_tensors_with_a_time_axis():
    c = LayerKVCache()
    msg = r"^update needs one or more tensors with a time axis at dim -2$"
    for bad in ((), ([[0.0]],), (torch.zeros(3),), (torch.zeros(1, 2),
                                                   torch.zeros(4))):
        with pytest.raises(ValueError, match=msg):
            c.update(*bad)
    c.update(torch.zeros(2, 1))                   # 2-D (B, S) is enough
    assert len(c) == 2 and c.batch_size == 2


def test_check_next_rejects_overflow_before_anything_is_computed():
    for cache in (KVCache(2, max_len=5), LayerKVCache(max_len=5)):
        cache.check_next(torch.arange(5))              # exactly fills it
        with pytest.raises(ValueError, match=r"^cache overflow: 0 cached \+ "
                           r"6 new positions exceeds max_len=5$"):
            cache.check_next(torch.arange(6))


def test_model_cache_layers_share_its_limit_and_messages():
    cache = KVCache(3, max_len=4)
    assert [layer.max_len for layer in cache.layers] == [4, 4, 4]
    with pytest.raises(ValueError, match="exceeds max_len=4"):
        cache[2].update(torch.zeros(1, 5, 2))      # each layer enforces it
    with pytest.raises(ValueError, match=r"^n_layers must be >= 1, got 0$"):
        KVCache(0)
    layer = LayerKVCache()
    layer.update(torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match=r"^batch size 3 does not match the "
                       r"cache's batch size 2$"):
        layer.update(torch.zeros(3, 1, 3))

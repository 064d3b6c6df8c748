"""Tests for course_lib.model.kv_cache and the cache plumbing in mha/blocks/decoder_lm.

Generation with the cache (course_lib.generation.decoding) is tested in
test_decoding.py."""
from types import SimpleNamespace

import pytest
import torch

from course_lib.model.kv_cache import KVCache, LayerKVCache
from course_lib.sizing.kv_cache_size import kv_cache_bytes, kv_values_per_token
from course_lib.model.decoder_lm import DecoderLMConfig
from tiny_lm_support import MODELS, tiny_lm

torch.manual_seed(123)


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
    lm = tiny_lm(num_key_value_heads=2)
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
    with pytest.raises(ValueError, match="number of layers"):
        lm(torch.randint(23, (2, 1)), cache=KVCache(3))


def test_layer_cache_update_checks():
    c = LayerKVCache(max_len=4)
    k = torch.zeros(1, 2, 3, 8)
    c.update(k, k)
    assert len(c) == 3
    with pytest.raises(ValueError, match="overflow"):
        c.update(k[:, :, :2], k[:, :, :2])
    with pytest.raises(ValueError, match="n must be <="):
        c.crop(5)


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
    G = MODELS[name].get("num_key_value_heads", 4)
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
    # Hugging Face names; head_dim, when set, beats width // heads, and
    # num_key_value_heads None means one K/V head per query head
    hf = SimpleNamespace(num_hidden_layers=2, hidden_size=64,
                         num_attention_heads=4, num_key_value_heads=None,
                         head_dim=32)
    assert kv_values_per_token(hf) == 2 * 4 * 32 * 2
    hf.head_dim = None
    assert kv_values_per_token(hf) == 2 * 4 * 16 * 2
    course = DecoderLMConfig(vocab_size=10, hidden_size=48,
                             num_attention_heads=6, num_key_value_heads=3,
                             num_hidden_layers=5)
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
        kv_cache_bytes(SimpleNamespace(num_hidden_layers=2, kv_lora_rank=8),
                       1)
    with pytest.raises(ValueError, match="n_layers must be >= 0"):
        kv_cache_bytes(LLAMA2_7B, 1, n_layers=-1)
    with pytest.raises(ValueError, match="config.num_attention_heads"):
        kv_cache_bytes(SimpleNamespace(num_hidden_layers=2,
                                       num_attention_heads=0, hidden_size=8),
                       1)


# ==================================================== layers called alone
def test_rope_attention_alone_continues_cache_positions():
    # Called directly (not through DecoderLM) with a cache and no
    # positions, attention with the RoPE hook must rotate the new token
    # by its true position, so one-at-a-time equals all-at-once.
    from course_lib.model.masks import causal_mask
    from course_lib.model.kv_cache import LayerKVCache
    from course_lib.model.mha import MultiHeadAttention
    from course_lib.model.rope import RotaryEmbedding
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
    # Called directly with a cache, a layer rotated a new
    # token by whatever position it was given, e.g. 0 after 3 cached ones.
    from course_lib.model.kv_cache import LayerKVCache
    from course_lib.model.mha import MultiHeadAttention
    from course_lib.model.mla import MLAConfig, MultiHeadLatentAttention
    from course_lib.model.rope import RotaryEmbedding
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


# ============================== mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.kv_cache survived the ones
# above. (The messages in full: tests/pins/test_kv_cache_messages.py.)
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
    with pytest.raises(ValueError, match=r"^n must be <= 1, got 2$"):
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


def test_check_next_rejects_what_is_not_a_1d_tensor():
    c = LayerKVCache()
    with pytest.raises(ValueError, match=r"^positions must be a 1-D tensor"):
        c.check_next(torch.tensor([[0, 1]]))
    with pytest.raises(TypeError, match=r"^positions must be a torch"):
        c.check_next([0, 1])
    c.check_next(torch.tensor([0, 1]))              # continues an empty cache


def test_check_next_compares_on_the_positions_device(device_spy):
    # Only a CPU here: a spy checks that the expected run 0, 1, ... is
    # built on the device of the positions (else a GPU run would fail).
    from course_lib._util import validation
    asked = device_spy(validation, "arange")
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


def test_check_next_rejects_overflow_before_anything_is_computed():
    for cache in (KVCache(2, max_len=5), LayerKVCache(max_len=5)):
        cache.check_next(torch.arange(5))              # exactly fills it
        with pytest.raises(ValueError, match="exceeds max_len=5"):
            cache.check_next(torch.arange(6))


def test_model_cache_layers_share_its_limit():
    cache = KVCache(3, max_len=4)
    assert [layer.max_len for layer in cache.layers] == [4, 4, 4]
    with pytest.raises(ValueError, match="exceeds max_len=4"):
        cache[2].update(torch.zeros(1, 5, 2))      # each layer enforces it
    with pytest.raises(ValueError, match="n_layers"):
        KVCache(0)
    # at most MAX_LAYERS (4,096) layers: more is a mistake, not a model
    from course_lib.model.kv_cache import MAX_LAYERS
    assert len(KVCache(MAX_LAYERS).layers) == MAX_LAYERS
    with pytest.raises(ValueError, match="n_layers"):
        KVCache(MAX_LAYERS + 1)


def test_cache_of_one_tensor_per_position_appends_and_checks_the_batch():
    # MLA caches a latent (and a RoPE key): update takes any number of
    # tensors, one is enough
    c = LayerKVCache()
    c.update(torch.zeros(2, 3, 4))
    (out,) = c.update(torch.ones(2, 1, 4))
    assert out.shape == (2, 4, 4) and out[:, 3].eq(1).all()
    with pytest.raises(ValueError, match="batch size"):
        c.update(torch.zeros(3, 1, 4))

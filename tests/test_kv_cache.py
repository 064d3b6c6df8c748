"""Tests for course_lib.kv_cache and the cache plumbing in mha/blocks/models."""
import pytest
import torch

from course_lib.kv_cache import KVCache, LayerKVCache
from course_lib.models import DecoderLM, DecoderLMConfig

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

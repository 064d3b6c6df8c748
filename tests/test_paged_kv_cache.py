"""Tests for course_lib.serving.paged_kv_cache: the allocator's counts,
the slot mapping against its loop form, the gather against chapter 9's
contiguous cache fed the same keys and values, prefix sharing and copy
on write, the model's logits through the paged cache against the model
run without a cache, and the memory formula."""
import pytest
import torch

from course_lib.model.kv_cache import LayerKVCache
from course_lib.serving.paged_kv_cache import (
    BlockAllocator,
    PagedKVCache,
    PagedStepCache,
    paged_memory,
)
from course_lib.sizing.kv_cache_size import kv_cache_bytes
from tiny_lm_support import MODELS, tiny_lm

G, D_K = 2, 8                                 # gqa-rope: 2 K/V heads of 8


def gqa_config():
    return tiny_lm(**MODELS["gqa-rope"]).config


def write(cache, seq_ids, T, g):
    """Append T random rows per sequence through a step view, in every
    layer; return them: {layer: (k, v)} each (B, G, T, d_k)."""
    step = PagedStepCache(cache, seq_ids, T)
    rows = {}
    for layer in range(cache.num_layers):
        k, v = torch.randn(2, len(seq_ids), G, T, D_K, generator=g)
        rows[layer] = (k, v)
        step.layers[layer].update(k, v)
    return rows


def test_allocator_counts_and_free_list():
    a = BlockAllocator(3)
    x, y = a.allocate(), a.allocate()
    assert (x, y) == (0, 1) and a.num_free == 1 and a.num_used == 2
    a.fork(x)
    assert a.ref_counts == [2, 1, 0]
    assert a.free(x) is False and a.num_used == 2     # still referenced
    assert a.free(x) is True and a.num_free == 2
    assert list(a.free_blocks) == [2, 0]              # back at the end
    a.allocate(), a.allocate()
    with pytest.raises(ValueError, match="out of blocks"):
        a.allocate()


def test_slot_mapping_is_table_times_block_size_plus_offset():
    cache = PagedKVCache(gqa_config(), 10, 3)
    for s in (0, 1):
        cache.add_sequence(s)
    cache.append_slots(0, 4)
    cache.append_slots(1, 5)        # interleaved: blocks not contiguous
    cache.append_slots(0, 3)
    for s in (0, 1):
        table = cache.block_table(s)
        loop = [table[p // 3] * 3 + p % 3 for p in range(cache.seq_lens[s])]
        assert cache.slot_mapping(s).tolist() == loop
    assert cache.block_table(0) == [0, 1, 4] and cache.block_table(1) == [
        2, 3]


@pytest.mark.parametrize("block_size", [1, 3, 4])
def test_gather_equals_the_contiguous_cache(block_size):
    """Three sequences written in interleaved chunks: each one's gathered
    rows equal the rows a contiguous LayerKVCache concatenates, right-
    aligned, with the key mask True exactly there."""
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(gqa_config(), 40, block_size)
    ref = {s: [LayerKVCache() for _ in range(cache.num_layers)]
           for s in range(3)}
    for s in ref:
        cache.add_sequence(s)
    for seq_ids, T in (([0, 1, 2], 2), ([1], 5), ([0, 2], 1), ([2], 4),
                       ([0, 1, 2], 1)):
        rows = write(cache, seq_ids, T, g)
        for row, s in enumerate(seq_ids):
            for layer, (k, v) in rows.items():
                ref[s][layer].update(k[row:row + 1], v[row:row + 1])
    lens = [len(ref[s][0]) for s in range(3)]
    assert lens == [cache.seq_lens[s] for s in range(3)] == [4, 8, 8]
    for layer in range(cache.num_layers):
        k, v, mask = cache.gather([0, 1, 2], layer)
        assert k.shape == v.shape == (3, G, 8, D_K)
        for s, n in enumerate(lens):
            assert mask[s].tolist() == [False] * (8 - n) + [True] * n
            want_k, want_v = ref[s][layer].tensors      # (1, G, n, d_k)
            assert torch.equal(k[s, :, 8 - n:], want_k[0])
            assert torch.equal(v[s, :, 8 - n:], want_v[0])


def test_update_returns_the_gather_of_the_new_step():
    g = torch.Generator().manual_seed(1)
    cache = PagedKVCache(gqa_config(), 8, 2)
    cache.add_sequence(5)
    write(cache, [5], 3, g)
    step = PagedStepCache(cache, [5], 1)
    k, v = torch.randn(2, 1, G, 1, D_K, generator=g)
    got_k, got_v = step.layers[1].update(k, v)
    want_k, want_v, _ = cache.gather([5], 1)
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert torch.equal(got_k[:, :, -1:], k)
    assert step.seq_len == 3 and step.positions.tolist() == [[3]]


def test_prefix_blocks_are_shared_and_counted_once():
    cfg = gqa_config()
    cache = PagedKVCache(cfg, 12, 4)
    g = torch.Generator().manual_seed(2)
    prompt_a = torch.arange(11)                 # 2 full blocks + 3
    prompt_b = torch.cat([torch.arange(9), torch.tensor([20, 21])])
    assert cache.add_sequence(0, prompt_a) == 0          # nothing cached
    write(cache, [0], 11, g)
    cache.cache_blocks(0, prompt_a)
    assert len(cache.cached_blocks) == 2
    # b shares a's first 8 tokens = 2 full blocks; its 3rd block differs
    assert cache.num_cached_blocks(prompt_b) == 2
    assert cache.add_sequence(1, prompt_b) == 8
    write(cache, [1], 3, g)
    ta, tb = cache.block_table(0), cache.block_table(1)
    assert tb[:2] == ta[:2] and tb[2] != ta[2]
    assert [cache.allocator.ref_counts[j] for j in ta] == [2, 2, 1]
    assert cache.num_used_blocks == 4                    # not 6
    assert cache.nbytes() == 4 * cache.block_nbytes()
    assert cache.block_nbytes() == kv_cache_bytes(cfg, 4, bytes_per_value=4)
    k, _, _ = cache.gather([0, 1], 0)
    assert torch.equal(k[0, :, :8], k[1, :, :8])         # the same rows
    # a prompt ending on a block boundary keeps its last token to compute
    assert cache.num_cached_blocks(torch.arange(8)) == 1
    cache.free_sequence(0)
    assert cache.num_used_blocks == 3 and len(cache.cached_blocks) == 2
    cache.free_sequence(1)
    assert cache.num_free_blocks == 12 and len(cache.cached_blocks) == 2
    assert cache.block_tables == {} and cache.allocator.ref_counts == [0] * 12


def test_freed_prefix_blocks_are_reused_until_evicted_least_recent_first():
    """A finished sequence's cached prefix blocks stay on the free list
    with their keys and values: a later prompt with that prefix takes them
    back (same rows); allocation hands out the oldest-freed block first
    and drops a cached block from the prefix table when it reuses it."""
    cfg = gqa_config()
    cache = PagedKVCache(cfg, 6, 4)
    g = torch.Generator().manual_seed(4)
    prompt = torch.arange(9)                    # 2 full blocks + 1
    cache.add_sequence(0, prompt)
    write(cache, [0], 9, g)
    cache.cache_blocks(0, prompt)
    first = cache.block_table(0)                # [0, 1, 2]
    k0, v0, _ = cache.gather([0], 1)
    cache.free_sequence(0)
    assert list(cache.allocator.free_blocks) == [3, 4, 5, 0, 1, 2]
    assert cache.num_cached_blocks(prompt) == 2
    assert cache.num_cached_blocks(prompt, free_only=True) == 2
    # the same prefix later: blocks 0 and 1 come back off the free list
    assert cache.add_sequence(1, torch.cat([prompt[:8], torch.tensor([30])]))\
        == 8
    assert cache.block_table(1) == first[:2] and cache.num_free_blocks == 4
    k1, v1, _ = cache.gather([1], 1)
    assert torch.equal(k1, k0[:, :, :8]) and torch.equal(v1, v0[:, :, :8])
    cache.free_sequence(1)
    # four blocks for another sequence: 3, 4, 5 (never cached), then 2,
    # the least recently freed; blocks 0 and 1 stay cached
    cache.add_sequence(2)
    write(cache, [2], 16, g)
    assert cache.block_table(2) == [3, 4, 5, 2]
    assert cache.num_cached_blocks(prompt) == 2
    cache.add_sequence(3)
    write(cache, [3], 5, g)                     # evicts 0, then 1
    assert cache.block_table(3) == [0, 1]
    assert not cache.cached_blocks and cache.num_cached_blocks(prompt) == 0


def test_fork_copies_a_shared_partial_block_on_write():
    g = torch.Generator().manual_seed(3)
    cache = PagedKVCache(gqa_config(), 10, 4)
    cache.add_sequence(0)
    write(cache, [0], 6, g)                     # blocks: full, 2 of 4 used
    cache.fork(0, 1)
    parent = cache.block_table(0)
    assert cache.block_table(1) == parent and cache.num_used_blocks == 2
    before = [cache.gather([1], layer)[:2] for layer in range(2)]
    assert cache.blocks_needed(1, 1) == 1       # the copy
    assert cache.blocks_needed(1, 2) == 1       # still fits in the copy
    write(cache, [1], 1, g)                     # child writes: its copy
    child = cache.block_table(1)
    assert child[0] == parent[0] and child[1] != parent[1]
    assert cache.allocator.ref_counts[parent[1]] == 1
    assert cache.num_used_blocks == 3
    for layer in range(2):
        k, v, _ = cache.gather([1], layer)
        assert torch.equal(k[:, :, :6], before[layer][0])    # copied rows
        assert torch.equal(v[:, :, :6], before[layer][1])
        kp, _, _ = cache.gather([0], layer)
        assert torch.equal(kp, before[layer][0])     # parent unchanged
    write(cache, [0], 1, g)                     # parent: its block alone
    assert cache.block_table(0) == parent and cache.num_used_blocks == 3
    cache.free_sequence(0), cache.free_sequence(1)
    assert cache.num_free_blocks == 10


@pytest.mark.parametrize("name", MODELS)
def test_model_through_paged_cache_equals_uncached(name):
    """Prefill two prompts one at a time, then decode both together
    through the paged cache: every row's logits equal the model run on
    the whole sequence without a cache (independent reference)."""
    lm = tiny_lm(**MODELS[name])
    g = torch.Generator().manual_seed(4)
    seqs = [torch.randint(23, (n,), generator=g) for n in (3, 7)]
    extra = torch.randint(23, (2, 4), generator=g)
    cache = PagedKVCache(lm.config, 12, 3)
    got = [[], []]
    with torch.no_grad():
        for s, p in enumerate(seqs):
            cache.add_sequence(s)
            step = PagedStepCache(cache, [s], len(p))
            z = lm(p[None], step.positions, cache=step,
                   attention_mask=step.attention_mask)
            got[s].append(z[0, -1])
        for t in range(4):
            step = PagedStepCache(cache, [0, 1], 1)
            z = lm(extra[:, t:t + 1], step.positions, cache=step,
                   attention_mask=step.attention_mask)          # (2, 1, V)
            for s in (0, 1):
                got[s].append(z[s, -1])
        for s, p in enumerate(seqs):
            full = lm(torch.cat([p, extra[s]])[None])[0, len(p) - 1:]
            torch.testing.assert_close(torch.stack(got[s]), full,
                                       atol=1e-5, rtol=1e-5)


def test_paged_memory_closed_form():
    cfg = gqa_config()               # 2 layers x 2 x 2 heads x 8 = 64/pos
    per = kv_cache_bytes(cfg, 1, bytes_per_value=4)
    assert per == 256
    m = paged_memory(cfg, [5, 12, 3], 4, block_size=4, max_batch=8)
    # positions 8, 15, 6 -> blocks 2 + 4 + 2
    assert m.paged_blocks == 8 and m.paged_bytes == 8 * 4 * per
    assert m.contiguous_bytes == 8 * (12 + 4) * per
    assert m.token_bytes == (8 + 15 + 6) * per and m.shared_blocks == 0
    s = paged_memory(cfg, [9, 12, 3], 4, block_size=4, shared_prefix_len=9)
    # shared full blocks: min(9, T0 - 1) // 4 = 2, 2, 0 -> held once: 2
    assert s.shared_blocks == 2
    assert s.paged_blocks == (3 - 2) + (4 - 2) + 2 + 2
    assert s.contiguous_bytes == 3 * 16 * per


def test_bad_input():
    cfg = gqa_config()
    with pytest.raises(ValueError, match="block_size"):
        PagedKVCache(cfg, 4, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(cfg, 0, 4)
    with pytest.raises(TypeError, match="config"):
        PagedKVCache({"num_hidden_layers": 2}, 4, 4)
    with pytest.raises(ValueError, match="paged KV cache"):
        PagedKVCache(cfg, 10 ** 9, 16)
    cache = PagedKVCache(cfg, 4, 4)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match="already"):
        cache.add_sequence(0)
    with pytest.raises(ValueError, match="seq_ids"):
        PagedStepCache(cache, [], 1)
    with pytest.raises(ValueError, match="seq_ids"):
        PagedStepCache(cache, [3], 1)
    with pytest.raises(ValueError, match="num_new"):
        PagedStepCache(cache, [0], 0)
    with pytest.raises(ValueError, match="block_size"):
        paged_memory(cfg, [3], 2, block_size=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        paged_memory(cfg, [3], 0)
    with pytest.raises(ValueError, match="lengths"):
        paged_memory(cfg, [], 2)

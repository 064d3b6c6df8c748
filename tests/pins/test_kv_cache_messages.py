"""Pins: the exact wording of error messages of course_lib.model.kv_cache.
They keep messages from changing by accident; the behaviour itself is
specified in tests/test_kv_cache.py.

Found by mutation testing (benchmarks/mutation.md, "kv_cache survivors
and why"): a mutant that changes only a message is killed here, so
`make mutation` runs this file with the behaviour tests ([tool.mutmut]
in pyproject.toml).
"""
import pytest
import torch

from course_lib.model.kv_cache import KVCache, LayerKVCache


# Split from test_kv_cache.py's
# test_check_next_rejects_what_is_not_a_1d_tensor.
def test_check_next_not_1d_message():
    c = LayerKVCache()
    with pytest.raises(ValueError, match=r"^positions must be a 1-D tensor "
                       r"\(T,\), got \(1, 2\)$"):
        c.check_next(torch.tensor([[0, 1]]))


def test_check_next_message_shows_at_most_8_positions():
    c = LayerKVCache()
    with pytest.raises(ValueError, match=r"got \[1, 2, 3, 4, 5, 6, 7, 8\]$"):
        c.check_next(torch.arange(1, 9))                  # 8: all shown
    with pytest.raises(ValueError, match=r"^positions must continue the "
                       r"cache, i\.e\. start at 0 and increase by 1, got "
                       r"\[1, 2, 3, 4, 5, 6, 7, 8, '\.\.\.'\]$"):
        c.check_next(torch.arange(1, 10))                 # 9: cut after 8


# Split from test_kv_cache.py's
# test_check_next_rejects_overflow_before_anything_is_computed.
def test_cache_overflow_message():
    for cache in (KVCache(2, max_len=5), LayerKVCache(max_len=5)):
        cache.check_next(torch.arange(5))              # exactly fills it
        with pytest.raises(ValueError, match=r"^cache overflow: 0 cached \+ "
                           r"6 new positions exceeds max_len=5$"):
            cache.check_next(torch.arange(6))


# Split from test_kv_cache.py's test_model_cache_layers_share_its_limit
# (formerly ..._and_messages).
def test_model_cache_n_layers_message():
    with pytest.raises(ValueError, match=r"^n_layers must be >= 1, got 0$"):
        KVCache(0)


def test_too_many_layers_message_in_full():
    with pytest.raises(ValueError,
                       match=r"^n_layers must be <= 4,096, got 4,097$"):
        KVCache(4097)

"""Tests for course_lib.model.mha (chapter 5): heads cut out of the feature axis
and merged back, K/V heads repeated for grouped-query attention, and the
absolute positions of the queries.

References used: an explicit loop over batch, heads and tokens, torch's
repeat_interleave, and positions written out by hand.
"""
import pytest
import torch

from course_lib.model import mha
from course_lib.model.mha import merge_heads, repeat_kv, split_heads
from course_lib.model.mha import mha_param_count


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def test_repeat_kv_matches_repeat_interleave():
    x = torch.randn(2, 3, 5, 4)
    out = repeat_kv(x, 2)
    assert out.shape == (2, 6, 5, 4)
    assert torch.equal(out, x.repeat_interleave(2, dim=1))
    assert torch.equal(out[:, 4], x[:, 2])                  # head 4 -> kv 2
    assert repeat_kv(x, 1) is x


def test_head_counts_must_divide():
    with pytest.raises(ValueError, match=r"n_heads must be divisible"):
        mha_param_count(d_model=64, n_heads=8, n_kv_heads=3)


def test_split_and_merge_heads_against_loop():
    x = torch.randn(2, 5, 12)
    s = split_heads(x, 3)
    assert s.shape == (2, 3, 5, 4)
    for b in range(2):
        for h in range(3):
            for t in range(5):
                assert torch.equal(s[b, h, t], x[b, t, 4 * h:4 * h + 4])
    assert torch.equal(merge_heads(s), x)
    # the tempting x.view(B, H, T, d_k) is a different (wrong) split
    assert not torch.equal(x.view(2, 3, 5, 4), s)


# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.mha survived the ones above.
def test_query_positions_by_hand(device_spy):
    from course_lib.model.kv_cache import LayerKVCache
    cpu = torch.device("cpu")
    assert mha.query_positions(None, 3, None, cpu).tolist() == [0, 1, 2]
    cache = LayerKVCache()
    cache.update(torch.zeros(1, 4, 2))                     # 4 cached
    assert mha.query_positions(None, 2, cache, cpu).tolist() == [4, 5]
    given = torch.tensor([4, 5])
    assert mha.query_positions(given, 2, cache, cpu) is given
    with pytest.raises(ValueError, match=r"^positions must continue the "
                       r"cache, i\.e\. start at 4"):
        mha.query_positions(torch.tensor([0, 1]), 2, cache, cpu)
    with pytest.raises(ValueError, match=r"^positions must have shape"):
        mha.query_positions(torch.arange(3), 2, None, cpu)
    with pytest.raises(TypeError, match=r"^positions must be a torch"):
        mha.query_positions([0, 1], 2, None, cpu)
    # the default positions are built on the device asked for (a spy:
    # there is only a CPU here, where a dropped device= changes nothing)
    asked = device_spy(mha, "arange")
    mha.query_positions(None, 2, None, cpu)
    assert asked == [cpu]



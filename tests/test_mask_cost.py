"""Tiles a mask empties, and block-sparse attention against the explicit
path."""
import pytest
import torch

from course_lib.experiments.mask_cost import (block_sparse_attention,
                                              tile_counts, time_mask_cost)
from course_lib.model.attention import scaled_dot_product_attention
from course_lib.model.masks import causal_mask, sliding_window_mask


def _brute_counts(mask, b):
    Lq, Lk = mask.shape
    empty = full = total = 0
    for i in range(0, Lq, b):
        for j in range(0, Lk, b):
            tile = mask[i:i + b, j:j + b]
            total += 1
            empty += int(not tile.any())
            full += int(bool(tile.all()))
    return total, empty, full, total - empty - full


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_causal_tiles_closed_form(n):
    b = 16
    c = tile_counts(causal_mask(n * b), b)
    assert c == (n * n, n * (n - 1) // 2, n * (n - 1) // 2, n)


@pytest.mark.parametrize("mask", [
    sliding_window_mask(100, window=23), causal_mask(70, 90),
    torch.rand(50, 61, generator=torch.Generator().manual_seed(0)) < 0.02])
@pytest.mark.parametrize("b", [7, 16])
def test_tile_counts_match_loop(mask, b):
    assert tuple(tile_counts(mask, b)) == _brute_counts(mask, b)


@pytest.mark.parametrize("skip", [True, False])
def test_block_sparse_attention_matches_explicit(skip):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 70, 16, generator=g)
    k, v = torch.randn(2, 2, 3, 90, 16, generator=g).unbind(0)
    masks = [causal_mask(70, 90), sliding_window_mask(70, 90, window=13),
             torch.rand(70, 90, generator=g) < 0.03]   # some dead rows
    assert not masks[2].any(-1).all()
    for mask in masks:
        ref, _ = scaled_dot_product_attention(q, k, v, mask)
        out = block_sparse_attention(q, k, v, mask, 16, skip=skip)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_time_mask_cost_rows():
    rows = time_mask_cost([32], tiled_length=64, block_size=16, window=16,
                          n_documents=4, heads=1, d_k=8, repeats=1)
    assert [(r.name, r.length) for r in rows] == [
        ("explicit", 32), ("causal", 64), ("window", 64), ("documents", 64)]
    assert rows[1].visited == 1 - 6 / 16           # 4 blocks: 6 empty
    assert rows[3].visited == 4 / 16               # 4 diagonal tiles
    assert all(r.a_seconds > 0 and r.b_seconds > 0 for r in rows)


def test_mask_cost_bad_input():
    q = torch.randn(4, 8)
    with pytest.raises(TypeError, match="mask"):
        tile_counts(torch.ones(4, 4), 2)
    with pytest.raises(ValueError, match="block_size"):
        tile_counts(causal_mask(4), 0)
    with pytest.raises(ValueError, match="mask"):
        block_sparse_attention(q, q, q, causal_mask(4)[None], 2)
    with pytest.raises(TypeError, match="skip"):
        block_sparse_attention(q, q, q, causal_mask(4), 2, skip=1)
    with pytest.raises(TypeError, match="repeats"):
        time_mask_cost(repeats=1.5)
    with pytest.raises(ValueError, match="lengths"):
        time_mask_cost([0])

"""Tests for course_lib.pretrained.fp8_blocks (chapter 10's checkpoint
format): against a block-by-block loop, with partial edge blocks."""
import math

import pytest
import torch

from course_lib.pretrained.fp8_blocks import (FP8_MAX, dequantize_fp8_blocks,
                                              quantize_fp8_blocks)


def loop_dequantize(q, s, block):
    """Reference: every element times the scale of the block it sits in."""
    R, C = q.shape
    out = torch.empty(R, C)
    for r in range(R):
        for c in range(C):
            out[r, c] = q[r, c].float() * s[r // block, c // block].float()
    return out


@pytest.mark.parametrize("R,C,block", [(8, 12, 4), (7, 10, 4), (5, 3, 8),
                                       (9, 9, 3), (1, 1, 128)])
def test_equals_the_loop_form(R, C, block):
    gen = torch.Generator().manual_seed(R * C)
    q = (torch.randn(R, C, generator=gen) * 100).to(torch.float8_e4m3fn)
    s = torch.rand(math.ceil(R / block), math.ceil(C / block),
                   generator=gen)
    got = dequantize_fp8_blocks(q, s, block=block)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, loop_dequantize(q, s, block))


def test_chapter_10_example_round_trip():
    """The chapter's made-up weight: 256 x 384 in 2 x 3 blocks; and a
    shape with partial blocks (DeepSeek-V3's kv_a_proj is 576 x 7168)."""
    torch.manual_seed(0)
    for shape in ((256, 384), (576, 300)):
        w = torch.randn(*shape) * 0.02
        q, s = quantize_fp8_blocks(w)
        assert q.dtype == torch.float8_e4m3fn
        assert s.shape == (math.ceil(shape[0] / 128),
                           math.ceil(shape[1] / 128))
        back = dequantize_fp8_blocks(q, s)
        assert (back - w).norm() / w.norm() < 0.04      # E4M3: 3 bits
        # each block's largest value is stored as +-448 exactly
        assert q.float().abs().max() == FP8_MAX
        if shape == (256, 384):                 # chapter 10's own formula
            blocks = w.view(2, 128, 3, 128)
            torch.testing.assert_close(s, blocks.abs().amax(dim=(1, 3))
                                       / 448)


def test_zero_block_gets_scale_one_and_stays_zero():
    w = torch.zeros(4, 6)
    w[0, 0] = 1.0
    q, s = quantize_fp8_blocks(w, block=4)
    torch.testing.assert_close(s, torch.tensor([[1.0 / 448, 1.0]]))
    torch.testing.assert_close(dequantize_fp8_blocks(q, s, block=4), w)


def test_bad_input():
    q, s = torch.zeros(5, 5), torch.ones(2, 2)
    with pytest.raises(ValueError):
        dequantize_fp8_blocks(q, torch.ones(1, 2), block=4)   # wrong grid
    with pytest.raises(ValueError):
        dequantize_fp8_blocks(q[0], s, block=4)                # not 2-D
    with pytest.raises(ValueError):
        dequantize_fp8_blocks(q.long(), s, block=4)
    with pytest.raises((TypeError, ValueError)):
        dequantize_fp8_blocks(q, s, block=0)
    with pytest.raises((TypeError, ValueError)):
        quantize_fp8_blocks(q, block="4")
    with pytest.raises(ValueError):
        quantize_fp8_blocks(q.long())

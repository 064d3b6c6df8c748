"""Tests for course_lib.model.alibi (chapter 2's transfer exercise).

References: the slopes of the paper's released code (``get_slopes`` of
ofirpress/attention_with_linear_biases, written out here), the values the
paper lists for 8 heads, and a plain loop over (h, i, j) for the bias.
"""
import math

import pytest
import torch

from course_lib.model.alibi import alibi_bias, alibi_slopes


def paper_slopes(n):
    """get_slopes from the ALiBi repository."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + paper_slopes(2 * closest)[0::2][:n - closest]


def test_eight_heads_are_the_papers_halves():
    assert alibi_slopes(8).tolist() == [1 / 2 ** i for i in range(1, 9)]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 8, 12, 16, 20, 32, 64, 96])
def test_slopes_match_the_released_code(n):
    torch.testing.assert_close(alibi_slopes(n),
                               torch.tensor(paper_slopes(n)))


@pytest.mark.parametrize("H,L", [(1, 1), (2, 5), (8, 7), (6, 4), (16, 3)])
def test_bias_is_the_loop(H, L):
    m = paper_slopes(H)
    want = torch.empty(H, L, L)
    for h in range(H):
        for i in range(L):
            for j in range(L):
                want[h, i, j] = -m[h] * (i - j) if j <= i else -math.inf
    got = alibi_bias(H, L)
    assert got.dtype == torch.float32 and got.shape == (H, L, L)
    torch.testing.assert_close(got, want)


def test_bias_depends_on_the_offset_only_and_masks_the_future():
    b = alibi_bias(4, 10)
    for o in range(10):                       # every diagonal is constant
        d = b.diagonal(-o, dim1=1, dim2=2)
        assert (d == d[:, :1]).all()
    assert torch.isinf(b[:, 0, 1:]).all() and (b.diagonal(0, 1, 2) == 0).all()
    # the softmax of a row of equal scores plus the bias favours near keys
    w = torch.softmax(b[0, -1], dim=-1)
    assert (w[1:] > w[:-1]).all()


def test_bad_input():
    with pytest.raises(TypeError, match="n_heads"):
        alibi_slopes(2.0)
    with pytest.raises(ValueError, match="n_heads"):
        alibi_bias(0, 3)
    with pytest.raises(ValueError, match="length"):
        alibi_bias(2, 0)
    with pytest.raises(TypeError, match="length"):
        alibi_bias(2, True)

r"""ALiBi: attention with linear biases (Press, Smith and Lewis, 2022).

ALiBi adds no position vectors. Each head $h$ adds a fixed penalty
proportional to the distance to its causal scores,

$$s_{ij} = q_i \cdot k_j / \sqrt{d_k} - m_h\,(i - j), \qquad j \le i,$$

with a head-specific slope $m_h$ that is not learned. For $H$ heads, $H$ a
power of two, the slopes form the geometric sequence
$m_h = 2^{-8h/H}$, $h = 1, \dots, H$ (for $H = 8$: $1/2, 1/4, \dots,
1/256$): steep heads look near, shallow heads far. For other $H$ the
paper's code takes the $2^{\lfloor \log_2 H \rfloor}$ slopes of the power
of two below, then every other slope of the sequence for twice that power
until it has $H$. Because the penalty depends on $i - j$ only and grows
linearly without limit, a model trained on short sequences meets no
unseen input at longer ones, only larger penalties.

Shape letters: H heads, L sequence length (queries and keys alike).
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_int

__all__ = ["alibi_slopes", "alibi_bias"]


def _power_of_two_slopes(n: int) -> list[float]:
    """$2^{-8h/n}$ for $h = 1..n$ ($n$ a power of two)."""
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi_slopes(n_heads: int) -> torch.Tensor:
    r"""The slope $m_h$ of every head, (H,) float32.

    $m_h = 2^{-8h/H}$ for $h = 1, \dots, H$ when $H$ is a power of two.
    Otherwise, with $P = 2^{\lfloor\log_2 H\rfloor}$: the $P$ slopes of
    $P$ heads, then the slopes $1, 3, 5, \dots$ (1-based: every other one,
    starting with the first) of $2P$ heads, up to $H$ in all, as in the
    paper's released code.

    Args:
        n_heads: H >= 1.
    """
    check_int("n_heads", n_heads, minimum=1, maximum=1 << 16)
    p = 1 << (n_heads.bit_length() - 1)            # largest power of 2 <= H
    slopes = _power_of_two_slopes(p)
    if p < n_heads:
        slopes += _power_of_two_slopes(2 * p)[0::2][:n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(n_heads: int, length: int) -> torch.Tensor:
    r"""The additive causal ALiBi bias, (H, L, L) float32.

    $$B_{hij} = \begin{cases} -m_h\,(i - j) & j \le i \\
                               -\infty & j > i \end{cases}$$

    with $m_h$ from :func:`alibi_slopes`: added to a head's (L, L) scores
    before the softmax, it applies the linear penalty and the causal mask
    at once (query $i$ sees keys $0..i$; the diagonal is 0).

    Args:
        n_heads: H >= 1.
        length: L >= 1, the number of positions (queries = keys).
    """
    check_int("n_heads", n_heads, minimum=1, maximum=1 << 16)
    check_int("length", length, minimum=1, maximum=1 << 14)
    pos = torch.arange(length)
    dist = (pos[:, None] - pos[None, :]).float()              # (L, L): i - j
    bias = -alibi_slopes(n_heads)[:, None, None] * dist       # (H, L, L)
    return bias.masked_fill(dist < 0, -math.inf)              # j > i masked

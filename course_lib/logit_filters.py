r"""Logit filters: temperature, top-k, top-p and min-p.

Each function maps logits $z \in \mathbb{R}^{V}$ (any leading dimensions)
to new logits; :mod:`course_lib.sampling` composes them and draws a token.

* :func:`apply_temperature` rescales the logits, $z / \tau$ (the
  temperature is $\tau$ throughout, since $T$ is the sequence length);
* :func:`top_k_filter` keeps the $k$ largest logits;
* :func:`top_p_filter` keeps the smallest set of most likely tokens whose
  probability mass reaches $p$ (nucleus sampling);
* :func:`min_p_filter` keeps the tokens at least ``min_p`` times as likely
  as the most likely one.

A filtered-out token gets the logit $-\infty$, so the softmax gives it
probability $e^{-\infty} = 0$ exactly, as a mask does in chapter 4.

Shape letters: V vocabulary size, ``...`` any leading dimensions.

Introduced in chapter 8.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .validation import check_int, check_real

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter",
           "min_p_filter"]


def _check_logits(logits) -> None:
    if not isinstance(logits, torch.Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got "
                         f"{type(logits).__name__}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a floating tensor, got dtype "
                         f"{logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"logits must have shape (..., V) with V >= 1, got "
                         f"{tuple(logits.shape)}")
    if torch.isnan(logits).any():
        raise ValueError("logits must not contain NaN")
    # +inf has no probability (inf / inf): an overflowed model output
    if (logits == float("inf")).any():
        raise ValueError("logits must not contain +inf (an overflow, e.g. "
                         "a float16 model: run it in float32)")
    # a row of -inf has no distribution: softmax would return NaN
    if (logits == float("-inf")).all(dim=-1).any():
        raise ValueError("every row of logits needs at least one entry "
                         "above -inf")


def _check_temperature(temperature) -> float:
    check_real("temperature", temperature, minimum=0)
    return float(temperature)


def _check_top_k(top_k) -> int:
    check_int("top_k", top_k, minimum=1)
    return top_k


def _check_top_p(top_p) -> float:
    check_real("top_p", top_p, positive=True, maximum=1)
    return float(top_p)


def _check_min_p(min_p) -> float:
    check_real("min_p", min_p, minimum=0, maximum=1)
    return float(min_p)


def apply_temperature(logits: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    r"""Divide the logits by a temperature $\tau$: $z \mapsto z / \tau$.

    $$p_i(\tau) = \frac{e^{z_i / \tau}}{\sum_j e^{z_j / \tau}}.$$

    $\tau < 1$ sharpens the distribution, $\tau > 1$ flattens it, and the
    order of the logits never changes. As $\tau \to \infty$ every
    $z_i / \tau \to 0$ and $p$ tends to the uniform distribution over the
    tokens with finite logits. As $\tau \to 0$ it tends to a one-hot vector
    on the largest logit (uniform over the maxima if several tie).
    $\tau = 0$ is accepted and
    returns that limit with ties broken towards the lowest index, like
    ``torch.argmax``: the first maximum keeps logit 0 and all others get
    $-\infty$, so sampling at $\tau = 0$ is exactly greedy decoding.

    A small $\tau$ can overflow $z / \tau$ (float16 logits of 12 at
    $\tau = 10^{-4}$ exceed 65504): the division is done in float32 at least,
    and where it would still overflow, on $z - \max_j z_j$ instead, which
    changes no probability (softmax ignores a shift of every logit).

    Args:
        logits: ``(..., V)`` floating tensor.
        temperature: a finite number $\tau \ge 0$.

    Returns:
        ``(..., V)`` tensor of tempered logits (float32 for half-precision
        input).

    Introduced in chapter 8.
    """
    _check_logits(logits)
    tau = _check_temperature(temperature)
    if tau == 0:
        first_max = logits.argmax(dim=-1, keepdim=True)       # (..., 1)
        out = torch.full_like(logits, float("-inf"))
        return out.scatter(-1, first_max, 0.0)                # (..., V)
    z = logits.float() if logits.element_size() < 4 else logits
    out = z / tau                                             # z / tau
    if (torch.isinf(out) & torch.isfinite(z)).any():          # overflowed
        out = (z - z.amax(dim=-1, keepdim=True)) / tau
    return out


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    r"""Keep the $k$ largest logits of each row; set the rest to $-\infty$.

    A token survives if fewer than $k$ tokens have a strictly larger logit,
    that is if $z_i \ge z_{(k)}$, the $k$-th largest value. Tokens tied with
    $z_{(k)}$ are all kept, so a row may keep more than $k$ tokens; this
    makes the result independent of the order of the vocabulary, and is
    what Hugging Face's ``TopKLogitsWarper`` does. $k \ge V$ keeps every
    token.

    Args:
        logits: ``(..., V)`` floating tensor.
        k: an int $\ge 1$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.

    Introduced in chapter 8.
    """
    _check_logits(logits)
    k = min(_check_top_k(k), logits.shape[-1])
    # z_(k): the k-th largest logit of each row
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]      # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))    # (..., V)


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    r"""Nucleus filter: keep the smallest head of the distribution with mass $\ge p$.

    Sort the probabilities $p_{(1)} \ge p_{(2)} \ge \dots$ and find the
    first $m$ with $\sum_{i \le m} p_{(i)} \ge p$. Tokens $(1), \dots, (m)$
    are kept, including the token $(m)$ whose probability carries the sum
    across $p$; the rest get $-\infty$. Equivalently, token $i$ is kept iff
    the mass of the tokens strictly more likely than it is below $p$:

    $$\text{keep}_i \iff \sum_{j:\, z_j > z_i} p_j < p.$$

    The first token always survives (the mass before it is $0 < p$).
    Tokens tied with token $(m)$ are all kept, so the result does not
    depend on how the sort orders ties. $p = 1$ keeps every token (it is
    the identity, as in Hugging Face, where ``top_p=1.0`` disables the
    filter), even those whose probability underflows to 0.

    Args:
        logits: ``(..., V)`` floating tensor (may already hold $-\infty$).
        p: a number in $(0, 1]$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.

    Introduced in chapter 8.
    """
    _check_logits(logits)
    p = _check_top_p(p)
    if p == 1.0:
        return logits.clone()
    sorted_logits, _ = torch.sort(logits, dim=-1, descending=True)
    # cumulative sums in float64: fewer rounding surprises right at p
    probs = F.softmax(sorted_logits.double(), dim=-1)         # (..., V)
    # mass strictly before each sorted position: sum_{i < m} p_(i)
    before = probs.cumsum(dim=-1) - probs                     # (..., V)
    keep_sorted = before < p                                  # (..., V)
    keep_sorted[..., 0] = True
    # the last kept logit in sorted order; keeping z >= it also keeps ties
    n_kept = keep_sorted.sum(dim=-1, keepdim=True)            # (..., 1)
    threshold = sorted_logits.gather(-1, n_kept - 1)          # (..., 1)
    return logits.masked_fill(logits < threshold, float("-inf"))


def min_p_filter(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    r"""Min-p filter: keep tokens at least ``min_p`` times as likely as the top one.

    With $p_{\max} = \max_j p_j$, token $i$ survives iff

    $$p_i \ge p_{\text{min}} \cdot p_{\max}
    \iff z_i \ge \max_j z_j + \log p_{\text{min}},$$

    the rule of min-p sampling (Nguyen et al., 2024). The threshold
    scales with the model's confidence: a peaked distribution
    ($p_{\max}$ near 1) keeps few tokens, a flat one keeps many, which is
    what top-p also aims at, but min-p never adds a token of tiny
    probability just to fill the mass $p$ of a flat tail. The test needs no
    sort and no normalisation: it compares each logit with the row's
    largest. The top token always survives; $p_{\text{min}} = 0$ keeps
    every token, and $p_{\text{min}} = 1$ keeps the maxima only (greedy,
    ties kept).

    Args:
        logits: ``(..., V)`` floating tensor (may already hold $-\infty$).
        min_p: a number in $[0, 1]$.

    Returns:
        ``(..., V)`` tensor, equal to ``logits`` on the kept tokens and
        $-\infty$ elsewhere.

    Introduced in chapter 8.
    """
    _check_logits(logits)
    min_p = _check_min_p(min_p)
    if min_p == 0.0:
        return logits.clone()
    # log(p_i / p_max) = z_i - max_j z_j, computed without a softmax
    z_max = logits.amax(dim=-1, keepdim=True)                 # (..., 1)
    keep = logits - z_max >= math.log(min_p)                  # (..., V)
    return logits.masked_fill(~keep, float("-inf"))

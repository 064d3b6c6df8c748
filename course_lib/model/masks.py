r"""Masks: which keys each query may read, and tools to check them.

A mask is a boolean tensor, ``True`` = "may attend", that
:func:`~course_lib.model.attention.scaled_dot_product_attention` applies to the
scores. This module builds them and holds what chapter 4 needs around
them:

* :func:`causal_mask` (end-aligned, so it works with a KV cache),
  :func:`sliding_window_mask`, :func:`padding_mask` and
  :func:`combine_masks` build and combine boolean masks;

* :func:`additive_mask` turns a boolean mask into the matrix $M$ of the
  formula $\mathrm{softmax}(QK^\top/\sqrt{d_k} + M)\,V$, with $M_{ij} = 0$
  where query $i$ may read key $j$ and $M_{ij} = -\infty$ where it may not;
* :func:`next_token_pairs` makes the shifted (input, target) pairs of
  next-token training, which is why a query may see its own position;
* :func:`influence_matrix` measures, by perturbation, which inputs can move
  which outputs, so causality can be checked on any sequence function;
* :func:`draw_mask` draws a mask (optionally with the weights in its
  cells) into a matplotlib Axes.

Shape letters: B batch, T sequence length, Lq query length, Lk key length,
D feature width, ... any leading dimensions (batch, heads).
"""
from __future__ import annotations

import functools

import torch

from .._util.validation import (
    check_alloc,
    check_bool_mask,
    check_float_dtype,
    check_int,
    check_lengths,
    check_sizes,
)

__all__ = ["causal_mask", "sliding_window_mask", "padding_mask",
           "combine_masks", "additive_mask"]


# ---------------------------------------------------------- building masks
def causal_mask(q_len: int, k_len: int | None = None, *,
                device: torch.device | str | None = None) -> torch.Tensor:
    r"""Causal mask aligned to the end of the keys: (Lq, Lk) bool.

    Query $i$ may see key $j$ iff $j \le i + (L_k - L_q)$: the last query
    sits at the last key. With $L_q = L_k$ this is the lower triangle;
    with $L_q = 1$ (one new token against a cache of $L_k$ keys) the row
    is all True. torch's ``is_causal=True`` aligns to the *start*
    (top-left) instead, which differs when $L_q \ne L_k$. With
    $L_q > L_k$ the first $L_q - L_k$ rows allow no key at all (attention
    returns zeros there).

    Args:
        q_len, k_len: numbers of queries Lq and keys Lk (default Lq).
        device: device of the result.
    """
    k_len = q_len if k_len is None else k_len
    check_sizes(q_len=q_len, k_len=k_len)
    check_alloc("q_len * k_len", q_len * k_len)
    i = torch.arange(q_len, device=device)[:, None]             # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]             # (1, Lk)
    # j <= i + Lk - Lq
    return j <= i + (k_len - q_len)                             # (Lq, Lk)


def sliding_window_mask(q_len: int, k_len: int | None = None, *,
                        window: int,
                        device: torch.device | str | None = None
                        ) -> torch.Tensor:
    r"""Causal sliding window: each query sees its last ``window`` keys.

    With $i' = i + L_k - L_q$ (end-aligned as in :func:`causal_mask`),
    query $i$ may see key $j$ iff $i' - w < j \le i'$: at most $w$ keys
    per row, so a block-wise kernel costs $O(Lw)$ instead of $O(L^2)$.

    Args:
        q_len, k_len, device: as in :func:`causal_mask`.
        window: keys visible per query, counting itself ($w \ge 1$).
    Returns:
        bool tensor (Lq, Lk).
    """
    check_int("window", window, minimum=1)
    causal = causal_mask(q_len, k_len, device=device)           # (Lq, Lk)
    k_len = causal.shape[1]
    i = torch.arange(q_len, device=device)[:, None]             # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]             # (1, Lk)
    # i' - w < j, with i' = i + Lk - Lq
    return causal & (j > i + (k_len - q_len) - window)          # (Lq, Lk)


def padding_mask(lengths, max_len: int, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    r"""Key-padding mask (B, 1, Lk): True for real keys, False for padding.

    Sequence $b$ has ``lengths[b]`` real tokens, then padding up to
    ``max_len``. The mask acts on the KEY axis (the last one): no query may
    attend to a padding key. (B, 1, Lk) broadcasts over the queries of
    scores (B, Lq, Lk); for per-head scores (B, H, Lq, Lk) insert the head
    axis, ``mask[:, None]`` = (B, 1, 1, Lk). Padding *queries* are not
    masked: their outputs are computed and ignored downstream.

    Args:
        lengths: B ints (list, 1-D integer tensor or array), each in
            [0, max_len].
        max_len: padded length Lk.
        device: where to build the mask (match it to the scores).
    """
    check_int("max_len", max_len, minimum=1)
    lengths = check_lengths(lengths, minimum=0, maximum=max_len)
    check_alloc("len(lengths) * max_len", len(lengths) * max_len)
    lens = torch.tensor(lengths, device=device)[:, None, None]  # (B, 1, 1)
    pos = torch.arange(max_len, device=device)[None, None, :]   # (1, 1, Lk)
    return pos < lens                                           # (B, 1, Lk)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    r"""Logical AND of boolean masks, with broadcasting.

    A key is allowed only if every mask allows it: causal (Lq, Lk) AND
    padding (B, 1, Lk) gives (B, Lq, Lk). ``None`` means "no restriction";
    the result is None if all masks are None.
    """
    present = [m for m in masks if m is not None]
    for m in present:
        check_bool_mask("masks", m)
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        raise ValueError(f"masks of shapes {[tuple(m.shape) for m in present]}"
                         f" do not broadcast together") from None
    return functools.reduce(torch.logical_and, present) if present else None


# ------------------------------------------ masks as the softmax sees them
def additive_mask(mask: torch.Tensor, *,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""The additive form $M$ of a boolean mask: 0 where allowed, $-\infty$.

    Adding $M$ to the scores before the softmax gives a blocked key the
    weight $e^{-\infty} / Z = 0$ exactly, while allowed keys keep
    $e^{s_{ij}}$, so the softmax renormalises over the allowed keys only:

    $$a_{ij} = \frac{e^{s_{ij} + M_{ij}}}{\sum_{j'} e^{s_{ij'} + M_{ij'}}}
    = \frac{e^{s_{ij}}\,[j \text{ allowed}]}
    {\sum_{j' \text{ allowed}} e^{s_{ij'}}}.$$

    Args:
        mask: bool tensor of any shape, ``True`` where the query may attend.
        dtype: floating dtype of the result.

    Returns:
        A tensor of the shape of ``mask`` holding ``0.0`` and ``-inf``.
    """
    check_bool_mask("mask", mask)
    check_float_dtype("dtype", dtype)
    # M_ij = 0 if allowed else -inf
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))

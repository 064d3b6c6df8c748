r"""What a mask costs: nothing saved by the explicit path, tiles by a kernel.

The explicit path (:func:`~course_lib.model.attention.
scaled_dot_product_attention`) computes all $L_q L_k$ scores and *then*
sets the blocked ones to $-\infty$: a causal mask throws away about half
of the work after doing it, and costs one more pass over the scores.

A tiled kernel (FlashAttention; :mod:`course_lib.model.online_softmax`)
walks the $(L_q, L_k)$ score matrix in $b \times b$ tiles, query block by
key block. A tile whose mask is all False contributes nothing, so the
kernel can skip it without computing it. For $L = nb$ with blocks
aligned to the diagonal, a causal mask empties exactly $n(n-1)/2$ of the
$n^2$ tiles, keeps $n(n-1)/2$ full ones (no mask needed there) and $n$
partial ones on the diagonal: the visited share is $(n+1)/2n \to 1/2$. A
sliding window of $w$ keys visits about $L/b \cdot (w/b + 1)$ tiles, and
$k$ packed documents of equal length about $1/k$ of the causal ones.

:func:`tile_counts` counts the tiles a mask empties, exactly;
:func:`block_sparse_attention` is the tiled loop over query and key
blocks with the online softmax, skipping empty tiles or not, and
:func:`time_mask_cost` times both comparisons.

Shape letters: B batch, H heads, Lq queries, Lk keys, d_k head width,
b block size, ... leading dims (B, H).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .._util.threads import small_ops
from .._util.timing import best_time
from .._util.validation import (check_attention_inputs, check_bool,
                                check_bool_mask, check_int, check_type)
from ..model.attention import scaled_dot_product_attention
from ..model.masks import causal_mask, sliding_window_mask
from ..tasks.packing import document_causal_mask

__all__ = ["TileCounts", "tile_counts", "block_sparse_attention",
           "MaskTiming", "time_mask_cost"]


class TileCounts(NamedTuple):
    """How a mask splits into ``b x b`` tiles: all False (``empty``, a
    kernel skips it), all True (``full``, no mask to apply) or mixed
    (``partial``); ``total`` = the sum."""
    total: int
    empty: int
    full: int
    partial: int


def _tile_map(mask: torch.Tensor, block_size: int
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile: does the mask allow any entry, and does it allow every
    entry inside the matrix? Each (..., n_q, n_k) bool; edge tiles may be
    shorter than ``block_size``."""
    *lead, Lq, Lk = mask.shape
    b = block_size
    nq, nk = -(-Lq // b), -(-Lk // b)                        # ceil
    padded = mask.new_zeros((*lead, nq * b, nk * b))
    padded[..., :Lq, :Lk] = mask
    tiles = padded.reshape(*lead, nq, b, nk, b).transpose(-3, -2)
    any_ = tiles.any(-1).any(-1)                             # (..., nq, nk)
    valid = torch.zeros_like(padded)
    valid[..., :Lq, :Lk] = True
    valid = valid.reshape(*lead, nq, b, nk, b).transpose(-3, -2)
    all_ = (tiles | ~valid).all(-1).all(-1)                  # (..., nq, nk)
    return any_, all_


def tile_counts(mask: torch.Tensor, block_size: int) -> TileCounts:
    r"""Count the ``block_size`` x ``block_size`` tiles of a mask that are
    empty, full and partial.

    Tile $(I, J)$ holds queries $Ib \dots Ib + b - 1$ and keys
    $Jb \dots Jb + b - 1$ (the last ones may be shorter). For a causal
    $(nb, nb)$ mask: $n(n-1)/2$ empty, $n(n-1)/2$ full, $n$ partial.

    Args:
        mask: bool (Lq, Lk) or (..., Lq, Lk), True = may attend; a batch
            of masks counts the tiles of all of them.
        block_size: $b \ge 1$.
    """
    check_bool_mask("mask", mask)
    check_int("block_size", block_size, minimum=1)
    if mask.dim() < 2:
        raise ValueError(f"mask must have shape (..., Lq, Lk), got "
                         f"{tuple(mask.shape)}")
    any_, all_ = _tile_map(mask, block_size)
    total, empty = any_.numel(), int((~any_).sum())
    full = int(all_.sum())
    return TileCounts(total, empty, full, total - empty - full)


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor, mask: torch.Tensor,
                           block_size: int, *, skip: bool = True
                           ) -> torch.Tensor:
    r"""Masked attention by $b \times b$ tiles with an online softmax,
    skipping the tiles the mask empties (or visiting all, ``skip=False``).

    For each query block the loop keeps the running maximum $m$, sum
    $\ell$ and unnormalised output $o$ of
    :func:`~course_lib.model.online_softmax.tiled_attention` over the key
    blocks it visits. An empty tile would add $e^{-\infty} = 0$ to $\ell$
    and $o$, so skipping it changes nothing but the time; a full tile
    needs no mask. Rows that see no key at all return zeros, as the
    explicit path does.

    Args:
        q, k, v: (..., Lq, d_k), (..., Lk, d_k), (..., Lk, d_v).
        mask: bool (Lq, Lk), True = may attend, shared by the leading dims.
        block_size: $b$, queries and keys per tile.
        skip: skip empty tiles (the point of a block-sparse kernel).
    Returns:
        out (..., Lq, d_v), equal to the explicit path's up to rounding.
    """
    check_int("block_size", block_size, minimum=1)
    check_bool("skip", skip)
    check_type("mask", mask, torch.Tensor, "a torch.Tensor")
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (Lq, Lk), got "
                         f"{tuple(mask.shape)}")
    scale = check_attention_inputs(q, k, v, mask, None)
    b = block_size
    visit, full = _tile_map(mask, b)                         # (nq, nk) each
    if not skip:
        visit = torch.ones_like(visit)
    q = q * scale
    out = []
    for I in range(visit.shape[0]):
        q_t = q[..., I * b:(I + 1) * b, :]                   # (..., b, d_k)
        m = q_t.new_full((*q_t.shape[:-1], 1), float("-inf"))  # running max
        l = q_t.new_zeros((*q_t.shape[:-1], 1))              # running sum
        o = q_t.new_zeros((*q_t.shape[:-1], v.shape[-1]))    # (..., b, d_v)
        for J in visit[I].nonzero()[:, 0].tolist():
            s = q_t @ k[..., J * b:(J + 1) * b, :].transpose(-2, -1)  # (.,b,b)
            if not full[I, J]:
                tile = mask[I * b:(I + 1) * b, J * b:(J + 1) * b]
                s = s.masked_fill(~tile, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            # rows with no key yet keep m = -inf: shift by 0 there, not NaN
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)
            alpha, p = torch.exp(m - shift), torch.exp(s - shift)
            l = alpha * l + p.sum(-1, keepdim=True)
            o = alpha * o + p @ v[..., J * b:(J + 1) * b, :]  # (..., b, d_v)
            m = m_new
        out.append(torch.where(l > 0, o / l.clamp(min=1e-30), 0.0))
    return torch.cat(out, dim=-2)                            # (..., Lq, d_v)


class MaskTiming(NamedTuple):
    """One timed comparison: seconds of ``a`` and of ``b`` (best of the
    repeats, interleaved) and the share of tiles ``b`` visits (1.0 for
    the explicit path)."""
    name: str
    length: int
    a_seconds: float
    b_seconds: float
    visited: float


@small_ops()  # every variant on one thread: the same method at each size
def time_mask_cost(lengths=(128, 256, 512), *, tiled_length: int = 512,
                   block_size: int = 64, window: int = 64,
                   n_documents: int = 4, heads: int = 4, d_k: int = 32,
                   repeats: int = 3, seed: int = 0) -> list[MaskTiming]:
    r"""Time what masks cost, on random (1, H, L, d_k) inputs.

    Rows ``"explicit"``: the explicit path without a mask (``a``) and with
    the causal mask (``b``), at each of ``lengths``. Rows ``"causal"``,
    ``"window"``, ``"documents"``: :func:`block_sparse_attention` at
    ``tiled_length`` visiting every tile (``a``) and skipping the empty
    ones (``b``), for the causal mask, a sliding window of ``window``
    keys and ``n_documents`` packed documents of equal length. Each pair
    is timed interleaved, best of ``repeats``
    (:func:`~course_lib._util.timing.best_time` per call), on one thread.
    """
    for name, value, low in (("tiled_length", tiled_length, 1),
                             ("block_size", block_size, 1),
                             ("window", window, 1),
                             ("n_documents", n_documents, 1),
                             ("heads", heads, 1), ("d_k", d_k, 1),
                             ("repeats", repeats, 1), ("seed", seed, 0)):
        check_int(name, value, minimum=low)
    lengths = list(lengths)
    for L in lengths:
        check_int("lengths", L, minimum=1, maximum=8192)
    check_int("tiled_length", tiled_length, minimum=1, maximum=8192)
    g = torch.Generator().manual_seed(seed)

    def pair(fn_a, fn_b):
        a, b = float("inf"), float("inf")
        for _ in range(repeats):           # A, B, A, B, ...: same load
            a = min(a, best_time(fn_a, 1))
            b = min(b, best_time(fn_b, 1))
        return a, b

    rows = []
    for L in lengths:
        q, k, v = torch.randn(3, 1, heads, L, d_k, generator=g).unbind(0)
        mask = causal_mask(L)
        a, b = pair(lambda: scaled_dot_product_attention(q, k, v),
                    lambda: scaled_dot_product_attention(q, k, v, mask))
        rows.append(MaskTiming("explicit", L, a, b, 1.0))
    L = tiled_length
    q, k, v = torch.randn(3, 1, heads, L, d_k, generator=g).unbind(0)
    doc = torch.arange(L)[None] * n_documents // L           # (1, L) ids
    masks = {"causal": causal_mask(L),
             "window": sliding_window_mask(L, window=window),
             "documents": document_causal_mask(doc)[0]}      # (L, L)
    for name, mask in masks.items():
        counts = tile_counts(mask, block_size)
        a, b = pair(lambda: block_sparse_attention(q, k, v, mask, block_size,
                                                   skip=False),
                    lambda: block_sparse_attention(q, k, v, mask,
                                                   block_size))
        rows.append(MaskTiming(name, L, a, b,
                               1 - counts.empty / counts.total))
    return rows

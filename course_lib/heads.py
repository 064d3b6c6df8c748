r"""The tensor layout every attention layer shares: heads cut out of the
feature axis and made a batch axis (:func:`split_heads`,
:func:`merge_heads`), K/V heads repeated for grouped-query attention
(:func:`repeat_kv`), a boolean mask brought to 4-D (:func:`mask_to_4d`) and
the absolute positions of the queries (:func:`query_positions`).
:class:`course_lib.mha.MultiHeadAttention` is built on them, and so are
the later attention layers (MLA, tensor-parallel attention).

Shape letters: B batch, T queries, S keys/values, D = ``d_model``, H query
heads, G key/value heads, d_k = ``head_dim`` = D / H.

Introduced in chapter 5.
"""
from __future__ import annotations

import torch

from .validation import (broadcasts_to, check_bool_mask, check_int,
                         check_type)

__all__ = ["split_heads", "merge_heads", "repeat_kv", "mask_to_4d",
           "query_positions"]


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    r"""Cut the feature axis into heads and make heads a batch axis.

    Feature $i\,d_k + c$ is feature $c$ of head $i$ (head $i$ owns
    columns $i d_k, \dots, (i+1) d_k - 1$ of $W^Q$), so a ``view`` to
    ``(B, T, H, d_k)`` finds the heads; the transpose puts heads before
    tokens, so attention runs on one (T, d_k) matrix per (batch, head).

    Args:
        x: ``(B, T, H * d_k)`` queries, keys or values; n_heads: H.

    Returns:
        ``(B, H, T, d_k)``.

    Introduced in chapter 5.
    """
    check_int("n_heads", n_heads, minimum=1)
    if x.dim() != 3 or x.shape[-1] % n_heads:
        raise ValueError(f"x must have shape (B, T, n_heads * d_k) with "
                         f"n_heads={n_heads}, got {tuple(x.shape)}")
    B, T, width = x.shape
    # Not x.view(B, H, T, d_k): that would mix tokens into heads.
    x = x.view(B, T, n_heads, width // n_heads)      # (B, T, H, d_k)
    return x.transpose(1, 2)                         # (B, H, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    r"""Inverse of :func:`split_heads`: $\mathrm{Concat}(\mathrm{head}_1,
    \dots, \mathrm{head}_h)$ along the feature axis.

    Args:
        x: ``(B, H, T, d_k)``.

    Returns:
        ``(B, T, H * d_k)``, head $i$ in features $i d_k$ to $(i+1)d_k - 1$.

    Introduced in chapter 5.
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if x.dim() != 4:
        raise ValueError(f"x must have shape (B, H, T, d_k), got "
                         f"{tuple(x.shape)}")
    B, H, T, d_k = x.shape
    # transpose makes x non-contiguous, so reshape (which copies) not view
    return x.transpose(1, 2).reshape(B, T, H * d_k)  # (B, T, H*d_k)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    r"""Repeat each key/value head ``n_rep`` times along the head axis.

    $g$ K/V heads serve $h = g\,n_{\text{rep}}$ query heads: query head
    $i$ reads K/V head $\lfloor i / n_{\text{rep}} \rfloor$ (Llama layout).

    Args:
        x: ``(B, G, S, d_k)``; n_rep: ``n_heads // n_kv_heads`` (>= 1).

    Returns:
        ``(B, G * n_rep, S, d_k)``; ``x`` itself when ``n_rep == 1``.

    Introduced in chapter 5.
    """
    check_int("n_rep", n_rep, minimum=1)
    if x.dim() != 4:
        raise ValueError(
            f"x must have shape (B, G, S, d_k), got {tuple(x.shape)}")
    if n_rep == 1:
        return x
    B, G, S, d_k = x.shape
    # expand is a view (no copy); the reshape then materialises the copies.
    x = x[:, :, None, :, :].expand(B, G, n_rep, S, d_k)  # (B, G, r, S, d_k)
    return x.reshape(B, G * n_rep, S, d_k)               # (B, H, S, d_k)


def mask_to_4d(mask, B: int, H: int, T: int, S: int):
    """Bring a boolean mask (True = may attend) to 4-D (.., .., T, S),
    checking that it broadcasts to ``(B, H, T, S)``.

    A 3-D mask is read as per-example, (B, T, S) or (B, 1, S), so it
    gains a head axis at 1: broadcasting it as-is would align its batch
    axis with the head axis. ``None`` passes through.

    Introduced in chapter 5.
    """
    if mask is None:
        return None
    check_bool_mask("mask", mask)
    target, shape = (B, H, T, S), tuple(mask.shape)
    m4 = mask[:, None] if mask.dim() == 3 else mask      # (B, 1, T|1, S)
    if not (m4.dim() in (2, 4) and broadcasts_to(m4.shape, target)):
        raise ValueError(
            f"mask of shape {shape} does not broadcast to (B, H, T, S) "
            f"= {target}; expected (T, S), (B, 1, S), (B, T, S) or "
            f"(B, H, T, S)")
    return m4


def query_positions(positions, T: int, cache, device) -> torch.Tensor:
    """The absolute positions (T,) of T queries: ``positions`` as given
    (checked to have shape (T,) and, with a cache, to continue it), or by
    default the T positions after those already in ``cache`` (0.. without
    one). Used by every attention layer that rotates by position.

    Introduced in chapter 5.
    """
    if positions is None:
        past = len(cache) if cache is not None else 0
        return torch.arange(past, past + T, device=device)   # (T,)
    if not isinstance(positions, torch.Tensor) or \
            tuple(positions.shape) != (T,):
        got = getattr(positions, "shape", positions)
        raise ValueError(f"positions must be a tensor of shape (T,) = "
                         f"({T},), got {got}")
    if cache is not None:
        cache.check_next(positions)        # rotations must match the keys
    return positions

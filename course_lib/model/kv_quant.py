r"""Symmetric int8 quantisation of cached keys and values.

A cached tensor $x$ is stored as 8-bit integers $q$ and a scale $s$
shared by a group of values:

$$s = \frac{\max_{\text{group}} |x|}{127}, \qquad
q = \mathrm{clamp}\big(\mathrm{round}(x / s), -127, 127\big), \qquad
\hat x = s\,q .$$

Rounding to the nearest grid point moves each value by at most half a
step, $|x - \hat x| \le s/2$, and a value already on the grid ($x = s\,n$
with the same $s$) comes back exactly. The group is chosen by ``dim``, the
axis (or axes) that share one scale: ``dim=-1`` gives one scale per token
and head, over the $d_h$ features; ``dim=-2`` gives one per channel, over
the cached tokens, the choice KIVI (Liu et al. 2024) makes for keys, whose
large values sit in a few fixed channels of trained models.

Stored as int8 plus one scale per group, a cache takes about half the
bytes of fp16 and a quarter of fp32 (the scales add $2/d_h$ of a byte per
value at fp16 when grouped per token).

Shape letters: B batch, G key/value heads, S cached tokens, d_h head
width; ``...`` any shape.
"""
from __future__ import annotations

import torch

from .._util.validation import check_int, check_type

__all__ = ["quantize_int8", "dequantize_int8", "fake_quantize_int8"]

QMAX = 127      # symmetric: -127..127, so that -x quantises to -q


def quantize_int8(x: torch.Tensor, *, dim: int | tuple[int, ...] = -1
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$q = \mathrm{round}(x / s)$ with $s = \max |x| / 127$ per group.

    Args:
        x: a floating tensor ``(...)``, e.g. keys ``(B, G, S, d_h)``.
        dim: the axis or axes over which one scale is shared (``-1``:
            per token and head; ``-2``: per channel).

    Returns:
        ``(q, scale)``: int8 ``q`` of ``x``'s shape and ``scale`` of
        ``x``'s dtype, with size 1 along ``dim`` (``(B, G, S, 1)`` for
        ``dim=-1``). A group of zeros gets scale 1 (any scale is exact).
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating tensor, got {x.dtype}")
    dims = dim if isinstance(dim, tuple) else (dim,)
    if not dims:
        raise ValueError("dim must name at least one axis, got ()")
    for d in dims:
        check_int("dim", d, minimum=-x.dim(), maximum=x.dim() - 1)
    amax = x.abs().amax(dim=dims, keepdim=True)              # (..., 1, ...)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(x / scale).clamp(-QMAX, QMAX)            # x's shape
    return q.to(torch.int8), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    r"""$\hat x = s\,q$, in the scale's dtype.

    Args:
        q: int8 ``(...)`` from :func:`quantize_int8`.
        scale: its scale, broadcastable to ``q``.

    Returns:
        ``(...)`` floating tensor, within ``scale / 2`` of the original.
    """
    check_type("q", q, torch.Tensor, "a torch.Tensor")
    if q.dtype != torch.int8:
        raise TypeError(f"q must be an int8 tensor, got {q.dtype}")
    check_type("scale", scale, torch.Tensor, "a torch.Tensor")
    return q.to(scale.dtype) * scale                         # (...)


def fake_quantize_int8(x: torch.Tensor, *,
                       dim: int | tuple[int, ...] = -1) -> torch.Tensor:
    r"""Quantise and dequantise at once: the values an int8 cache would
    hand back to attention, in ``x``'s dtype. Applied again it returns
    the same values up to float rounding (each group's largest magnitude
    is already $127\,s$), so a growing cache can be re-quantised whole
    after each step: only the new tokens change."""
    return dequantize_int8(*quantize_int8(x, dim=dim))

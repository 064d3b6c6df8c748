r"""Probes of chapter 2: the sinusoidal table's rotation identity, its
offset dot products, the clock-hands picture, and a one-head
self-attention that shows why RoPE is applied after the projections.

$PE(p + k) = R(k)\,PE(p)$ for a block-diagonal rotation $R(k)$ that does
not depend on $p$ (:func:`rotation_matrix`), and $PE(p) \cdot PE(p + k)$
depends on $k$ only (:func:`offset_dot_product`).

Shape letters: T sequence length, D feature width, P = D/2 feature
pairs, ... leading dimensions.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_alloc, check_even, check_real, check_type
from ..model.rope import apply_rope
from ..model.sinusoidal import frequencies

__all__ = ["rotation_matrix", "offset_dot_product", "draw_clock_hands",
           "self_attention"]


def rotation_matrix(k: float, d_model: int, base: float = 10000.0,
                    *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""Block-diagonal $R(k)$ with $PE(p + k) = R(k)\,PE(p)$ for every $p$.

    By the angle-addition formulas, with $a = p\omega_i$, $c = k\omega_i$:
    $\sin(a + c) = \cos c \sin a + \sin c \cos a$ and
    $\cos(a + c) = -\sin c \sin a + \cos c \cos a$, so block $i$ is
    $\begin{pmatrix} \cos c & \sin c \\ -\sin c & \cos c
    \end{pmatrix}$ acting on $(\sin a, \cos a)$. It depends on $k$ only.

    Args:
        k: the offset (any real, negative allowed).
        d_model, base: feature width $D$ (even) and the constant $b$.
        dtype: floating dtype of the result.
    Returns:
        orthogonal tensor of shape (D, D).
    """
    check_real("k", k, positive=False)
    check_even("d_model", d_model)
    # An integer dtype would round every sin and cos to 0 or 1.
    check_type("dtype", dtype, torch.dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    check_alloc("d_model * d_model", d_model * d_model)
    c = k * frequencies(d_model, base)                         # (P,)
    cos, sin = torch.cos(c), torch.sin(c)                      # (P,)
    r = torch.zeros(d_model, d_model, dtype=torch.float64)     # (D, D)
    even = torch.arange(0, d_model, 2)                         # (P,)
    r[even, even] = cos
    r[even, even + 1] = sin
    r[even + 1, even] = -sin
    r[even + 1, even + 1] = cos
    return r.to(dtype)


def offset_dot_product(offsets: torch.Tensor, d_model: int,
                       base: float = 10000.0) -> torch.Tensor:
    r"""$PE(p) \cdot PE(p + k) = \sum_i \cos(k\,\omega_i)$, any $p$.

    Each pair contributes $\sin a \sin(a + c) + \cos a \cos(a + c) =
    \cos c$. The result does not involve $p$ and is even in $k$.

    Args:
        offsets: tensor of offsets $k$, any shape (...).
        d_model, base: feature width $D$ (even) and the constant $b$.
    Returns:
        float64 tensor of shape (...).
    """
    if not isinstance(offsets, torch.Tensor):
        raise TypeError(
            f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
    check_even("d_model", d_model)
    # one cosine per offset and feature pair
    check_alloc("offsets.numel() * d_model / 2",
                offsets.numel() * (d_model // 2))
    w = frequencies(d_model, base)                             # (P,)
    k = offsets.to(torch.float64)[..., None]                   # (..., 1)
    return torch.cos(k * w).sum(-1)                            # (...)


# ----------------------------------------------------------- the picture
def draw_clock_hands(fig, *, position: float, d_model: int = 16,
                     base: float = 10000.0, ncols: int = 4) -> None:
    r"""Draw $PE(p)$ as $D/2$ clock faces, one hand per feature pair.

    Pair $i$ is the point $(\sin p\omega_i, \cos p\omega_i)$: plotted
    with the sine on the x axis and the cosine on the y axis it is a clock
    hand that starts at 12 o'clock for $p = 0$ and turns clockwise by
    $\omega_i$ radians per position. Pair 0 is the fast seconds hand; the
    last pair barely moves.

    Args:
        fig: an empty matplotlib Figure to draw into.
        position: the position $p$ (may be fractional).
        d_model: even feature width $D$ (one clock per pair).
        base: the constant $b$; ncols: clocks per row.
    Returns:
        None (draws into ``fig``).
    """
    if not hasattr(fig, "add_subplot"):
        raise TypeError(f"fig must be a matplotlib Figure, got "
                        f"{type(fig).__name__}")
    check_real("position", position, positive=False)
    w = frequencies(d_model, base).tolist()                    # (P,)
    n = d_model // 2
    circle = torch.linspace(0, 2 * math.pi, 121)
    for i in range(n):
        ax = fig.add_subplot(math.ceil(n / ncols), ncols, i + 1)
        a = position * w[i]
        ax.plot(torch.sin(circle), torch.cos(circle), color="0.6", lw=1)
        ax.plot([0, 0], [0.85, 1.0], color="0.6", lw=1)       # 12 o'clock
        ax.plot([0, math.sin(a)], [0, math.cos(a)], color="C3", lw=2.5,
                solid_capstyle="round")
        ax.plot([0], [0], "o", color="0.2", ms=3)
        lam = 2 * math.pi / w[i]                       # wavelength
        lam_txt = f"{lam:.1f}" if lam < 100 else f"{lam:,.0f}"
        ax.set_title(f"pair {i}: λ = {lam_txt}", fontsize=8)
        ax.set(xlim=(-1.15, 1.15), ylim=(-1.15, 1.15), aspect="equal")
        ax.axis("off")
    fig.suptitle(f"PE(p) for p = {position:g} as {n} clock hands "
                 f"(sin → x, cos → y)", fontsize=10)


def self_attention(x: torch.Tensor, *, w_q: torch.Tensor,
                   w_k: torch.Tensor, w_v: torch.Tensor,
                   positions: torch.Tensor | None = None,
                   base: float = 10000.0) -> torch.Tensor:
    r"""Single-head self-attention, optionally with RoPE on $q$ and $k$.

    $\mathrm{softmax}(QK^\top / \sqrt{d_k})\,V$ with $Q = XW^Q$,
    $K = XW^K$, $V = XW^V$. If ``positions`` is given, $Q$ and $K$ (not
    $V$) are rotated with :func:`apply_rope` after the projection. A
    minimal helper for this chapter; chapter 3 treats attention properly.

    Args:
        x: tensor (..., T, D).
        w_q, w_k, w_v: projections (D, d_k), (D, d_k), (D, d_v);
            d_k even if RoPE is used.
        positions, base: None (no positions), or as in :func:`apply_rope`.
    Returns:
        tensor (..., T, d_v).
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, D), got "
                         f"{tuple(x.shape)}")
    d = x.shape[-1]
    for name, w in (("w_q", w_q), ("w_k", w_k), ("w_v", w_v)):
        check_type(name, w, torch.Tensor, "a torch.Tensor")
        if w.dim() != 2 or w.shape[0] != d:
            raise ValueError(f"{name} must have shape ({d}, ...), got "
                             f"{tuple(w.shape)}")
    if w_q.shape[1] != w_k.shape[1]:
        raise ValueError(f"w_q and w_k must have the same width, got "
                         f"{w_q.shape[1]} and {w_k.shape[1]}")
    q, k, v = x @ w_q, x @ w_k, x @ w_v              # (..., T, d_k|d_v)
    if positions is not None:
        # After the projection: a rotation applied to x would be mixed
        # away by W^Q and W^K and the scores would not stay relative.
        q = apply_rope(q, positions, base=base,
                       interleave=True)                        # (..., T, d_k)
        k = apply_rope(k, positions, base=base,
                       interleave=True)                        # (..., T, d_k)
    # scores = Q K^T / sqrt(d_k)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., T, T)
    return torch.softmax(scores, dim=-1) @ v                   # (..., T, d_v)

r"""The sinusoidal positional encoding (Vaswani et al. 2017): a fixed table
added to the embeddings once, at the input, built on one list of angular
frequencies, one per pair of features,

$$\omega_i = \text{base}^{-2i/D}, \qquad i = 0, \dots, D/2 - 1,$$

which rotary embeddings (:mod:`course_lib.positional`) reuse.

Shape letters: L positions in a table (``length``), D feature width
(``d_model``), P = D/2 feature pairs, ... leading dimensions.

Introduced in chapter 2.
"""
from __future__ import annotations

import math

import torch

from .validation import check_int, check_real

__all__ = ["frequencies", "wavelengths", "sinusoidal_encoding",
           "rotation_matrix", "offset_dot_product", "draw_clock_hands"]


# --------------------------------------------------------------- checks
def _check_d_model(name: str, value) -> None:
    check_int(name, value, minimum=2)
    if value % 2:
        raise ValueError(
            f"{name} must be even, got {value} (features come in pairs)")



# ---------------------------------------------------- sinusoidal encoding
def frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    r"""Angular frequency of each feature pair, $\omega_i = b^{-2i/D}$.

    Pair $i$ turns by $\omega_i$ radians per position: pair 0 by one
    radian, the last pair by $b^{-(D-2)/D}$, just above $1/b$.

    Args:
        d_model: even feature width $D$.
        base: the constant $b$ (10000 in the paper).
    Returns:
        float64 tensor of shape (P,) = (D/2,), decreasing.

    Introduced in chapter 2.
    """
    _check_d_model("d_model", d_model)
    check_real("base", base, positive=True)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)   # (P,)
    # w_i = base^(-2i/D)
    return base ** (-two_i / d_model)                          # (P,)


def wavelengths(d_model: int, base: float = 10000.0) -> torch.Tensor:
    r"""Wavelength of each pair in positions, $\lambda_i = 2\pi b^{2i/D}$.

    A geometric progression from $2\pi$ (pair 0) up to
    $2\pi b^{(D-2)/D}$ for the last pair. The paper rounds this to
    "$10000 \cdot 2\pi$"; the exact largest value is slightly smaller.

    Args:
        d_model, base: feature width $D$ (even) and the constant $b$.
    Returns:
        float64 tensor of shape (P,), increasing.

    Introduced in chapter 2.
    """
    # lambda_i = 2 pi / w_i
    return 2 * math.pi / frequencies(d_model, base)            # (P,)


def sinusoidal_encoding(length: int, d_model: int, base: float = 10000.0,
                        *, dtype: torch.dtype = torch.float32
                        ) -> torch.Tensor:
    r"""The fixed sinusoidal table of Vaswani et al. (2017).

    $PE_{p, 2i} = \sin(p\,\omega_i)$ and $PE_{p, 2i+1} = \cos(p\,
    \omega_i)$ with $\omega_i = b^{-2i/D}$: each pair of columns is a
    point on the unit circle that turns by $\omega_i$ per position.

    Args:
        length: number of positions $L$ (rows), positions $0 .. L-1$.
        d_model: even feature width $D$ (columns).
        base: the constant $b$; dtype: floating dtype of the result.
    Returns:
        tensor of shape (L, D).

    Introduced in chapter 2.
    """
    check_int("length", length, minimum=1)
    w = frequencies(d_model, base)                             # (P,)
    pos = torch.arange(length, dtype=torch.float64)            # (L,)
    # Angles in float64: p * w_i reaches thousands of radians, where
    # float32 would already lose the third decimal of sin and cos.
    angle = pos[:, None] * w[None, :]                          # (L, P)
    pe = torch.empty(length, d_model, dtype=torch.float64)     # (L, D)
    # PE[p, 2i] = sin(p w_i)
    pe[:, 0::2] = torch.sin(angle)
    # PE[p, 2i+1] = cos(p w_i)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(dtype)


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

    Introduced in chapter 2.
    """
    check_real("k", k, positive=False)
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

    Introduced in chapter 2.
    """
    if not isinstance(offsets, torch.Tensor):
        raise ValueError(
            f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
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

    Introduced in chapter 2.
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

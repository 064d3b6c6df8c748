r"""The sinusoidal positional encoding (Vaswani et al. 2017): a fixed table
added to the embeddings once, at the input, built on one list of angular
frequencies, one per pair of features,

$$\omega_i = \text{base}^{-2i/D}, \qquad i = 0, \dots, D/2 - 1,$$

which rotary embeddings (:mod:`course_lib.model.rope`) reuse.

Shape letters: L positions in a table (``length``), D feature width
(``d_model``), P = D/2 feature pairs, ... leading dimensions.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import (
    check_alloc,
    check_even,
    check_int,
    check_real,
    check_type,
)

__all__ = ["frequencies", "wavelengths", "sinusoidal_encoding"]


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
    """
    check_even("d_model", d_model)
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
    """
    check_int("length", length, minimum=1)
    check_even("d_model", d_model)
    # An integer dtype would round every sin and cos to 0 or 1.
    check_type("dtype", dtype, torch.dtype, "a torch.dtype")
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    check_alloc("length * d_model", length * d_model)
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

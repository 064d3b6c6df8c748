r"""Rotary position embedding (RoPE, Su et al. 2021).

Self-attention treats its input as a set, so order has to be injected.
The sinusoidal table (:mod:`course_lib.model.sinusoidal`) is added to the
embeddings once, at the input. RoPE instead rotates queries and keys in
every attention layer, so that their dot product depends only on the
offset between two positions. Feature pair $i$ turns by

$$\theta_i = \text{base}^{-2i/D}, \qquad i = 0, \dots, D/2 - 1$$

radians per position, the frequencies of the sinusoidal table.

Shape letters: L positions in a table (``length``), T sequence length,
D feature width (``d_model`` for the table, the head width for RoPE),
P = D/2 feature pairs, ... leading batch dimensions (B batch, H heads).
"""
from __future__ import annotations

import torch
from torch import nn

from .._util.validation import check_bool, check_even, check_real

__all__ = ["rope_permutation", "apply_rope", "RotaryEmbedding", "rope_cos_sin"]


# ---------------------------------------------------------------- RoPE
def rope_permutation(d_model: int) -> torch.Tensor:
    r"""Index that turns the interleaved layout into the split-halves one.

    Interleaved RoPE rotates the pairs $(2i, 2i+1)$; split-halves
    ("rotate_half") RoPE rotates $(i, i + D/2)$. With ``perm`` from this
    function, ``x[..., perm]`` moves feature $2i$ to slot $i$ and $2i+1$ to
    slot $i + D/2$, so ``apply_rope(x, ...)[..., perm] ==
    apply_rope(x[..., perm], ..., interleave=False)``.

    Args:
        d_model: even feature width $D$.
    Returns:
        int64 tensor (D,): [0, 2, 4, ..., D-2, 1, 3, ..., D-1].
    """
    check_even("d_model", d_model)
    return torch.cat([torch.arange(0, d_model, 2),
                      torch.arange(1, d_model, 2)])            # (D,)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, *,
               base: float = 10000.0, interleave: bool = False
               ) -> torch.Tensor:
    r"""Rotate each feature pair of ``x`` by its position times $\theta_i$.

    With $\theta_i = b^{-2i/D}$, pair $(x_a, x_b)$ of the vector at
    position $m$ becomes $(x_a \cos m\theta_i - x_b \sin m\theta_i,\;
    x_a \sin m\theta_i + x_b \cos m\theta_i)$, i.e. the complex number
    $x_a + \mathrm{i}\,x_b$ times $e^{\mathrm{i} m \theta_i}$. Then
    $\langle \mathrm{rope}(q, m), \mathrm{rope}(k, n)\rangle$ depends
    on $m - n$ only. Apply it to queries and keys, never to values.

    Args:
        x: tensor (..., T, D) with D even (queries or keys of one head).
        positions: integer or float tensor (T,), or any shape that
            broadcasts to ``x.shape[:-1]``.
        base: the constant $b$.
        interleave: True rotates pairs $(2i, 2i+1)$ as in the RoPE paper;
            False rotates $(i, i + D/2)$ as Llama-style "rotate_half" code.
    Returns:
        tensor of the same shape and dtype as ``x``.

    An inner step of every attention layer, run at every position of
    every decoding step: it trusts its caller (:class:`RotaryEmbedding`
    checks the width, base and pairing once, at construction).
    """
    d = x.shape[-1]
    cos, sin = rope_cos_sin(positions, d, base=base, dtype=x.dtype)
    # Interleaved pairs (2i, 2i+1); split halves pair i with i + D/2.
    xa, xb = ((x[..., 0::2], x[..., 1::2]) if interleave       # (..., T, P)
              else (x[..., : d // 2], x[..., d // 2:]))        # (..., T, P)
    # (xa + i xb) * e^{i m theta} = (xa cos - xb sin) + i (xa sin + xb cos)
    ya = xa * cos - xb * sin                                   # (..., T, P)
    yb = xa * sin + xb * cos                                   # (..., T, P)
    if interleave:
        return torch.stack([ya, yb], dim=-1).flatten(-2)       # (..., T, D)
    return torch.cat([ya, yb], dim=-1)                         # (..., T, D)


class RotaryEmbedding(nn.Module):
    r"""RoPE as a module: the position hook of multi-head attention.

    Holds the head width, the base $b$ and the pairing, and rotates a
    head's queries or keys by their positions with :func:`apply_rope`.
    It has no parameters, so a model's weights are the same with or
    without it; :class:`~course_lib.model.mha.MultiHeadAttention` calls it on
    $q$ and $k$ after the projections (chapter 5), which is all that
    turns Vaswani's attention into Llama's.

    Args:
        head_dim: even width $d_k$ of one head.
        base: the constant $b$ (10000 in the RoPE paper and Llama-2,
            500000 in Llama-3, 100000 in SmolLM2).
        interleave: pairing of the features, as in :func:`apply_rope`:
            False = "rotate half" $(i, i + d_k/2)$ of the Hugging Face
            Llama code (the default), True = adjacent pairs $(2i, 2i+1)$
            of the paper and of llama.cpp.
    """

    def __init__(self, head_dim: int, *, base: float = 10000.0,
                 interleave: bool = False) -> None:
        super().__init__()
        check_even("head_dim", head_dim)
        check_real("base", base, positive=True)
        check_bool("interleave", interleave)
        self.head_dim, self.base = head_dim, float(base)
        self.interleave = interleave

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, base={self.base:g}, "
                f"interleave={self.interleave}")

    def forward(self, x: torch.Tensor, positions: torch.Tensor
                ) -> torch.Tensor:
        """x (..., T, head_dim), positions (T,) -> rotated x, same shape."""
        return apply_rope(x, positions, base=self.base,
                          interleave=self.interleave)


def _theta(d: int, base: float, device: torch.device | str = "cpu"
           ) -> torch.Tensor:
    """theta_i = base^(-2i/D), float64 (P,) on ``device``: the sinusoidal
    table's frequencies (:func:`course_lib.model.sinusoidal.frequencies`)."""
    two_i = torch.arange(0, d, 2, dtype=torch.float64,
                         device=device)                        # (P,)
    return base ** (-two_i / d)                                # (P,)


_TABLES: dict = {}          # (D, base, dtype, device) -> (cos, sin) (L, P)
_TABLE_ROWS = 1 << 20       # positions beyond this are computed directly


def rope_cos_sin(positions: torch.Tensor, d: int, *, base: float = 10000.0,
                 dtype: torch.dtype = torch.float32
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$\cos m\theta_i$ and $\sin m\theta_i$ for every position $m$.

    Angles are computed in float64 (see :func:`sinusoidal_encoding`) and
    then cast. For integer positions $\ge 0$ the rows come from a table
    built once per (D, base, dtype, device), grown as needed: every layer
    of a model and every decoding step reuse it instead of recomputing
    the same cosines (chapter 13). Same numbers either way.

    Args:
        positions: tensor of any shape (...); d: even feature width D.
        base: the constant $b$; dtype: dtype of the result.
    Returns:
        cos, sin: tensors (..., P).
    """
    if not positions.is_floating_point() and positions.numel():
        lo, hi = positions.aminmax()
        if lo >= 0 and hi < _TABLE_ROWS:
            key = (d, float(base), dtype, positions.device)
            table = _TABLES.get(key)
            if table is None or table[0].shape[0] <= hi:
                # built on the CPU (float64 is slow on many GPUs),
                # then moved
                theta = _theta(d, base, "cpu")                 # (P,)
                L = max(1024, 1 << int(hi).bit_length())       # rows
                pos = torch.arange(L, dtype=torch.float64,
                                   device="cpu")               # (L,)
                angle = (pos[:, None] * theta).to(positions.device)
                if len(_TABLES) > 16:
                    _TABLES.clear()
                table = _TABLES[key] = (torch.cos(angle).to(dtype),
                                        torch.sin(angle).to(dtype))
            return table[0][positions], table[1][positions]  # (..., P)
    theta = _theta(d, base, positions.device)                  # (P,)
    # Angles m * theta_i in float64, then cast.
    angle = positions.to(torch.float64)[..., None] * theta     # (..., P)
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)

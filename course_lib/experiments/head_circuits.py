r"""The QK and OV circuits of one attention head (Elhage et al. 2021).

Head $i$ of a layer without RoPE reads the rows $x_t \in \mathbb{R}^D$ of
its input. With the biases folded into an extra input feature,
$\tilde x = [x, 1] \in \mathbb{R}^{D+1}$ and
$\tilde W^Q_i = \begin{bmatrix} W^Q_i \\ b^Q_i \end{bmatrix}
\in \mathbb{R}^{(D+1) \times d_k}$ (likewise $\tilde W^K_i$, $\tilde W^V_i$),
the head computes

$$s_{tj} = \frac{(\tilde x_t \tilde W^Q_i)(\tilde x_j \tilde W^K_i)^\top}
{\sqrt{d_k}} = \tilde x_t\, W^{QK}_i\, \tilde x_j^\top, \qquad
W^{QK}_i = \frac{\tilde W^Q_i (\tilde W^K_i)^\top}{\sqrt{d_k}}
\in \mathbb{R}^{(D+1) \times (D+1)},$$

$$\mathrm{head}_i W^O_i = A\, \tilde X\, W^{OV}_i, \qquad
W^{OV}_i = \tilde W^V_i\, W^O_i \in \mathbb{R}^{(D+1) \times D},$$

where $A = \mathrm{softmax}(S + M)$ and $W^O_i$ is the head's block of
$d_k$ rows of $W^O$. So one $(D+1) \times (D+1)$ bilinear form (the
**QK circuit**) decides where the head looks, and one
$(D+1) \times D$ linear map (the **OV circuit**) decides what it writes
into the residual stream; $W^Q_i$ and $W^K_i$ never matter separately,
only their product, of rank at most $d_k$. The layer's output is
$\sum_i A_i \tilde X W^{OV}_i + b^O$ (:func:`circuit_output`).

RoPE rotates $q$ and $k$ by position, which puts a position-dependent
rotation between $W^Q_i$ and $W^K_i$; these functions reject such a layer.

Shape letters: B batch, T length, D = ``d_model``, d_k head width.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_int, check_type
from ..model.mha import MultiHeadAttention, mask_to_4d

__all__ = ["qk_circuit", "ov_circuit", "circuit_output"]


def _check(mha, head) -> None:
    check_type("mha", mha, MultiHeadAttention, "a MultiHeadAttention")
    if mha.rope is not None:
        raise ValueError("mha must have no RoPE (rope=None): with RoPE the "
                         "QK circuit depends on the positions")
    check_int("head", head, minimum=0)
    if head >= mha.n_heads:
        raise ValueError(f"head must be < n_heads={mha.n_heads}, got {head}")


def _augmented(proj: torch.nn.Linear, rows: slice) -> torch.Tensor:
    """``[W; b]`` of a head: ``(D + 1, d_k)`` (a zero bias row if none)."""
    w = proj.weight[rows].T                                  # (D, d_k)
    b = proj.bias[rows] if proj.bias is not None else \
        torch.zeros(w.shape[1], dtype=w.dtype)
    return torch.cat([w, b[None]], dim=0)                    # (D+1, d_k)


@torch.no_grad()
def qk_circuit(mha: MultiHeadAttention, head: int) -> torch.Tensor:
    r"""$W^{QK}_i = \tilde W^Q_i (\tilde W^K_i)^\top / \sqrt{d_k}$.

    The score of query row $x_t$ for key row $x_j$ is
    $[x_t, 1]\, W^{QK}_i\, [x_j, 1]^\top$. Its top-left $D \times D$ block
    compares the two rows; the last row and column come from the biases.

    Args:
        mha: a :class:`MultiHeadAttention` without RoPE.
        head: query head $i$ (GQA: it reads K/V head $\lfloor i / r
            \rfloor$).

    Returns:
        ``(D + 1, D + 1)``.
    """
    _check(mha, head)
    d_k, g = mha.head_dim, head // mha.n_rep
    wq = _augmented(mha.q_proj, slice(head * d_k, (head + 1) * d_k))
    wk = _augmented(mha.k_proj, slice(g * d_k, (g + 1) * d_k))
    return wq @ wk.T / math.sqrt(d_k)                        # (D+1, D+1)


@torch.no_grad()
def ov_circuit(mha: MultiHeadAttention, head: int) -> torch.Tensor:
    r"""$W^{OV}_i = \tilde W^V_i W^O_i$: what head $i$ writes, per key row.

    A key row $x_j$ read with weight 1 adds $[x_j, 1]\,W^{OV}_i$ to the
    query's output (``o_proj``'s bias is shared by all heads and is not
    part of any head).

    Args:
        mha: a :class:`MultiHeadAttention` without RoPE.
        head: query head $i$.

    Returns:
        ``(D + 1, D)``.
    """
    _check(mha, head)
    d_k, g = mha.head_dim, head // mha.n_rep
    wv = _augmented(mha.v_proj, slice(g * d_k, (g + 1) * d_k))
    w_o = mha.o_proj.weight[:, head * d_k:(head + 1) * d_k].T  # (d_k, D)
    return wv @ w_o                                          # (D+1, D)


@torch.no_grad()
def circuit_output(mha: MultiHeadAttention, x: torch.Tensor, head: int,
                   mask: torch.Tensor | None = None):
    r"""Head $i$'s contribution to the layer output, from its circuits alone.

    $S = \tilde X W^{QK}_i \tilde X^\top$, $A = \mathrm{softmax}(S)$ over
    the keys that ``mask`` allows, output $A \tilde X W^{OV}_i$. Summed over
    the heads, plus ``o_proj``'s bias, this is ``mha(x, mask)``.

    Args:
        mha: a :class:`MultiHeadAttention` without RoPE.
        x: ``(B, T, D)`` the layer's input (self-attention).
        head: query head $i$.
        mask: bool, True = may attend, as for ``mha``. A query row with
            no allowed key gets zero weights and a zero output, as in
            :func:`~course_lib.model.attention.scaled_dot_product_attention`.

    Returns:
        ``(output (B, T, D), weights (B, T, T))``.
    """
    _check(mha, head)
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if x.dim() != 3 or x.shape[-1] != mha.d_model:
        raise ValueError(f"x must have shape (B, T, d_model={mha.d_model}),"
                         f" got {tuple(x.shape)}")
    B, T, D = x.shape
    x1 = torch.cat([x, x.new_ones(B, T, 1)], dim=-1)         # (B, T, D+1)
    scores = x1 @ qk_circuit(mha, head) @ x1.transpose(1, 2)  # (B, T, T)
    m4 = mask_to_4d(mask, B, mha.n_heads, T, T)
    has_key = None
    if m4 is not None:
        m = m4 if m4.dim() == 2 else m4[:, head if m4.shape[1] > 1 else 0]
        # a row with no allowed key would be 0/0: let it attend everywhere,
        # then zero it (scaled_dot_product_attention's rule)
        has_key = m.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~(m | ~has_key), float("-inf"))
    weights = scores.softmax(dim=-1)                         # (B, T, T)
    if has_key is not None:
        weights = weights * has_key                          # zero dead rows
    return weights @ x1 @ ov_circuit(mha, head), weights     # (B, T, D)

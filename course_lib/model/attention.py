r"""Scaled dot-product attention, its masks, and the cost of its L x L weights.

Each query $q_i$ is compared with every key $k_j$ by a dot product; the
softmax of the scaled scores gives weights that average the values:

$$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(
  \frac{QK^\top}{\sqrt{d_k}} + M\right) V,$$

where $M_{ij} = 0$ if query $i$ may attend to key $j$ and $-\infty$ if
not. Masks are boolean tensors, True = "may attend"; $M$ is built from
them inside :func:`scaled_dot_product_attention`. Why the scores are
divided by $\sqrt{d_k}$ is measured in
:mod:`course_lib.experiments.score_scaling`; the cost of the $L \times L$
weights in :mod:`course_lib.experiments.attention_cost`.

Shape letters: B batch, H heads, Lq queries, Lk keys (and values), d_k
query/key width, d_v value width, n softmax width, R random rows, ... any
leading batch dimensions (e.g. (B,) or (B, H)).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .._util.validation import check_attention_inputs, check_bool

__all__ = ["scaled_dot_product_attention", "attend", "fused_attention",
           "fused_attend"]


# ------------------------------------------------------------ attention
def scaled_dot_product_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        mask: torch.Tensor | None = None, *, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""$\mathrm{softmax}(QK^\top s + M)\,V$ with $s = 1/\sqrt{d_k}$, and
    the weights $A = \mathrm{softmax}(QK^\top s + M)$.

    Every step is written out: scores $S = QK^\top s$, disallowed
    entries set to $-\infty$ (so $e^{-\infty} = 0$ removes them from the
    softmax), row-wise softmax $A$, then $AV$. A query row with no
    allowed key would be $0/0$; it gets zero weights and a zero output
    instead of NaN. :func:`fused_attention` computes the same output in
    torch's fused kernel, which never forms $A$.

    Args:
        q, k, v: queries (..., Lq, d_k), keys (..., Lk, d_k), values
            (..., Lk, d_v); leading dims broadcast.
        mask: None, or bool tensor broadcastable to (..., Lq, Lk),
            True where query i may attend to key j.
        scale: multiplier $s$ of the scores; default $1/\sqrt{d_k}$.
    Returns:
        ``(out, weights)``: out (..., Lq, d_v) and the attention weights
        $A$ (..., Lq, Lk).
    """
    scale = check_attention_inputs(q, k, v, mask, scale)
    return attend(q, k, v, mask, scale)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           mask: torch.Tensor | None, scale: float
           ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""The computation of :func:`scaled_dot_product_attention`, for
    callers that have validated its arguments (a
    :class:`~course_lib.model.mha.MultiHeadAttention` checks its inputs
    once per call, then runs this in every head at once): ``(out,
    weights)`` = $(AV, A)$ with $A = \mathrm{softmax}(QK^\top s + M)$.
    """
    # A row with no allowed key: let it attend everywhere (finite softmax,
    # finite gradients) and zero it afterwards.
    has_key = None if mask is None else mask.any(dim=-1, keepdim=True)
    safe_mask = None if mask is None else mask | ~has_key  # (..., Lq, Lk)
    # 1) Scores S = Q K^T s (scaling q first costs Lq*d_k, not Lq*Lk),
    #    in float32 for half-precision q, k: scores can pass fp16's 65504.
    if q.element_size() < 4:
        q, k = q.float(), k.float()
    scores = (q * scale) @ k.transpose(-2, -1)             # (..., Lq, Lk)
    # 2) Additive mask: S + M with M = -inf where the mask is False.
    if safe_mask is not None:
        scores = scores.masked_fill(~safe_mask, float("-inf"))
    # 3) A = softmax(S + M) along the keys (then back to v's dtype).
    weights = torch.softmax(scores, dim=-1).to(v.dtype)    # (..., Lq, Lk)
    if has_key is not None:
        weights = weights * has_key                        # zero dead rows
    # 4) out = A V: each output row is a weighted average of value rows.
    out = weights @ v                                      # (..., Lq, d_v)
    return out, weights


def fused_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None = None, *,
                    scale: float | None = None,
                    enable_gqa: bool = False) -> torch.Tensor:
    r"""The output of :func:`scaled_dot_product_attention` from torch's
    fused kernel (``torch.nn.functional.scaled_dot_product_attention``).

    The kernel works block by block and never holds the (..., Lq, Lk)
    weights, so it returns the output only. The same results up to
    rounding, fully masked query rows zeroed as well.

    Args:
        q, k, v, mask, scale: as :func:`scaled_dot_product_attention`.
        enable_gqa: q (B, H, Lq, d_k) with k, v (B, G, Lk, d) and H a
            multiple of G: each K/V head serves H/G query heads inside
            the kernel, without copies (chapter 5's GQA).
    Returns:
        out (..., Lq, d_v).
    """
    check_bool("enable_gqa", enable_gqa)
    scale = check_attention_inputs(q, k, v, mask, scale, gqa=enable_gqa)
    return fused_attend(q, k, v, mask, scale, enable_gqa)


def fused_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 mask: torch.Tensor | None, scale: float,
                 enable_gqa: bool) -> torch.Tensor:
    """The computation of :func:`fused_attention`, for callers that have
    validated its arguments (as :func:`attend` for the explicit path).
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=scale,
                                              enable_gqa=enable_gqa)
    has_key = mask.any(dim=-1, keepdim=True)               # (..., Lq, 1)
    # The kernel adds the mask to Q K^T in place, so Q K^T must have the
    # mask's batch axes even when only v has them: expand q (a view).
    q = q.expand(*torch.broadcast_shapes(q.shape[:-2], mask.shape[:-2]),
                 *q.shape[-2:])
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | ~has_key, scale=scale,
        enable_gqa=enable_gqa)                             # (..., Lq, d_v)
    return out * has_key

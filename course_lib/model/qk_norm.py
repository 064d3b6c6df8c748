r"""QK-norm: RMSNorm on each head's queries and keys before the scores.

In ordinary attention a score $q \cdot k / \sqrt{d_k}$ grows with the
norms of $q$ and $k$, and in large models trained at high learning rates
those norms can grow until the softmax saturates to one key and training
diverges (Dehghani et al. 2023; Wortsman et al. 2023). QK-norm normalises
every query and key vector of a head with RMSNorm over its $d_k$
features, each with a learned gain, then attends as usual:

$$\hat q = \gamma_Q \odot \frac{q}{\mathrm{rms}(q)},\quad
\hat k = \gamma_K \odot \frac{k}{\mathrm{rms}(k)},\quad
\mathrm{out} = \mathrm{softmax}\!\left(\frac{\hat Q \hat K^\top}
{\sqrt{d_k}} + M\right) V,$$

with $\mathrm{rms}(u) = \sqrt{\frac{1}{d_k}\sum_c u_c^2 + \epsilon}$. With
unit gains every normalised vector has length $\sqrt{d_k}$ (up to
$\epsilon$), so every score lies in $[-\sqrt{d_k}, \sqrt{d_k}]$ whatever
the inputs. Qwen3 and Gemma 3 normalise per head with one gain of $d_k$
entries shared by all heads, as here; OLMo 2 normalises the whole
projection output instead. Values are not normalised.

Shape letters: B batch, H heads, T queries, S keys, d_k head width, d_v
value width.
"""
from __future__ import annotations

import torch

from .._util.validation import check_attention_inputs, check_shape
from .attention import attend
from .block import rms_norm

__all__ = ["qk_norm_attention"]


def qk_norm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      q_weight: torch.Tensor, k_weight: torch.Tensor,
                      mask: torch.Tensor | None = None, *,
                      eps: float = 1e-6) -> torch.Tensor:
    r"""Attention with RMSNorm applied to every query and key vector.

    Args:
        q: (B, H, T, d_k) queries; k: (B, H, S, d_k) keys; v: (B, H, S,
            d_v) values (any leading dims that broadcast).
        q_weight, k_weight: (d_k,) gains $\gamma_Q$, $\gamma_K$, shared by
            all heads.
        mask: None, or bool broadcastable to the scores (B, H, T, S);
            True where query t may read key s.
        eps: $\epsilon > 0$ of both norms.
    Returns:
        (B, H, T, d_v): $\mathrm{softmax}(\hat Q \hat K^\top / \sqrt{d_k}
        + M)\,V$, fully masked rows zero.
    """
    scale = check_attention_inputs(q, k, v, mask, None)
    d_k = q.shape[-1]
    check_shape("q_weight", q_weight, (d_k,), f"(d_k={d_k},)")
    check_shape("k_weight", k_weight, (d_k,), f"(d_k={d_k},)")
    q_hat = rms_norm(q, q_weight, eps)                    # (B, H, T, d_k)
    k_hat = rms_norm(k, k_weight, eps)                    # (B, H, S, d_k)
    out, _ = attend(q_hat, k_hat, v, mask, scale)         # (B, H, T, d_v)
    return out

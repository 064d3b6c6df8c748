r"""The acceptance step of speculative decoding (chapter 8's transfer
exercise).

A cheap draft model proposes a token $x \sim q$; the target model, whose
distribution is $p$, accepts it with probability

$$a(x) = \min\Big(1, \frac{p(x)}{q(x)}\Big),$$

and on a rejection a replacement is drawn from the residual distribution

$$r = \frac{\max(0,\, p - q)}{\sum_v \max(0,\, p_v - q_v)}.$$

The token that comes out is then distributed exactly as $p$ (Leviathan
et al. 2023; Chen et al. 2023): $q(x)\,a(x) = \min(p(x), q(x))$, and the
rejection mass $1 - \sum_v \min(p_v, q_v) = \sum_v \max(0, p_v - q_v)$
times $r$ supplies the rest, $\max(0, p - q)$. Where $p = q$ nothing is
ever rejected and the residual has no mass; :func:`speculative_acceptance`
then returns $p$ itself as the (never used) residual.

Shape letters: ``...`` any batch axes, V vocabulary.
"""
from __future__ import annotations

import torch

from .._util.validation import check_type

__all__ = ["speculative_acceptance"]


def speculative_acceptance(p: torch.Tensor, q: torch.Tensor,
                           draft: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Acceptance probability of a drafted token and the residual
    distribution to resample from on a rejection.

    $$a = \min\big(1, p(x) / q(x)\big), \qquad
    r = \mathrm{norm}\big(\max(0, p - q)\big)$$

    (``r = p`` where $p = q$: no mass to reject).

    Args:
        p: ``(..., V)`` the target model's probabilities (each row sums
            to 1).
        q: ``(..., V)`` the draft model's probabilities, same shape.
        draft: ``(...)`` integer ids of the drafted tokens, each with
            $q(x) > 0$ (it was drawn from $q$).

    Returns:
        ``(accept, residual)``: ``accept`` ``(...)`` in ``[0, 1]`` and
        ``residual`` ``(..., V)``, rows summing to 1, both in ``p``'s
        dtype.
    """
    for name, t in (("p", p), ("q", q), ("draft", draft)):
        check_type(name, t, torch.Tensor, "a torch.Tensor")
    if not p.dtype.is_floating_point or p.dim() < 1:
        raise ValueError(f"p must be a floating (..., V) tensor, got "
                         f"{p.dtype} of shape {tuple(p.shape)}")
    if q.dtype != p.dtype or q.shape != p.shape:
        raise ValueError(f"q must have p's dtype and shape {tuple(p.shape)},"
                         f" got {q.dtype} {tuple(q.shape)}")
    if draft.dtype.is_floating_point or draft.dtype == torch.bool \
            or draft.shape != p.shape[:-1]:
        raise ValueError(f"draft must be an integer tensor of shape "
                         f"{tuple(p.shape[:-1])}, got {draft.dtype} "
                         f"{tuple(draft.shape)}")
    if ((p < 0) | (q < 0)).any():
        raise ValueError("p and q must be probabilities (>= 0)")
    V = p.shape[-1]
    if ((draft < 0) | (draft >= V)).any():
        raise ValueError(f"draft must hold ids in [0, {V})")
    idx = draft[..., None]                                   # (..., 1)
    p_x = p.gather(-1, idx)[..., 0]                          # (...)
    q_x = q.gather(-1, idx)[..., 0]                          # (...)
    if (q_x <= 0).any():
        raise ValueError("every drafted token must have q(x) > 0 (the "
                         "draft model proposed it)")
    accept = torch.clamp(p_x / q_x, max=1.0)                 # (...)
    excess = torch.clamp(p - q, min=0.0)                     # (..., V)
    mass = excess.sum(-1, keepdim=True)                      # (..., 1)
    residual = torch.where(mass > 0, excess / mass.clamp(min=1e-300), p)
    return accept, residual

r"""Load balancing of a mixture of experts: keeping every expert in use.

Nothing in the language-model loss asks a router to spread the tokens,
and a router left alone collapses onto a few experts (chapter 11). Two
remedies, both measured in chapter 11:

- the **auxiliary loss** of the Switch Transformer,
  $E \sum_i f_i P_i$ (:func:`load_balancing_loss`), added to the training
  loss with a small coefficient; per sequence it is DeepSeek-V3's
  complementary sequence-wise loss;
- DeepSeek-V3's **auxiliary-loss-free** balancing: a per-expert bias that
  only the choice sees, moved against each expert's load after every step
  (:func:`update_bias`).

Both start from the load: token-slots per expert (:func:`expert_load`).

A third loss keeps the router's numbers small rather than its load even:
ST-MoE's **router z-loss** (:func:`router_z_loss`), the mean squared
log-sum-exp of the router logits.

Shape letters: N tokens, E experts, k experts per token, B and T as in
the rest of the library (see the package docstring).
"""
from __future__ import annotations

import torch
from torch import nn

from .._util.validation import check_int, check_real, check_type

__all__ = ["expert_load", "load_balancing_loss", "router_z_loss",
           "update_bias"]


def expert_load(indices: torch.Tensor, n_experts: int) -> torch.Tensor:
    r"""Token-slots per expert: $c_i = \#\{(t, j) : \mathrm{idx}_{t,j} = i\}$.

    Args:
        indices: ``(..., k)`` long chosen experts. n_experts: $E$.

    Returns:
        ``(E,)`` long counts; they sum to $N k$.
    """
    check_int("n_experts", n_experts, minimum=1)
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.long:
        raise ValueError(f"indices must be a long tensor, got "
                         f"{indices!r:.60}")
    if indices.numel() and (indices.min() < 0 or indices.max() >= n_experts):
        raise ValueError(f"indices must lie in [0, {n_experts}), got "
                         f"values in [{indices.min()}, {indices.max()}]")
    return torch.bincount(indices.reshape(-1), minlength=n_experts)


def load_balancing_loss(probs: torch.Tensor, indices: torch.Tensor,
                        n_experts: int) -> torch.Tensor:
    r"""Switch Transformer's auxiliary loss, $E \sum_i f_i P_i$.

    $f_i$ is the fraction of the $N k$ token-slots sent to expert $i$ and
    $P_i = \frac1N \sum_t p_{i,t}$ the mean router probability of expert
    $i$ (Fedus et al. 2022, eqs. 4-6). Only $P_i$ carries a gradient. A
    uniform router ($p_{i,t} = 1/E$) gives exactly 1 whatever the
    choices; if all slots pile onto the experts that also get all the
    probability the loss grows to $E$ (or $E/k$). Add ``coef * loss``
    per MoE layer to the training loss (Switch: coef $10^{-2}$).
    With ``(B, T, ...)`` inputs the loss is computed per sequence and
    averaged: DeepSeek-V3's complementary sequence-wise loss (eqs.
    17-20, with $\alpha$ as coef).

    Hugging Face's ``load_balancing_loss_func`` counts $f_i$ per choice
    rank and so returns $k$ times this value.

    Args:
        probs: ``(N, E)`` or ``(B, T, E)`` router probabilities.
        indices: ``(N, k)`` or ``(B, T, k)`` chosen experts.
        n_experts: $E$.

    Returns:
        Scalar tensor.
    """
    check_int("n_experts", n_experts, minimum=1)
    if not isinstance(probs, torch.Tensor) or probs.dim() not in (2, 3) \
            or probs.shape[-1] != n_experts:
        got = tuple(probs.shape) if isinstance(probs, torch.Tensor) else probs
        raise ValueError(f"probs must have shape (N, {n_experts}) or (B, T, "
                         f"{n_experts}), got {got!r:.60}")
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.long \
            or indices.shape[:-1] != probs.shape[:-1]:
        got = tuple(indices.shape) if isinstance(indices, torch.Tensor) \
            else indices
        raise ValueError(f"indices must be a long tensor of shape "
                         f"{tuple(probs.shape[:-1])} + (k,), got {got!r:.60}")
    expert_load(indices, n_experts)                          # range check
    if probs.shape[-2] == 0:
        return probs.new_zeros(())     # no tokens: nothing is imbalanced
    if indices.shape[-1] == 0:
        # f_i would be 0/0: a token must choose at least one expert
        raise ValueError(f"indices must hold k >= 1 chosen experts per "
                         f"token, got shape {tuple(indices.shape)}")
    one_hot = nn.functional.one_hot(indices, n_experts)      # (.., N, k, E)
    # f_i = (slots sent to i) / (N k)
    f = one_hot.flatten(-3, -2).float().mean(-2)             # (.., E)
    # P_i = mean_t p_{i,t}
    P = probs.mean(-2)                                       # (.., E)
    return (n_experts * (f * P).sum(-1)).mean()


def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    r"""ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean over
    tokens of the squared log-sum-exp of the router logits,

    $$\mathcal{L}_z = \frac{1}{N} \sum_{t=1}^{N} \Big(\log
    \sum_{i=1}^{E} e^{x_{t,i}}\Big)^2 .$$

    Why it works: a softmax router's probabilities do not change when
    all of a token's logits move by the same $c$, $\mathrm{softmax}(x_t
    + c) = \mathrm{softmax}(x_t)$, but the log-sum-exp $z_t$ moves by
    $c$. Nothing in the language-model loss fixes that level, so the
    logits can drift large, where $e^{x}$ in low precision rounds badly
    (bfloat16 keeps 8 bits). The gradient,

    $$\frac{\partial \mathcal{L}_z}{\partial x_{t,i}} = \frac{2}{N}
    \, z_t \, \mathrm{softmax}(x_t)_i ,$$

    pulls every token's logits towards $z_t = 0$, i.e. towards logits
    that are already log-probabilities ($\sum_i e^{x_{t,i}} = 1$), and
    pulls the largest logits hardest. ST-MoE adds $c_z \mathcal{L}_z$
    with $c_z = 10^{-3}$ and found it stabilised training without
    hurting quality.

    Computed in float32 whatever the logits' dtype.

    Args:
        logits: ``(..., E)`` router logits $x$ (``Routing.logits``);
            every leading position is one token.

    Returns:
        Scalar tensor (with gradient); 0 for no tokens.
    """
    check_type("logits", logits, torch.Tensor, "a torch.Tensor")
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a floating tensor, got "
                        f"{logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape (..., E) with E >= 1, "
                         f"got {tuple(logits.shape)}")
    z = torch.logsumexp(logits.float(), dim=-1)              # (...,)
    if z.numel() == 0:
        return z.new_zeros(())         # no tokens: nothing to penalise
    return z.pow(2).mean()


def update_bias(bias: torch.Tensor, load: torch.Tensor, *,
                gamma: float) -> torch.Tensor:
    r"""Auxiliary-loss-free balancing step (Wang et al. 2024; V3 report):
    $b_i \leftarrow b_i + \gamma\,\mathrm{sign}(\bar c - c_i)$.

    An overloaded expert ($c_i > \bar c$, the mean load) becomes less
    attractive, an underloaded one more; the gates never see $b$, so the
    model's output is changed only through which experts are chosen.
    V3 used $\gamma = 0.001$ for most of pre-training.

    Args:
        bias: ``(E,)`` current $b$. load: ``(E,)`` token counts $c_i$ of
            the last step. gamma: update speed $\gamma \ge 0$.

    Returns:
        ``(E,)`` the new bias (a new tensor).
    """
    check_real("gamma", gamma)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    for name, t in (("bias", bias), ("load", load)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D tensor (E,), got "
                             f"{t!r:.60}")
    if load.shape != bias.shape:
        raise ValueError(f"load must have shape {tuple(bias.shape)}, got "
                         f"{tuple(load.shape)}")
    if load.numel() and not bool((load.min() >= 0) & load.isfinite().all()):
        # sign() of a NaN difference is NaN, and a count is never negative
        raise ValueError(f"load must hold finite counts >= 0, got "
                         f"{load.tolist()!r:.80}")
    c = load.to(bias.dtype)
    # b_i += gamma * sign(mean load - load_i)
    return bias + gamma * torch.sign(c.mean() - c)

r"""Routers of a mixture of experts: which experts a token uses, and how much.

A router scores every expert for every token, *selects* the $k$ best and
then *weights* the chosen ones: two separate steps. For token $t$ with
hidden state $u_t \in \mathbb{R}^D$ and router matrix $W$ with one row
$e_i$ (the expert's *centroid*) per expert:

- **softmax router** (Shazeer et al. 2017 without noise; Switch;
  Mixtral): $p_t = \mathrm{softmax}(u_t W^\top)$, keep the top $k$ of
  $p_t$ and renormalise among them, $g_{i,t} = p_{i,t} / \sum_{j \in
  \mathrm{TopK}} p_{j,t}$ (Mixtral, $k = 2$).
- **DeepSeek-V3 router** (report sec. 2.1.2, eqs. 13-16): sigmoid
  affinities $s_{i,t} = \sigma(u_t^\top e_i)$; the choice uses
  $s_{i,t} + b_i$ with a bias $b_i$ that is *not* trained by gradients
  but nudged towards balance (auxiliary-loss-free balancing); the gate
  uses the unbiased $s_{i,t}$ of the chosen experts, normalised over them
  and multiplied by ``routed_scaling_factor``. Optionally the experts are
  split into groups and only the ``topk_group`` best groups may be used
  (node-limited routing). :func:`deepseek_v3_gates` is the same choice
  written as one function of the affinities.
- **expert choice** (Zhou et al. 2022): the other way round, each expert
  picks the ``capacity`` tokens it scores highest
  (:func:`expert_choice_gates`), so no expert is ever over its capacity,
  while a token may be picked by several experts or by none.

Balancing the load over the experts (the Switch auxiliary loss and
DeepSeek-V3's bias update) is in :mod:`course_lib.model.load_balancing`.

Shape letters: N tokens (batch and time flattened), E experts, k experts
per token (``top_k``), D = ``d_model``, ``n_group`` expert groups (not
G, which means key/value heads), ... leading dimensions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._util.validation import (
    check_alloc,
    check_bool,
    check_int,
    check_real,
    check_top_k,
)
from .load_balancing import update_bias

__all__ = ["Routing", "select_top_k", "TopKRouter", "group_limited_mask",
           "deepseek_v3_gates", "DeepSeekV3Router", "expert_choice_gates"]


@dataclass
class Routing:
    """What a router decided for N tokens.

    Attributes:
        logits: ``(N, E)`` raw scores $u_t W^\\top$.
        scores: ``(N, E)`` affinities: softmax probabilities (softmax
            router) or sigmoid affinities $s_{i,t}$ (DeepSeek-V3).
        probs: ``(N, E)`` a distribution over experts per token, used by
            :func:`load_balancing_loss`: the softmax, or $s_{i,t} /
            \\sum_j s_{j,t}$ (DeepSeek-V3 eq. 19).
        indices: ``(N, k)`` long, chosen experts, best first.
        weights: ``(N, k)`` gates $g_{i,t}$ of the chosen experts.
    """
    logits: torch.Tensor
    scores: torch.Tensor
    probs: torch.Tensor
    indices: torch.Tensor
    weights: torch.Tensor

    def dense_gates(self) -> torch.Tensor:
        """``(N, E)`` gates with zeros for the experts not chosen."""
        out = torch.zeros_like(self.scores)                  # (N, E)
        return out.scatter(1, self.indices, self.weights)


def _check_router_args(d_model, n_experts, top_k) -> None:
    check_int("d_model", d_model, minimum=1)
    check_int("n_experts", n_experts, minimum=1)
    check_top_k(top_k, n_experts)
    check_alloc("n_experts * d_model", n_experts * d_model)   # weight (E, D)


def _check_x(x, d_model: int) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 \
            or x.shape[-1] != d_model:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else x
        raise ValueError(f"x must have shape (..., {d_model}), got "
                         f"{got!r:.60}")


def select_top_k(probs: torch.Tensor, k: int, *, normalize: bool = True
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Step 1, select the $k$ largest scores; step 2, weight them.

    With ``normalize`` the chosen scores are divided by their sum,
    $g_i = p_i / \sum_{j \in \mathrm{TopK}} p_j$, so the gates add up
    to 1: $[0.6, 0.3, 0.1]$ with $k = 2$ gives $[2/3, 1/3]$. Without it
    the gates are the raw $p_i$ (Switch, $k = 1$). Chosen scores that
    are all 0 (ties at zero) get the limit of equal scores, $1/k$ each.

    Args:
        probs: ``(..., E)`` non-negative scores. k: $1 \le k \le E$.
        normalize: renormalise among the chosen.

    Returns:
        ``indices`` ``(..., k)`` long (best first) and ``weights``
        ``(..., k)``.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() < 1:
        raise ValueError(f"probs must be a tensor (..., E), got {probs!r:.60}")
    check_int("k", k, minimum=1)
    if k > probs.shape[-1]:
        raise ValueError(f"k must be <= E={probs.shape[-1]}, got {k}")
    check_bool("normalize", normalize)
    if probs.numel() and not bool(probs.min() >= 0):
        # topk ranks NaN above every number, and a negative score makes
        # the gates' sum meaningless; min is NaN if any entry is
        raise ValueError(f"probs must be non-negative scores without NaN, "
                         f"got a minimum of {probs.min().item()}")
    weights, indices = probs.topk(k, dim=-1)                 # (..., k)
    if normalize:
        # g_i = p_i / sum_{j in TopK} p_j (1/k if that sum is 0)
        total = weights.sum(-1, keepdim=True)                # (..., 1)
        weights = torch.where(total > 0, weights / total, 1.0 / k)
    return indices, weights


class TopKRouter(nn.Module):
    r"""Softmax router of Mixtral: $p = \mathrm{softmax}(u W^\top)$, top $k$,
    renormalised among the chosen (``normalize``).

    ``weight`` $W$ (E, D) is the ``gate.weight`` of a Mixtral checkpoint
    (no bias). Initialised $N(0, 0.02^2)$ as in Hugging Face's code.

    Args:
        d_model: $D$. n_experts: $E$. top_k: $k$.
        normalize: renormalise the chosen probabilities (Mixtral: yes).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *,
                 normalize: bool = True) -> None:
        super().__init__()
        _check_router_args(d_model, n_experts, top_k)
        check_bool("normalize", normalize)
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.normalize = normalize
        self.weight = nn.Parameter(torch.randn(n_experts, d_model) * 0.02)

    def extra_repr(self) -> str:
        return (f"{self.d_model}, n_experts={self.n_experts}, "
                f"top_k={self.top_k}, normalize={self.normalize}")

    def forward(self, x: torch.Tensor) -> Routing:
        """x (..., D) -> :class:`Routing` of the N = prod(...) tokens."""
        _check_x(x, self.d_model)
        u = x.reshape(-1, self.d_model)                      # (N, D)
        logits = u @ self.weight.T                           # (N, E)
        # p_t = softmax(u_t W^T)
        probs = logits.softmax(-1)                           # (N, E)
        indices, weights = select_top_k(probs, self.top_k,
                                        normalize=self.normalize)
        return Routing(logits, probs, probs, indices, weights)


def group_limited_mask(scores: torch.Tensor, *, n_group: int,
                       topk_group: int) -> torch.Tensor:
    r"""Which experts a token may use under group-limited routing.

    The $E$ experts form ``n_group`` contiguous groups (in DeepSeek-V3 one
    group per node). A group's score is the sum of its two largest
    scores; only the ``topk_group`` best groups stay eligible, so each
    token's experts sit on at most ``topk_group`` nodes (V3: 8 groups,
    4 kept).

    Args:
        scores: ``(N, E)`` choice scores ($s + b$ in DeepSeek-V3).
        n_group: number of expert groups, divides $E$. topk_group: groups
            kept, at most ``n_group``.

    Returns:
        ``(N, E)`` bool, True where the expert is eligible.
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2:
        raise ValueError(f"scores must be a tensor (N, E), got "
                         f"{scores!r:.60}")
    N, E = scores.shape
    check_int("n_group", n_group, minimum=1)
    check_int("topk_group", topk_group, minimum=1)
    if E % n_group:
        raise ValueError(f"n_group must divide E={E}, got {n_group}")
    if topk_group > n_group:
        raise ValueError(f"topk_group must be <= n_group={n_group}, got "
                         f"{topk_group}")
    if bool(scores.isnan().any()):
        # topk would rank a NaN group above every other (-inf, a masked
        # expert, is a valid score)
        raise ValueError("scores must not hold NaN")
    grouped = scores.view(N, n_group, E // n_group)          # (N, n_group, E/n_group)
    # group score = sum of the group's top-2 scores (top-1 if size 1)
    top2 = grouped.topk(min(2, E // n_group), dim=-1).values
    group_scores = top2.sum(-1)                              # (N, n_group)
    keep = group_scores.topk(topk_group, dim=-1).indices     # (N, topk_group)
    group_mask = torch.zeros(N, n_group, dtype=torch.bool,
                             device=scores.device).scatter(1, keep, True)
    return group_mask.repeat_interleave(E // n_group, dim=1)  # (N, E)


def deepseek_v3_gates(scores: torch.Tensor, bias: torch.Tensor, k: int,
                      n_group: int, topk_group: int,
                      scale: float) -> torch.Tensor:
    r"""DeepSeek-V3's gates from the affinities, as one dense matrix.

    The choice uses $s_{i,t} + b_i$ among the experts of the
    ``topk_group`` best of ``n_group`` groups (:func:`group_limited_mask`);
    a chosen expert's gate is its *unbiased* affinity, normalised over the
    chosen and multiplied by ``scale`` (report eqs. 13-16):

    $$g_{i,t} = \rho\,\frac{s_{i,t}}{\sum_{j \in \mathcal{K}_t}
    s_{j,t}} \ (i \in \mathcal{K}_t), \qquad 0 \text{ otherwise}.$$

    This is what :class:`DeepSeekV3Router` computes from its sigmoid
    scores (``Routing.dense_gates()``), as a function of ``scores`` and
    ``bias`` alone.

    Args:
        scores: ``(N, E)`` affinities $s_{i,t}$ (after the sigmoid, > 0).
        bias: ``(E,)`` choice bias $b_i$.
        k: experts per token. n_group, topk_group: as in
            :func:`group_limited_mask` (1, 1 = no groups).
        scale: $\rho$, ``routed_scaling_factor`` (V3: 2.5).

    Returns:
        ``(N, E)`` gates, zero for the experts not chosen.
    """
    if not isinstance(scores, torch.Tensor) or scores.dim() != 2 \
            or not scores.is_floating_point():
        raise ValueError(f"scores must be a float tensor (N, E), got "
                         f"{scores!r:.60}")
    E = scores.shape[1]
    if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (E,):
        raise ValueError(f"bias must be a tensor of shape ({E},), got "
                         f"{bias!r:.60}")
    check_int("k", k, minimum=1)
    check_real("scale", scale, positive=True)
    check_int("n_group", n_group, minimum=1)
    check_int("topk_group", topk_group, minimum=1)
    if E % n_group or topk_group > n_group:
        raise ValueError(f"n_group must divide E={E} and topk_group <= "
                         f"n_group, got n_group={n_group}, topk_group="
                         f"{topk_group}")
    if k > topk_group * (E // n_group):
        raise ValueError(f"k must be <= the experts of the kept groups "
                         f"({topk_group * (E // n_group)}), got {k}")
    choice = scores + bias                                   # (N, E)
    allowed = group_limited_mask(choice, n_group=n_group,
                                 topk_group=topk_group)      # (N, E)
    idx = choice.masked_fill(~allowed, float("-inf")).topk(
        k, dim=-1).indices                                   # (N, k)
    g = scores.gather(-1, idx)                               # unbiased s
    g = g / g.sum(-1, keepdim=True) * scale                  # (N, k)
    return torch.zeros_like(scores).scatter(-1, idx, g)      # (N, E)


class DeepSeekV3Router(nn.Module):
    r"""DeepSeek-V3's router: sigmoid affinities, bias-adjusted choice,
    gates from the unbiased affinities.

    ``weight`` (E, D) holds the centroids $e_i$ (``mlp.gate.weight``);
    the buffer ``e_score_correction_bias`` (E,) is $b_i$
    (``mlp.gate.e_score_correction_bias``, one per MoE layer in the
    released checkpoint). It is a buffer: gradients never touch it, it is
    saved in the ``state_dict`` and it is not in ``parameters()``; change
    it with :meth:`update_bias`.

    Args:
        d_model: $D$. n_experts: $E$ (V3: 256). top_k: $K_r$ (V3: 8).
        n_group, topk_group: group-limited routing (V3: 8, 4; 1, 1 = off).
        routed_scaling_factor: multiplies the gates (V3: 2.5).
        norm_topk_prob: normalise the chosen affinities (V3: yes).

    The affinities, the choice and the gates are computed in float32 for
    any input dtype (the gates are cast to the experts' dtype where they
    multiply them).
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, *,
                 n_group: int = 1, topk_group: int = 1,
                 routed_scaling_factor: float = 1.0,
                 norm_topk_prob: bool = True) -> None:
        super().__init__()
        _check_router_args(d_model, n_experts, top_k)
        check_int("n_group", n_group, minimum=1)
        check_int("topk_group", topk_group, minimum=1)
        check_real("routed_scaling_factor", routed_scaling_factor,
                   positive=True)
        check_bool("norm_topk_prob", norm_topk_prob)
        if n_experts % n_group or topk_group > n_group:
            raise ValueError(f"n_group must divide n_experts={n_experts} "
                             f"and topk_group <= n_group, got n_group="
                             f"{n_group}, topk_group={topk_group}")
        if top_k > topk_group * (n_experts // n_group):
            raise ValueError(f"top_k must be <= experts in the kept groups "
                             f"({topk_group * (n_experts // n_group)}), "
                             f"got {top_k}")
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.n_group, self.topk_group = n_group, topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.randn(n_experts, d_model) * 0.02)
        self.register_buffer("e_score_correction_bias",
                             torch.zeros(n_experts))         # b_i

    def extra_repr(self) -> str:
        return (f"{self.d_model}, n_experts={self.n_experts}, top_k="
                f"{self.top_k}, n_group={self.n_group}, topk_group="
                f"{self.topk_group}, routed_scaling_factor="
                f"{self.routed_scaling_factor}")

    def forward(self, x: torch.Tensor) -> Routing:
        """x (..., D) -> :class:`Routing` of the N = prod(...) tokens."""
        _check_x(x, self.d_model)
        u = x.reshape(-1, self.d_model)                      # (N, D)
        # float32 whatever the model's dtype, as DeepSeek's and HF's code
        # do: small gaps between affinities decide which experts win
        logits = u.float() @ self.weight.float().T           # (N, E)
        # (15) s_{i,t} = Sigmoid(u_t^T e_i)
        s = logits.sigmoid()                                 # (N, E)
        # (16) the choice uses s_{i,t} + b_i; b only decides who is chosen
        choice = s + self.e_score_correction_bias            # (N, E)
        if self.n_group > 1:
            allowed = group_limited_mask(choice.detach(),
                                         n_group=self.n_group,
                                         topk_group=self.topk_group)
            choice = choice.masked_fill(~allowed, float("-inf"))
        indices = choice.topk(self.top_k, dim=-1).indices    # (N, k)
        # (14) g'_{i,t} = s_{i,t} for the chosen: the UNbiased affinity
        weights = s.gather(1, indices)                       # (N, k)
        if self.norm_topk_prob:
            # (13) g_{i,t} = g'_{i,t} / sum_j g'_{j,t}
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        weights = weights * self.routed_scaling_factor
        # (19) s'_{i,t} = s_{i,t} / sum_j s_{j,t}, for the balance loss
        probs = s / s.sum(-1, keepdim=True)                  # (N, E)
        return Routing(logits, s, probs, indices, weights)

    @torch.no_grad()
    def update_bias(self, load: torch.Tensor, *, gamma: float) -> None:
        """In place: $b_i \\mathrel{+}= \\gamma\\,\\mathrm{sign}(\\bar c
        - c_i)$ with this batch's ``load`` (E,); see :func:`update_bias`."""
        self.e_score_correction_bias.copy_(
            update_bias(self.e_score_correction_bias, load, gamma=gamma))


def expert_choice_gates(probs: torch.Tensor, capacity: int) -> torch.Tensor:
    r"""Expert-choice routing (Zhou et al. 2022): every expert picks the
    ``capacity`` tokens that score it highest.

    With router probabilities $P \in \mathbb{R}^{N \times E}$ (a softmax
    over the experts for each token), expert $i$ takes the top
    ``capacity`` entries of its column $P_{:, i}$; the gate of a chosen
    (token, expert) pair is the probability itself, not renormalised:

    $$G_{t,i} = P_{t,i} \ \text{if } t \in \mathrm{TopK}(P_{:,i},
    C), \qquad 0 \text{ otherwise}.$$

    Every expert processes exactly $C$ tokens (none is idle, none
    overflows), a token can be chosen by several experts or by none, and
    the choice depends on the other tokens of the group (the leading
    dimensions are independent groups, e.g. sequences).

    Args:
        probs: ``(..., N, E)`` router probabilities, at least 2-D.
        capacity: tokens per expert $C$, $1 \le C \le N$.

    Returns:
        ``(..., N, E)`` gates: ``probs`` where chosen, 0 elsewhere.
    """
    if not isinstance(probs, torch.Tensor) or probs.dim() < 2 \
            or not probs.is_floating_point():
        raise ValueError(f"probs must be a float tensor (..., N, E), got "
                         f"{probs!r:.60}")
    N = probs.shape[-2]
    check_int("capacity", capacity, minimum=1)
    if capacity > N:
        raise ValueError(f"capacity must be <= N={N} tokens, got "
                         f"{capacity}")
    if probs.numel() and bool(probs.isnan().any()):
        raise ValueError("probs must not hold NaN")
    # each column (expert) ranks the N tokens: top-C along the token axis
    top = probs.topk(capacity, dim=-2).indices               # (..., C, E)
    chosen = torch.zeros_like(probs, dtype=torch.bool).scatter(
        -2, top, True)                                       # (..., N, E)
    return torch.where(chosen, probs, torch.zeros_like(probs))

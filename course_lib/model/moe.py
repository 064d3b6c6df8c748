r"""The mixture-of-experts layer: a router and many small FFNs.

A dense FFN sends every token through the same weights. A mixture of
experts (MoE) keeps $E$ expert FFNs and lets a router
(:mod:`course_lib.model.routing`) pick $k$ of them per token (DeepSeek-V3
report, eq. 12, without the residual that :class:`DecoderBlock` adds):

$$h_t = \sum_{i=1}^{N_s} \mathrm{FFN}^{(s)}_i(u_t)
      + \sum_{i=1}^{N_r} g_{i,t}\, \mathrm{FFN}^{(r)}_i(u_t),$$

with $g_{i,t} = 0$ for the $E - k$ experts not chosen, and optional
*shared* experts $\mathrm{FFN}^{(s)}$ that every token uses (DeepSeekMoE;
stored as one SwiGLU of width $N_s \cdot$ ``d_expert``, as in the
released checkpoints). Compute per token follows the $k$ active experts;
memory holds all $E$.

Dispatch: the $N k$ token-slots are sorted by expert, each expert runs
once on its own tokens, and the weighted results are copied back to
their slots and summed per token (:meth:`MoE.forward_with_info`).
:meth:`MoE.forward_loop` is the same computation token by token, the
readable reference. With a *capacity factor* each expert
takes at most $C = \lceil c\,N k / E \rceil$ slots; later slots (in
token order) are dropped and contribute nothing.

Calling the layer returns its output only, like every FFN, so a block
need not know which FFN it holds. What the router did (:class:`MoEInfo`:
the choices, the load, the auxiliary loss) is kept on the layer as
``last_info``, and :func:`moe_infos` collects it from every MoE layer of
a model. Hugging Face's Mixtral (transformers 5) does the same: its
sparse block returns the hidden states only, and the router logits of
each layer are recorded from the router module when the model is asked
for them (``output_router_logits=True``).

Names follow the released checkpoints (``mlp.gate.weight``,
``mlp.experts.{i}.gate_proj.weight``, ``mlp.shared_experts.up_proj.weight``,
``mlp.gate.e_score_correction_bias``), so DeepSeek-V3 weights load by
renaming the prefix only and Mixtral's by also renaming ``w1, w3, w2`` to
``gate_proj, up_proj, down_proj``.

Shape letters: B batch, T length, N = B T tokens, D = ``d_model``,
E experts, k experts per token, F = ``d_expert``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .._util.validation import (
    MAX_ELEMENTS,
    check_alloc,
    check_int,
    check_real,
    check_top_k,
    check_type,
    config_field,
)
from .block import SwiGLU
from .load_balancing import expert_load, load_balancing_loss
from .routing import DeepSeekV3Router, Routing, TopKRouter

__all__ = ["MoEInfo", "expert_capacity", "expected_fraction_touched", "MoE",
           "moe_infos", "moe_from_config"]


@dataclass
class MoEInfo:
    """What one MoE layer did on a batch: :attr:`MoE.last_info` after a
    call, the second output of :meth:`MoE.forward_with_info`.

    Attributes:
        routing: the router's :class:`~course_lib.model.routing.Routing`.
        load: ``(E,)`` long, token-slots assigned to each expert (before
            capacity drops).
        aux_loss: scalar :func:`~course_lib.model.load_balancing.load_balancing_loss`
            (with gradient; add ``coef * aux_loss`` to the training loss).
        dropped: token-slots dropped by the capacity limit (0 without).
        capacity: slots per expert $C$, or None (no limit).
    """
    routing: Routing
    load: torch.Tensor
    aux_loss: torch.Tensor
    dropped: int = 0
    capacity: int | None = None

    @property
    def indices(self) -> torch.Tensor:
        """``(N, k)`` chosen experts."""
        return self.routing.indices

    @property
    def weights(self) -> torch.Tensor:
        """``(N, k)`` gates."""
        return self.routing.weights

    @property
    def probs(self) -> torch.Tensor:
        """``(N, E)`` router probabilities."""
        return self.routing.probs


def expert_capacity(n_tokens: int, n_experts: int, top_k: int,
                    capacity_factor: float) -> int:
    r"""Slots per expert, $C = \lceil c \cdot N k / E \rceil$.

    $Nk/E$ is the load of a perfectly balanced router; the capacity
    factor $c$ (Switch: 1.0 to 1.25) is the head-room above it.
    """
    check_int("n_tokens", n_tokens, minimum=0)
    check_int("n_experts", n_experts, minimum=1)
    check_int("top_k", top_k, minimum=1)
    check_real("capacity_factor", capacity_factor, positive=True)
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def expected_fraction_touched(n_tokens: int, n_experts: int,
                              top_k: int) -> float:
    r"""Expected share of experts used by at least one of $n$ tokens when
    each picks $k$ distinct experts uniformly: $1 - (1 - k/E)^n$.
    """
    check_int("n_tokens", n_tokens, minimum=0)
    check_int("n_experts", n_experts, minimum=1)
    check_top_k(top_k, n_experts)
    return 1.0 - (1.0 - top_k / n_experts) ** n_tokens


class MoE(nn.Module):
    r"""Mixture-of-experts FFN: ``x (B, T, D) -> out (B, T, D)``.

    Calling the layer returns the output; :meth:`forward_with_info`
    returns ``(out, info)``.

    Args:
        d_model: $D$.
        n_experts: routed experts $E$ (DeepSeek-V3: 256, Mixtral: 8).
        top_k: experts per token $k$ (8, 2).
        d_expert: hidden width $F$ of each expert SwiGLU
            (``moe_intermediate_size``: 2048; Mixtral 14336).
        n_shared_experts: $N_s$ always-on experts, stored as one SwiGLU of
            width $N_s F$ (V3: 1; Mixtral: 0 = none).
        gate: the router, a :class:`~course_lib.model.routing.TopKRouter`
            (default) or :class:`~course_lib.model.routing.DeepSeekV3Router`
            with the same ``n_experts`` and ``top_k``.
        capacity_factor: None (no limit) or $c > 0$, see
            :func:`expert_capacity`.

    Attributes:
        last_info: the :class:`MoEInfo` of the last forward call: the
            routing, load, auxiliary loss (with its gradient) and drops;
            ``None`` before the first. :func:`moe_infos` collects it from
            every MoE layer of a model. A copy of the layer
            (``copy.deepcopy``, pickling) starts with ``None``.
    """

    last_info: MoEInfo | None

    def __init__(self, d_model: int, *, n_experts: int, top_k: int,
                 d_expert: int, n_shared_experts: int = 0,
                 gate: nn.Module | None = None,
                 capacity_factor: float | None = None) -> None:
        super().__init__()
        check_int("d_model", d_model, minimum=1)
        check_int("n_experts", n_experts, minimum=1)
        check_int("d_expert", d_expert, minimum=1)
        check_int("n_shared_experts", n_shared_experts, minimum=0)
        # every expert is built at once: 3 D F weights each, plus the router
        check_alloc("(n_experts + n_shared_experts) * 3 * d_model * d_expert",
                    (n_experts + n_shared_experts) * 3 * d_model * d_expert
                    + n_experts * d_model)
        if gate is None:
            gate = TopKRouter(d_model, n_experts, top_k)
        if not isinstance(gate, (TopKRouter, DeepSeekV3Router)) or \
                (gate.d_model, gate.n_experts, gate.top_k) != \
                (d_model, n_experts, top_k):
            raise ValueError(
                f"gate must be a TopKRouter or DeepSeekV3Router with "
                f"d_model={d_model}, n_experts={n_experts}, top_k={top_k}, "
                f"got {gate!r:.120}")
        if capacity_factor is not None:
            check_real("capacity_factor", capacity_factor, positive=True)
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.d_expert, self.n_shared = d_expert, n_shared_experts
        self.capacity_factor = capacity_factor
        self.gate = gate                                     # W (E, D)
        self.experts = nn.ModuleList(
            SwiGLU(d_model, d_expert) for _ in range(n_experts))  # FFN^(r)
        self.shared_experts = (SwiGLU(d_model, n_shared_experts * d_expert)
                               if n_shared_experts else None)  # FFN^(s)
        self.last_info = None

    def __getstate__(self) -> dict:
        # last_info holds tensors of the last graph, which deepcopy
        # refuses (non-leaf tensors) and a copy has not run
        return {**super().__getstate__(), "last_info": None}

    def extra_repr(self) -> str:
        return f"capacity_factor={self.capacity_factor}"

    def active_parameters(self) -> int:
        """Parameters one token uses: router + $k$ experts + shared."""
        per_expert = sum(p.numel() for p in self.experts[0].parameters())
        shared = (0 if self.shared_experts is None else
                  sum(p.numel() for p in self.shared_experts.parameters()))
        return self.gate.weight.numel() + self.top_k * per_expert + shared

    def _route(self, x: torch.Tensor):
        if not isinstance(x, torch.Tensor) or x.dim() < 2 \
                or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else x
            raise ValueError(f"x must have shape (B, T, {self.d_model}) or "
                             f"(N, {self.d_model}), got {got!r:.60}")
        u = x.reshape(-1, self.d_model)                      # (N, D)
        r = self.gate(u)
        cap = None if self.capacity_factor is None else expert_capacity(
            u.shape[0], self.n_experts, self.top_k, self.capacity_factor)
        return u, r, cap

    def _info(self, r: Routing, dropped: int, cap) -> MoEInfo:
        return MoEInfo(r, expert_load(r.indices, self.n_experts),
                       load_balancing_loss(r.probs, r.indices,
                                           self.n_experts), dropped, cap)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) or (N, D) -> out of the same shape.

        The residual is not added here (the block adds it). The
        :class:`MoEInfo` of the call is kept as :attr:`last_info`."""
        out, self.last_info = self.forward_with_info(x)
        return out

    def forward_with_info(self, x: torch.Tensor
                          ) -> tuple[torch.Tensor, MoEInfo]:
        """:meth:`forward`, and the :class:`MoEInfo` of the call.

        Returns:
            ``(out, info)``: out of the shape of x, (B, T, D) or (N, D).
            :attr:`last_info` is left as it was.
        """
        u, r, cap = self._route(x)
        N, k = r.indices.shape
        # 1) flatten the N k token-slots; slot s = t k + j is token t's
        #    j-th choice
        slot_expert = r.indices.reshape(-1)                  # (N k,)
        slot_weight = r.weights.reshape(-1)                  # (N k,)
        # 2) group slots by expert; the stable sort keeps token order
        #    inside each expert, which decides who is dropped at capacity
        order = torch.argsort(slot_expert, stable=True)      # (N k,)
        counts = torch.bincount(slot_expert, minlength=self.n_experts)
        dropped = 0
        if cap is not None:
            starts = torch.cumsum(counts, 0) - counts        # (E,)
            rank = torch.arange(N * k, device=u.device) \
                - starts[slot_expert[order]]                 # (N k,)
            keep = rank < cap
            dropped = int((~keep).sum())
            order = order[keep]                              # kept slots
            counts = counts.clamp(max=cap)
        token = order // k                                   # (S,)
        # 3) gather the tokens in expert order; each expert runs once on
        #    its contiguous chunk (an unused expert does no work)
        chunks = u[token].split(counts.tolist())             # E x (n_e, D)
        ys = [self.experts[e](c) for e, c in enumerate(chunks) if len(c)]
        y = torch.cat(ys) if ys else u.new_zeros(0, self.d_model)  # (S, D)
        # g_{e,t} FFN_e(u_t), slot by slot
        y = y * slot_weight[order, None].to(y.dtype)         # (S, D)
        # 4) put each result back in its slot (dropped slots stay 0) and
        #    add token t's k slots: one copy and one sum, which on CPU is
        #    several times faster than index_add_ per expert
        slots = u.new_zeros(N * k, self.d_model).index_copy(0, order, y)
        out = slots.view(N, k, self.d_model).sum(1)          # (N, D)
        if self.shared_experts is not None:
            # + sum_i FFN^(s)_i(u_t): every token, no gate
            out = out + self.shared_experts(u)               # (N, D)
        return out.reshape(x.shape), self._info(r, dropped, cap)

    def forward_loop(self, x: torch.Tensor) -> tuple[torch.Tensor, MoEInfo]:
        """Reference form of :meth:`forward_with_info`: the same output
        token by token and choice by choice (slow).

        Returns:
            ``(out, info)`` as :meth:`forward_with_info`; the drop count
            is counted here, slot by slot. :attr:`last_info` is left as
            it was.
        """
        u, r, cap = self._route(x)
        used = [0] * self.n_experts          # slots each expert has taken
        dropped, rows = 0, []
        for t in range(u.shape[0]):
            h = torch.zeros(self.d_model, dtype=u.dtype, device=u.device)
            for j in range(self.top_k):
                e = int(r.indices[t, j])
                if cap is not None and used[e] >= cap:
                    dropped += 1              # expert full: slot dropped
                    continue
                used[e] += 1
                h = h + r.weights[t, j] * self.experts[e](u[t])
            if self.shared_experts is not None:
                h = h + self.shared_experts(u[t])
            rows.append(h)
        return torch.stack(rows).reshape(x.shape), self._info(r, dropped, cap)


def moe_infos(model: nn.Module) -> list[MoEInfo]:
    """The :attr:`MoE.last_info` of every MoE layer in ``model``, in
    ``model.modules()`` order: what each layer's router did in its last
    forward call.

    A layer counts if it is an :class:`MoE` or records a ``last_info``
    the same way (the expert-parallel layer of
    :mod:`course_lib.distributed.expert_parallel`); a model without one
    gives ``[]``. Typical use, the auxiliary loss of every layer::

        logits = model(x)
        aux = sum(i.aux_loss for i in moe_infos(model))

    Raises:
        ValueError naming the layers that have not run a forward yet.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    layers = [(name, m) for name, m in model.named_modules()
              if isinstance(m, MoE) or "last_info" in vars(m)]
    idle = [name or "model" for name, m in layers if m.last_info is None]
    if idle:
        raise ValueError(f"the MoE layers {', '.join(idle)!s:.200} have "
                         f"not run a forward yet: call model(x) first")
    return [m.last_info for _, m in layers]


def moe_from_config(config, *, capacity_factor: float | None = None) -> MoE:
    r"""An :class:`MoE` layer from a config with Hugging Face field names:
    a DeepSeek-V3 or Mixtral ``config.json``, a ``transformers`` config,
    or a :class:`~course_lib.sizing.configs.ModelConfig` (chapter 12,
    whose model builder uses this function for its MoE layers).

    Reads width ``hidden_size``, ``n_routed_experts`` (Mixtral:
    ``num_local_experts``), ``num_experts_per_tok``,
    ``moe_intermediate_size`` (Mixtral: ``intermediate_size``) and
    ``n_shared_experts`` (None = 0). The router is DeepSeek-V3's
    (:class:`DeepSeekV3Router`: sigmoid scores, expert groups, bias) when
    the config has ``scoring_func="sigmoid"`` or sets ``n_group``, with
    ``n_group``, ``topk_group`` (None = 1), ``routed_scaling_factor``
    (None = 1) and ``norm_topk_prob`` (default True); otherwise a softmax
    :class:`TopKRouter` (Mixtral) that renormalises its $k$ gates unless
    ``norm_topk_prob`` is False.
    """
    D = config_field(config, "hidden_size")
    E = config_field(config, "n_routed_experts", "num_local_experts")
    k = config_field(config, "num_experts_per_tok")
    F = config_field(config, "moe_intermediate_size", "intermediate_size")
    n_shared = getattr(config, "n_shared_experts", 0) or 0
    for name, value, low in (("hidden_size", D, 1), ("n_routed_experts", E, 1),
                             ("moe_intermediate_size", F, 1),
                             ("n_shared_experts", n_shared, 0)):
        check_int(f"config.{name}", value, minimum=low)
    # A released model's layer (DeepSeek-V3: 11 billion parameters) would
    # be built expert by expert until the memory runs out.
    n_params = (E + n_shared) * 3 * D * F + E * D
    if n_params > MAX_ELEMENTS:
        raise ValueError(
            f"config describes an MoE layer of {n_params:,} parameters "
            f"({4 * n_params / 2**30:,.1f} GiB in float32), more than the "
            f"{MAX_ELEMENTS:,} one layer may allocate; build a smaller "
            f"config (fewer n_routed_experts, a smaller hidden_size or "
            f"moe_intermediate_size), e.g. dataclasses.replace(config, "
            f"hidden_size=256, moe_intermediate_size=64)")
    normalize = bool(getattr(config, "norm_topk_prob", True))
    if getattr(config, "scoring_func", None) == "sigmoid" or \
            getattr(config, "n_group", None) is not None:
        gate = DeepSeekV3Router(
            D, E, k, n_group=getattr(config, "n_group", None) or 1,
            topk_group=getattr(config, "topk_group", None) or 1,
            routed_scaling_factor=float(
                getattr(config, "routed_scaling_factor", None) or 1.0),
            norm_topk_prob=normalize)
    else:
        gate = TopKRouter(D, E, k, normalize=normalize)
    return MoE(D, n_experts=E, top_k=k, d_expert=F,
               n_shared_experts=n_shared, gate=gate,
               capacity_factor=capacity_factor)

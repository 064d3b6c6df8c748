r"""Expert parallelism: the routed experts of an MoE layer spread over W
ranks, tokens sent to their experts and back with two all-to-alls.

Each rank holds $E/W$ of the $E$ routed experts (rank $r$: experts
$r E/W \dots (r+1) E/W - 1$), a copy of the router and of the shared
experts, and its own tokens. One MoE layer (GShard, Lepikhin et al.
2020; DeepSeek-V3 report sec. 3.2.2) then runs in five steps:

1. route the rank's $N_r$ tokens locally: $N_r k$ token-slots, each
   bound for the rank that holds its expert;
2. exchange the counts (how many slots each rank will receive);
3. **dispatch**: an all-to-all with uneven splits sends every slot's
   hidden state $u_t$ ($D$ numbers) to its expert's rank;
4. each rank runs each of its experts once on all the slots it received;
5. **combine**: the reverse all-to-all brings the results home, where
   they are weighted by the gates, summed over the $k$ slots and added
   to the shared experts' output, exactly as the single-process
   :class:`~course_lib.model.moe.MoE` does.

Traffic. Every slot travels out once and back once, so one layer moves

$$\text{bytes} = 2\, N k D\, b$$

for $N$ tokens (summed over ranks; $b$ bytes per number). Rank $r$'s
own tokens account for $N_r k D b$ sent at dispatch and as much received
at combine. A slot whose expert lives on its own rank is copied, not
sent; under uniform routing a fraction $(W-1)/W$ of the slots leave
their rank. :class:`ExpertParallelStats` counts both, from the split
sizes the all-to-alls actually used.

Shape letters: N tokens of this rank, D = ``d_model``, E experts
(``E_r`` = E/W on one rank), k experts per token, W ranks, S slots.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from .._util.validation import check_int, check_type
from ..model.load_balancing import expert_load, load_balancing_loss
from ..model.moe import MoE, MoEInfo
from .collectives import all_to_all, require_group, resolve_rank_and_size

__all__ = ["all_to_all_bytes", "bytes_sent_per_rank", "ExpertParallelStats",
           "ExpertParallelMoE"]


def all_to_all_bytes(n_tokens: int, top_k: int, d_model: int,
                     element_size: int, *, world_size: int = 1) -> float:
    r"""Bytes one MoE layer's dispatch plus combine moves for ``n_tokens``
    tokens: $2 N k D b$.

    With ``world_size`` $W > 1$: the expected bytes that leave their rank
    under uniform routing, $2 N k D b\,(W-1)/W$ (a slot whose expert is
    local is not sent). For a rank's own tokens it is what the rank
    sends at dispatch plus receives at combine; for all tokens it is the
    total over ranks of bytes sent (= bytes received).
    """
    for name, v in (("n_tokens", n_tokens), ("top_k", top_k),
                    ("d_model", d_model), ("element_size", element_size),
                    ("world_size", world_size)):
        check_int(name, v, minimum=0 if name == "n_tokens" else 1)
    total = 2 * n_tokens * top_k * d_model * element_size
    return total if world_size == 1 else total * (world_size - 1) / world_size


def bytes_sent_per_rank(counts: torch.Tensor, placement: torch.Tensor,
                        d_model: int, dispatch_size: int,
                        combine_size: int) -> torch.Tensor:
    r"""Bytes each rank sends to the other ranks in one MoE layer, for a
    given routing table and any placement of the experts.

    Rank $s$'s tokens send ``counts[s, e]`` slots to expert $e$, which
    lives on rank $p_e$ = ``placement[e]``. Summed over experts, rank $s$
    sends $S_{sr} = \sum_{e:\,p_e = r} c_{se}$ slots to rank $r$. A slot
    that stays on its rank ($r = s$) is copied, not sent. Rank $r$ sends
    its own remote slots out at dispatch, each $D$ numbers of
    ``dispatch_size`` bytes, and the results of the remote slots its
    experts served back at combine, each $D$ numbers of ``combine_size``
    bytes:

    $$\text{sent}_r = D\Big(b_d \sum_{s \ne r} S_{rs}
    + b_c \sum_{s \ne r} S_{sr}\Big).$$

    With $b_d = b_c$ and the contiguous placement of
    :class:`ExpertParallelMoE` this is
    :attr:`ExpertParallelStats.remote_bytes_sent` of each rank; summed
    over ranks and averaged over uniform routings it is
    :func:`all_to_all_bytes` with ``world_size`` $W$.

    Args:
        counts: ``(W, E)`` integer tensor, slots of each rank's tokens
            per expert ($\ge 0$).
        placement: ``(E,)`` integer tensor, the rank of each expert, in
            $[0, W)$ (any placement; a rank may hold no expert).
        d_model: $D$, numbers per slot.
        dispatch_size, combine_size: bytes per number at dispatch and at
            combine ($b_d$, $b_c$; e.g. 1 for FP8, 2 for bf16).

    Returns:
        ``(W,)`` int64: bytes rank $r$ sends to other ranks.
    """
    check_type("counts", counts, torch.Tensor, "a torch.Tensor")
    check_type("placement", placement, torch.Tensor, "a torch.Tensor")
    for name, t, dims in (("counts", counts, 2), ("placement", placement, 1)):
        if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
            raise TypeError(f"{name} must be an integer tensor, got "
                            f"{t.dtype}")
        if t.dim() != dims:
            raise ValueError(f"{name} must be {dims}-D, got shape "
                             f"{tuple(t.shape)}")
    W, E = counts.shape
    if W == 0 or E == 0:
        raise ValueError(f"counts must have at least one rank and one "
                         f"expert, got shape {tuple(counts.shape)}")
    if placement.shape[0] != E:
        raise ValueError(f"placement must have one entry per expert "
                         f"({E}), got shape {tuple(placement.shape)}")
    if (counts < 0).any():
        raise ValueError("counts must be >= 0")
    if (placement < 0).any() or (placement >= W).any():
        raise ValueError(f"placement must hold ranks in [0, {W}), got "
                         f"{placement.tolist()}")
    check_int("d_model", d_model, minimum=1)
    check_int("dispatch_size", dispatch_size, minimum=1)
    check_int("combine_size", combine_size, minimum=1)
    slots = torch.zeros(W, W, dtype=torch.int64, device=counts.device
                        ).index_add_(1, placement.long().to(counts.device),
                                     counts.long())        # (W, W): s -> r
    remote = slots.masked_fill(
        torch.eye(W, dtype=torch.bool, device=counts.device), 0)
    return d_model * (dispatch_size * remote.sum(1)        # own slots out
                      + combine_size * remote.sum(0))      # results back


@dataclass
class ExpertParallelStats:
    """What one :class:`ExpertParallelMoE` forward exchanged and spent on
    one rank.

    Attributes:
        rank: this rank. row_bytes: bytes of one slot, $D b$.
        send_splits: ``[W]`` slots this rank dispatched to each rank
            (its own tokens; ``sum = N k``).
        recv_splits: ``[W]`` slots it received from each rank (served by
            its experts).
        expert_seconds: wall time of the local experts (compute).
        dispatch_seconds, combine_seconds: wall time inside the two
            all-to-alls (communication plus waiting for slower ranks).
        forward_seconds: the whole forward; ``forward_seconds -
            expert_seconds`` is everything that is not expert compute.

    Bytes count slots times ``row_bytes``; ``remote_*`` leave out the
    slots a rank sends to itself (copied in memory, not sent).
    """
    rank: int
    row_bytes: int
    send_splits: list[int]
    recv_splits: list[int]
    expert_seconds: float = 0.0
    dispatch_seconds: float = 0.0
    combine_seconds: float = 0.0
    forward_seconds: float = 0.0
    local_experts: list[int] = field(default_factory=list)

    @property
    def dispatch_sent(self) -> int:
        return sum(self.send_splits) * self.row_bytes

    @property
    def dispatch_received(self) -> int:
        return sum(self.recv_splits) * self.row_bytes

    @property
    def bytes_sent(self) -> int:
        """Dispatch out (own slots) + combine out (served slots)."""
        return (sum(self.send_splits) + sum(self.recv_splits)) \
            * self.row_bytes

    bytes_received = bytes_sent    # the combine mirrors the dispatch

    @property
    def remote_bytes_sent(self) -> int:
        """:attr:`bytes_sent` without the slots kept on this rank."""
        own = self.send_splits[self.rank] + self.recv_splits[self.rank]
        return self.bytes_sent - own * self.row_bytes

    remote_bytes_received = remote_bytes_sent

    def cross_node_bytes(self, ranks_per_node: int) -> int:
        r"""Bytes this rank sends to ranks of other nodes (dispatch plus
        combine), with ranks $0 \dots$ ``ranks_per_node``$-1$ on node 0
        and so on: one copy per slot (no per-node deduplication, see
        :mod:`course_lib.distributed.node_routing`)."""
        check_int("ranks_per_node", ranks_per_node, minimum=1)
        node = self.rank // ranks_per_node
        out = sum(s + r for dst, (s, r) in enumerate(
            zip(self.send_splits, self.recv_splits))
            if dst // ranks_per_node != node)
        return out * self.row_bytes

    @property
    def waiting_seconds(self) -> float:
        """Forward time that is not local expert compute."""
        return self.forward_seconds - self.expert_seconds


class ExpertParallelMoE(nn.Module):
    r"""A :class:`~course_lib.model.moe.MoE` whose routed experts are spread
    over the ranks of ``group``.

    Rank $r$ keeps experts $r E/W \dots (r+1)E/W - 1$ (``experts``, in
    that order; ``expert_offset`` is $rE/W$) and copies of ``gate`` and
    ``shared_experts``. Each rank passes its own tokens and gets their
    outputs, equal to the single-process ``moe`` on those tokens.
    Gradients of the local experts collect the slots of every rank;
    those of the replicated router and shared experts come from this
    rank's tokens only (average them over ranks as for data-parallel
    weights). Every rank must call forward and backward together, with
    inputs that require gradients on all ranks or on none (the
    backward of each all-to-all is an all-to-all too).

    As :class:`~course_lib.model.moe.MoE`: calling the layer returns the
    output and keeps the :class:`~course_lib.model.moe.MoEInfo` of this
    rank's tokens as ``last_info`` (``None`` before the first call; what
    :func:`~course_lib.model.moe.moe_infos` collects);
    :meth:`forward_with_info` returns ``(out, info)``. After each
    forward, ``stats`` is an :class:`ExpertParallelStats`.

    Args:
        moe: the single-process layer ($W$ divides ``n_experts``; no
            ``capacity_factor``).
        group: process group (default: the world).
        rank, world_size: build for these instead of the group's.
    """

    def __init__(self, moe: MoE, group=None, *, rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        check_type("moe", moe, MoE, "a course_lib MoE")
        rank, world_size = resolve_rank_and_size(group, rank, world_size)
        if moe.n_experts % world_size:
            raise ValueError(f"world_size={world_size} must divide the "
                             f"moe's n_experts, got {moe.n_experts}")
        if moe.capacity_factor is not None:
            raise ValueError(f"moe.capacity_factor must be None (expert "
                             f"parallelism here drops no tokens), got "
                             f"{moe.capacity_factor}")
        self.group, self.rank, self.world_size = group, rank, world_size
        self.d_model, self.n_experts = moe.d_model, moe.n_experts
        self.top_k = moe.top_k
        self.n_local = moe.n_experts // world_size           # E_r
        self.expert_offset = rank * self.n_local
        self.gate = copy.deepcopy(moe.gate)                  # replicated
        self.experts = nn.ModuleList(                        # this rank's
            copy.deepcopy(moe.experts[self.expert_offset + i])
            for i in range(self.n_local))
        self.shared_experts = copy.deepcopy(moe.shared_experts)
        self.stats: ExpertParallelStats | None = None
        self.last_info: MoEInfo | None = None

    def __getstate__(self) -> dict:
        # as MoE: last_info holds tensors of the last graph
        return {**super().__getstate__(), "last_info": None}

    def extra_repr(self) -> str:
        last = self.expert_offset + self.n_local - 1
        return (f"experts {self.expert_offset}..{last} of "
                f"{self.n_experts} (rank {self.rank} of "
                f"{self.world_size})")

    def _exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """send_counts (W, E_r): slots for each rank's experts -> (W, E_r)
        slots each rank sends to this rank's experts."""
        if self.world_size == 1:
            return send_counts
        recv = torch.empty_like(send_counts)
        # equal splits of E_r counts each: rank s gets row s
        dist.all_to_all_single(recv.view(-1), send_counts.reshape(-1),
                               group=self.group)
        return recv                                          # (W, E_r)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, T, D) or (N, D), this rank's tokens -> out of the same
        shape; the :class:`~course_lib.model.moe.MoEInfo` of these tokens
        is kept as ``last_info``."""
        out, self.last_info = self.forward_with_info(x)
        return out

    def forward_with_info(self, x: torch.Tensor
                          ) -> tuple[torch.Tensor, MoEInfo]:
        """:meth:`forward`, and the
        :class:`~course_lib.model.moe.MoEInfo` of this rank's tokens.

        Returns:
            ``(out, info)``: out of the shape of x, (B, T, D) or (N, D).
        """
        require_group(self.group, self.world_size)
        t0 = time.perf_counter()
        if not isinstance(x, torch.Tensor) or x.dim() < 2 \
                or x.shape[-1] != self.d_model:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else x
            raise ValueError(f"x must have shape (B, T, {self.d_model}) or "
                             f"(N, {self.d_model}), got {got!r:.60}")
        W, E_r, D = self.world_size, self.n_local, self.d_model
        u = x.reshape(-1, D)                                 # (N, D)
        # 1) route locally; slot s = t k + j is token t's j-th choice
        r = self.gate(u)
        N, k = r.indices.shape
        slot_expert = r.indices.reshape(-1)                  # (N k,)
        # experts are contiguous per rank, so sorting by expert also
        # sorts by destination rank
        order = torch.argsort(slot_expert, stable=True)      # (N k,)
        send_counts = torch.bincount(slot_expert, minlength=self.n_experts)
        send_counts = send_counts.view(W, E_r)               # (W, E_r)
        # 2) who receives how much
        recv_counts = self._exchange_counts(send_counts)     # (W, E_r)
        send_splits = send_counts.sum(1).tolist()            # [W]
        recv_splits = recv_counts.sum(1).tolist()            # [W]
        send = u[order // k]                                 # (N k, D)
        # 3) dispatch: slots to the ranks of their experts
        t1 = time.perf_counter()
        recv = all_to_all(send, recv_splits, send_splits, self.group)
        t2 = time.perf_counter()                             # (S, D)
        # 4) run each local expert once: regroup the received slots (in
        #    source-rank order) by local expert
        local = torch.arange(E_r, device=x.device).repeat(W)  # (W E_r,)
        recv_expert = local.repeat_interleave(recv_counts.reshape(-1))
        by_expert = torch.argsort(recv_expert, stable=True)  # (S,)
        chunks = recv[by_expert].split(recv_counts.sum(0).tolist())
        # every local expert runs, even on 0 slots, so its parameters are
        # in the graph on every rank
        y = torch.cat([e(c) for e, c in zip(self.experts, chunks)])
        y = torch.empty_like(y).index_copy(0, by_expert, y)  # (S, D)
        t3 = time.perf_counter()
        # 5) combine: results back to the ranks of their tokens
        back = all_to_all(y, send_splits, recv_splits, self.group)
        t4 = time.perf_counter()                             # (N k, D)
        # g_{e,t} FFN_e(u_t), slot by slot, as in MoE.forward_with_info
        back = back * r.weights.reshape(-1)[order, None].to(back.dtype)
        slots = u.new_zeros(N * k, D).index_copy(0, order, back)
        out = slots.view(N, k, D).sum(1)                     # (N, D)
        if self.shared_experts is not None:
            # + sum_i FFN^(s)_i(u_t): replicated, local
            out = out + self.shared_experts(u)               # (N, D)
        info = MoEInfo(r, expert_load(r.indices, self.n_experts),
                       load_balancing_loss(r.probs, r.indices,
                                           self.n_experts))
        self.stats = ExpertParallelStats(
            self.rank, D * u.element_size(), send_splits, recv_splits,
            expert_seconds=t3 - t2, dispatch_seconds=t2 - t1,
            combine_seconds=t4 - t3,
            forward_seconds=time.perf_counter() - t0,
            local_experts=list(range(self.expert_offset,
                                     self.expert_offset + E_r)))
        return out.reshape(x.shape), info

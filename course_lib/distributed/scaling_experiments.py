r"""Chapter 14's experiments, as workers for
:class:`~course_lib.distributed.launch.Pool` and :func:`~course_lib.distributed.launch.run`.

Every function is called on every rank as ``worker(rank, world_size,
size, ...)`` and runs its experiment on the ranks $0 \dots$ ``size``$-1$
(a process group of its own, so a pool of 4 ranks can run 2-rank and
4-rank experiments); the other ranks return None. Every rank builds the
same modules and inputs from the same seed, so each can compare its part
of the parallel result with the single-process result without any
communication.

They live in the library, not in the notebook, because the ranks are
spawned processes that find a worker by importing its module.

Shape letters: B batch, T length, D = ``d_model``, N tokens of a rank,
E experts, k experts per token, W ranks (``size``).
"""
from __future__ import annotations

import contextlib
import statistics

import torch
import torch.distributed as dist

from .._util.validation import check_bool, check_int, check_real
from ..model.block import SwiGLU
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention
from ..model.moe import MoE
from ..model.rope import RotaryEmbedding
from ..model.routing import DeepSeekV3Router
from .expert_parallel import ExpertParallelMoE
from .node_routing import cross_node_traffic
from .tensor_parallel import TensorParallelAttention, TensorParallelSwiGLU

__all__ = ["count_all_reduce", "tensor_parallel_run", "expert_parallel_run",
           "imbalance_run", "node_limited_run"]


def _group(rank: int, world_size: int, size: int):
    """(group of ranks 0..size-1, member?). Every rank must call it, in
    the same order (``new_group`` is collective)."""
    check_int("size", size, minimum=1)
    if size > world_size:
        raise ValueError(f"size must be <= world_size={world_size}, got "
                         f"{size}")
    if size == world_size:
        return None, True
    return dist.new_group(list(range(size))), rank < size


@contextlib.contextmanager
def count_all_reduce():
    """Record every ``torch.distributed.all_reduce`` made inside the
    block: yields a list that receives one payload size in bytes
    (numel x element size) per call. What crosses the wire depends on
    the algorithm (a ring all-reduce sends $2(W-1)/W$ payloads per rank).
    """
    calls: list[int] = []
    original = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel() * tensor.element_size())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        yield calls
    finally:
        dist.all_reduce = original


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def tensor_parallel_run(rank: int, world_size: int, size: int, *,
                        d_model: int = 64, d_ff: int = 256,
                        n_heads: int = 8, n_kv_heads: int = 4,
                        batch: int = 2, length: int = 16,
                        seed: int = 0, device: str | torch.device = "cpu"
                        ) -> dict | None:
    r"""A SwiGLU FFN and a GQA attention block (RoPE, causal mask) split
    over ``size`` ranks, against the single-process modules, on
    ``device`` (this rank's GPU under NCCL, the CPU under gloo).

    Returns (on ranks < size) max differences of the outputs and of the
    input gradients (loss $\sum Y \odot C$), the all-reduces made in
    forward and backward (payload bytes per call, from
    :func:`count_all_reduce`), the number of tokens $BT$ and this
    rank's share of the parameters.
    """
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    device = torch.device(device)
    torch.manual_seed(seed)
    # built on the CPU from the seed (the same numbers on every rank and
    # device), then moved
    ffn = SwiGLU(d_model, d_ff).to(device)
    mha = MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads,
                             rope=RotaryEmbedding(d_model // n_heads)
                             ).to(device)
    x = torch.randn(batch, length, d_model).to(device)       # (B, T, D)
    c = torch.randn(batch, length, d_model).to(device)
    mask = causal_mask(length, device=device)
    out: dict = {"n_tokens": batch * length}
    for name, full, tp, extra in (
            ("ffn", ffn, TensorParallelSwiGLU(ffn, group), ()),
            ("attention", mha, TensorParallelAttention(mha, group),
             (mask,))):
        x_tp, x_ref = (x.clone().requires_grad_() for _ in range(2))
        with count_all_reduce() as fwd:
            y_tp = tp(x_tp, *extra)                          # (B, T, D)
        with count_all_reduce() as bwd:
            (y_tp * c).sum().backward()
        y_ref = full(x_ref, *extra)
        (y_ref * c).sum().backward()
        out[name] = {
            "out_diff": _maxdiff(y_tp, y_ref),
            "grad_diff": _maxdiff(x_tp.grad, x_ref.grad),
            "forward_all_reduce": fwd, "backward_all_reduce": bwd,
            "params": sum(p.numel() for p in tp.parameters()),
            "params_full": sum(p.numel() for p in full.parameters())}
    return out


def _inputs(size: int, n_tokens: int, d_model: int, seed: int,
            device: torch.device | str = "cpu"):
    gen = torch.Generator().manual_seed(seed + 1)
    return [torch.randn(n_tokens, d_model, generator=gen).to(device)
            for _ in range(size)]                            # W x (N, D)


def expert_parallel_run(rank: int, world_size: int, size: int, *,
                        n_tokens: int = 64, d_model: int = 32,
                        n_experts: int = 8, top_k: int = 2,
                        d_expert: int = 32, repeats: int = 1,
                        seed: int = 0, device: str | torch.device = "cpu"
                        ) -> dict | None:
    r"""An MoE layer (softmax top-k router, one shared expert) run with
    :class:`~course_lib.distributed.expert_parallel.ExpertParallelMoE` on ``size``
    ranks of ``n_tokens`` tokens each, against the single-process MoE on
    all tokens, on ``device``.

    Returns ``{"max_diff": float, "stats": [ExpertParallelStats of each
    of the repeats], "n_tokens": N}`` on ranks < size.
    """
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    check_int("repeats", repeats, minimum=1)
    torch.manual_seed(seed)
    moe = MoE(d_model, n_experts=n_experts, top_k=top_k, d_expert=d_expert,
              n_shared_experts=1).to(device)
    ep = ExpertParallelMoE(moe, group)
    xs = _inputs(size, n_tokens, d_model, seed, device)
    stats = []
    with torch.no_grad():
        for _ in range(repeats):
            y = ep(xs[rank])                                 # (N, D)
            stats.append(ep.stats)
        ref = moe(torch.cat(xs))                             # (W N, D)
    rows = slice(rank * n_tokens, (rank + 1) * n_tokens)
    return {"max_diff": _maxdiff(y, ref[rows]), "stats": stats,
            "n_tokens": n_tokens}


def _median_times(stats: list) -> dict[str, float]:
    return {name: statistics.median(getattr(s, name) for s in stats)
            for name in ("expert_seconds", "dispatch_seconds",
                         "combine_seconds", "forward_seconds",
                         "waiting_seconds")}


def imbalance_run(rank: int, world_size: int, size: int, *,
                  skew: float = 3.0, steps: int = 40, gamma: float = 0.02,
                  repeats: int = 5, n_tokens: int = 512, d_model: int = 128,
                  n_experts: int = 8, top_k: int = 2, d_expert: int = 512,
                  seed: int = 0) -> dict | None:
    r"""A straggler and its cure. The tokens lean towards rank 0's
    experts: $x_t = z_t + \text{skew}\cdot v$ with $z_t \sim
    \mathcal{N}(0, I)$ and $v$ the unit vector along the sum of rank 0's
    expert centroids. The DeepSeek-V3 router (sigmoid, bias $b$, no
    groups) then sends rank 0 more slots than the others.

    1. ``repeats`` forwards: slots served and median times per rank.
    2. ``steps`` forwards with the auxiliary-loss-free bias update of
       chapter 11, $b_i \mathrel{+}= \gamma\,\mathrm{sign}(\bar c - c_i)$,
       from the *global* load $c$ (an all-reduce of the ranks' loads),
       so every rank's copy of the router stays identical.
    3. ``repeats`` forwards again.

    Returns ``{"before": ..., "after": ...}`` (each with ``"served"``,
    the slots this rank's experts served, and median times of
    :class:`~course_lib.distributed.expert_parallel.ExpertParallelStats`),
    ``"imbalance"``: max/mean expert load of every balancing step, and
    ``"bias"``, the final $b$ (E,).
    """
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    check_real("skew", skew)
    check_real("gamma", gamma)
    check_int("steps", steps, minimum=0)
    check_int("repeats", repeats, minimum=1)
    torch.manual_seed(seed)
    gate = DeepSeekV3Router(d_model, n_experts, top_k)
    with torch.no_grad():
        gate.weight.normal_(0, d_model ** -0.5)    # logits ~ N(0, 1)
    moe = MoE(d_model, n_experts=n_experts, top_k=top_k, d_expert=d_expert,
              gate=gate)
    ep = ExpertParallelMoE(moe, group)
    v = gate.weight[: n_experts // size].sum(0)
    v = (v / v.norm()).detach()                              # (D,)
    gen = torch.Generator().manual_seed(seed + 1 + rank)
    x = torch.randn(n_tokens, d_model, generator=gen) + skew * v  # (N, D)

    def measure() -> dict:
        stats = []
        for _ in range(repeats):
            ep(x)
            stats.append(ep.stats)
        return {"served": sum(stats[-1].recv_splits),
                "sent": sum(stats[-1].send_splits),
                **_median_times(stats)}

    out: dict = {}
    with torch.no_grad():
        ep(x)                                                # warm-up
        out["before"] = measure()
        imbalance = []
        for _ in range(steps):
            ep(x)
            load = ep.last_info.load.clone()                 # (E,)
            dist.all_reduce(load, group=group)               # global c
            imbalance.append(float(load.max() / load.float().mean()))
            ep.gate.update_bias(load, gamma=gamma)
        out["after"] = measure()
    out["imbalance"] = imbalance
    out["bias"] = ep.gate.e_score_correction_bias.clone()
    return out


def node_limited_run(rank: int, world_size: int, size: int, *,
                     ranks_per_node: int = 1, limited: bool = True,
                     topk_group: int = 2, n_tokens: int = 256,
                     d_model: int = 32, n_experts: int = 16,
                     top_k: int = 4, seed: int = 0) -> dict | None:
    r"""Expert parallelism over ``size`` ranks grouped into nodes of
    ``ranks_per_node``, with DeepSeek-V3's router; ``limited``: one expert
    group per node and only the ``topk_group`` best nodes allowed per
    token (group-limited routing), else no limit.

    Returns on ranks < size: ``"cross_node_bytes"`` measured from the
    all-to-all split sizes (dispatch + combine, one copy per slot),
    ``"traffic"``, the :class:`~course_lib.distributed.node_routing.NodeTraffic` of
    this rank's tokens (per-slot and per-node copies), and
    ``"max_diff"`` against the single-process MoE.
    """
    check_bool("limited", limited)
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    check_int("ranks_per_node", ranks_per_node, minimum=1)
    if size % ranks_per_node:
        raise ValueError(f"ranks_per_node must divide size={size}, got "
                         f"{ranks_per_node}")
    n_nodes = size // ranks_per_node
    torch.manual_seed(seed)
    gate = DeepSeekV3Router(d_model, n_experts, top_k,
                            n_group=n_nodes if limited else 1,
                            topk_group=topk_group if limited else 1)
    with torch.no_grad():
        gate.weight.normal_(0, d_model ** -0.5)
    moe = MoE(d_model, n_experts=n_experts, top_k=top_k, d_expert=16,
              gate=gate)
    ep = ExpertParallelMoE(moe, group)
    xs = _inputs(size, n_tokens, d_model, seed)
    with torch.no_grad():
        y, info = ep.forward_with_info(xs[rank])
        ref = moe(torch.cat(xs))
    rows = slice(rank * n_tokens, (rank + 1) * n_tokens)
    node = torch.full((n_tokens,), rank // ranks_per_node)
    traffic = cross_node_traffic(info.indices, node, n_experts=n_experts,
                                 n_nodes=n_nodes,
                                 row_bytes=ep.stats.row_bytes)
    return {"cross_node_bytes": ep.stats.cross_node_bytes(ranks_per_node),
            "traffic": traffic, "stats": ep.stats,
            "max_diff": _maxdiff(y, ref[rows])}

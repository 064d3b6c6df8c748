r"""Traffic that crosses node boundaries under expert parallelism.

A cluster is made of *nodes* (machines), each with several devices
(ranks). Inside a node the devices talk over fast links (NVLink on
DeepSeek-V3's H800s, 160 GB/s); between nodes over the network
(InfiniBand, 50 GB/s per GPU). With experts spread over all devices,
what limits an MoE layer is the bytes that cross node boundaries.

Two ways to count them for one token with hidden state of $D$ numbers
($b$ bytes each) and $k$ chosen experts:

- **per slot** (what a plain all-to-all such as
  :class:`~course_lib.distributed.expert_parallel.ExpertParallelMoE` does): every
  slot whose expert sits on another node crosses, up to $k$ copies;
- **per node** (DeepSeek-V3's dispatch, report sec. 3.2.2): the token
  crosses the network once per *target node* and is then forwarded to
  the right devices inside that node over NVLink, so it crosses at most
  as many times as it has distinct remote nodes.

Node-limited routing (:func:`course_lib.model.routing.group_limited_mask`,
one expert group per node, ``topk_group`` $= M$) keeps every token's
experts on at most $M$ nodes, which bounds the per-node count by $M$
(V3: $M = 4$ of 8 nodes, with $k = 8$). It does *not* bound the per-slot
count, which can still be $k$: the bound needs both the router and the
deduplicating dispatch.

Experts are laid out contiguously: expert $e$ lives on node
$\lfloor e / (E/n_\text{nodes}) \rfloor$.

Shape letters: N tokens, k experts per token, E experts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .._util.validation import check_int

__all__ = ["expert_nodes", "NodeTraffic", "cross_node_traffic"]


def _check_indices(indices) -> None:
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2 \
            or indices.dtype != torch.long:
        raise ValueError(f"indices must be a long tensor (N, k) of chosen "
                         f"experts, got {indices!r:.60}")


def expert_nodes(indices: torch.Tensor, n_experts: int,
                 n_nodes: int) -> torch.Tensor:
    r"""The node of every chosen expert: ``indices (N, k) -> (N, k)``,
    $\lfloor e / (E / n_\text{nodes}) \rfloor$.
    """
    _check_indices(indices)
    check_int("n_experts", n_experts, minimum=1)
    check_int("n_nodes", n_nodes, minimum=1)
    if n_experts % n_nodes:
        raise ValueError(f"n_nodes must divide n_experts={n_experts}, got "
                         f"{n_nodes}")
    # expert E or -1 would land on a node that does not exist
    if indices.numel() and (indices.min() < 0 or indices.max() >= n_experts):
        raise ValueError(f"indices must hold experts in [0, {n_experts}), "
                         f"got [{indices.min().item()}, "
                         f"{indices.max().item()}]")
    return indices // (n_experts // n_nodes)                 # (N, k)


@dataclass
class NodeTraffic:
    """Cross-node traffic of N tokens (see :func:`cross_node_traffic`).

    Attributes:
        n_tokens: N. top_k: k.
        nodes_per_token: ``(N,)`` distinct nodes holding a token's
            experts (its own node included if used).
        remote_slots: ``(N,)`` slots whose expert is on another node
            (per-slot dispatch: copies that cross).
        remote_nodes: ``(N,)`` distinct other nodes (per-node dispatch:
            copies that cross).
        row_bytes: bytes of one copy, $D b$.
    """
    n_tokens: int
    top_k: int
    nodes_per_token: torch.Tensor
    remote_slots: torch.Tensor
    remote_nodes: torch.Tensor
    row_bytes: int

    @property
    def slot_bytes(self) -> int:
        """Dispatch bytes crossing nodes, one copy per remote slot."""
        return int(self.remote_slots.sum()) * self.row_bytes

    @property
    def node_bytes(self) -> int:
        """Dispatch bytes crossing nodes, one copy per remote node."""
        return int(self.remote_nodes.sum()) * self.row_bytes


def cross_node_traffic(indices: torch.Tensor, token_node: torch.Tensor,
                       *, n_experts: int, n_nodes: int,
                       row_bytes: int = 1) -> NodeTraffic:
    r"""Count what the dispatch of one MoE layer sends across nodes.

    Args:
        indices: ``(N, k)`` chosen experts of N tokens.
        token_node: ``(N,)`` long, the node each token lives on.
        n_experts: $E$; n_nodes: nodes, dividing $E$ (contiguous layout).
        row_bytes: bytes per copy of a token, $D b$.

    Returns:
        :class:`NodeTraffic`. The combine sends the same copies back, so
        a layer's cross-node bytes are twice the dispatch's (with the
        combine's element size).
    """
    nodes = expert_nodes(indices, n_experts, n_nodes)        # (N, k)
    if not isinstance(token_node, torch.Tensor) or \
            token_node.shape != indices.shape[:1]:
        raise ValueError(f"token_node must be a tensor of shape "
                         f"({indices.shape[0]},), got {token_node!r:.60}")
    if token_node.numel() and (token_node.min() < 0
                               or token_node.max() >= n_nodes):
        raise ValueError(f"token_node must hold nodes in [0, {n_nodes}), "
                         f"got [{token_node.min().item()}, "
                         f"{token_node.max().item()}]")
    check_int("row_bytes", row_bytes, minimum=1)
    N, k = indices.shape
    used = torch.zeros(N, n_nodes, dtype=torch.bool)
    used.scatter_(1, nodes, True)                            # (N, nodes)
    own = torch.nn.functional.one_hot(token_node.long(), n_nodes).bool()
    remote_slots = (nodes != token_node[:, None]).sum(1)     # (N,)
    remote_nodes = (used & ~own).sum(1)                      # (N,)
    return NodeTraffic(N, k, used.sum(1), remote_slots, remote_nodes,
                       row_bytes)

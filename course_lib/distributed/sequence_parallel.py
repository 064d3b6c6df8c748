r"""Sequence parallelism (Korthikanti et al. 2022): the parts of a
tensor-parallel block that TP leaves replicated, split along the sequence.

Tensor parallelism (:mod:`course_lib.distributed.tensor_parallel`) splits
attention and the FFN, but the norms, the dropouts and the residual
additions between them run on the full ``(B, T, D)`` activations on
every rank: W copies of the same numbers, which cost activation memory.
These operations act on every token on its own, so rank $r$ can run them
on its own slice of the sequence, tokens $rT/W \dots (r+1)T/W - 1$.

The collectives at the edges of the TP region change, and their bytes do
not:

- entering the region, each rank needs the whole sequence: Megatron's $f$
  (identity) becomes an **all-gather** along the sequence
  (:func:`gather_from_sequence_parallel`), whose backward is a
  reduce-scatter of the gradient;
- leaving it, the row-parallel layer's partial sums were all-reduced
  ($g$); a rank now needs the sum for its own tokens only, a
  **reduce-scatter** along the sequence
  (:func:`reduce_scatter_to_sequence_parallel`), whose backward is an
  all-gather.

A ring all-reduce *is* a reduce-scatter followed by an all-gather
(:func:`~course_lib.distributed.data_parallel.ring_bytes_per_rank`): per
block and direction, TP sends $\frac{2(W-1)}{W}n$ bytes per rank in one
all-reduce, SP $\frac{W-1}{W}n + \frac{W-1}{W}n$ in a reduce-scatter
and an all-gather, $n = BTDb$. Same bytes, and the norms hold $1/W$ of
the activations.

One more thing changes: the weights that act in the sequence-parallel
region (the norms' $\gamma$, the row-parallel bias) are replicated, but
each rank sees only its tokens, so its gradient is a partial sum.
Megatron marks them (``param.sequence_parallel = True``) and all-reduces
their gradients over the TP group after the backward
(:func:`all_reduce_sequence_parallel_grads`).

Megatron keeps activations sequence-first, ``(T, B, D)``, so that a
slice of the sequence is a contiguous block and the collectives work in
place; batch-first, as here, the sequence axis is moved to the front for
the collective and back. Megatron also saves only its slice of the
all-gathered input of the column-parallel layers and gathers it again in
the backward; here autograd keeps the gathered input, so the saving is in
the norms, the residual stream and the dropouts only.

Shape letters: B batch, T length (the whole sequence), $T_r = T/W$
tokens of a rank, D = ``d_model``, W ranks.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from .._util.validation import check_type
from ..model.attention import fused_attention, scaled_dot_product_attention
from ..model.block import DecoderBlock, SwiGLU
from ..model.mha import (
    MultiHeadAttention,
    merge_heads,
    query_positions,
    repeat_kv,
    split_heads,
)
from .collectives import group_rank_and_size, require_group
from .tensor_parallel import (
    RowParallelLinear,
    TensorParallelAttention,
    TensorParallelSwiGLU,
)

__all__ = ["scatter_to_sequence_parallel", "gather_from_sequence_parallel",
           "reduce_scatter_to_sequence_parallel",
           "SequenceParallelRowLinear", "SequenceParallelSwiGLU",
           "SequenceParallelAttention", "SequenceParallelBlock",
           "all_reduce_sequence_parallel_grads"]


# ---------------------------------------------------------- collectives
def _all_gather_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, T_r, ...) on every rank -> (B, T, ...), rank order."""
    W = group_rank_and_size(group)[1]
    xt = x.transpose(0, 1).contiguous()                      # (T_r, B, ...)
    out = xt.new_empty((W * xt.shape[0],) + xt.shape[1:])    # (T, B, ...)
    dist.all_gather_single(out, xt, group=group)
    # contiguous: the layers that read it share one copy
    return out.transpose(0, 1).contiguous()                  # (B, T, ...)


def _reduce_scatter_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, T, ...) partial sums -> (B, T_r, ...): this rank's tokens of
    the sum over ranks."""
    W = group_rank_and_size(group)[1]
    xt = x.transpose(0, 1).contiguous()                      # (T, B, ...)
    out = xt.new_empty((xt.shape[0] // W,) + xt.shape[1:])   # (T_r, B, ...)
    dist.reduce_scatter_single(out, xt, group=group)
    return out.transpose(0, 1).contiguous()                  # (B, T_r, ...)


def _split_seq(x: torch.Tensor, group) -> torch.Tensor:
    """(B, T, ...) -> this rank's (B, T_r, ...) slice."""
    rank, W = group_rank_and_size(group)
    n = x.shape[1] // W
    return x.narrow(1, rank * n, n)


class _ScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_seq(x, group).clone()

    @staticmethod
    def backward(ctx, grad):
        return _all_gather_seq(grad, ctx.group), None


class _GatherFromSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        # every rank's grad is a partial sum (its own weight shard): sum
        # over ranks, keep this rank's tokens
        return _reduce_scatter_seq(grad, ctx.group), None


class _ReduceScatterToSequenceParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        # every rank's partial sum fed every token: all need the full grad
        return _all_gather_seq(grad, ctx.group), None


def _check_sequence(name: str, x, group) -> int:
    check_type(name, x, torch.Tensor, "a torch.Tensor")
    W = group_rank_and_size(group)[1]
    if x.dim() < 2:
        raise ValueError(f"{name} must have a sequence axis (B, T, ...), "
                         f"got shape {tuple(x.shape)}")
    return W


def scatter_to_sequence_parallel(x: torch.Tensor,
                                 group=None) -> torch.Tensor:
    r"""Enter the sequence-parallel region: ``x (B, T, ...)``, the same on
    every rank, -> this rank's tokens ``(B, T/W, ...)``. Backward: the
    ranks' gradients are all-gathered (each slice came from one rank).
    $W$ must divide $T$. On one process the identity.
    """
    W = _check_sequence("x", x, group)
    if x.shape[1] % W:
        raise ValueError(f"world_size={W} must divide the sequence length "
                         f"x.shape[1]={x.shape[1]}")
    if W == 1:
        return x
    return _ScatterToSequenceParallel.apply(x, group)


def gather_from_sequence_parallel(x: torch.Tensor,
                                  group=None) -> torch.Tensor:
    r"""All-gather along the sequence, the entry of the TP region (in
    place of $f$): ``x (B, T/W, ...)`` -> ``(B, T, ...)`` on every rank.
    Backward: a reduce-scatter, the sum over ranks of the gradient's
    slice for this rank's tokens. On one process the identity.
    """
    W = _check_sequence("x", x, group)
    if W == 1:
        return x
    return _GatherFromSequenceParallel.apply(x, group)


def reduce_scatter_to_sequence_parallel(x: torch.Tensor,
                                        group=None) -> torch.Tensor:
    r"""Reduce-scatter along the sequence, the exit of the TP region (in
    place of $g$'s all-reduce): partial sums ``x (B, T, ...)`` ->
    $\sum_r x_r$ on this rank's tokens, ``(B, T/W, ...)``. Backward: an
    all-gather. $W$ must divide $T$. On one process the identity.
    """
    W = _check_sequence("x", x, group)
    if x.shape[1] % W:
        raise ValueError(f"world_size={W} must divide the sequence length "
                         f"x.shape[1]={x.shape[1]}")
    if W == 1:
        return x
    return _ReduceScatterToSequenceParallel.apply(x, group)


# --------------------------------------------------------------- layers
class SequenceParallelRowLinear(RowParallelLinear):
    r"""A :class:`~course_lib.distributed.tensor_parallel.RowParallelLinear`
    whose partial sums are reduce-scattered along the sequence instead of
    all-reduced: $Y_{r'} = \big(\sum_r X_r A_r\big)_{\text{tokens of }r'}
    + b$.

    The bias is replicated and added to this rank's tokens only, so its
    gradient is marked ``sequence_parallel`` (all-reduce it with
    :func:`all_reduce_sequence_parallel_grads`).

    Forward: ``x_r (B, T, m/W) -> (B, T/W, D_out)``.
    """

    def __init__(self, linear: nn.Linear, *, group=None,
                 rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__(linear, group=group, rank=rank,
                         world_size=world_size)
        if self.bias is not None:
            self.bias.sequence_parallel = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_group(self.group, self.world_size)
        # (sum_r X_r A_r) on this rank's tokens: a reduce-scatter
        y = reduce_scatter_to_sequence_parallel(F.linear(x, self.weight),
                                                self.group)  # (B, T/W, D)
        return y if self.bias is None else y + self.bias


class SequenceParallelSwiGLU(TensorParallelSwiGLU):
    r"""A :class:`~course_lib.distributed.tensor_parallel.TensorParallelSwiGLU`
    that takes and returns this rank's tokens:

    $$Y_r = \Big(\sum_{r'} \big(\mathrm{SiLU}(X W_{g,r'}) \odot
    X W_{u,r'}\big) W_{d,r'}\Big)_{\text{tokens of } r}, \qquad
    X = \mathrm{AllGather}(X_1, \dots, X_W).$$

    Args: as :class:`TensorParallelSwiGLU`.

    Forward: ``x (B, T/W, D) -> (B, T/W, D)``.
    """

    def __init__(self, ffn: SwiGLU, group=None, *, rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__(ffn, group, rank=rank, world_size=world_size)
        self.down_proj = SequenceParallelRowLinear(
            ffn.down_proj, group=group, rank=self.rank,
            world_size=self.world_size)                      # W_{d,r}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_group(self.group, self.world_size)
        # all-gather (replaces f): every rank needs every token
        x = gather_from_sequence_parallel(x, self.group)     # (B, T, D)
        gate = F.silu(self.gate_proj(x))                     # (B, T, F/W)
        # reduce-scatter inside down_proj (replaces g's all-reduce)
        return self.down_proj(gate * self.up_proj(x))        # (B, T/W, D)


class SequenceParallelAttention(TensorParallelAttention):
    r"""A :class:`~course_lib.distributed.tensor_parallel.TensorParallelAttention`
    (this rank's heads) that takes and returns this rank's tokens: the
    input is all-gathered, attention runs over the whole sequence on the
    rank's heads, and $W^O$'s partial sums are reduce-scattered.

    Args: as :class:`TensorParallelAttention`. Self-attention only (no
    ``context``), no KV cache.
    """

    def __init__(self, mha: MultiHeadAttention, group=None, *,
                 rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__(mha, group, rank=rank, world_size=world_size)
        self.o_proj = SequenceParallelRowLinear(
            mha.o_proj, group=group, rank=self.rank,
            world_size=self.world_size)                      # W^O_r

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, T/W, D)`` -> ``(B, T/W, D)``; ``mask`` and
        ``positions`` are those of the whole sequence (T), as for the
        single-process module."""
        require_group(self.group, self.world_size)
        if not isinstance(x, torch.Tensor) or x.dim() != 3 \
                or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T/W, d_model="
                             f"{self.d_model}), got "
                             f"{getattr(x, 'shape', x)!r:.60}")
        # all-gather (replaces f): the whole sequence on every rank
        x = gather_from_sequence_parallel(x, self.group)     # (B, T, D)
        B, T, _ = x.shape
        q = split_heads(self.q_proj(x), self.n_heads)        # (B, H_r, T, d_k)
        k = split_heads(self.k_proj(x), self.n_kv_heads)     # (B, G_r, T, d_k)
        v = split_heads(self.v_proj(x), self.n_kv_heads)     # (B, G_r, T, d_k)
        if self.rope is not None:
            positions = query_positions(positions, T, None, x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        mask = self._local_mask(mask, B, T, T)
        if self.fused:
            out = fused_attention(q, k, v, mask, enable_gqa=self.n_rep > 1)
        else:
            out, _ = scaled_dot_product_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask)
        # reduce-scatter inside o_proj (replaces g's all-reduce)
        return self.o_proj(merge_heads(out))                 # (B, T/W, D)


class SequenceParallelBlock(nn.Module):
    r"""A pre-norm :class:`~course_lib.model.block.DecoderBlock` with tensor
    parallelism inside attention and the FFN, and sequence parallelism
    around them: the norms, dropouts and residual additions run on this
    rank's $T/W$ tokens.

    $$x_r \leftarrow x_r + \mathrm{Drop}(\mathrm{RS}(\mathrm{Attn}_r(
    \mathrm{AG}(\mathrm{Norm}_1(x_r))))), \qquad x_r \leftarrow x_r +
    \mathrm{Drop}(\mathrm{RS}(\mathrm{FFN}_r(\mathrm{AG}(
    \mathrm{Norm}_2(x_r))))),$$

    AG an all-gather and RS a reduce-scatter along the sequence. The
    norms are copies of the block's, their weights marked
    ``sequence_parallel``. Dropout draws its mask on this rank's tokens
    only (Megatron gives each TP rank its own random state there).

    Args:
        block: a ``DecoderBlock`` whose attention is a
            ``MultiHeadAttention`` and whose FFN is a ``SwiGLU``.
        group, rank, world_size: as :class:`TensorParallelSwiGLU`.

    Forward: ``x (B, T/W, D)`` -> ``(B, T/W, D)``; ``mask`` (causal, ...)
    and ``positions`` of the whole sequence.
    """

    def __init__(self, block: DecoderBlock, group=None, *,
                 rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        check_type("block", block, DecoderBlock, "a course_lib DecoderBlock")
        check_type("block.attention", block.attention, MultiHeadAttention,
                   "a course_lib MultiHeadAttention")
        check_type("block.ffn", block.ffn, SwiGLU, "a course_lib SwiGLU")
        kw = dict(rank=rank, world_size=world_size)
        self.attention = SequenceParallelAttention(block.attention, group,
                                                   **kw)
        self.ffn = SequenceParallelSwiGLU(block.ffn, group, **kw)
        self.group, self.rank = group, self.ffn.rank
        self.world_size = self.ffn.world_size
        self.norm1 = copy.deepcopy(block.norm1)
        self.norm2 = copy.deepcopy(block.norm2)
        self.dropout = nn.Dropout(block.dropout.p)
        for norm in (self.norm1, self.norm2):
            for p in norm.parameters():
                p.sequence_parallel = True

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T/W, D) -> (B, T/W, D)."""
        D = self.attention.d_model
        if not isinstance(x, torch.Tensor) or x.dim() != 3 \
                or x.shape[-1] != D:
            raise ValueError(f"x must have shape (B, T/W, d_model={D}), "
                             f"got {getattr(x, 'shape', x)!r:.60}")
        # x_r = x_r + Attn(Norm1(x_r)): the norm on T/W tokens
        a = self.attention(self.norm1(x), mask, positions=positions)
        x = x + self.dropout(a)                              # (B, T/W, D)
        f = self.ffn(self.norm2(x))                          # (B, T/W, D)
        return x + self.dropout(f)                           # (B, T/W, D)


def all_reduce_sequence_parallel_grads(module: nn.Module,
                                       group=None) -> int:
    r"""Sum over the ranks the gradients of ``module``'s parameters marked
    ``sequence_parallel`` (norm weights, row-parallel biases): each rank
    holds $\sum_{t \in r} \partial L / \partial \gamma$ over its own
    tokens, and the full gradient is the sum over ranks. One all-reduce
    of the flattened gradients, after the backward and before the
    optimizer step (Megatron's ``_allreduce_layernorm_grads``).

    Returns the number of gradient values reduced.
    """
    check_type("module", module, nn.Module, "a torch.nn.Module")
    grads = [p.grad for p in module.parameters()
             if getattr(p, "sequence_parallel", False) and p.grad is not None]
    if not grads or group_rank_and_size(group)[1] == 1:
        return sum(g.numel() for g in grads)
    flat = torch.cat([g.reshape(-1) for g in grads])         # one message
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    return flat.numel()

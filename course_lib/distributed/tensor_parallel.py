r"""Tensor parallelism in the style of Megatron-LM: one layer's matrices
split over W ranks, one all-reduce per block.

A linear layer $Y = XA$ can be split two ways (Shoeybi et al. 2019):

- by **columns**, $A = [A_1, \dots, A_W]$: rank $r$ computes
  $Y_r = X A_r$, a slice of the output features, from the full input;
- by **rows**, $A = [A_1; \dots; A_W]$ and $X = [X_1, \dots, X_W]$:
  rank $r$ computes a partial sum $X_r A_r$ and $Y = \sum_r X_r A_r$
  needs one all-reduce.

Chained, column then row, the slices of the first layer are exactly the
inputs the second needs, and a nonlinearity that acts feature by feature
(SiLU, the SwiGLU product) can run on the slices in between. A whole FFN
then costs one all-reduce forward ($g$) and one backward ($f$, see
:mod:`course_lib.distributed.launch`):

$$\mathrm{SwiGLU}(X) = \sum_r \big(\mathrm{SiLU}(X W_{g,r}) \odot
X W_{u,r}\big) W_{d,r}.$$

Attention splits the same way by **heads**: $W^Q, W^K, W^V$ by column
blocks of whole heads (with GQA, rank $r$ keeps query heads
$rH/W \dots$ and the K/V heads $rG/W \dots$ they read), each rank runs
attention on its heads, and $W^O$ by rows sums the heads' contributions.
Every rank passes the same tokens and receives the full output.

``nn.Linear`` stores $A^\top$ as ``weight`` (out, in): a column shard is
a block of *rows* of ``weight``.

Shape letters: B batch, T length, S key/value length, D = ``d_model``,
H, G query and key/value heads (``H_r``, ``G_r`` on one rank), d_k head
width, F hidden width, W ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._util.validation import check_bool, check_type
from ..model.attention import fused_attention, scaled_dot_product_attention
from ..model.block import SwiGLU
from ..model.mha import (
    MultiHeadAttention,
    mask_to_4d,
    merge_heads,
    query_positions,
    repeat_kv,
    split_heads,
)
from .collectives import (
    copy_to_parallel,
    reduce_from_parallel,
    require_group,
    resolve_rank_and_size,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "TensorParallelSwiGLU",
           "TensorParallelAttention"]


def _shard(t: torch.Tensor | None, dim: int, rank: int, world_size: int):
    """Rank's contiguous block of ``t`` along ``dim``, as a new parameter."""
    if t is None:
        return None
    block = t.shape[dim] // world_size
    part = t.detach().narrow(dim, rank * block, block)
    return nn.Parameter(part.clone(), requires_grad=t.requires_grad)


def _check_linear(name: str, linear, n: int, what: str, W: int) -> None:
    if n % W:
        raise ValueError(f"world_size={W} must divide {name}'s {what}, "
                         f"got {what}={n}")


class ColumnParallelLinear(nn.Module):
    r"""This rank's column block of $Y = XA + b$: $Y_r = X A_r + b_r$.

    Built from the full ``linear``; keeps rows $r\,\frac{n}{W} \dots
    (r+1)\frac{n}{W} - 1$ of its ``weight`` (and bias), $n$ =
    ``out_features``.

    Args:
        linear: the single-process layer (D_in -> n).
        group: process group (default: the world).
        rank, world_size: build for these instead of the group's.
        copy_input: apply $f$ to the input (gradient all-reduced); a
            block that applies $f$ once for several layers passes False.

    Forward: ``x (..., D_in) -> (..., n / W)``.
    """

    def __init__(self, linear: nn.Linear, *, group=None,
                 rank: int | None = None, world_size: int | None = None,
                 copy_input: bool = True) -> None:
        super().__init__()
        check_type("linear", linear, nn.Linear, "an nn.Linear")
        check_bool("copy_input", copy_input)
        self.rank, self.world_size = resolve_rank_and_size(group, rank, world_size)
        _check_linear("linear", linear, linear.out_features, "out_features",
                      self.world_size)
        self.group, self.copy_input = group, copy_input
        self.in_features = linear.in_features
        self.out_features = linear.out_features // self.world_size
        self.weight = _shard(linear.weight, 0, self.rank, self.world_size)
        self.bias = _shard(linear.bias, 0, self.rank, self.world_size)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features} (shard "
                f"{self.rank} of {self.world_size})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_group(self.group, self.world_size)
        if self.copy_input:
            x = copy_to_parallel(x, self.group)
        return F.linear(x, self.weight, self.bias)           # (..., n/W)


class RowParallelLinear(nn.Module):
    r"""$Y = \sum_r X_r A_r + b$: this rank's row block $A_r$ applied to
    its input slice $X_r$, then one all-reduce ($g$); the bias is added
    once, after the sum.

    Built from the full ``linear``; keeps columns $r\,\frac{m}{W} \dots$
    of its ``weight``, $m$ = ``in_features``, and the whole bias.

    Args:
        linear: the single-process layer (m -> D_out).
        group, rank, world_size: as :class:`ColumnParallelLinear`.

    Forward: ``x_r (..., m / W) -> (..., D_out)``, the same on every rank.
    """

    def __init__(self, linear: nn.Linear, *, group=None,
                 rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        check_type("linear", linear, nn.Linear, "an nn.Linear")
        self.rank, self.world_size = resolve_rank_and_size(group, rank, world_size)
        _check_linear("linear", linear, linear.in_features, "in_features",
                      self.world_size)
        self.group = group
        self.in_features = linear.in_features // self.world_size
        self.out_features = linear.out_features
        self.weight = _shard(linear.weight, 1, self.rank, self.world_size)
        self.bias = _shard(linear.bias, 0, 0, 1)             # replicated

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features} (shard "
                f"{self.rank} of {self.world_size})")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_group(self.group, self.world_size)
        # Y = sum_r X_r A_r: the one all-reduce of the block
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias     # (..., D_out)


class TensorParallelSwiGLU(nn.Module):
    r"""A :class:`~course_lib.model.block.SwiGLU` split over the ranks: gate and
    up projections by columns, down projection by rows.

    $\mathrm{SwiGLU}(X) = \sum_r (\mathrm{SiLU}(X W_{g,r}) \odot
    X W_{u,r}) W_{d,r}$: each rank holds $F/W$ hidden units, $3DF/W$
    parameters, and the block needs one all-reduce of $B T D$ numbers.

    Args:
        ffn: the single-process SwiGLU ($W$ divides its ``d_ff``).
        group: process group (default: the world).
        rank, world_size: build for these instead of the group's.

    Forward: ``x (..., D) -> (..., D)``, the same tokens on every rank.
    """

    def __init__(self, ffn: SwiGLU, group=None, *, rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        check_type("ffn", ffn, SwiGLU, "a course_lib SwiGLU")
        rank, world_size = resolve_rank_and_size(group, rank, world_size)
        if ffn.d_ff % world_size:
            raise ValueError(f"world_size={world_size} must divide the "
                             f"ffn's d_ff, got d_ff={ffn.d_ff}")
        kw = dict(group=group, rank=rank, world_size=world_size)
        self.group, self.rank, self.world_size = group, rank, world_size
        self.d_model, self.d_ff = ffn.d_model, ffn.d_ff // world_size
        self.gate_proj = ColumnParallelLinear(ffn.gate_proj, copy_input=False,
                                              **kw)          # W_{g,r}
        self.up_proj = ColumnParallelLinear(ffn.up_proj, copy_input=False,
                                            **kw)            # W_{u,r}
        self.down_proj = RowParallelLinear(ffn.down_proj, **kw)  # W_{d,r}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        require_group(self.group, self.world_size)
        # f: the same x everywhere; its gradient is summed over ranks
        x = copy_to_parallel(x, self.group)                  # (..., D)
        gate = F.silu(self.gate_proj(x))                     # (..., F/W)
        # sum_r (SiLU(X W_{g,r}) * X W_{u,r}) W_{d,r}; g inside down_proj
        return self.down_proj(gate * self.up_proj(x))        # (..., D)


class TensorParallelAttention(nn.Module):
    r"""A :class:`~course_lib.model.mha.MultiHeadAttention` with its heads split
    over the ranks.

    Rank $r$ keeps query heads $r H_r \dots (r+1) H_r - 1$ and K/V heads
    $r G_r \dots (r+1) G_r - 1$ ($H_r = H/W$, $G_r = G/W$; the query heads
    of a rank read only its K/V heads), as column blocks of ``q_proj``,
    ``k_proj``, ``v_proj``, and the matching rows of $W^O$ (``o_proj``):

    $$\mathrm{MultiHead}(X) = \sum_r \mathrm{Concat}_{i \in r}
    (\mathrm{head}_i)\, W^O_r + b^O.$$

    The RoPE hook and the ``fused`` flag are kept. No KV cache here.

    Args:
        mha: the single-process module ($W$ must divide ``n_heads`` and
            ``n_kv_heads``).
        group, rank, world_size: as :class:`TensorParallelSwiGLU`.
    """

    def __init__(self, mha: MultiHeadAttention, group=None, *,
                 rank: int | None = None,
                 world_size: int | None = None) -> None:
        super().__init__()
        check_type("mha", mha, MultiHeadAttention,
                   "a course_lib MultiHeadAttention")
        rank, world_size = resolve_rank_and_size(group, rank, world_size)
        if mha.n_heads % world_size or mha.n_kv_heads % world_size:
            raise ValueError(
                f"world_size={world_size} must divide n_heads and "
                f"n_kv_heads, got n_heads={mha.n_heads}, n_kv_heads="
                f"{mha.n_kv_heads}")
        kw = dict(group=group, rank=rank, world_size=world_size)
        self.group, self.rank, self.world_size = group, rank, world_size
        self.d_model, self.head_dim = mha.d_model, mha.head_dim
        self.n_heads_total = mha.n_heads
        self.n_heads = mha.n_heads // world_size             # H_r
        self.n_kv_heads = mha.n_kv_heads // world_size       # G_r
        self.n_rep = mha.n_rep
        self.rope, self.fused = mha.rope, mha.fused
        self.q_proj = ColumnParallelLinear(mha.q_proj, copy_input=False,
                                           **kw)             # W^Q_r
        self.k_proj = ColumnParallelLinear(mha.k_proj, copy_input=False,
                                           **kw)             # W^K_r
        self.v_proj = ColumnParallelLinear(mha.v_proj, copy_input=False,
                                           **kw)             # W^V_r
        self.o_proj = RowParallelLinear(mha.o_proj, **kw)    # W^O_r

    def extra_repr(self) -> str:
        return (f"heads {self.n_heads} of {self.n_heads_total}, kv heads "
                f"{self.n_kv_heads} (shard {self.rank} of "
                f"{self.world_size})")

    def _local_mask(self, mask, B: int, T: int, S: int):
        """The full-model mask checked against (B, H, T, S); a per-head
        mask keeps this rank's heads."""
        m4 = mask_to_4d(mask, B, self.n_heads_total, T, S)
        if m4 is not None and m4.dim() == 4 and m4.shape[1] > 1:
            m4 = m4[:, self.rank * self.n_heads:
                    (self.rank + 1) * self.n_heads]          # (B, H_r, T, S)
        return m4

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                context: torch.Tensor | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """Same arguments as ``MultiHeadAttention.forward`` (no cache, no
        weights): ``x (B, T, D)`` -> ``(B, T, D)`` on every rank."""
        require_group(self.group, self.world_size)
        if not isinstance(x, torch.Tensor) or x.dim() != 3 \
                or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model="
                             f"{self.d_model}), got "
                             f"{getattr(x, 'shape', x)!r:.60}")
        B, T, D = x.shape
        # f once for the three projections (and the context if any)
        x = copy_to_parallel(x, self.group)
        ctx = x if context is None else copy_to_parallel(context, self.group)
        # 1) this rank's heads only: Q_r = X W^Q_r, K_r, V_r
        q = split_heads(self.q_proj(x), self.n_heads)        # (B, H_r, T, d_k)
        k = split_heads(self.k_proj(ctx), self.n_kv_heads)   # (B, G_r, S, d_k)
        v = split_heads(self.v_proj(ctx), self.n_kv_heads)   # (B, G_r, S, d_k)
        # 2) the position hook rotates q and k, as in the full module
        if self.rope is not None:
            positions = query_positions(positions, T, None, x.device)
            q, k = self.rope(q, positions), self.rope(k, positions)
        mask = self._local_mask(mask, B, T, k.shape[2])
        # 3) attention on the rank's heads
        if self.fused:
            out = fused_attention(q, k, v, mask, enable_gqa=self.n_rep > 1)
        else:
            out, _ = scaled_dot_product_attention(
                q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask)
        # 4) sum_r Concat_{i in r}(head_i) W^O_r + b^O: one all-reduce
        return self.o_proj(merge_heads(out))                 # (B, T, D)

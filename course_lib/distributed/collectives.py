r"""Autograd-aware collectives of tensor and expert parallelism.

Two conjugate operators (Megatron-LM, Shoeybi et al. 2019, sec. 3):

- :func:`copy_to_parallel` ($f$): identity forward, all-reduce backward.
  Every rank holds the same input $X$ and uses it with its own shard
  $A_r$; the gradient $\partial L / \partial X = \sum_r
  (\partial L / \partial Y_r) A_r^\top$ needs every rank's term.
- :func:`reduce_from_parallel` ($g$): all-reduce forward, identity
  backward. $Y = \sum_r Y_r$; each rank already holds the full
  $\partial L / \partial Y$.

and :func:`all_to_all`, the exchange of expert parallelism: rank $r$
sends rows ``in_splits[s]`` to rank $s$ and receives ``out_splits[s]``
rows from it (uneven splits); its backward is the reverse exchange.
torch has autograd versions of these in ``torch.distributed.nn``, but
its all-reduce also sums the gradient in backward, which counts a
replicated output $W$ times; these are the Megatron pair, written out.

On one process (no process group) each is the identity.

Shape letters: W ranks (``world_size``), ... any dimensions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .._util.validation import check_int, check_type

__all__ = ["group_rank_and_size", "resolve_rank_and_size", "require_group",
           "copy_to_parallel", "reduce_from_parallel", "all_to_all"]


def group_rank_and_size(group=None) -> tuple[int, int]:
    """``(rank, world_size)`` of this process in ``group`` (default: the
    whole world); ``(0, 1)`` when no process group is initialised.
    """
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def resolve_rank_and_size(group, rank, world_size) -> tuple[int, int]:
    """The group's rank and size, or the ones given (to build shards
    without a process group, e.g. to inspect them)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass rank and world_size together or neither, "
                         f"got rank={rank!r}, world_size={world_size!r}")
    if rank is None:
        return group_rank_and_size(group)
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0)
    if rank >= world_size:
        raise ValueError(f"rank must be < world_size={world_size}, got "
                         f"{rank}")
    return rank, world_size


def require_group(group, world_size: int) -> None:
    """A module built for ``world_size`` > 1 ranks needs an initialised
    process group; raises a RuntimeError saying how to start one."""
    check_int("world_size", world_size, minimum=1)
    if world_size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"this module was built for world_size={world_size} but no "
            f"process group is initialised: run it inside a worker of "
            f"course_lib.distributed.launch.run (or torchrun)")


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)  # sum_r dL/dY_r A_r^T
        return grad, None


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)       # Y = sum_r Y_r
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's $f$: ``x`` unchanged; in backward the gradient is
    all-reduced (summed over the ranks). ``x`` any shape.
    """
    if group_rank_and_size(group)[1] == 1:
        return x
    return _CopyToParallel.apply(x, group)


def reduce_from_parallel(x: torch.Tensor, group=None) -> torch.Tensor:
    """Megatron's $g$: the sum of ``x`` over the ranks, one all-reduce;
    the gradient passes unchanged. ``x`` any shape, the same on every rank.
    """
    if group_rank_and_size(group)[1] == 1:
        return x
    return _ReduceFromParallel.apply(x, group)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group, ctx.rows = (out_splits, in_splits), group, \
            x.shape[0]
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits,
                               group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        # the reverse exchange: what came from rank s goes back to s
        back = grad.new_empty((ctx.rows,) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits,
                               out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int],
               in_splits: list[int], group=None) -> torch.Tensor:
    r"""Exchange rows between ranks: rows ``in_splits[0]`` of ``x`` go to
    rank 0, the next ``in_splits[1]`` to rank 1, ...; the result holds
    ``out_splits[s]`` rows from each rank $s$, in rank order.

    Differentiable: the backward sends the gradient rows back where they
    came from. Every rank must take part (forward and backward).

    Args:
        x: ``(sum(in_splits), ...)``.
        out_splits, in_splits: W row counts each (``out_splits`` of this
            rank is ``in_splits`` of the others, entry for this rank).

    Returns:
        ``(sum(out_splits), ...)``.
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    W = group_rank_and_size(group)[1]
    if len(out_splits) != W or len(in_splits) != W \
            or sum(in_splits) != x.shape[0]:
        raise ValueError(
            f"in_splits and out_splits must have world_size={W} entries "
            f"and sum(in_splits) must be x.shape[0]={x.shape[0]}, got "
            f"in_splits={in_splits}, out_splits={out_splits}")
    if W == 1:
        return x
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group)

r"""PyTorch's own tensor parallelism (``DTensor``), checked against the
course's layers.

The course builds tensor parallelism by hand
(:mod:`course_lib.distributed.tensor_parallel`): each rank keeps its
column or row block of a weight as a plain tensor, and Megatron's $f$ and
$g$ put the all-reduces in. PyTorch ships the same idea as an API, the
one a learner meets first (``torch.distributed.tensor.parallel``):

- a ``DeviceMesh`` names the ranks that share the work (here a 1-D mesh
  of every rank; on a cluster a 2-D mesh, TP inside a machine and data
  or expert parallelism across machines);
- ``parallelize_module(module, mesh, plan)`` replaces the named
  submodules' weights by ``DTensor`` shards, each rank holding its
  block, with a *placement* that says how the blocks make the whole
  tensor: ``Shard(0)`` (split along dimension 0) or ``Replicate()``;
- ``ColwiseParallel()`` splits an ``nn.Linear`` by output features (the
  rows of ``weight``, $A_r$ in $Y_r = XA_r$) and ``RowwiseParallel()`` by
  input features, summing the partial outputs with an all-reduce: the
  column-then-row chain of Megatron-LM.

For a SwiGLU, the plan ``{"gate_proj": ColwiseParallel(), "up_proj":
ColwiseParallel(), "down_proj": RowwiseParallel()}`` is the same split as
:class:`~course_lib.distributed.tensor_parallel.TensorParallelSwiGLU`:
:func:`dtensor_tp_run` builds both from one single-process SwiGLU and
compares their shards, outputs and input gradients with each other and
with the single process.

Shape letters: B batch, T length, D = ``d_model``, F = ``d_ff``, W ranks.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from .._util.validation import check_int
from ..model.block import SwiGLU
from .tensor_parallel import TensorParallelSwiGLU

__all__ = ["dtensor_tp_run"]

_NAMES = ("gate_proj", "up_proj", "down_proj")


def _maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def _parallelize(ffn: SwiGLU) -> SwiGLU:
    """``ffn`` split over every rank by torch's API, in place."""
    # a 1-D mesh of all ranks, named "tp"
    mesh = init_device_mesh("cpu", (dist.get_world_size(),),
                            mesh_dim_names=("tp",))
    # the plan: which nn.Linear is split how; weights become DTensors
    return parallelize_module(ffn, mesh, {
        "gate_proj": ColwiseParallel(),             # W_{g,r}: Shard(0)
        "up_proj": ColwiseParallel(),               # W_{u,r}: Shard(0)
        "down_proj": RowwiseParallel()})            # W_{d,r}: Shard(1)


def dtensor_tp_run(rank: int, world_size: int, *, d_model: int = 64,
                   d_ff: int = 256, batch: int = 2, length: int = 16,
                   seed: int = 0) -> dict:
    r"""A SwiGLU split over all ``world_size`` ranks twice, by torch's
    ``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel``
    and by the course's ``TensorParallelSwiGLU``, against the
    single-process module built from the same seed (forward, and the
    gradient of the input for the loss $\sum Y \odot C$).

    Returns (each rank): ``"same_shards"`` (this rank's blocks of the
    three weights are equal in both), ``"local_shapes"`` (the DTensor
    shards' shapes), ``"placements"`` (how each weight is split, as
    text), max differences ``"out_vs_course"``, ``"out_vs_single"``,
    ``"grad_vs_course"``, ``"grad_vs_single"``.
    """
    check_int("rank", rank, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_int("d_model", d_model, minimum=1)
    check_int("d_ff", d_ff, minimum=world_size)
    check_int("batch", batch, minimum=1)
    check_int("length", length, minimum=1)
    check_int("seed", seed, minimum=0)
    if d_ff % world_size:
        raise ValueError(f"world_size={world_size} must divide d_ff, got "
                         f"d_ff={d_ff}")
    torch.manual_seed(seed)
    full = SwiGLU(d_model, d_ff)                    # the same on every rank
    x = torch.randn(batch, length, d_model)         # (B, T, D)
    c = torch.randn(batch, length, d_model)
    torch_tp = _parallelize(copy.deepcopy(full))    # torch's API
    course_tp = TensorParallelSwiGLU(full)          # the course's layers
    out: dict = {"same_shards": all(
        torch.equal(getattr(torch_tp, name).weight.to_local(),
                    getattr(course_tp, name).weight)
        for name in _NAMES)}
    out["local_shapes"] = {
        name: tuple(getattr(torch_tp, name).weight.to_local().shape)
        for name in _NAMES}
    out["placements"] = {
        name: str(getattr(torch_tp, name).weight.placements)
        for name in _NAMES}
    ys, grads = {}, {}
    for name, module in (("torch", torch_tp), ("course", course_tp),
                         ("single", full)):
        xi = x.clone().requires_grad_()
        y = module(xi)                              # (B, T, D)
        (y * c).sum().backward()
        ys[name], grads[name] = y.detach().clone(), xi.grad
    for other in ("course", "single"):
        out[f"out_vs_{other}"] = _maxdiff(ys["torch"], ys[other])
        out[f"grad_vs_{other}"] = _maxdiff(grads["torch"], grads[other])
    return out

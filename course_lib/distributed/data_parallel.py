r"""Data parallelism and its sharded form, ZeRO / FSDP: what each rank
holds and what it sends.

**Data parallelism (DP).** Every rank holds the whole model and takes
its own $B/W$ rows of the batch. With the loss the mean over the batch
and equal shards, the full gradient is the mean of the ranks' gradients,

$$\nabla_\theta L = \frac{1}{B}\sum_{b=1}^{B} \nabla_\theta \ell_b
= \frac{1}{W}\sum_{r=1}^{W} \nabla_\theta L_r, \qquad
L_r = \frac{W}{B}\sum_{b \in r} \ell_b,$$

so one all-reduce of the $\Psi$ gradient numbers (then a division by
$W$) gives every rank the gradient one process would compute on the
concatenated batch, and the same optimizer step keeps the replicas equal.
torch's ``DistributedDataParallel`` (DDP) does not wait for the end of
the backward: it groups the gradients into *buckets* (25 MB by default)
and all-reduces each bucket as soon as all its gradients are ready,
while the backward of earlier layers still runs.
:func:`record_gradient_buckets` logs the buckets of a DDP model.

**What an all-reduce sends.** A ring all-reduce of $n$ bytes is a
*reduce-scatter* (after $W-1$ steps rank $r$ holds the sum of chunk $r$)
followed by an *all-gather* (the summed chunks go round once more); each
step sends a chunk of $n/W$ bytes, so a rank sends

$$\underbrace{\tfrac{W-1}{W}\,n}_{\text{reduce-scatter}} +
\underbrace{\tfrac{W-1}{W}\,n}_{\text{all-gather}}
= \tfrac{2(W-1)}{W}\,n$$

(:func:`ring_bytes_per_rank`). Sharding (ZeRO) and sequence parallelism
both split the all-reduce into its two halves and do useful work in
between.

**ZeRO** (Rajbhandari et al. 2020). Mixed-precision Adam keeps, per
parameter, 2 bytes of fp16 weights, 2 of fp16 gradients and $K = 12$ of
optimizer states (fp32 master weights, momentum and variance, 4 each):
$16\Psi$ bytes on every DP rank. ZeRO removes the redundancy in stages
(:func:`zero_model_state_bytes`):

| stage | shards | bytes per rank |
|---|---|---|
| DP | nothing | $(2 + 2 + K)\Psi$ |
| ZeRO-1 ($P_{os}$) | optimizer states | $4\Psi + K\Psi/W$ |
| ZeRO-2 ($P_{os+g}$) | + gradients | $2\Psi + (2+K)\Psi/W$ |
| ZeRO-3 ($P_{os+g+p}$) | + parameters | $(4+K)\Psi/W$ |

ZeRO-1 and 2 send what DP sends: the gradients are reduce-scattered (a
rank needs the summed gradient only of its own shard, which it updates)
and the updated shards all-gathered, $2\Psi$ values. ZeRO-3 keeps only a
shard of the parameters too and all-gathers each layer's parameters
before its forward and again before its backward: $3\Psi$, 1.5 times DP
(:func:`zero_traffic_bytes`).

**FSDP** is ZeRO-3 in PyTorch. FSDP2's ``fully_shard`` turns every
parameter into a ``DTensor`` sharded along dim 0 over a ``DeviceMesh``
(rank $r$ keeps rows $r\lceil n/W\rceil \dots$, the last ranks fewer
when $W$ does not divide $n$); applied to each block and then to the root, it
all-gathers a block's parameters just before the block runs, frees them
after (``reshard_after_forward``; False keeps them for the backward:
ZeRO-2's traffic), and reduce-scatters the block's gradients as soon as
they are ready. It runs on the CPU with gloo, as here. The worker
:func:`~course_lib.distributed.scaling_experiments.fully_shard_run`
trains one step with it against one process; :func:`count_collectives`
records the collectives it makes.

DeepSeek-V3 trains with ZeRO-1 data parallelism inside 16-way pipeline
and 64-way expert parallelism (report, sec. 3.2).

Shape letters: W ranks (``world_size``), $\Psi$ parameters, B batch.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from .._util.validation import (check_choice, check_int, check_real,
                                check_type)

__all__ = ["ring_bytes_per_rank", "ModelStateBytes", "zero_model_state_bytes",
           "zero_traffic_bytes", "CollectiveCall", "count_collectives",
           "record_gradient_buckets"]

# what one rank sends per byte of the full tensor, times W / (W - 1)
_RING_PASSES = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}


def ring_bytes_per_rank(collective: str, n_bytes: float,
                        world_size: int) -> float:
    r"""Bytes one rank sends in a ring ``collective`` over a tensor of
    ``n_bytes`` (the full tensor: all-reduce's, all-gather's output,
    reduce-scatter's input): $\frac{W-1}{W}n$ for a reduce-scatter or an
    all-gather, $\frac{2(W-1)}{W}n$ for an all-reduce (the two in a row).

    gloo and NCCL may pick another algorithm (a tree, recursive halving)
    for some sizes; the ring is the bandwidth-optimal one and the
    reference the papers count with.

    Args:
        collective: ``"all_reduce"``, ``"reduce_scatter"`` or
            ``"all_gather"``.
        n_bytes: size of the full tensor in bytes.
        world_size: $W \ge 1$.
    """
    check_choice("collective", collective, tuple(_RING_PASSES))
    check_real("n_bytes", n_bytes, minimum=0)
    check_int("world_size", world_size, minimum=1)
    W = world_size
    return _RING_PASSES[collective] * (W - 1) / W * n_bytes


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes of model states one rank holds (see
    :func:`zero_model_state_bytes`): ``params``, ``grads`` and
    ``optimizer_states``; ``total`` their sum."""
    params: float
    grads: float
    optimizer_states: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer_states


def zero_model_state_bytes(n_params: int, world_size: int, stage: int, *,
                           param_bytes: int = 2, grad_bytes: int = 2,
                           optimizer_bytes: int = 12) -> ModelStateBytes:
    r"""Bytes of model states per rank under plain data parallelism
    (``stage=0``) and ZeRO stages 1-3 (Rajbhandari et al. 2020, fig. 1):

    $$\text{DP: } (p + g + K)\Psi, \quad
    \text{1: } (p + g)\Psi + \frac{K\Psi}{W}, \quad
    \text{2: } p\Psi + \frac{(g + K)\Psi}{W}, \quad
    \text{3: } \frac{(p + g + K)\Psi}{W},$$

    with $p = 2$, $g = 2$ (fp16) and $K = 12$ (Adam's fp32 weights,
    momentum and variance) for mixed-precision training. The paper's
    example, $\Psi = 7.5$ B on $W = 64$ GPUs: 120, 31.4, 16.6 and 1.9 GB.
    Activations, buffers and fragmentation come on top.

    Args:
        n_params: $\Psi$. world_size: data-parallel ranks $W$.
        stage: 0 (DP), 1, 2 or 3.
        param_bytes, grad_bytes, optimizer_bytes: $p$, $g$, $K$ per
            parameter.

    Returns:
        :class:`ModelStateBytes` (floats: $\Psi/W$ need not be whole).
    """
    check_int("n_params", n_params, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_choice("stage", stage, (0, 1, 2, 3))
    for name, b in (("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                    ("optimizer_bytes", optimizer_bytes)):
        check_int(name, b, minimum=0)
    W, psi = world_size, n_params
    # stage s shards the optimizer states (s >= 1), gradients (s >= 2),
    # parameters (s = 3)
    return ModelStateBytes(
        params=param_bytes * psi / (W if stage >= 3 else 1),
        grads=grad_bytes * psi / (W if stage >= 2 else 1),
        optimizer_states=optimizer_bytes * psi / (W if stage >= 1 else 1))


def zero_traffic_bytes(n_params: int, world_size: int, stage: int, *,
                       element_bytes: int = 2) -> float:
    r"""Bytes one rank sends per training step under DP or ZeRO stage
    1-3, with ring collectives (Rajbhandari et al. 2020, sec. 7):

    - DP: an all-reduce of the gradients, $\frac{2(W-1)}{W}\Psi b$;
    - ZeRO-1, 2: a reduce-scatter of the gradients and an all-gather of
      the updated parameters, the same $\frac{2(W-1)}{W}\Psi b$;
    - ZeRO-3: all-gathers of the parameters in the forward and again in
      the backward, and a reduce-scatter of the gradients,
      $\frac{3(W-1)}{W}\Psi b$.

    Args:
        n_params: $\Psi$. world_size: $W$. stage: 0 (DP), 1, 2 or 3.
        element_bytes: $b$, bytes per communicated value (2: fp16).
    """
    check_int("n_params", n_params, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_choice("stage", stage, (0, 1, 2, 3))
    check_int("element_bytes", element_bytes, minimum=1)
    n = n_params * element_bytes
    if stage == 0:
        return ring_bytes_per_rank("all_reduce", n, world_size)
    passes = 3 if stage == 3 else 2     # all-gathers + one reduce-scatter
    return passes * ring_bytes_per_rank("all_gather", n, world_size)


@dataclass(frozen=True)
class CollectiveCall:
    """One collective seen by :func:`count_collectives`: ``op``
    (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``), ``n_bytes``
    of the full tensor and the group's ``world_size``; ``ring_bytes`` is
    what one rank sends with a ring (:func:`ring_bytes_per_rank`)."""
    op: str
    n_bytes: int
    world_size: int

    @property
    def ring_bytes(self) -> float:
        return ring_bytes_per_rank(self.op, self.n_bytes, self.world_size)


# torch.distributed function -> (op, argument holding the full tensor)
_COUNTED = {"all_reduce": ("all_reduce", "tensor"),
            "all_gather_single": ("all_gather", "output_tensor"),
            "all_gather_into_tensor": ("all_gather", "output_tensor"),
            "reduce_scatter_single": ("reduce_scatter", "input"),
            "reduce_scatter_tensor": ("reduce_scatter", "input")}


@contextlib.contextmanager
def count_collectives():
    """Record every all-reduce, all-gather and reduce-scatter that Python
    code calls through ``torch.distributed`` inside the block (the course's
    layers, FSDP2): yields a list that receives one
    :class:`CollectiveCall` per call.

    DDP is not seen: its reducer calls the process group from C++ (use
    :func:`record_gradient_buckets`).
    """
    calls: list[CollectiveCall] = []
    originals = {name: getattr(dist, name) for name in _COUNTED
                 if hasattr(dist, name)}

    def counting(name, original):
        op, arg = _COUNTED[name]
        signature = inspect.signature(original)

        def call(*args, **kwargs):
            bound = signature.bind(*args, **kwargs).arguments
            t = bound[arg]
            calls.append(CollectiveCall(op, t.numel() * t.element_size(),
                                        dist.get_world_size(
                                            bound.get("group"))))
            return original(*args, **kwargs)
        return call

    for name, original in originals.items():
        setattr(dist, name, counting(name, original))
    try:
        yield calls
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def record_gradient_buckets(model: DistributedDataParallel) -> list[int]:
    """Log the buckets a DDP model all-reduces: returns a list that
    receives each bucket's size in bytes as the backward sends it.

    Registers a communication hook that records the bucket's flat
    gradient buffer and then does what DDP does without a hook (the
    ``allreduce_hook`` of torch: divide by $W$, all-reduce), so the
    gradients are unchanged. Call it before the first backward.
    """
    check_type("model", model, DistributedDataParallel,
               "a torch.nn.parallel.DistributedDataParallel")
    sizes: list[int] = []

    def hook(group, bucket):
        buffer = bucket.buffer()                 # the bucket's gradients
        sizes.append(buffer.numel() * buffer.element_size())
        return default_hooks.allreduce_hook(group, bucket)   # mean over W

    model.register_comm_hook(model.process_group, hook)
    return sizes

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

Shape letters: B batch (of a rank), T length, D = ``d_model``, N tokens
of a rank, E experts, k experts per token, V vocabulary, W ranks
(``size``).
"""
from __future__ import annotations

import contextlib
import copy
import statistics

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel

from .._util.validation import (check_bool, check_choice, check_int,
                                check_real, check_sizes)
from ..model.block import DecoderBlock, SwiGLU
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention
from ..model.moe import MoE
from ..model.rope import RotaryEmbedding
from ..model.routing import DeepSeekV3Router
from .data_parallel import count_collectives, record_gradient_buckets
from .expert_parallel import ExpertParallelMoE
from .node_routing import cross_node_traffic
from .sequence_parallel import (SequenceParallelBlock,
                                all_reduce_sequence_parallel_grads)
from .tensor_parallel import TensorParallelAttention, TensorParallelSwiGLU

__all__ = ["count_all_reduce", "tensor_parallel_run", "expert_parallel_run",
           "imbalance_run", "node_limited_run", "data_parallel_run",
           "fully_shard_run", "sequence_parallel_run"]


def _check_size(world_size: int, size: int) -> None:
    check_int("size", size, minimum=1)
    if size > world_size:
        raise ValueError(f"size must be <= world_size={world_size}, got "
                         f"{size}")


def _group(rank: int, world_size: int, size: int):
    """(group of ranks 0..size-1, member?). Every rank must call it, in
    the same order (``new_group`` is collective)."""
    _check_size(world_size, size)
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

    The layout is a ``DeviceMesh`` of shape (nodes, ranks per node),
    dimensions ``("node", "tp")``: the inner one holds the ranks of a node,
    where tensor parallelism would go (NVLink); expert parallelism spans
    the whole mesh (its two dimensions flattened into one group, ``"ep"``),
    and a rank's node is its coordinate along ``"node"``.

    Returns on ranks < size: ``"cross_node_bytes"`` measured from the
    all-to-all split sizes (dispatch + combine, one copy per slot),
    ``"traffic"``, the :class:`~course_lib.distributed.node_routing.NodeTraffic` of
    this rank's tokens (per-slot and per-node copies), and
    ``"max_diff"`` against the single-process MoE.
    """
    check_bool("limited", limited)
    check_int("ranks_per_node", ranks_per_node, minimum=1)
    _check_size(world_size, size)
    if size % ranks_per_node:
        raise ValueError(f"ranks_per_node must divide size={size}, got "
                         f"{ranks_per_node}")
    n_nodes = size // ranks_per_node
    # every rank of the world builds the mesh (its groups are collective)
    mesh = init_device_mesh("cpu", (n_nodes, ranks_per_node),
                            mesh_dim_names=("node", "tp"))
    # one group over both dimensions (torch's idiom, as in torchtitan)
    ep_mesh = mesh._flatten("ep")
    if mesh.get_coordinate() is None:                # not in the mesh
        return None
    torch.manual_seed(seed)
    gate = DeepSeekV3Router(d_model, n_experts, top_k,
                            n_group=n_nodes if limited else 1,
                            topk_group=topk_group if limited else 1)
    with torch.no_grad():
        gate.weight.normal_(0, d_model ** -0.5)
    moe = MoE(d_model, n_experts=n_experts, top_k=top_k, d_expert=16,
              gate=gate)
    ep = ExpertParallelMoE(moe, ep_mesh.get_group())
    xs = _inputs(size, n_tokens, d_model, seed)
    with torch.no_grad():
        y, info = ep.forward_with_info(xs[rank])
        ref = moe(torch.cat(xs))
    rows = slice(rank * n_tokens, (rank + 1) * n_tokens)
    node = torch.full((n_tokens,), mesh.get_local_rank("node"))
    traffic = cross_node_traffic(info.indices, node, n_experts=n_experts,
                                 n_nodes=n_nodes,
                                 row_bytes=ep.stats.row_bytes)
    return {"cross_node_bytes": ep.stats.cross_node_bytes(ranks_per_node),
            "traffic": traffic, "stats": ep.stats,
            "max_diff": _maxdiff(y, ref[rows])}


# ------------------------------------------------- data parallelism, FSDP
def _tiny_lm(vocab_size: int, d_model: int, n_layers: int,
             seed: int) -> DecoderLM:
    """A small Llama-style DecoderLM (GQA, RoPE, SwiGLU, tied
    embeddings), the same on every rank."""
    torch.manual_seed(seed)
    return DecoderLM(DecoderLMConfig(
        vocab_size=vocab_size, hidden_size=d_model, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=n_layers))


def _lm_batch(size: int, batch: int, length: int, vocab_size: int,
              seed: int) -> torch.Tensor:
    """Token ids (W B, T + 1) of the global batch: rank r takes rows
    r B ... (r+1) B - 1."""
    gen = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab_size, (size * batch, length + 1),
                         generator=gen)


def _lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all (rows x positions)."""
    logits = model(ids[:, :-1])                              # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _max_grad_diff(params, ref_params, full=lambda t: t) -> float:
    return max(_maxdiff(full(p.grad), q.grad)
               for p, q in zip(params, ref_params))


def data_parallel_run(rank: int, world_size: int, size: int, *,
                      batch: int = 4, length: int = 16,
                      vocab_size: int = 64, d_model: int = 32,
                      n_layers: int = 2, bucket_cap_mb: float = 0.05,
                      steps: int = 2, seed: int = 0) -> dict | None:
    r"""A small DecoderLM trained data-parallel with torch's
    ``DistributedDataParallel`` on ``size`` ranks, each on its ``batch``
    rows of the global batch, against one process on all $W B$ rows
    (mean cross-entropy: the DDP gradient, averaged over ranks, must be
    the one-process gradient).

    ``steps`` backward passes (gradients zeroed between them): DDP builds
    its buckets in parameter order for the first and rebuilds them in
    the order the gradients arrived for the next ones, of at most
    ``bucket_cap_mb`` MB each.

    Returns on ranks < size: ``"grad_diff"`` (max over all parameters of
    the last backward), ``"buckets"``, a list per backward of the
    bucket sizes all-reduced (bytes, from
    :func:`~course_lib.distributed.data_parallel.record_gradient_buckets`),
    ``"n_params"`` and ``"param_bytes"`` (float32).
    """
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    check_sizes(batch=batch, length=length, steps=steps)
    check_real("bucket_cap_mb", bucket_cap_mb, positive=True)
    model = _tiny_lm(vocab_size, d_model, n_layers, seed)
    ids = _lm_batch(size, batch, length, vocab_size, seed)   # (W B, T+1)
    ref = copy.deepcopy(model)
    _lm_loss(ref, ids).backward()            # one process, all W B rows
    ddp = DistributedDataParallel(model, process_group=group,
                                  bucket_cap_mb=bucket_cap_mb)
    buckets = record_gradient_buckets(ddp)
    mine = ids[rank * batch:(rank + 1) * batch]              # (B, T+1)
    per_step = []
    for _ in range(steps):
        ddp.zero_grad(set_to_none=True)
        start = len(buckets)
        _lm_loss(ddp, mine).backward()       # all-reduces inside
        per_step.append(buckets[start:])
    n_params = sum(p.numel() for p in model.parameters())
    return {"grad_diff": _max_grad_diff(model.parameters(),
                                        ref.parameters()),
            "buckets": per_step, "n_params": n_params,
            "param_bytes": 4 * n_params}


def _local_bytes(tensors) -> int:
    """Bytes this rank stores of (possibly sharded) tensors."""
    from torch.distributed.tensor import DTensor
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes
               for t in tensors)


def _optimizer_states(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The per-parameter state tensors (Adam's two moments), without the
    step counters."""
    return [v for state in opt.state.values() for k, v in state.items()
            if k != "step"]


def fully_shard_run(rank: int, world_size: int, size: int, *,
                    optimizer: str = "adam", lr: float = 1e-2,
                    batch: int = 4, length: int = 16,
                    vocab_size: int = 64, d_model: int = 32,
                    n_layers: int = 2, seed: int = 0) -> dict | None:
    r"""One training step of a small DecoderLM under FSDP2
    (``torch.distributed.fsdp.fully_shard``, ZeRO-3) on a 1-D
    ``DeviceMesh`` of ``size`` ranks, each on its ``batch`` rows, against
    one process on all rows with the same optimizer (``"adam"`` or
    ``"sgd"``, learning rate ``lr``).

    Each block is one FSDP unit (all-gathered before it runs, resharded
    after), the root holds the embedding and the final norm.

    Returns on ranks < size: ``"grad_diff"`` (the full gradients,
    gathered, against one process), ``"step_diff"`` (the parameters
    after the step), this rank's ``"param_bytes"``, ``"grad_bytes"`` and
    ``"optimizer_bytes"`` and the one-process ``"param_bytes_full"`` and
    ``"optimizer_bytes_full"``, ``"collectives"``: the
    :class:`~course_lib.distributed.data_parallel.CollectiveCall` of the
    forward and backward, and ``"n_params"``.
    """
    _check_size(world_size, size)
    check_choice("optimizer", optimizer, ("adam", "sgd"))
    check_real("lr", lr, positive=True)
    check_sizes(batch=batch, length=length)
    # FSDP2 and DTensor take a second to import: only where they run
    from torch.distributed.fsdp import fully_shard
    # every rank of the world builds the mesh (its group is collective)
    mesh = init_device_mesh("cpu", (size,), mesh_dim_names=("dp",))
    if mesh.get_coordinate() is None:
        return None
    model = _tiny_lm(vocab_size, d_model, n_layers, seed)
    ids = _lm_batch(size, batch, length, vocab_size, seed)   # (W B, T+1)
    ref = copy.deepcopy(model)
    for layer in model.layers:               # one unit per block ...
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)            # ... and the root's rest
    make = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]
    opt, ref_opt = make(model.parameters(), lr=lr), \
        make(ref.parameters(), lr=lr)
    mine = ids[rank * batch:(rank + 1) * batch]              # (B, T+1)
    with count_collectives() as calls:
        _lm_loss(model, mine).backward()     # gradients reduce-scattered
    _lm_loss(ref, ids).backward()
    grad_diff = _max_grad_diff(model.parameters(), ref.parameters(),
                               lambda g: g.full_tensor())
    opt.step()                               # each rank updates its shard
    ref_opt.step()
    with torch.no_grad():
        step_diff = max(_maxdiff(p.full_tensor(), q) for p, q in
                        zip(model.parameters(), ref.parameters()))
    return {"grad_diff": grad_diff, "step_diff": step_diff,
            "param_bytes": _local_bytes(model.parameters()),
            "grad_bytes": _local_bytes(p.grad for p in model.parameters()),
            "optimizer_bytes": _local_bytes(_optimizer_states(opt)),
            "param_bytes_full": _local_bytes(ref.parameters()),
            "optimizer_bytes_full": _local_bytes(_optimizer_states(ref_opt)),
            "collectives": calls,
            "n_params": sum(p.numel() for p in ref.parameters())}


# --------------------------------------------------- sequence parallelism
@contextlib.contextmanager
def _saved_activation_bytes(module: nn.Module):
    """Bytes autograd saves for the backward inside the block, each
    storage once, the parameters of ``module`` left out: yields a
    one-element list."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages: dict[int, int] = {}
    total = [0]

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield total
    total[0] = sum(storages.values())


@contextlib.contextmanager
def _output_bytes(*modules: nn.Module):
    """Bytes of the outputs of ``modules`` in the block: yields a
    one-element list."""
    total = [0]

    def hook(module, inputs, output):
        total[0] += output.nbytes

    handles = [m.register_forward_hook(hook) for m in modules]
    try:
        yield total
    finally:
        for h in handles:
            h.remove()


class _TensorParallelBlock(nn.Module):
    """The block of :func:`tensor_parallel_run`: TP attention and FFN, the
    norms and residual additions replicated on all T tokens."""

    def __init__(self, block: DecoderBlock, group) -> None:
        super().__init__()
        self.norm1 = copy.deepcopy(block.norm1)
        self.norm2 = copy.deepcopy(block.norm2)
        self.attention = TensorParallelAttention(block.attention, group)
        self.ffn = TensorParallelSwiGLU(block.ffn, group)

    def forward(self, x, mask):
        x = x + self.attention(self.norm1(x), mask)          # (B, T, D)
        return x + self.ffn(self.norm2(x))                   # (B, T, D)


def _shard_grad_diff(parallel: nn.Module, full: nn.Module, rank: int,
                     W: int) -> float:
    """Max difference of every shard's gradient against its block of the
    full gradient: rows of the column-parallel weights (and their
    biases), columns of the row-parallel ones."""
    diff = 0.0
    for name, p in parallel.named_parameters():
        layer = name.rsplit(".", 2)[-2]
        if getattr(p, "sequence_parallel", False) or layer.startswith(
                "norm"):
            continue                          # replicated, not a shard
        dim = 1 if layer in ("o_proj", "down_proj") else 0
        g = full.get_parameter(name).grad
        n = g.shape[dim] // W
        diff = max(diff, _maxdiff(p.grad, g.narrow(dim, rank * n, n)))
    return diff


def sequence_parallel_run(rank: int, world_size: int, size: int, *,
                          d_model: int = 64, d_ff: int = 256,
                          n_heads: int = 8, n_kv_heads: int = 4,
                          batch: int = 2, length: int = 16,
                          seed: int = 0) -> dict | None:
    r"""A pre-norm block (GQA attention with RoPE and a causal mask,
    SwiGLU, RMSNorms) run three ways on ``size`` ranks: on one process,
    with tensor parallelism (norms replicated) and with sequence
    parallelism around it
    (:class:`~course_lib.distributed.sequence_parallel.SequenceParallelBlock`,
    rank $r$ holding tokens $rT/W \dots$). Loss $\sum Y \odot C$.

    Returns on ranks < size ``{"tp": ..., "sp": ...}``, each with
    ``"out_diff"`` and ``"grad_diff"`` (input gradient; for SP on this
    rank's tokens) against one process, ``"forward"`` and ``"backward"``,
    the collectives made
    (:class:`~course_lib.distributed.data_parallel.CollectiveCall`),
    ``"norm_bytes"``, the bytes of the two norms' outputs on this rank,
    and ``"saved_bytes"``, what autograd kept for the backward (each
    storage once, weights left out); for SP also ``"weight_grad_diff"``
    (every shard against its block of the full gradient),
    ``"replicated_grad_diff"`` (the norm weights and the row-parallel
    bias, after their all-reduce,
    :func:`~course_lib.distributed.sequence_parallel.all_reduce_sequence_parallel_grads`)
    and ``"grad_sync"``, that all-reduce's collectives.
    """
    group, member = _group(rank, world_size, size)
    if not member:
        return None
    check_sizes(batch=batch, length=length)
    if length % size:
        raise ValueError(f"size={size} must divide length={length}")
    torch.manual_seed(seed)
    block = DecoderBlock(d_model, attention=MultiHeadAttention(
        d_model, n_heads, n_kv_heads=n_kv_heads,
        rope=RotaryEmbedding(d_model // n_heads)), ffn=SwiGLU(d_model, d_ff))
    x = torch.randn(batch, length, d_model)                  # (B, T, D)
    c = torch.randn(batch, length, d_model)
    mask = causal_mask(length)
    # built before the reference's backward: the norms are copies
    tp, sp = _TensorParallelBlock(block, group), \
        SequenceParallelBlock(block, group)
    x_ref = x.clone().requires_grad_()
    y_ref = block(x_ref, mask)                               # (B, T, D)
    (y_ref * c).sum().backward()
    n = length // size
    mine = slice(rank * n, (rank + 1) * n)                   # T/W tokens
    out = {}
    for name, layer, x_in, c_in, ref in (
            ("tp", tp, x, c, y_ref),
            ("sp", sp, x[:, mine], c[:, mine], y_ref[:, mine])):
        x_in = x_in.clone().requires_grad_()
        with count_collectives() as fwd, \
                _output_bytes(layer.norm1, layer.norm2) as norm_bytes, \
                _saved_activation_bytes(layer) as saved:
            y = layer(x_in, mask)
        with count_collectives() as bwd:
            (y * c_in).sum().backward()
        ref_grad = x_ref.grad if name == "tp" else x_ref.grad[:, mine]
        out[name] = {"out_diff": _maxdiff(y, ref),
                     "grad_diff": _maxdiff(x_in.grad, ref_grad),
                     "forward": fwd, "backward": bwd,
                     "norm_bytes": norm_bytes[0], "saved_bytes": saved[0]}
    with count_collectives() as sync:
        all_reduce_sequence_parallel_grads(sp, group)
    out["sp"] |= {
        "weight_grad_diff": _shard_grad_diff(sp, block, rank, size),
        "replicated_grad_diff": max(
            _maxdiff(p.grad, block.get_parameter(name).grad)
            for name, p in sp.named_parameters()
            if getattr(p, "sequence_parallel", False)),
        "grad_sync": sync}
    return out

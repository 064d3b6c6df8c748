r"""Workers for :func:`course_lib.distributed.launch.run` that check the
parallel layers against the single-process ones, and workers that fail
on purpose.

They live in a module of their own, not in a test function, because
:func:`~course_lib.distributed.launch.run` *spawns* its processes, which
find the worker by importing its module (``tests/`` is on the path the
spawned processes inherit). Every rank builds the same
single-process module from the same seed, so the references need no
communication: each rank compares its part of the parallel result with
the matching part of the single-process result. The loss is
$L = \sum (\text{out} \odot C)$ with a fixed random $C$, so every
gradient is a non-trivial number.

Each check returns maximum absolute differences (floats) by name, and
the expert-parallel check also the exchange counters.

The parallel layers run under ``torch.device("meta")`` (:func:`_strict`):
a tensor they create without ``device=`` lands on the meta device and
the step fails or its result differs, as it would on a GPU, where such a
tensor lands on the CPU. This machine has no GPU; the meta device is how
it catches the mistake.

Shape letters: B batch, T length, D = ``d_model``, N tokens of a rank,
W ranks.
"""
from __future__ import annotations

import copy
import time

import torch
import torch.distributed as dist

from course_lib.distributed.collectives import group_rank_and_size
from course_lib.distributed import scaling_experiments
from course_lib.distributed.expert_parallel import ExpertParallelMoE
from course_lib.distributed.sequence_parallel import (
    SequenceParallelBlock,
    all_reduce_sequence_parallel_grads,
)
from course_lib.distributed.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TensorParallelAttention,
    TensorParallelSwiGLU,
)
from course_lib.model.block import DecoderBlock, SwiGLU
from course_lib.model.masks import causal_mask
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.moe import MoE
from course_lib.model.rope import RotaryEmbedding
from course_lib.model.routing import DeepSeekV3Router, TopKRouter

__all__ = ["check_tensor_parallel", "check_expert_parallel",
           "check_sequence_parallel", "check_parallel_layers",
           "fail_on_rank", "sleep_on_rank"]


def _diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    """max |a - b|, a missing gradient counting as zeros."""
    if a is None and b is None:
        return 0.0
    a = torch.zeros_like(b) if a is None else a.detach()
    b = torch.zeros_like(a) if b is None else b.detach()
    return float((a - b).abs().max()) if a.numel() else 0.0


def _strict():
    """Tensors created without ``device=`` go to the meta device."""
    return torch.device("meta")


def _rows(t: torch.Tensor | None, rank: int, W: int, dim: int):
    if t is None:
        return None
    n = t.shape[dim] // W
    return t.narrow(dim, rank * n, n)


def _tp_case(rank: int, W: int, full, make_tp, x: torch.Tensor,
             call: dict, column: list[str], row: list[str],
             prefix: str) -> dict[str, float]:
    """Forward and backward of ``full`` and its tensor-parallel version
    on the same x; diffs of output, input gradient and shard gradients."""
    tp = make_tp(full)
    c = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
    x_tp, x_ref = x.clone().requires_grad_(), x.clone().requires_grad_()
    with _strict():
        out_tp = tp(x_tp, **call)
        (out_tp * c).sum().backward()
    out_ref = full(x_ref, **call)
    (out_ref * c).sum().backward()
    res = {f"{prefix}_out": _diff(out_tp, out_ref),
           f"{prefix}_grad_x": _diff(x_tp.grad, x_ref.grad)}
    grads = 0.0
    for name in column + row:
        a, b = tp.get_submodule(name), full.get_submodule(name)
        dim = 0 if name in column else 1
        grads = max(grads, _diff(a.weight.grad, _rows(b.weight.grad, rank,
                                                      W, dim)))
        if b.bias is not None:    # row-parallel bias is replicated
            ref = _rows(b.bias.grad, rank, W, 0) if name in column \
                else b.bias.grad
            grads = max(grads, _diff(a.bias.grad, ref))
    res[f"{prefix}_grad_weights"] = grads
    return res


def _check_linears(rank: int, W: int, group, x: torch.Tensor) -> dict:
    """The two linear layers alone: column-parallel (own f: its input
    gradient is summed over the ranks; loss = the sum over ranks of each
    rank's slice) and row-parallel (input = this rank's slice of X)."""
    full = torch.nn.Linear(x.shape[-1], 16)
    c = torch.randn(x.shape[:-1] + (16,),
                    generator=torch.Generator().manual_seed(3))
    col = ColumnParallelLinear(full, group=group)
    row = RowParallelLinear(full, group=group)
    x_col, x_row, x_ref = (x.clone().requires_grad_() for _ in range(3))
    with _strict():
        y_col = col(x_col)                                   # (..., 16/W)
        (y_col * _rows(c, rank, W, -1)).sum().backward()
        x_part = _rows(x_row, rank, W, -1)                   # (..., D/W)
        y_row = row(x_part)                                  # (..., 16)
        (y_row * c).sum().backward()
    y_ref = full(x_ref)
    (y_ref * c).sum().backward()
    return {"linear_out": max(_diff(y_col, _rows(y_ref, rank, W, -1)),
                              _diff(y_row, y_ref)),
            "linear_grad_x": max(_diff(x_col.grad, x_ref.grad), _diff(
                _rows(x_row.grad, rank, W, -1), _rows(x_ref.grad, rank,
                                                      W, -1))),
            "linear_grad_weights": max(
                _diff(col.weight.grad, _rows(full.weight.grad, rank, W, 0)),
                _diff(col.bias.grad, _rows(full.bias.grad, rank, W, 0)),
                _diff(row.weight.grad, _rows(full.weight.grad, rank, W, 1)),
                _diff(row.bias.grad, full.bias.grad))}


def check_tensor_parallel(rank: int, world_size: int, seed: int = 0,
                          group=None) -> dict[str, float]:
    """The column- and row-parallel linear layers alone,
    TensorParallelSwiGLU and TensorParallelAttention (GQA with RoPE,
    causal mask, biases; and the fused path with a per-head mask) against
    the single-process modules. W must divide 4. With ``group`` the
    layers run in that process group (rank and size taken from it).
    """
    if group is not None:
        rank, world_size = group_rank_and_size(group)
    torch.manual_seed(seed)
    B, T, D = 2, 5, 32
    x = torch.randn(B, T, D)
    res = _tp_case(rank, world_size, SwiGLU(D, 64),
                   lambda m: TensorParallelSwiGLU(m, group), x, {},
                   ["gate_proj", "up_proj"], ["down_proj"], "swiglu")
    res |= _check_linears(rank, world_size, group, x)
    qkv, o = ["q_proj", "k_proj", "v_proj"], ["o_proj"]
    mha = MultiHeadAttention(D, 8, n_kv_heads=4, bias=True,
                             rope=RotaryEmbedding(4))
    res |= _tp_case(rank, world_size, mha,
                    lambda m: TensorParallelAttention(m, group), x,
                    {"mask": causal_mask(T)}, qkv, o, "attn")
    mha = MultiHeadAttention(D, 8, n_kv_heads=4, bias=False, fused=True)
    head_mask = torch.rand(B, 8, T, T) < 0.7                 # (B, H, T, S)
    res |= _tp_case(rank, world_size, mha,
                    lambda m: TensorParallelAttention(m, group), x,
                    {"mask": head_mask}, qkv, o, "attn_fused")
    return res


def _moe(router: str, n_shared: int, D: int = 16) -> MoE:
    """E = 8 experts, k = 2; the DeepSeek-V3 router with 4 groups of which
    2 are kept, a non-zero bias and scale 2.5. ``"skewed"``: a V3 router
    whose bias sends every slot to experts 0 and 1 (rank 0), so the other
    ranks receive nothing (all their split sizes are 0)."""
    E, k = 8, 2
    if router == "topk":
        gate = TopKRouter(D, E, k)
    else:
        gate = DeepSeekV3Router(D, E, k, n_group=4, topk_group=2,
                                routed_scaling_factor=2.5)
        gate.e_score_correction_bias.normal_(0, 0.05)
        if router == "skewed":
            gate.e_score_correction_bias[:2] = 10.0
    # larger router weights than the default init: sharper, less even
    # routing, so some rank receives few or no slots from another
    with torch.no_grad():
        gate.weight.normal_(0, 0.5)
    return MoE(D, n_experts=E, top_k=k, d_expert=8,
               n_shared_experts=n_shared, gate=gate)


def check_expert_parallel(rank: int, world_size: int, seed: int = 0,
                          group=None) -> dict:
    """ExpertParallelMoE against MoE, for both routers, with and without
    shared experts, and a skewed router that sends every slot to rank 0
    (inputs without gradient there).
    Rank s holds 3 + 4 s tokens (uneven on purpose).

    References: the MoE on all ranks' tokens at once (outputs, input
    gradients, gradients of this rank's experts, which collect every
    rank's slots) and on this rank's tokens alone (routing information,
    gradients of the replicated router and shared experts).

    Returns ``{case: {diff name: float, ..., "stats": ExpertParallelStats,
    "n_tokens": N_r}}``. ``group`` as in :func:`check_tensor_parallel`.
    """
    if group is not None:
        rank, world_size = group_rank_and_size(group)
    W, D = world_size, 16
    gen = torch.Generator().manual_seed(seed + 1)
    xs = [torch.randn(3 + 4 * s, D, generator=gen) for s in range(W)]
    cs = [torch.randn(3 + 4 * s, D, generator=gen) for s in range(W)]
    rows = slice(sum(len(t) for t in xs[:rank]),
                 sum(len(t) for t in xs[:rank + 1]))
    out = {}
    for router, n_shared in [("topk", 0), ("topk", 1), ("deepseek_v3", 0),
                             ("deepseek_v3", 1), ("skewed", 1)]:
        torch.manual_seed(seed)
        moe = _moe(router, n_shared, D)
        ep = ExpertParallelMoE(moe, group)
        ref_all, ref_own = copy.deepcopy(moe), copy.deepcopy(moe)
        # the skewed case also leaves the inputs without gradient: only
        # the parameters need one (a frozen embedding, say)
        frozen = router == "skewed"
        x = xs[rank].clone().requires_grad_(not frozen)
        with _strict():
            y = ep(x)
            info = ep.last_info
            (y * cs[rank]).sum().backward()
        X = torch.cat(xs).requires_grad_(not frozen)
        Y = ref_all(X)
        (Y * torch.cat(cs)).sum().backward()
        y_own, info_own = ref_own.forward_with_info(xs[rank])
        (y_own * cs[rank]).sum().backward()
        r = {"out": _diff(y, Y[rows]),
             "grad_x": _diff(x.grad, None if frozen else X.grad[rows]),
             "grad_experts": max(
                 _diff(p.grad, q.grad) for i, e in enumerate(ep.experts)
                 for p, q in zip(e.parameters(), ref_all.experts[
                     ep.expert_offset + i].parameters())),
             "grad_router": _diff(ep.gate.weight.grad,
                                  ref_own.gate.weight.grad),
             "aux_loss": _diff(info.aux_loss, info_own.aux_loss),
             "same_routing": bool(
                 torch.equal(info.indices, info_own.indices)
                 and torch.equal(info.load, info_own.load)),
             "stats": ep.stats, "n_tokens": len(xs[rank])}
        if n_shared:
            r["grad_shared"] = max(_diff(p.grad, q.grad) for p, q in zip(
                ep.shared_experts.parameters(),
                ref_own.shared_experts.parameters()))
        out[f"{router}_shared{n_shared}"] = r
    return out


def check_sequence_parallel(rank: int, world_size: int, seed: int = 0,
                            group=None) -> dict[str, dict[str, float]]:
    """SequenceParallelBlock against the single-process DecoderBlock, rank
    r holding tokens r T/W ... (T = 8, W must divide 8), loss
    sum(out * C) over all ranks' tokens: outputs and input gradients on
    this rank's tokens, each weight shard's gradient against its block of
    the full one, and the replicated weights marked ``sequence_parallel``
    (norms, row-parallel biases) after their all-reduce.

    Two blocks: RMSNorm, GQA with RoPE, causal mask, no biases; and
    LayerNorm (weight and bias), biases everywhere, the fused attention
    path with a per-head mask. ``group`` as in
    :func:`check_tensor_parallel`.
    """
    if group is not None:
        rank, world_size = group_rank_and_size(group)
    B, T, D = 2, 8, 32
    n = T // world_size
    mine = slice(rank * n, (rank + 1) * n)
    out = {}
    for case, norm, bias, fused, mask in (
            ("rms", "rms", False, False, causal_mask(T)),
            ("layer_fused", "layer", True, True,
             torch.rand(B, 8, T, T, generator=torch.Generator()
                        .manual_seed(seed)) < 0.7)):
        torch.manual_seed(seed)
        mha = MultiHeadAttention(D, 8, n_kv_heads=4, bias=bias, fused=fused,
                                 rope=None if fused else RotaryEmbedding(4))
        block = DecoderBlock(D, attention=mha, ffn=SwiGLU(D, 64, bias=bias),
                             norm=norm)
        sp = SequenceParallelBlock(block, group)
        x, c = torch.randn(B, T, D), torch.randn(B, T, D)
        x_sp = x[:, mine].clone().requires_grad_()
        with _strict():
            y = sp(x_sp, mask)                               # (B, T/W, D)
            (y * c[:, mine]).sum().backward()
            all_reduce_sequence_parallel_grads(sp, group)
        x_ref = x.clone().requires_grad_()
        y_ref = block(x_ref, mask)
        (y_ref * c).sum().backward()
        marked = [name for name, p in sp.named_parameters()
                  if getattr(p, "sequence_parallel", False)]
        shards = 0.0
        for name, p in sp.named_parameters():
            if name in marked:
                continue
            g = block.get_parameter(name).grad
            dim = 1 if ("o_proj" in name or "down_proj" in name) \
                and name.endswith("weight") else 0
            shards = max(shards, _diff(p.grad, _rows(g, rank, world_size,
                                                     dim)))
        out[case] = {
            "out": _diff(y, y_ref[:, mine]),
            "grad_x": _diff(x_sp.grad, x_ref.grad[:, mine]),
            "grad_shards": shards,
            "grad_replicated": max(_diff(sp.get_parameter(m).grad,
                                         block.get_parameter(m).grad)
                                   for m in marked),
            "n_replicated": len(marked)}
    return out


def check_parallel_layers(rank: int, world_size: int,
                          seed: int = 0) -> dict:
    """All checks in one group (start-up is paid once):
    ``{"tp": check_tensor_parallel(...), "ep": check_expert_parallel(...),
    "sp": check_sequence_parallel(...), "sp_run": the chapter's
    sequence_parallel_run}``.
    With W = 4 also ``"tp_pairs"``, ``"ep_pairs"`` and ``"sp_pairs"``: the
    same checks in two process groups of two ranks each, {0, 1} and
    {2, 3}, side by side (the ``group`` argument of the layers). With
    W = 2 also ``"ddp"`` (the chapter's data_parallel_run) and ``"fsdp"``
    (fully_shard_run with ``"sgd"`` and ``"adam"``).
    """
    res = {"tp": check_tensor_parallel(rank, world_size, seed),
           "ep": check_expert_parallel(rank, world_size, seed),
           "sp": check_sequence_parallel(rank, world_size, seed),
           "sp_run": scaling_experiments.sequence_parallel_run(
               rank, world_size, world_size)}
    if world_size == 4:
        # every rank creates every group, in the same order
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        mine = pairs[rank // 2]
        res["tp_pairs"] = check_tensor_parallel(rank, 2, seed, mine)
        res["ep_pairs"] = check_expert_parallel(rank, 2, seed, mine)
        res["sp_pairs"] = check_sequence_parallel(rank, 2, seed, mine)
    if world_size == 2:
        # torch's DDP and FSDP2 (each process imports torch._dynamo for
        # them once, a few seconds: on 2 ranks only)
        res["ddp"] = scaling_experiments.data_parallel_run(rank, 2, 2)
        res["fsdp"] = {opt: scaling_experiments.fully_shard_run(
            rank, 2, 2, optimizer=opt) for opt in ("sgd", "adam")}
    return res


def fail_on_rank(rank: int, world_size: int, bad_rank: int = 1) -> int:
    """Rank ``bad_rank`` raises a ValueError; the others wait for it in an
    all-reduce that never completes (until :func:`run` stops them).
    """
    if rank == bad_rank:
        time.sleep(0.5)          # let the others enter the collective
        raise ValueError(f"deliberate failure on rank {rank}")
    t = torch.ones(1)
    dist.all_reduce(t)
    return int(t)


def sleep_on_rank(rank: int, world_size: int, seconds: float = 3600.0,
                  slow_rank: int = 0) -> int:
    """Rank ``slow_rank`` sleeps ``seconds``; the others return at once
    (a hung rank, for :func:`run`'s timeout).
    """
    if rank == slow_rank:
        time.sleep(seconds)
    return rank

r"""Hiding an all-to-all behind expert computation: two micro-batches.

An expert-parallel MoE layer does three things in turn: *dispatch*
(an all-to-all sends each token to the rank of its expert), *compute*
(each rank runs its experts) and *combine* (an all-to-all sends the
results back). Done in that order, the network idles while the experts
run and the experts idle while the network runs:

$$ t_{\text{serial}} = 2\,(d + c + b), $$

for two micro-batches of dispatch time $d$, compute time $c$ and
combine time $b$ each. Started with ``async_op=True``, a collective
returns a handle at once and proceeds in the background (gloo's
threads here; a communication stream, or DeepEP's receive hook, on a
GPU), so the second micro-batch's dispatch travels while the first
one's experts run, and the first one's combine while the second one's
experts run. If the transfers and the arithmetic truly run side by
side,

$$ t_{\text{overlap}} \approx d + \max(c, d) + \max(c, b) + b, $$

and at best (for $c \ge d, b$) a time $d + b$, half the communication,
is hidden. Whether they run side by side depends on the hardware: a
GPU moves bytes with copy engines and network cards beside its compute
units; here gloo's threads copy through the kernel on the *same* CPU
cores that run the experts, so they compete.

:func:`overlap_run` runs both schedules on the same tokens and the same
expert FFN, checks that they give the same output, and times them (and
each part alone), so the time hidden is measured, not assumed.
DeepSeek-V3's prefill runs two micro-batches this way (the attention and
MoE of one beside the dispatch and combine of the other), and DeepEP's
low-latency kernels let the receive happen in a hook, without occupying
the GPU's compute units.

Every rank sends ``n_tokens / W`` of its tokens to each rank (a
balanced routing, to keep the measurement about overlap, not about
imbalance).

Shape letters: N tokens of a micro-batch on one rank, D = ``d_model``,
W ranks.
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .._util.validation import check_int
from ..model.block import SwiGLU

__all__ = ["overlap_run"]


def _serial(xs: list[torch.Tensor], expert: SwiGLU, group
            ) -> list[torch.Tensor]:
    """Dispatch, compute, combine for each micro-batch in turn."""
    outs = []
    for x in xs:                                             # (N, D)
        recv = torch.empty_like(x)
        dist.all_to_all_single(recv, x, group=group)         # dispatch
        y = expert(recv)                                     # compute
        back = torch.empty_like(y)
        dist.all_to_all_single(back, y, group=group)         # combine
        outs.append(back)
    return outs


def _overlapped(xs: list[torch.Tensor], expert: SwiGLU, group
                ) -> list[torch.Tensor]:
    """Both dispatches start at once; each micro-batch's experts run
    while the other's data is in flight."""
    recvs = [torch.empty_like(x) for x in xs]                # 2 x (N, D)
    sent = [dist.all_to_all_single(r, x, group=group, async_op=True)
            for r, x in zip(recvs, xs)]                      # dispatch both
    backs, combined = [], []
    for recv, handle in zip(recvs, sent):
        handle.wait()                                        # this one's in
        y = expert(recv)                     # the next dispatch travels
        back = torch.empty_like(y)
        combined.append(dist.all_to_all_single(back, y, group=group,
                                               async_op=True))
        backs.append(back)
    for handle in combined:
        handle.wait()
    return backs


def _interleaved_medians(fns: dict, repeats: int, group) -> dict:
    """Median seconds of each function of ``fns``, timed in turn (A, B,
    C, ..., A, B, C, ...) so that a busy spell of the machine touches
    all of them alike."""
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            dist.barrier(group=group)
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _group(world_size: int, size: int | None):
    """(group of ranks 0..size-1 or None for the world, this rank a
    member?). Every rank calls it: ``new_group`` is collective."""
    if size is None or size == world_size:
        return None, True
    check_int("size", size, minimum=1)
    if size > world_size:
        raise ValueError(f"size must be <= world_size={world_size}, got "
                         f"{size}")
    return dist.new_group(list(range(size))), dist.get_rank() < size


def overlap_run(rank: int, world_size: int, n_tokens: int = 2048,
                d_model: int = 256, d_ff: int = 1024, repeats: int = 7,
                seed: int = 0, size: int | None = None) -> dict | None:
    r"""Two micro-batches of ``n_tokens`` tokens each through dispatch,
    one SwiGLU expert per rank and combine: serially and overlapped.

    Runs on ranks $0 \dots$ ``size``$-1$ (default: all); the other
    ranks return None.

    The four schedules are timed in turn, ``repeats`` rounds.

    Returns (each rank of the group) median seconds of ``"serial"``,
    ``"overlapped"``, ``"compute"`` (the expert on both micro-batches,
    no communication) and ``"communication"`` (the four all-to-alls, no
    compute), and ``"max_diff"``: max |overlapped - serial| of the
    outputs (0: the schedule changes the order of events, not the
    arithmetic).
    """
    check_int("rank", rank, minimum=0)
    check_int("world_size", world_size, minimum=1)
    check_int("seed", seed, minimum=0)
    check_int("n_tokens", n_tokens, minimum=world_size)
    check_int("d_model", d_model, minimum=1)
    check_int("d_ff", d_ff, minimum=1)
    check_int("repeats", repeats, minimum=1)
    group, member = _group(world_size, size)
    if not member:
        return None
    W = dist.get_world_size(group)
    torch.manual_seed(seed + rank)                           # rank's expert
    expert = SwiGLU(d_model, d_ff)
    n = n_tokens // W * W
    gen = torch.Generator().manual_seed(seed + 100 + rank)
    xs = [torch.randn(n, d_model, generator=gen)
          for _ in range(2)]                                 # 2 x (N, D)
    with torch.no_grad():
        serial = _serial(xs, expert, group)
        overlapped = _overlapped(xs, expert, group)
        max_diff = max(float((a - b).abs().max())
                       for a, b in zip(serial, overlapped))

        def communication() -> None:
            for x in xs:
                out = torch.empty_like(x)
                dist.all_to_all_single(out, x, group=group)
                dist.all_to_all_single(x.clone(), out, group=group)

        times = _interleaved_medians({
            "serial": lambda: _serial(xs, expert, group),
            "overlapped": lambda: _overlapped(xs, expert, group),
            "compute": lambda: [expert(x) for x in xs],
            "communication": communication}, repeats, group)
    return {**times, "max_diff": max_diff}

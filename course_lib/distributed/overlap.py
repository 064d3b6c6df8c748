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
threads here; a separate stream or DeepEP's hook on a GPU), so the
second micro-batch's dispatch can travel while the first one's experts
run, and the first one's combine while the second one's experts run:

$$ t_{\text{overlap}} \approx d + \max(c, d) + \max(c, b) + b. $$

:func:`overlap_run` runs both schedules on the same tokens and the same
expert FFN, checks that they give the same output, and times them (and
each part alone), so the time hidden is measured, not assumed.
DeepSeek-V3 overlaps the same way across two micro-batches of its
training steps (DualPipe), and DeepEP's low-latency kernels let the
receive happen in a hook, without occupying the GPU's compute units.

Every rank sends ``n_tokens / W`` of its tokens to each rank (a
balanced routing, to keep the measurement about overlap, not about
imbalance).
"""
from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from .._util.validation import check_int
from ..model.block import SwiGLU

__all__ = ["overlap_run"]


def _serial(xs: list[torch.Tensor], expert: SwiGLU) -> list[torch.Tensor]:
    """Dispatch, compute, combine for each micro-batch in turn."""
    outs = []
    for x in xs:                                             # (n, D)
        recv = torch.empty_like(x)
        dist.all_to_all_single(recv, x)                      # dispatch
        y = expert(recv)                                     # compute
        back = torch.empty_like(y)
        dist.all_to_all_single(back, y)                      # combine
        outs.append(back)
    return outs


def _overlapped(xs: list[torch.Tensor], expert: SwiGLU
                ) -> list[torch.Tensor]:
    """Both dispatches start at once; each micro-batch's experts run
    while the other's data is in flight."""
    recvs = [torch.empty_like(x) for x in xs]
    sent = [dist.all_to_all_single(r, x, async_op=True)
            for r, x in zip(recvs, xs)]                      # dispatch both
    backs, combined = [], []
    for recv, handle in zip(recvs, sent):
        handle.wait()                                        # this one's in
        y = expert(recv)                     # the next dispatch travels
        back = torch.empty_like(y)
        combined.append(dist.all_to_all_single(back, y, async_op=True))
        backs.append(back)
    for handle in combined:
        handle.wait()
    return backs


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def overlap_run(rank: int, world_size: int, n_tokens: int = 2048,
                d_model: int = 256, d_ff: int = 1024, repeats: int = 7,
                seed: int = 0) -> dict:
    r"""Two micro-batches of ``n_tokens`` tokens each through dispatch,
    one SwiGLU expert per rank and combine: serially and overlapped.

    Returns (each rank) median seconds of ``"serial"``,
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
    torch.manual_seed(seed + rank)                           # rank's expert
    expert = SwiGLU(d_model, d_ff)
    n = n_tokens // world_size * world_size
    gen = torch.Generator().manual_seed(seed + 100 + rank)
    xs = [torch.randn(n, d_model, generator=gen) for _ in range(2)]
    with torch.no_grad():
        serial = _serial(xs, expert)
        overlapped = _overlapped(xs, expert)
        max_diff = max(float((a - b).abs().max())
                       for a, b in zip(serial, overlapped))

        def communication() -> None:
            for x in xs:
                out = torch.empty_like(x)
                dist.all_to_all_single(out, x)
                dist.all_to_all_single(x.clone(), out)

        times = {
            "serial": _median_seconds(lambda: _serial(xs, expert), repeats),
            "overlapped": _median_seconds(lambda: _overlapped(xs, expert),
                                          repeats),
            "compute": _median_seconds(lambda: [expert(x) for x in xs],
                                       repeats),
            "communication": _median_seconds(communication, repeats)}
    return {**times, "max_diff": max_diff}

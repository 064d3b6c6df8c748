r"""The cost of attention's L x L weights, measured.

The explicit path of :func:`~course_lib.model.attention.scaled_dot_product_attention`
forms the weights $A = \mathrm{softmax}(QK^\top/\sqrt{d_k})$, $B \cdot H
\cdot L^2$ numbers; torch's fused kernel
(:func:`~course_lib.model.attention.fused_attention`) works block by block
and never holds them. This module counts those bytes, times the two paths
against each other, asks the profiler which kernel torch picked, and
measures the peak memory of a call (the explicit path against the tiled
loop of :mod:`course_lib.model.online_softmax`).

Shape letters: B batch, H heads, L sequence length (queries = keys), d_k
head width.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .._util.timing import best_time
from .._util.validation import (check_bool, check_callable, check_int,
                                check_lengths)
from ..model.attention import fused_attention, scaled_dot_product_attention

__all__ = ["attention_weights_bytes", "AttentionTiming", "time_attention",
           "profile_fused_attention", "MemoryProfile", "profile_memory"]


# ------------------------------------------------------------ the L x L cost
def attention_weights_bytes(length: int, *, batch: int = 1,
                            n_heads: int = 1,
                            dtype: torch.dtype = torch.float32) -> int:
    r"""Bytes of the attention weights $A$: $B \cdot H \cdot L^2$ entries.

    Args:
        length: sequence length L (queries = keys); batch, n_heads: B, H.
        dtype: element type of the weights.
    """
    for name, value in (("length", length), ("batch", batch),
                        ("n_heads", n_heads)):
        check_int(name, value, minimum=1)
    itemsize = torch.empty((), dtype=dtype).element_size()
    return batch * n_heads * length * length * itemsize


@dataclass
class AttentionTiming:
    """One row of the explicit-vs-fused benchmark."""
    length: int
    explicit_seconds: float
    fused_seconds: float
    weights_bytes: int     # measured nbytes of the explicit path's A

    @property
    def ratio(self) -> float:
        """explicit / fused time (> 1: the fused kernel is faster)."""
        return self.explicit_seconds / self.fused_seconds


def time_attention(lengths: Sequence[int] = (128, 512, 2048), *,
                   d_k: int = 64, batch: int = 1, n_heads: int = 8,
                   repeats: int = 3, causal: bool = False,
                   seed: int = 0) -> list[AttentionTiming]:
    r"""Time the explicit path against torch's fused attention on CPU.

    Both compute $\mathrm{softmax}(QK^\top/\sqrt{d_k})V$ for q, k, v of
    shape (B, H, L, d_k). The explicit path materialises the (B, H, L, L)
    weights; the fused kernel works block by block and never holds them.

    Args:
        lengths: sequence lengths L; d_k: head width; batch, n_heads: B, H.
        repeats: timed calls per measurement (the minimum is kept).
        causal: add a causal mask (same boolean mask on both paths).
        seed: seed of the random inputs.
    Returns:
        one AttentionTiming per length, in order.
    """
    lengths = check_lengths(lengths, minimum=1)
    for name, value in (("d_k", d_k), ("batch", batch),
                        ("n_heads", n_heads), ("repeats", repeats)):
        check_int(name, value, minimum=1)
    check_bool("causal", causal)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for L in lengths:
        q, k, v = torch.randn(3, batch, n_heads, L, d_k,
                              generator=g)                  # 3 x (B, H, L, d)
        # j <= i: the lower triangle (chapter 4's causal_mask)
        mask = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
        with torch.inference_mode():
            _, w = scaled_dot_product_attention(q, k, v, mask)
            nbytes = w.element_size() * w.nelement()
            del w                                 # free (B, H, L, L) first
            times = [best_time(lambda f=f: f(q, k, v, mask), repeats)
                     for f in (scaled_dot_product_attention, fused_attention)]
        rows.append(AttentionTiming(L, *times, nbytes))
    return rows


def profile_fused_attention(length: int, *, n_heads: int = 8,
                            d_k: int = 64) -> tuple[list[str], int]:
    r"""Which kernel torch's fused attention runs here, and what it allocates.

    Runs ``F.scaled_dot_product_attention`` once on random (1, H, L, d_k)
    tensors under ``torch.profiler`` with memory profiling.

    Returns:
        ``(kernels, allocated)``: the names of the attention ops called
        (the dispatcher's choice, e.g. a flash-attention kernel) and the
        bytes allocated during the call, output included (an upper bound
        on its peak memory).
    """
    from torch.profiler import ProfilerActivity, profile
    check_int("length", length, minimum=1)
    check_int("n_heads", n_heads, minimum=1)
    check_int("d_k", d_k, minimum=1)
    q, k, v = torch.randn(3, 1, n_heads, length, d_k).unbind(0)  # (B,H,L,d)
    with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU],
                               profile_memory=True) as prof:
        F.scaled_dot_product_attention(q, k, v)
    events = prof.key_averages()
    kernels = sorted(e.key for e in events if "attention" in e.key)
    return kernels, sum(max(e.self_cpu_memory_usage, 0) for e in events)


@dataclass(frozen=True)
class MemoryProfile:
    """What one call allocated, in bytes, as the profiler recorded it."""
    peak: int      # most bytes held at once by tensors the call created
    largest: int   # the largest single allocation of one operation


def profile_memory(fn: Callable[[], object]) -> MemoryProfile:
    r"""Run ``fn()`` once under ``torch.profiler`` with memory profiling and
    return its peak and largest allocation (:class:`MemoryProfile`).

    The profiler records the bytes each operation allocates and every
    free; summing them in time order gives the memory held at each moment
    beyond what existed before the call. Tensors are allocated exactly,
    so the numbers do not vary from run to run (unlike timings). The
    result of ``fn`` is dropped inside the profiled region.
    """
    from torch.profiler import ProfilerActivity, profile
    check_callable("fn", fn)
    with _quiet_fd2(), profile(activities=[ProfilerActivity.CPU],
                               profile_memory=True) as prof:
        fn()
    # self_cpu_memory_usage: what an op allocated minus what it freed,
    # its children excluded; "[memory]" events are frees between ops.
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage)
                     for e in prof.events() if e.self_cpu_memory_usage)
    held = peak = largest = 0
    for _, nbytes in changes:
        held += nbytes
        peak = max(peak, held)
        largest = max(largest, nbytes)
    return MemoryProfile(peak=peak, largest=largest)


@contextlib.contextmanager
def _quiet_fd2():
    """Silence file descriptor 2: the profiler's C++ backend writes status
    lines (with timestamps) straight to it, bypassing ``sys.stderr``."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)

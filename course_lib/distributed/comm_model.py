r"""What a collective costs in time: measured on the local group, fitted
with the alpha-beta model, and the bytes that really crossed the wire.

**The alpha-beta model.** Sending one message of $n$ bytes over a link
takes

$$ t(n) = \alpha + \beta\,n, $$

a fixed latency $\alpha$ (seconds) plus $n$ over the bandwidth
$1/\beta$ (bytes per second). A collective is a schedule of such
messages. A ring all-reduce over $W$ ranks runs $2(W-1)$ steps, each
sending $n/W$ bytes, so

$$ t_{\text{all-reduce}}(n) = 2(W-1)\,\alpha + \tfrac{2(W-1)}{W}\,n\,\beta, $$

and an all-to-all in which a rank sends $s$ bytes in total to the
$W-1$ others takes $t = (W-1)\,\alpha + s\,\beta$ when its messages go
one after the other over one link. Both formulas have the form
$t = a + b\,x$: :func:`fit_alpha_beta` fits $a$ and $b$ to measured
times by least squares on relative error (sizes span several decades,
so every size counts alike).

**Measured here.** :func:`collective_cost_run` times ``all_reduce`` and
``all_to_all_single`` on the local process group (gloo over TCP on one
machine) for several payload sizes, and reads the bytes that crossed the
loopback interface during each call from ``/proc/net/dev``
(:func:`loopback_bytes`, Linux). Those counters are the wire: TCP
headers included, whatever algorithm gloo picked. What they measure is
this machine's processes talking through its kernel, not NVLink or
InfiniBand; the fitted model is what carries over, with a cluster's own
$\alpha$ and $\beta$ put in.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist

from .._util.validation import check_int, check_real, check_type

__all__ = ["AlphaBeta", "fit_alpha_beta", "ring_all_reduce_seconds",
           "all_to_all_seconds", "loopback_bytes", "collective_cost_run"]

_NET_DEV = Path("/proc/net/dev")


@dataclass(frozen=True)
class AlphaBeta:
    r"""A link: latency ``alpha`` (s per message) and ``beta`` (s per
    byte). ``seconds(n, messages)`` is $m\alpha + n\beta$."""
    alpha: float
    beta: float

    @property
    def bandwidth(self) -> float:
        """Bytes per second, $1/\\beta$."""
        return math.inf if self.beta == 0 else 1.0 / self.beta

    def seconds(self, n_bytes: float, messages: int = 1) -> float:
        """Time of ``messages`` messages carrying ``n_bytes`` in all."""
        return messages * self.alpha + n_bytes * self.beta


def fit_alpha_beta(x: Sequence[float], seconds: Sequence[float]
                   ) -> tuple[float, float]:
    r"""Least-squares fit of $t = a + b\,x$ on relative error:
    minimise $\sum_i \big((a + b x_i - t_i)/t_i\big)^2$.

    Args:
        x: the sizes (bytes, or bytes scaled by a collective's factor),
            at least two distinct values.
        seconds: the measured times, one per size, all $> 0$.
    Returns:
        ``(a, b)``: intercept in seconds and slope in seconds per unit of
        x (for a ring all-reduce fitted on $x = n$: $a = 2(W-1)\alpha$,
        $b = 2(W-1)\beta/W$).
    """
    xs, ts = list(x), list(seconds)
    for v in xs:
        check_real("x", v, minimum=0)
    for v in ts:
        check_real("seconds", v, positive=True)
    if len(xs) != len(ts):
        raise ValueError(f"x and seconds must have the same length, got "
                         f"{len(xs)} and {len(ts)}")
    if len(set(xs)) < 2:
        raise ValueError("x must hold at least two distinct sizes")
    # rows [1/t, x/t] . [a, b] = 1 in the least-squares sense
    A = torch.tensor([[1 / t, v / t] for v, t in zip(xs, ts)],
                     dtype=torch.float64)                    # (n, 2)
    ones = torch.ones(len(ts), 1, dtype=torch.float64)
    a, b = torch.linalg.lstsq(A, ones).solution.flatten().tolist()
    return a, b


def ring_all_reduce_seconds(n_bytes: float, world_size: int,
                            link: AlphaBeta) -> float:
    r"""$2(W-1)\alpha + \frac{2(W-1)}{W} n \beta$: a ring all-reduce of
    ``n_bytes`` per rank over ``world_size`` ranks."""
    check_real("n_bytes", n_bytes, minimum=0)
    check_int("world_size", world_size, minimum=1)
    W = world_size
    check_type("link", link, AlphaBeta, "an AlphaBeta")
    return link.seconds(2 * (W - 1) / W * n_bytes, messages=2 * (W - 1))


def all_to_all_seconds(bytes_sent: float, world_size: int,
                       link: AlphaBeta) -> float:
    r"""$(W-1)\alpha + s\beta$: one rank's all-to-all that sends
    ``bytes_sent`` in all to the other ``world_size - 1`` ranks, one
    message each, over one link."""
    check_real("bytes_sent", bytes_sent, minimum=0)
    check_int("world_size", world_size, minimum=1)
    W = world_size
    check_type("link", link, AlphaBeta, "an AlphaBeta")
    return link.seconds(bytes_sent, messages=W - 1)


def loopback_bytes() -> int | None:
    """Bytes sent so far over the loopback interface (``lo`` in
    ``/proc/net/dev``), or None where there is no such file."""
    try:
        text = _NET_DEV.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, fields = line.partition(":")
        if name.strip() == "lo":
            return int(fields.split()[8])                    # tx bytes
    return None


def _timed(op, repeats: int, rank: int) -> tuple[float, int | None]:
    """(median seconds of ``op()`` over ``repeats`` calls, loopback bytes
    of one call seen by rank 0: the median over the calls)."""
    times, wire = [], []
    for _ in range(repeats):
        dist.barrier()
        before = loopback_bytes() if rank == 0 else None
        dist.barrier()             # no rank starts before rank 0 has read
        start = time.perf_counter()
        op()
        elapsed = time.perf_counter() - start
        dist.barrier()
        after = loopback_bytes() if rank == 0 else None
        times.append(elapsed)
        if before is not None and after is not None:
            wire.append(after - before)
    # the barriers send a few bytes too: small next to the payloads
    return (statistics.median(times),
            int(statistics.median(wire)) if wire else None)


def collective_cost_run(rank: int, world_size: int,
                        sizes: Sequence[int] = (2**10, 2**14, 2**18,
                                                2**22),
                        repeats: int = 5) -> dict:
    r"""Time ``all_reduce`` and ``all_to_all_single`` on every rank of
    the group for each payload of ``sizes`` bytes per rank (float32), and
    count the loopback bytes of each call.

    Returns (on every rank) ``{"sizes": [...], "all_reduce": [s, ...],
    "all_to_all": [s, ...], "all_reduce_wire": [bytes or None, ...],
    "all_to_all_wire": [...]}``: this rank's median seconds per call, and
    the bytes all ranks together put on the loopback interface during
    one call (counted by rank 0; None on the other ranks).
    """
    check_int("rank", rank, minimum=0)
    check_int("world_size", world_size, minimum=1)
    sizes = list(sizes)
    for s in sizes:
        check_int("sizes", s, minimum=4 * world_size)
    check_int("repeats", repeats, minimum=1)
    out: dict = {"sizes": sizes, "all_reduce": [], "all_to_all": [],
                 "all_reduce_wire": [], "all_to_all_wire": []}
    for n_bytes in sizes:
        n = n_bytes // 4 // world_size * world_size          # floats
        x = torch.ones(n)
        y = torch.empty(n)
        dist.all_reduce(x)                                   # warm up
        dist.all_to_all_single(y, x)
        for name, op in (("all_reduce", lambda x=x: dist.all_reduce(x)),
                         ("all_to_all", lambda x=x, y=y:
                          dist.all_to_all_single(y, x))):
            seconds, wire = _timed(op, repeats, rank)
            out[name].append(seconds)
            out[f"{name}_wire"].append(wire)
    return out

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
$\alpha$ and $\beta$ put in (:func:`fit_collective` turns a fitted
line into the link's $\alpha$ and $\beta$).

**Communication against computation.** One layer on one device that
works on $N$ tokens computes for $N f / F$ seconds ($f$ FLOPs per
token, $F$ FLOP/s achieved) and communicates for
$m\alpha + N s \beta$ ($m$ latency-bound steps, $s$ bytes sent per
token). Both grow with $N$, but only the communication has a fixed
part, so

$$ N s \beta + m\alpha > N f / F \iff
N < N^* = \frac{m\alpha}{f/F - s\beta} \quad (f/F > s\beta), $$

and if $s\beta \ge f/F$ the layer waits on the network at every batch
(unless the two overlap). :class:`LayerCost` holds $f, s, m$ and the
link; :func:`tensor_parallel_cost` and :func:`expert_parallel_cost` fill
them in for a DeepSeek-V3-like MoE layer from its configuration
(:func:`moe_layer_flops`: 2 FLOPs per active weight). These are models
with stated assumptions (bandwidth, latency, achieved FLOP/s), not
measurements.
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

from .._util.validation import (check_choice, check_int, check_real,
                                check_type)
from ..sizing.params import attention_params, expert_params, moe_layer_params

__all__ = ["AlphaBeta", "fit_alpha_beta", "ring_all_reduce_bytes",
           "ring_all_reduce_seconds", "all_to_all_seconds", "fit_collective",
           "moe_layer_flops", "LayerCost", "tensor_parallel_cost",
           "expert_parallel_cost", "loopback_bytes", "collective_cost_run"]

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


def ring_all_reduce_bytes(n_bytes: float, world_size: int) -> float:
    r"""$\frac{2(W-1)}{W}\,n$: the bytes each rank sends in a ring
    all-reduce of ``n_bytes`` per rank (a reduce-scatter, then an
    all-gather, each passing $W-1$ chunks of $n/W$). No all-reduce can
    send less per rank (Patarasuk and Yuan 2009); a backend may still
    pick another algorithm (a tree, a direct exchange) that sends more
    and waits less."""
    check_real("n_bytes", n_bytes, minimum=0)
    check_int("world_size", world_size, minimum=1)
    W = world_size
    return 2 * (W - 1) / W * n_bytes


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


#: the collectives :func:`fit_collective` knows: (steps, share of n sent)
_SCHEDULES = {
    "all_reduce": lambda W: (2 * (W - 1), 2 * (W - 1) / W),
    "all_to_all": lambda W: (W - 1, (W - 1) / W),
}


def fit_collective(collective: str, n_bytes: Sequence[float],
                   seconds: Sequence[float], world_size: int) -> AlphaBeta:
    r"""The link's $\alpha$ and $\beta$ from measured times of one
    collective, for payloads of ``n_bytes`` per rank.

    A ring all-reduce takes $t = 2(W-1)\alpha + \frac{2(W-1)}{W} n\beta$;
    an all-to-all of an $n$-byte tensor per rank sends $\frac{W-1}{W}n$
    of it, one message to each other rank, $t = (W-1)\alpha +
    \frac{W-1}{W} n\beta$. Both are $t = a + b\,n$:
    :func:`fit_alpha_beta` fits $a, b$, and dividing by the steps and by
    the share sent gives $\alpha$ and $\beta$.

    Args:
        collective: ``"all_reduce"`` or ``"all_to_all"``.
        n_bytes: payload per rank of each measurement.
        seconds: the measured times (> 0), one per payload.
        world_size: the ranks $W \ge 2$ that took part.
    Returns:
        :class:`AlphaBeta` (a noisy fit can give a negative ``alpha``:
        it is returned as fitted).
    """
    check_choice("collective", collective, tuple(_SCHEDULES))
    check_int("world_size", world_size, minimum=2)
    a, b = fit_alpha_beta(n_bytes, seconds)
    steps, share = _SCHEDULES[collective](world_size)
    return AlphaBeta(alpha=a / steps, beta=b / share)


def moe_layer_flops(config) -> int:
    r"""FLOPs per token of one MoE layer's matrix products: two (a
    multiply and an add) per weight the token uses,

    $$ f = 2\,\big(P_{\text{attn}} + E D + (n_s + k)\,3 D I_e\big), $$

    attention's projections $P_{\text{attn}}$ (chapter 10's count for
    MLA), the router ($E D$) and the shared and $k$ routed experts
    (SwiGLUs of width $I_e$). Left out: attention's scores and weighted
    sum over the context ($\propto$ the context length), the norms and
    the softmax, so $f$ is a lower bound on the work.

    Args:
        config: an MoE configuration (``course_lib.sizing.configs``).
    Returns:
        $f$ (int).
    """
    parts = moe_layer_params(config)          # checks: an MoE config
    active = (config.n_shared_experts + config.num_experts_per_tok) \
        * expert_params(config)
    return 2 * (attention_params(config) + parts["router"] + active)


@dataclass(frozen=True)
class LayerCost:
    r"""One layer on one device as a function of the tokens $N$ it works
    on: compute $N f / F$, communication $m\alpha + N s \beta$.

    Attributes:
        flops_per_token: $f$, this device's FLOPs per token.
        bytes_per_token: $s$, the bytes this device sends per token.
        messages: $m$, the steps that each pay the latency $\alpha$.
        link: the :class:`AlphaBeta` the bytes travel over.
    """
    flops_per_token: float
    bytes_per_token: float
    messages: int
    link: AlphaBeta

    def compute_seconds(self, tokens: float, flop_rate: float) -> float:
        """$N f / F$ at ``flop_rate`` $F$ FLOP/s achieved."""
        check_real("tokens", tokens, minimum=0)
        check_real("flop_rate", flop_rate, positive=True)
        return tokens * self.flops_per_token / flop_rate

    def comm_seconds(self, tokens: float) -> float:
        r"""$m\alpha + N s \beta$."""
        check_real("tokens", tokens, minimum=0)
        return self.link.seconds(tokens * self.bytes_per_token,
                                 messages=self.messages)

    def comm_bound_below(self, flop_rate: float) -> float:
        r"""$N^* = m\alpha / (f/F - s\beta)$: below $N^*$ tokens the
        communication takes longer than the compute; ``inf`` if it does
        at every $N$ ($s\beta \ge f/F$)."""
        check_real("flop_rate", flop_rate, positive=True)
        margin = self.flops_per_token / flop_rate - \
            self.bytes_per_token * self.link.beta
        if margin <= 0:
            return math.inf
        return self.messages * self.link.alpha / margin


def tensor_parallel_cost(config, world_size: int, link: AlphaBeta, *,
                         bytes_per_value: float = 2) -> LayerCost:
    r"""A whole MoE layer split by tensor parallelism over $W$ devices
    (attention by heads, every expert by columns and rows): each device
    does $f/W$ of the work on every token and sends, per token, two ring
    all-reduces (attention's and the FFN's) of the $D b$-byte output,

    $$ s = 2 \cdot \tfrac{2(W-1)}{W} D b, \qquad m = 2 \cdot 2(W-1). $$

    Args:
        config: an MoE configuration.
        world_size: $W \ge 1$.
        link: the devices' link (NVLink inside a machine).
        bytes_per_value: $b$ (2: bf16 activations).
    """
    check_int("world_size", world_size, minimum=1)
    check_type("link", link, AlphaBeta, "an AlphaBeta")
    check_real("bytes_per_value", bytes_per_value, positive=True)
    W = world_size
    f = moe_layer_flops(config) / W
    s = 2 * ring_all_reduce_bytes(config.hidden_size * bytes_per_value, W)
    return LayerCost(flops_per_token=f, bytes_per_token=s,
                     messages=2 * 2 * (W - 1), link=link)


def expert_parallel_cost(config, link: AlphaBeta, *, copies: float,
                         dispatch_bytes: float = 1,
                         combine_bytes: float = 2) -> LayerCost:
    r"""An MoE layer under expert parallelism with data-parallel
    attention: each device runs the whole layer for its own tokens (its
    share of the experts' work, in balance) and, per token, sends
    ``copies`` hidden states over ``link`` at dispatch and receives as
    many back at combine, so it sends

    $$ s = c\,D\,(b_d + b_c), \qquad m = 2 $$

    (at combine it sends the results of the slots it served, as many in
    balance as its own tokens sent). $c$ is $k(W-1)/W$ when every slot
    whose expert is elsewhere crosses the link, $M$ when a node-limited
    dispatch sends one copy per target node. The messages of one
    all-to-all travel to their ranks together: each all-to-all pays
    $\alpha$ once.

    Args:
        config: an MoE configuration.
        link: the link the copies cross (InfiniBand between machines).
        copies: $c$, hidden states sent per token (> 0).
        dispatch_bytes, combine_bytes: $b_d$ (1: FP8) and $b_c$ (2: bf16).
    """
    check_type("link", link, AlphaBeta, "an AlphaBeta")
    check_real("copies", copies, positive=True)
    check_real("dispatch_bytes", dispatch_bytes, positive=True)
    check_real("combine_bytes", combine_bytes, positive=True)
    f = moe_layer_flops(config)               # checks: an MoE config
    s = copies * config.hidden_size * (dispatch_bytes + combine_bytes)
    return LayerCost(flops_per_token=f, bytes_per_token=s, messages=2,
                     link=link)


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

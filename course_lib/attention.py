r"""Scaled dot-product attention, its masks, and the softmax Jacobian.

Each query $q_i$ is compared with every key $k_j$ by a dot product; the
softmax of the scaled scores gives weights that average the values:

$$\mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(
  \frac{QK^\top}{\sqrt{d_k}} + M\right) V,$$

where $M_{ij} = 0$ if query $i$ may attend to key $j$ and $-\infty$ if
not. Masks are boolean tensors, True = "may attend"; $M$ is built from
them inside :func:`scaled_dot_product_attention`.

Shape letters: B batch, H heads, Lq queries, Lk keys (and values), d_k
query/key width, d_v value width, n softmax width, R random rows, ... any
leading batch dimensions (e.g. (B,) or (B, H)).

Introduced in chapter 3.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from .timing import best_time
from .validation import (broadcasts_to, check_bool_mask, check_int,
                         check_lengths, check_real)

__all__ = ["scaled_dot_product_attention", "softmax_jacobian",
           "score_variance_mc", "saturation_stats", "SaturationStats",
           "attention_weights_bytes", "time_attention", "AttentionTiming",
           "profile_fused_attention"]


# --------------------------------------------------------------- checks
def _check_inputs(q, k, v, mask, scale) -> float:
    """Validate q, k, v, mask and scale; return the scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            raise ValueError(f"{name} must be a tensor (..., L, d), got "
                             f"{getattr(t, 'shape', t)!r:.60}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    shapes = f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share d_k, got {shapes}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share the length Lk, got {shapes}")
    batch = q.shape[:-2]
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        try:
            batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2],
                                           v.shape[:-2])
        except RuntimeError:
            raise ValueError(f"leading dims do not broadcast: "
                             f"{shapes}") from None
    if mask is not None:
        check_bool_mask("mask", mask)
        # The mask must broadcast *to* the scores and never enlarge them
        # (that would silently apply the wrong mask per batch element).
        scores = torch.Size((*batch, q.shape[-2], k.shape[-2]))
        if not broadcasts_to(mask.shape, scores):
            raise ValueError(f"mask of shape {tuple(mask.shape)} does not "
                             f"broadcast to the scores (..., Lq, Lk) = "
                             f"{tuple(scores)}")
    if scale is None:
        return 1.0 / math.sqrt(q.shape[-1])
    check_real("scale", scale, positive=True)
    return scale


# ------------------------------------------------------------ attention
def scaled_dot_product_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
        mask: torch.Tensor | None = None, *, scale: float | None = None,
        return_weights: bool = False, fused: bool = False):
    r"""$\mathrm{softmax}(QK^\top s + M)\,V$ with $s = 1/\sqrt{d_k}$.

    The explicit path writes out every step: scores $S = QK^\top s$,
    disallowed entries set to $-\infty$ (so $e^{-\infty} = 0$ removes
    them from the softmax), row-wise softmax $A$, then $AV$. A query row
    with no allowed key would be $0/0$; it returns zero weights and a
    zero output instead of NaN. ``fused=True`` calls
    ``torch.nn.functional.scaled_dot_product_attention`` (same result up
    to rounding, no weights; fully masked rows are zeroed too).

    Args:
        q, k, v: queries (..., Lq, d_k), keys (..., Lk, d_k), values
            (..., Lk, d_v); leading dims broadcast.
        mask: None, or bool tensor broadcastable to (..., Lq, Lk),
            True where query i may attend to key j.
        scale: multiplier $s$ of the scores; default $1/\sqrt{d_k}$.
        return_weights: also return the attention weights $A$.
        fused: use torch's fused kernel (no weights available).
    Returns:
        out (..., Lq, d_v), or (out, weights (..., Lq, Lk)).

    Introduced in chapter 3.
    """
    scale = _check_inputs(q, k, v, mask, scale)
    if fused and return_weights:
        raise ValueError("return_weights=True needs the explicit path, got "
                         "fused=True (the fused kernel keeps no weights)")
    # A row with no allowed key: let it attend everywhere (finite softmax,
    # finite gradients) and zero it afterwards.
    has_key = None if mask is None else mask.any(dim=-1, keepdim=True)
    safe_mask = None if mask is None else mask | ~has_key  # (..., Lq, Lk)
    if fused:
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=safe_mask, scale=scale)     # (..., Lq, d_v)
        return out if has_key is None else out * has_key

    # 1) Scores S = Q K^T s (scaling q first costs Lq*d_k, not Lq*Lk),
    #    in float32 for half-precision q, k: scores can pass fp16's 65504.
    if q.element_size() < 4:
        q, k = q.float(), k.float()
    scores = (q * scale) @ k.transpose(-2, -1)             # (..., Lq, Lk)
    # 2) Additive mask: S + M with M = -inf where the mask is False.
    if safe_mask is not None:
        scores = scores.masked_fill(~safe_mask, float("-inf"))
    # 3) A = softmax(S + M) along the keys (then back to v's dtype).
    weights = torch.softmax(scores, dim=-1).to(v.dtype)    # (..., Lq, Lk)
    if has_key is not None:
        weights = weights * has_key                        # zero dead rows
    # 4) out = A V: each output row is a weighted average of value rows.
    out = weights @ v                                      # (..., Lq, d_v)
    return (out, weights) if return_weights else out


# --------------------------------------------------- softmax and scaling
def softmax_jacobian(z: torch.Tensor) -> torch.Tensor:
    r"""Jacobian of the softmax, $J = \mathrm{diag}(p) - pp^\top$.

    $\partial p_i / \partial z_j = p_i(\delta_{ij} - p_j)$. When one $p_i$
    approaches 1 (a saturated softmax) every entry approaches 0, so almost
    no gradient flows back into the scores.

    Args:
        z: logits (..., n).
    Returns:
        tensor (..., n, n), entry [i, j] = $\partial p_i/\partial z_j$.

    Introduced in chapter 3.
    """
    if not isinstance(z, torch.Tensor) or z.dim() < 1 \
            or not z.is_floating_point():
        raise ValueError(f"z must be a floating tensor (..., n), got "
                         f"{z!r:.60}")
    p = torch.softmax(z, dim=-1)                                # (..., n)
    # J = diag(p) - p p^T
    return torch.diag_embed(p) - p[..., :, None] * p[..., None, :]


def score_variance_mc(d_k: int, n_samples: int, *, sigma_q: float = 1.0,
                      sigma_k: float = 1.0,
                      generator: torch.Generator | None = None) -> float:
    r"""Monte Carlo estimate of $\mathrm{Var}(q \cdot k)$ (float).

    $q$ and $k$ have independent zero-mean Gaussian components of standard
    deviations $\sigma_q$ and $\sigma_k$; the exact value is
    $d_k \sigma_q^2 \sigma_k^2$.

    Args:
        d_k: vector width; n_samples: number of independent (q, k) pairs.
        sigma_q, sigma_k: component standard deviations.
        generator: torch random generator, for reproducibility.

    Introduced in chapter 3.
    """
    check_int("d_k", d_k, minimum=1)
    check_int("n_samples", n_samples, minimum=2)
    check_real("sigma_q", sigma_q, positive=True)
    check_real("sigma_k", sigma_k, positive=True)
    qk = torch.randn(2, n_samples, d_k, generator=generator,
                     dtype=torch.float64)                   # (2, N, d_k)
    q, k = sigma_q * qk[0], sigma_k * qk[1]                 # (N, d_k) each
    return (q * k).sum(dim=-1).var().item()                 # Var(q . k)


@dataclass
class SaturationStats:
    """Softmax statistics over random query rows.

    The gradient is heavy-tailed without scaling (tiny in most rows, huge
    in a few), so its median, mean, 99th percentile and maximum are all
    kept: no single one tells the story.
    """
    d_k: int
    max_weight: float      # mean of the largest weight in a row
    saturated: float       # fraction of rows whose largest weight > 0.99
    entropy: float         # mean entropy of a row, in nats
    jacobian_norm: float   # median Frobenius norm of diag(p) - p p^T
    grad_norm: float       # median |dL/dq| for L = g . out, g ~ N(0, I)
    grad_mean: float = 0.0  # mean |dL/dq| over the rows
    grad_p99: float = 0.0   # 99th percentile of |dL/dq|
    grad_max: float = 0.0   # largest |dL/dq|


def saturation_stats(d_k: int, *, n_keys: int = 16, n_rows: int = 500,
                     d_v: int = 16, scaled: bool = True,
                     generator: torch.Generator | None = None
                     ) -> SaturationStats:
    r"""How saturated the attention softmax is for random unit-variance q, k.

    Draws ``n_rows`` independent rows: a query, ``n_keys`` keys, values
    $v_j$ and an upstream gradient $g$, all i.i.d. $N(0, 1)$. Scores are
    $s_j = c\,q\cdot k_j$ with $c = 1/\sqrt{d_k}$ (variance 1) or $c = 1$
    (variance $d_k$). For $L = g\cdot o$ with $o = \sum_j p_j v_j$, the
    chain rule through $J$ gives $\partial L/\partial q = c\sum_j
    (Ju)_j\, k_j$ with $u_j = v_j\cdot g$.

    Args:
        d_k: query/key width; n_keys: keys per row (softmax width n).
        n_rows: number of independent rows; d_v: value width.
        scaled: use $c = 1/\sqrt{d_k}$; generator: torch RNG.

    Introduced in chapter 3.
    """
    for name, value, low in (("d_k", d_k, 1), ("n_keys", n_keys, 2),
                             ("n_rows", n_rows, 1), ("d_v", d_v, 1)):
        check_int(name, value, minimum=low)
    kw = dict(generator=generator, dtype=torch.float64)
    q = torch.randn(n_rows, 1, d_k, **kw)                       # (R, 1, d_k)
    k = torch.randn(n_rows, n_keys, d_k, **kw)                  # (R, n, d_k)
    v = torch.randn(n_rows, n_keys, d_v, **kw)                  # (R, n, d_v)
    g = torch.randn(n_rows, d_v, 1, **kw)                       # (R, d_v, 1)
    c = 1 / math.sqrt(d_k) if scaled else 1.0
    scores = c * (q @ k.transpose(-2, -1))[:, 0]                # (R, n)
    p = torch.softmax(scores, dim=-1)                           # (R, n)
    jac = softmax_jacobian(scores)                              # (R, n, n)
    # dL/ds = J u with u_j = v_j . g, then dL/dq = c sum_j (dL/ds_j) k_j
    grad_s = jac @ (v @ g)                                      # (R, n, 1)
    grad_q = c * (grad_s.transpose(-2, -1) @ k)[:, 0]           # (R, d_k)
    # H(p) = -sum_j p_j log p_j
    entropy = -(p * torch.log_softmax(scores, dim=-1)).sum(-1)  # (R,)
    top = p.max(-1).values                                      # (R,)
    grad = grad_q.norm(dim=-1)                                  # (R,)
    return SaturationStats(
        d_k=d_k, max_weight=top.mean().item(),
        saturated=(top > 0.99).double().mean().item(),
        entropy=entropy.mean().item(),
        jacobian_norm=jac.flatten(1).norm(dim=-1).median().item(),
        grad_norm=grad.median().item(), grad_mean=grad.mean().item(),
        grad_p99=torch.quantile(grad, 0.99).item(),
        grad_max=grad.max().item())


# ------------------------------------------------------------ the L x L cost
def attention_weights_bytes(length: int, *, batch: int = 1,
                            n_heads: int = 1,
                            dtype: torch.dtype = torch.float32) -> int:
    r"""Bytes of the attention weights $A$: $B \cdot H \cdot L^2$ entries.

    Args:
        length: sequence length L (queries = keys); batch, n_heads: B, H.
        dtype: element type of the weights.

    Introduced in chapter 3.
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

    Introduced in chapter 3.
    """
    lengths = check_lengths(lengths, minimum=1)
    for name, value in (("d_k", d_k), ("batch", batch),
                        ("n_heads", n_heads), ("repeats", repeats)):
        check_int(name, value, minimum=1)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for L in lengths:
        q, k, v = torch.randn(3, batch, n_heads, L, d_k,
                              generator=g)                  # 3 x (B, H, L, d)
        # j <= i: the lower triangle (chapter 4's causal_mask)
        mask = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
        with torch.inference_mode():
            _, w = scaled_dot_product_attention(q, k, v, mask,
                                                return_weights=True)
            nbytes = w.element_size() * w.nelement()
            del w                                 # free (B, H, L, L) first
            times = [best_time(lambda f=f: scaled_dot_product_attention(
                q, k, v, mask, fused=f), repeats) for f in (False, True)]
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

    Introduced in chapter 3.
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

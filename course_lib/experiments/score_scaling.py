r"""Why the scores are divided by $\sqrt{d_k}$: the variance of a dot
product of random vectors grows like $d_k$ (measured by Monte Carlo), and
large scores saturate the softmax, whose Jacobian
$J = \mathrm{diag}(p) - pp^\top$ then vanishes.

Shape letters: n softmax width, R random rows, ... any leading
dimensions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._util.validation import check_alloc, check_bool, check_int, check_real

__all__ = ["softmax_jacobian", "score_variance_mc", "SaturationStats",
           "saturation_stats"]


def softmax_jacobian(z: torch.Tensor) -> torch.Tensor:
    r"""Jacobian of the softmax, $J = \mathrm{diag}(p) - pp^\top$.

    $\partial p_i / \partial z_j = p_i(\delta_{ij} - p_j)$. When one $p_i$
    approaches 1 (a saturated softmax) every entry approaches 0, so almost
    no gradient flows back into the scores.

    Args:
        z: logits (..., n).
    Returns:
        tensor (..., n, n), entry [i, j] = $\partial p_i/\partial z_j$.
    """
    if not isinstance(z, torch.Tensor) or not z.is_floating_point():
        raise TypeError(f"z must be a floating tensor (..., n), got "
                        f"{getattr(z, 'dtype', type(z).__name__)}")
    if z.dim() < 1:
        raise ValueError("z must have shape (..., n), got a 0-d tensor")
    # the Jacobian holds n values for each entry of z
    check_alloc("z.numel() * n", z.numel() * z.shape[-1])
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
    """
    for name, value, low in (("d_k", d_k, 1), ("n_keys", n_keys, 2),
                             ("n_rows", n_rows, 1), ("d_v", d_v, 1)):
        check_int(name, value, minimum=low)
    check_bool("scaled", scaled)
    # q, k, v, g and the Jacobians: about R n (d_k + d_v + n) values
    check_alloc("n_rows * n_keys * (d_k + d_v + n_keys)",
                n_rows * n_keys * (d_k + d_v + n_keys))
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

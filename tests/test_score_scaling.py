"""Tests for course_lib.experiments.score_scaling (chapter 3): why the scores are
divided by sqrt(d_k).

References used: torch.autograd.functional.jacobian for the softmax
Jacobian, closed forms (Var(q.k) = d_k sigma_q^2 sigma_k^2), autograd
through scaled_dot_product_attention on the same draws, and every
statistic of saturation_stats recomputed row by row.

The tests call the functions as attributes of course_lib.model.attention (which
re-exports them), exactly as they were written in test_attention.py.
"""
import math

import pytest
import torch

from course_lib.experiments import score_scaling
from course_lib.model import attention


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


@pytest.mark.parametrize("shape", [(5,), (3, 4)])
def test_softmax_jacobian_matches_autograd(shape):
    z = torch.randn(*shape, dtype=torch.float64)
    jac = score_scaling.softmax_jacobian(z)
    assert jac.shape == (*shape, shape[-1])
    for idx in range(z.shape[0] if z.dim() == 2 else 1):
        row = z[idx] if z.dim() == 2 else z
        ref = torch.autograd.functional.jacobian(
            lambda t: torch.softmax(t, -1), row)
        torch.testing.assert_close(jac[idx] if z.dim() == 2 else jac, ref)
    # Rows of J sum to 0 (probabilities keep summing to 1); J symmetric.
    torch.testing.assert_close(jac.sum(-1), torch.zeros(shape,
                                                        dtype=torch.float64))
    torch.testing.assert_close(jac, jac.transpose(-1, -2))


def test_softmax_jacobian_vanishes_when_saturated():
    z = torch.tensor([30.0, 0.0, 0.0], dtype=torch.float64)
    assert score_scaling.softmax_jacobian(z).abs().max().item() < 1e-12
    flat = score_scaling.softmax_jacobian(torch.zeros(4, dtype=torch.float64))
    assert math.isclose(flat[0, 0].item(), 0.25 - 0.0625)


@pytest.mark.parametrize("d_k,sq,sk", [(4, 1.0, 1.0), (64, 1.0, 1.0),
                                       (16, 2.0, 0.5), (8, 3.0, 1.5)])
def test_score_variance_matches_closed_form(d_k, sq, sk):
    g = torch.Generator().manual_seed(0)
    var = score_scaling.score_variance_mc(d_k, 40_000, sigma_q=sq, sigma_k=sk,
                              generator=g)
    assert math.isclose(var, d_k * sq**2 * sk**2, rel_tol=0.05)


def test_saturation_stats_scaling_effect():
    g = torch.Generator().manual_seed(0)
    raw = score_scaling.saturation_stats(256, scaled=False, generator=g)
    scaled = score_scaling.saturation_stats(256, scaled=True, generator=g)
    assert raw.max_weight > 0.8 > 0.5 > scaled.max_weight
    assert raw.saturated > 0.4 > 0.05 > scaled.saturated
    assert raw.jacobian_norm < 0.1 * scaled.jacobian_norm
    assert raw.grad_norm < 0.5 * scaled.grad_norm
    assert raw.entropy < scaled.entropy <= math.log(16)
    # With scaling, the statistics barely depend on d_k.
    other = score_scaling.saturation_stats(16, scaled=True, generator=g)
    assert abs(other.max_weight - scaled.max_weight) < 0.05
    assert abs(other.jacobian_norm / scaled.jacobian_norm - 1) < 0.1


def test_saturation_gradient_matches_autograd():
    # Same draws as saturation_stats, recomputed with autograd.
    for scaled in (True, False):
        g = torch.Generator().manual_seed(5)
        stats = score_scaling.saturation_stats(32, n_keys=6, n_rows=50, d_v=4,
                                   scaled=scaled, generator=g)
        g = torch.Generator().manual_seed(5)
        kw = dict(generator=g, dtype=torch.float64)
        q = torch.randn(50, 1, 32, **kw).requires_grad_()
        k = torch.randn(50, 6, 32, **kw)
        v = torch.randn(50, 6, 4, **kw)
        up = torch.randn(50, 4, 1, **kw)
        out, _ = attention.scaled_dot_product_attention(
            q, k, v, scale=None if scaled else 1.0)          # (R, 1, d_v)
        (out @ up).sum().backward()
        norms = q.grad[:, 0].norm(dim=-1)                    # (R,)
        assert math.isclose(stats.grad_norm, norms.median().item(),
                            rel_tol=1e-9)
        assert math.isclose(stats.grad_mean, norms.mean().item(),
                            rel_tol=1e-9)
        assert math.isclose(stats.grad_max, norms.max().item(),
                            rel_tol=1e-9)
        # 99th percentile by sorting: rank 0.99 * (R - 1), interpolated
        ranked = norms.sort().values
        pos = 0.99 * (len(ranked) - 1)
        lo = int(pos)
        p99 = ranked[lo] + (pos - lo) * (ranked[lo + 1] - ranked[lo])
        assert math.isclose(stats.grad_p99, p99.item(), rel_tol=1e-9)


def test_saturation_mean_gradient_does_not_shrink_without_scaling():
    # Chapter 3's claim: unscaled, the median gradient collapses with d_k
    # while the mean does not (a few unsaturated rows get huge gradients).
    g = torch.Generator().manual_seed(0)
    raw = score_scaling.saturation_stats(1024, n_rows=300, scaled=False, generator=g)
    scaled = score_scaling.saturation_stats(1024, n_rows=300, scaled=True, generator=g)
    assert raw.grad_norm < 0.01 * scaled.grad_norm
    assert raw.grad_mean > scaled.grad_mean
    assert raw.grad_max > 10 * scaled.grad_max
    assert scaled.grad_norm <= scaled.grad_p99 <= scaled.grad_max


# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.experiments.score_scaling survived the
# ones above.
def _saturation_by_hand(d_k, n_keys, n_rows, d_v, scaled, seed):
    """saturation_stats' statistics row by row: softmax, entropy from its
    definition, J = diag(p) - p p^T as an explicit outer product, and
    dL/dq by autograd (not through J)."""
    g_ = torch.Generator().manual_seed(seed)
    kw = dict(generator=g_, dtype=torch.float64)
    q = torch.randn(n_rows, 1, d_k, **kw)
    k = torch.randn(n_rows, n_keys, d_k, **kw)
    v = torch.randn(n_rows, n_keys, d_v, **kw)
    g = torch.randn(n_rows, d_v, 1, **kw)
    c = 1 / math.sqrt(d_k) if scaled else 1.0
    tops, ents, jacs, grads = [], [], [], []
    for r in range(n_rows):
        qr = q[r, 0].clone().requires_grad_(True)
        s = c * (k[r] @ qr)                                   # (n,)
        p = torch.exp(s - s.max()) / torch.exp(s - s.max()).sum()
        out = p @ v[r]                                        # (d_v,)
        (gq,) = torch.autograd.grad(out @ g[r, :, 0], qr)
        p = p.detach()
        tops.append(p.max())
        ents.append(-(p * p.log()).sum())
        jacs.append((torch.diag(p) - torch.outer(p, p)).norm())
        grads.append(gq.norm())
    tops, grads = torch.stack(tops), torch.stack(grads)
    return dict(max_weight=tops.mean().item(),
                saturated=(tops > 0.99).double().mean().item(),
                entropy=torch.stack(ents).mean().item(),
                jacobian_norm=torch.stack(jacs).median().item(),
                grad_norm=grads.median().item(),
                grad_mean=grads.mean().item(),
                grad_p99=torch.quantile(grads, 0.99).item(),
                grad_max=grads.max().item())


@pytest.mark.parametrize("scaled", [True, False])
def test_saturation_stats_equal_row_by_row_by_hand(scaled):
    st = score_scaling.saturation_stats(9, n_keys=5, n_rows=40, d_v=3, scaled=scaled,
                            generator=torch.Generator().manual_seed(2))
    ref = _saturation_by_hand(9, 5, 40, 3, scaled, seed=2)
    assert st.d_k == 9
    for name, value in ref.items():
        assert getattr(st, name) == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_saturation_stats_defaults_and_smallest_arguments():
    # defaults: 16 keys, 500 rows, d_v 16, scaled
    st = score_scaling.saturation_stats(4, generator=torch.Generator().manual_seed(0))
    ref = _saturation_by_hand(4, 16, 500, 16, True, seed=0)
    assert st.entropy == pytest.approx(ref["entropy"], rel=1e-9)
    assert st.grad_max == pytest.approx(ref["grad_max"], rel=1e-9)
    score_scaling.saturation_stats(1, n_keys=2, n_rows=1, d_v=1)          # all allowed
    for name, low in (("d_k", 1), ("n_keys", 2), ("n_rows", 1), ("d_v", 1)):
        kw = dict(d_k=4)
        kw[name] = low - 1
        with pytest.raises(ValueError, match=rf"^{name} must be >= {low}, "
                           rf"got {low - 1}$"):
            score_scaling.saturation_stats(**kw)


def test_score_variance_mc_defaults_generator_and_checks():
    # default sigmas 1: Var(q . k) = d_k (Monte Carlo, 40,000 pairs: about
    # 1 % standard error, so 5 % is 5 sigma)
    var = score_scaling.score_variance_mc(8, 40_000,
                              generator=torch.Generator().manual_seed(0))
    assert var == pytest.approx(8, rel=0.05)
    # the generator makes it reproducible, whatever the global RNG does
    a = score_scaling.score_variance_mc(3, 50, generator=torch.Generator().manual_seed(5))
    torch.randn(7)
    b = score_scaling.score_variance_mc(3, 50, generator=torch.Generator().manual_seed(5))
    assert a == b
    score_scaling.score_variance_mc(1, 2)                          # smallest arguments
    with pytest.raises(ValueError, match=r"^n_samples must be >= 2, got 1$"):
        score_scaling.score_variance_mc(3, 1)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match=r"^sigma_k must be > 0"):
            score_scaling.score_variance_mc(3, 10, sigma_k=bad)
    with pytest.raises(TypeError, match=r"^sigma_k must be a real number"):
        score_scaling.score_variance_mc(3, 10, sigma_k="1")
    with pytest.raises(TypeError, match=r"^z must be a floating tensor"):
        score_scaling.softmax_jacobian([1.0, 2.0])


def test_saturation_stats_rejects_huge_sizes_and_string_flags():
    with pytest.raises(ValueError, match="d_k"):
        score_scaling.saturation_stats(10**7, n_keys=8, n_rows=50)
    with pytest.raises(TypeError, match="scaled"):
        score_scaling.saturation_stats(8, scaled="False")


def test_saturation_stats_bound_counts_keys_values_and_scores(monkeypatch):
    # Each factor matters: many keys with narrow vectors (the n x n scores
    # dominate), and wide values next to a few keys, are both refused.
    with pytest.raises(ValueError, match="n_keys"):
        score_scaling.saturation_stats(1, n_keys=2**14, n_rows=1, d_v=1)
    from course_lib._util import validation
    monkeypatch.setattr(validation, "MAX_ELEMENTS", 10_000)
    with pytest.raises(ValueError, match="d_v"):     # 10 x (1 + 1000 + 10)
        score_scaling.saturation_stats(1, n_keys=10, n_rows=1, d_v=1000)
    score_scaling.saturation_stats(1, n_keys=10, n_rows=1, d_v=980)  # 9,910


def test_softmax_jacobian_rejects_a_huge_jacobian():
    with pytest.raises(ValueError, match="z"):
        score_scaling.softmax_jacobian(torch.zeros(10**5))

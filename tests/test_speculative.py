"""The speculative-decoding acceptance step: the token it emits is
distributed exactly as the target model's p (closed form and sampling)."""
import pytest
import torch

from course_lib.generation.speculative import speculative_acceptance


def dists(shape, V, seed, temperature=1.0):
    gen = torch.Generator().manual_seed(seed)
    p = (torch.randn(*shape, V, generator=gen, dtype=torch.float64)
         / temperature).softmax(-1)
    q = (torch.randn(*shape, V, generator=gen, dtype=torch.float64)
         / temperature).softmax(-1)
    return p, q


def emitted(p, q):
    """Distribution of the emitted token: sum over the draft x ~ q of
    accept(x) [x] + (1 - accept(x)) residual, built from the function."""
    V = p.shape[-1]
    out = torch.zeros_like(p)
    for x in range(V):
        draft = torch.full(p.shape[:-1], x, dtype=torch.long)
        a, r = speculative_acceptance(p, q, draft)
        q_x = q[..., x]
        out[..., x] += q_x * a
        out += (q_x * (1 - a))[..., None] * r
    return out


@pytest.mark.parametrize("shape,V,seed", [((), 5, 0), ((3,), 7, 1),
                                          ((2, 4), 3, 2), ((), 2, 3)])
def test_emitted_token_is_distributed_as_p(shape, V, seed):
    p, q = dists(shape, V, seed)
    torch.testing.assert_close(emitted(p, q), p)


def test_closed_form_loop():
    p, q = dists((4,), 6, 5)
    draft = torch.tensor([0, 3, 5, 1])
    a, r = speculative_acceptance(p, q, draft)
    for i in range(4):
        x = draft[i].item()
        assert a[i].item() == pytest.approx(min(1.0, p[i, x].item()
                                                / q[i, x].item()))
        excess = [max(0.0, pv - qv) for pv, qv in zip(p[i].tolist(),
                                                      q[i].tolist())]
        total = sum(excess)
        assert r[i].tolist() == pytest.approx([e / total for e in excess])


def test_sampling_matches_p():
    """Monte-Carlo: draft from q, accept or resample; frequencies ~ p."""
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    n = 200_000
    draft = torch.multinomial(q, n, replacement=True, generator=gen)
    a, r = speculative_acceptance(p.expand(n, -1), q.expand(n, -1), draft)
    keep = torch.rand(n, generator=gen, dtype=torch.float64) < a
    redraw = torch.multinomial(r, 1, generator=gen)[:, 0]
    tokens = torch.where(keep, draft, redraw)
    freq = torch.bincount(tokens, minlength=4).double() / n
    torch.testing.assert_close(freq, p, atol=5e-3, rtol=0)


def test_equal_distributions_accept_everything():
    p = torch.tensor([0.25, 0.25, 0.5])
    a, r = speculative_acceptance(p, p.clone(), torch.tensor(2))
    assert a.item() == 1.0
    torch.testing.assert_close(r, p)


def test_zero_target_probability_is_always_rejected():
    p = torch.tensor([0.0, 1.0])
    q = torch.tensor([0.5, 0.5])
    a, r = speculative_acceptance(p, q, torch.tensor(0))
    assert a.item() == 0.0
    assert r.tolist() == [0.0, 1.0]


def test_bad_inputs():
    p = torch.tensor([0.5, 0.5])
    with pytest.raises(TypeError, match="p"):
        speculative_acceptance([0.5, 0.5], p, torch.tensor(0))
    with pytest.raises(ValueError, match="q must"):
        speculative_acceptance(p, torch.ones(3) / 3, torch.tensor(0))
    with pytest.raises(ValueError, match="draft"):
        speculative_acceptance(p, p, torch.tensor(2))
    with pytest.raises(ValueError, match="draft"):
        speculative_acceptance(p, p, torch.tensor(0.0))
    with pytest.raises(ValueError, match=r"q\(x\) > 0"):
        speculative_acceptance(p, torch.tensor([0.0, 1.0]), torch.tensor(0))

"""Tests for course_lib.generation.sampling (chapter 8): min-p, by hand and
against a loop reference; its place in the sampling chain. Temperature,
top-k and top-p are tested in test_sampling.py."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.generation import sampling
from course_lib.generation.sampling import min_p_filter
from errors import error_for

INF = float("-inf")


def ref_min_p(row: list[float], min_p: float) -> list[bool]:
    """Keep token i iff p_i > 0 and p_i >= min_p * p_max (plain softmax)."""
    m = max(row)
    w = [math.exp(z - m) if z != INF else 0.0 for z in row]
    probs = [x / sum(w) for x in w]
    return [pi > 0 and pi >= min_p * max(probs) for pi in probs]


def test_min_p_hand_computed():
    # p = [0.5, 0.3, 0.15, 0.05]; min_p = 0.2 -> threshold 0.1: keep 3
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    out = min_p_filter(p.log(), 0.2)
    assert (out > INF).tolist() == [True, True, True, False]
    assert torch.equal(out[:3], p.log()[:3])
    # min_p = 0.5 -> threshold 0.25: keep 2; renormalised 0.5/0.8, 0.3/0.8
    q = F.softmax(min_p_filter(p.log(), 0.5), -1)
    torch.testing.assert_close(q, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_min_p_flat_keeps_many_peaked_keeps_few():
    # the threshold scales with p_max
    flat = torch.tensor([0.12, 0.11, 0.11, 0.1, 0.1, 0.1, 0.1, 0.09, 0.09,
                         0.08]).log()
    peaked = torch.tensor([0.91, 0.02, 0.01, 0.01, 0.01, 0.01, 0.01, 0.01,
                           0.005, 0.005]).log()
    assert int((min_p_filter(flat, 0.1) > INF).sum()) == 10
    assert int((min_p_filter(peaked, 0.1) > INF).sum()) == 1


@pytest.mark.parametrize("min_p", [0.0, 1e-3, 0.05, 0.1, 0.37, 0.9, 1.0])
def test_min_p_matches_reference(min_p):
    torch.manual_seed(0)
    for _ in range(20):
        z = torch.randn(4, 12) * 2
        z[0, 3] = INF                            # already filtered entry
        got = (min_p_filter(z, min_p) > INF).tolist()
        for row, g in zip(z.tolist(), got):
            want = ref_min_p(row, min_p)
            # skip exact boundary cases, where rounding decides
            m = max(row)
            near = [abs(x - m - math.log(min_p)) < 1e-6
                    for x in row if x != INF] if min_p > 0 else []
            if not any(near):
                assert g == want, (row, min_p)


def test_min_p_limits_and_ties():
    z = torch.tensor([1.0, 3.0, 3.0, -2.0])
    assert torch.equal(min_p_filter(z, 0.0), z)            # identity
    assert (min_p_filter(z, 1.0) > INF).tolist() == [False, True, True,
                                                     False]
    z3 = torch.randn(2, 3, 7)
    out = min_p_filter(z3, 0.3)
    assert out.shape == z3.shape and torch.all((out > INF).sum(-1) >= 1)


def test_min_p_in_the_chain_and_order():
    z = torch.randn(6, 20) * 2
    # after temperature: z_i / tau >= max / tau + log(min_p)
    tau, mp = 2.0, 0.1
    q = sampling.sampling_distribution(z, temperature=tau, min_p=mp)
    keep = z >= z.amax(-1, keepdim=True) + tau * math.log(mp)
    assert torch.equal(q > 0, keep)
    torch.testing.assert_close(q, F.softmax(
        (z / tau).masked_fill(~keep, INF), -1))
    # min-p commutes with top-k (both keep a head of the ranking, and the
    # min-p test does not depend on the normalisation)
    a = sampling.min_p_filter(sampling.top_k_filter(z, 5), 0.2)
    b = sampling.top_k_filter(sampling.min_p_filter(z, 0.2), 5)
    assert torch.equal(a, b)
    # sample_next and generate accept min_p; min_p = 1 is greedy
    gen = torch.Generator().manual_seed(0)
    draws = sampling.sample_next(z, min_p=1.0, generator=gen)
    assert torch.equal(draws, z.argmax(-1))


@pytest.mark.parametrize("bad, match", [
    (-0.1, "min_p"), (1.5, "min_p"), ("0.1", "min_p must be a real number"),
    (None, "min_p must be a real number"), (float("nan"), "min_p"),
    (True, "min_p must be a real number"),
])
def test_min_p_rejects_bad_values(bad, match):
    with pytest.raises(error_for(match), match=match):
        min_p_filter(torch.randn(5), bad)


@pytest.mark.parametrize("bad, error", [
    (-0.1, ValueError), (1.5, ValueError), ("0.1", TypeError),
    (float("inf"), ValueError)])
def test_sampler_min_p_argument_checked(bad, error):
    z = torch.randn(3, 5)
    for call in (lambda: sampling.sampling_distribution(z, min_p=bad),
                 lambda: sampling.sample_next(z, min_p=bad),
                 lambda: sampling.check_sampling_args(1.0, None, None, bad)):
        with pytest.raises(error, match="min_p"):
            call()


def test_min_p_rejects_bad_logits():
    with pytest.raises(TypeError, match="logits"):
        min_p_filter([1.0, 2.0], 0.1)
    with pytest.raises(TypeError, match="logits"):
        min_p_filter(torch.tensor([1, 2]), 0.1)


def test_chain_equals_hugging_face_warpers():
    # an independent reference: transformers' own warpers, in the order
    # its generate() builds them (temperature, top-k, top-p, min-p)
    warpers = pytest.importorskip("transformers.generation.logits_process")
    torch.manual_seed(1)
    z = torch.randn(64, 30) * 2.5        # continuous: no ties, no p on a sum
    for tau, k, p, mp in [(0.7, None, None, 0.1), (1.5, 10, 0.9, 0.05),
                          (1.0, None, 0.8, 0.2), (2.0, 5, None, 0.3)]:
        chain = [warpers.TemperatureLogitsWarper(tau)]
        if k is not None:
            chain.append(warpers.TopKLogitsWarper(k))
        if p is not None:
            chain.append(warpers.TopPLogitsWarper(p))
        chain.append(warpers.MinPLogitsWarper(mp))
        hf = z.clone()
        for w in chain:
            hf = w(None, hf)
        ours = sampling.sampling_distribution(z, temperature=tau, top_k=k,
                                       top_p=p, min_p=mp)
        torch.testing.assert_close(ours, F.softmax(hf, -1))

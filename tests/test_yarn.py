"""Tests for course_lib.model.yarn (YaRN RoPE scaling, chapter 10): closed form
against a loop over pairs, DeepSeek-V3's released values, the rotation
against chapter 2's apply_rope, bad input. The comparison with
transformers is in test_mla_reference.py."""
import math

import pytest
import torch

from course_lib.model.mla import deepseek_yarn
from course_lib.model.rope import apply_rope
from course_lib.model.sinusoidal import frequencies
from course_lib.model.yarn import (YARN_KEYS, check_rope_scaling,
                                   yarn_correction_range, yarn_frequencies,
                                   yarn_mscale, yarn_rope, yarn_scales)
from errors import error_for

V3 = deepseek_yarn(mscale=1.0)


def loop_frequencies(d, base, s, L, beta_fast, beta_slow):
    """YaRN one pair at a time, as the paper words it: a pair that turns
    more than beta_fast times over L positions keeps its frequency, one
    that turns fewer than beta_slow times is divided by s."""
    def pair(turns):
        return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(pair(beta_fast)), 0)
    high = min(math.ceil(pair(beta_slow)), d - 1)
    out = []
    for i in range(d // 2):
        w = base ** (-2 * i / d)
        if i <= low:
            out.append(w)
        elif i >= high:
            out.append(w / s)
        else:
            keep = 1 - (i - low) / (high - low)
            out.append(keep * w + (1 - keep) * w / s)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("d, base, s, L, bf, bs", [
    (64, 10000.0, 40, 4096, 32, 1),        # DeepSeek-V3
    (64, 50000.0, 32, 4096, 1, 1),         # Kimi K2: equal betas
    (64, 10000.0, 40, 2 * math.pi * 10000 ** (20 / 64), 1, 1),  # low=high
    (16, 10000.0, 4, 64, 32, 1),
    (128, 500000.0, 8, 8192, 32, 1)])
def test_closed_form_equals_loop(d, base, s, L, bf, bs):
    got = yarn_frequencies(d, base=base, factor=s,
                           original_max_position_embeddings=L,
                           beta_fast=bf, beta_slow=bs)
    assert got.dtype == torch.float64 and got.shape == (d // 2,)
    assert torch.allclose(got, loop_frequencies(d, base, s, L, bf, bs),
                          rtol=1e-14, atol=0)


def test_deepseek_v3_values():
    assert yarn_correction_range(
        64, base=10000.0, beta_fast=32, beta_slow=1,
        original_max_position_embeddings=4096) == (10, 23)
    w, w2 = frequencies(64), yarn_frequencies(64, base=10000.0, **V3)
    assert torch.equal(w2[:11], w[:11])                   # pairs 0-10 kept
    assert torch.allclose(w2[23:], w[23:] / 40, rtol=1e-15)   # 23-31 / 40
    ratio = w2[11:23] / w[11:23]
    assert (ratio.diff() < 0).all() and (ratio < 1).all() \
        and (ratio > 1 / 40).all()                        # ramp between
    m = yarn_mscale(40, 1.0)
    assert m == pytest.approx(1 + 0.1 * math.log(40)) \
        and round(m, 4) == 1.3689
    assert yarn_scales(V3) == (1.0, pytest.approx(1.8738542, abs=1e-7))
    # different mscale and mscale_all_dim: cos/sin factor is their ratio
    r, s = yarn_scales(dict(V3, mscale=2.0, mscale_all_dim=1.0))
    assert r == pytest.approx((1 + 0.2 * math.log(40)) /
                              (1 + 0.1 * math.log(40)))
    assert s == pytest.approx((1 + 0.1 * math.log(40)) ** 2)
    assert yarn_mscale(1.0, 1.0) == 1.0 and yarn_mscale(0.5) == 1.0


def test_factor_one_is_plain_rope():
    w = yarn_frequencies(64, base=10000.0, **dict(V3, factor=1))
    assert torch.allclose(w, frequencies(64), rtol=1e-15)


@pytest.mark.parametrize("interleave", [True, False])
def test_yarn_rope_with_plain_frequencies_is_apply_rope(interleave):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 7, 16)
    pos = torch.arange(7) + 90_000
    got = yarn_rope(x, pos, frequencies(16), interleave=interleave)
    want = apply_rope(x, pos, interleave=interleave)
    assert torch.allclose(got, want, atol=1e-6)
    scaled = yarn_rope(x, pos, frequencies(16), interleave=interleave,
                       rope_factor=1.5)
    assert torch.allclose(scaled, 1.5 * want, atol=1e-5)


def test_yarn_rope_is_relative():
    # Any frequencies keep the RoPE property <R_m q, R_n k> = f(m - n).
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 64, dtype=torch.float64)
    w = yarn_frequencies(64, base=10000.0, **V3)

    def score(m, n):
        return (yarn_rope(q, torch.tensor([m]), w)
                @ yarn_rope(k, torch.tensor([n]), w).T).item()
    assert score(7, 3) == pytest.approx(score(200_004, 200_000), abs=1e-9)


@pytest.mark.parametrize("value, match", [
    ([1], r"rope_scaling must be None or a dict with keys"),
    (dict(V3, extra=1), r"unknown \['extra'\]"),
    ({k: V3[k] for k in YARN_KEYS[:-1]}, r"missing \['mscale_all_dim'\]"),
    (dict(V3, type="linear"), r"rope_scaling\['type'\] must be 'yarn'"),
    (dict(V3, factor=0.5), r"rope_scaling\['factor'\] must be >= 1, got"),
    (dict(V3, factor="40"),
     r"rope_scaling\['factor'\] must be a real number"),
    (dict(V3, original_max_position_embeddings=4096.0),
     r"original_max_position_embeddings'\] must be an int"),
    (dict(V3, beta_slow=0), r"rope_scaling\['beta_slow'\] must be > 0"),
    (dict(V3, mscale=-1.0), r"rope_scaling\['mscale'\] must be > 0"),
    (dict(V3, beta_fast=1, beta_slow=32),
     r"rope_scaling\['beta_fast'\] must be >= beta_slow=32"),
])
def test_check_rope_scaling_rejects(value, match):
    with pytest.raises(error_for(match), match=match):
        check_rope_scaling("rope_scaling", value)


def test_bad_inputs():
    assert check_rope_scaling("r", None) is None
    assert check_rope_scaling("r", V3) == V3 \
        and check_rope_scaling("r", V3) is not V3         # a copy
    with pytest.raises(ValueError, match="d must be even"):
        yarn_frequencies(7, base=10000.0, **V3)
    with pytest.raises(ValueError, match="base must be >= 1"):
        yarn_frequencies(8, base=1.0, **V3)
    with pytest.raises(ValueError, match="beta_slow must be > 0, got -1"):
        yarn_frequencies(8, base=10000.0, **dict(V3, beta_slow=-1))
    with pytest.raises(ValueError, match="rope_scaling must be a dict"):
        yarn_scales(None)
    w = frequencies(8)
    with pytest.raises(ValueError, match=r"x must have shape "
                                          r"\(\.\.\., T, d\) with d = 2"):
        yarn_rope(torch.randn(3, 6), torch.arange(3), w)
    with pytest.raises(TypeError, match=r"x must be a floating tensor"):
        yarn_rope(torch.ones(3, 8, dtype=torch.long), torch.arange(3), w)
    with pytest.raises(ValueError, match="omega must be a 1-D tensor"):
        yarn_rope(torch.randn(3, 8), torch.arange(3), [1.0] * 4)


def test_yarn_rope_rejects_string_flags_and_bad_factors():
    w = frequencies(8)
    x, pos = torch.randn(3, 8), torch.arange(3)
    with pytest.raises(TypeError, match="interleave"):
        yarn_rope(x, pos, w, interleave="False")
    with pytest.raises(TypeError, match="positions"):
        yarn_rope(x, None, w)
    for bad in (0.0, -1.0, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match="rope_factor"):
            yarn_rope(x, pos, w, rope_factor=bad)
    # below 1 is valid: mscale < mscale_all_dim gives such a factor
    assert torch.allclose(yarn_rope(x, pos, w, rope_factor=0.5),
                          0.5 * yarn_rope(x, pos, w))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_deepseek_yarn_rejects_non_finite_mscale(bad):
    with pytest.raises(ValueError, match="mscale"):
        deepseek_yarn(mscale=bad)

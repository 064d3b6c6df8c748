"""Property-based tests of the public API's bad-input contract.

The contract (CONTRIBUTING): given any input, a public function returns a
finite, correct result, or raises a ``ValueError``/``TypeError`` whose
message names the argument. hypothesis draws the inputs: random shapes
(empty ones included), dtypes, NaN and infinities, huge and tiny values,
and wrong types; each property states what a correct result is.
"""
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from course_lib.generation import sampling
from course_lib.model.attention import (fused_attention,
                                        scaled_dot_product_attention)
from course_lib.notebook.exercises import parse_number
from course_lib.model.block import RMSNorm
from course_lib.model.masks import causal_mask, padding_mask
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.rope import apply_rope
from course_lib.model.routing import select_top_k

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
SPECIALS = st.sampled_from([0.0, -0.0, 1e-30, -1e30, 1e30, 65504.0,
                            float("inf"), float("-inf"), float("nan")])
FLOATS = st.one_of(st.floats(-1e4, 1e4, allow_nan=False, width=32),
                   SPECIALS)
DTYPES = st.sampled_from([torch.float32, torch.float64, torch.float16,
                          torch.bfloat16])


def tensors(shape, elements=FLOATS, dtype=torch.float32):
    """A tensor of ``shape`` drawn element by element."""
    n = math.prod(shape)
    return st.lists(elements, min_size=n, max_size=n).map(
        lambda xs: torch.tensor(xs, dtype=torch.float64).reshape(shape)
        .to(dtype))


def raises_naming(fn, names):
    """Call fn; if it raises, the error must be a ValueError/TypeError
    that names one of ``names``. Returns the result or None."""
    try:
        return fn()
    except (ValueError, TypeError) as exc:
        assert any(n in str(exc) for n in names), str(exc)
        return None


# ------------------------------------------------------------- sampling
@SETTINGS
@given(v=st.integers(1, 6), data=st.data(), dtype=DTYPES,
       temperature=st.one_of(st.floats(0, 1e3), SPECIALS),
       top_k=st.one_of(st.none(), st.integers(-2, 8)),
       top_p=st.one_of(st.none(), st.floats(-0.5, 1.5), SPECIALS))
def test_sampling_distribution_is_a_distribution_or_an_error(
        v, data, dtype, temperature, top_k, top_p):
    logits = data.draw(tensors((2, v), dtype=dtype))
    p = raises_naming(
        lambda: sampling.sampling_distribution(logits, temperature=temperature,
                                        top_k=top_k, top_p=top_p),
        ["logits", "temperature", "top_k", "top_p"])
    if p is None:
        return
    assert torch.isfinite(p).all() and (p >= 0).all()
    torch.testing.assert_close(p.double().sum(-1), torch.ones(2,
                               dtype=torch.float64), atol=1e-2, rtol=0)
    # no probability on a token whose logit is -inf (unless T = 0 ties)
    assert (p[logits == float("-inf")] == 0).all()


# ------------------------------------------------------------ attention
@SETTINGS
@given(lq=st.integers(0, 5), lk=st.integers(0, 5), d=st.integers(1, 4),
       dtype=DTYPES, data=st.data(), fused=st.booleans())
def test_attention_output_is_a_convex_mix_of_the_values(lq, lk, d, dtype,
                                                        data, fused):
    # finite q, k, v of any size (empty included): the output is finite and
    # every row lies within the range of the value rows it may read
    q = data.draw(tensors((1, lq, d), st.floats(-50, 50, width=16), dtype))
    k = data.draw(tensors((1, lk, d), st.floats(-50, 50, width=16), dtype))
    v = data.draw(tensors((1, lk, d), st.floats(-50, 50, width=16), dtype))
    mask = None if lq == 0 or lk == 0 else causal_mask(lq, lk)
    out = fused_attention(q, k, v, mask) if fused else \
        scaled_dot_product_attention(q, k, v, mask)[0]
    assert out.shape == (1, lq, d) and torch.isfinite(out.float()).all()
    if lk:
        lo, hi = v.float().amin(1, keepdim=True), v.float().amax(1,
                                                                 keepdim=True)
        slack = 0.02 * (hi - lo).abs() + 0.05
        assert ((out.float() >= lo - slack) | (out == 0)).all()
        assert ((out.float() <= hi + slack) | (out == 0)).all()


@SETTINGS
@given(q_len=st.one_of(st.integers(-2, 6), st.floats(), st.booleans(),
                       st.text(max_size=2)),
       k_len=st.one_of(st.none(), st.integers(-2, 6), st.floats()))
def test_causal_mask_is_end_aligned_or_an_error(q_len, k_len):
    m = raises_naming(lambda: causal_mask(q_len, k_len), ["q_len", "k_len"])
    if m is None:
        return
    K = q_len if k_len is None else k_len
    for i in range(q_len):
        for j in range(K):
            assert bool(m[i, j]) == (j <= i + K - q_len)


@SETTINGS
@given(lengths=st.one_of(st.lists(st.integers(-1, 6), max_size=4),
                         st.text(max_size=3), st.integers()),
       max_len=st.one_of(st.integers(-1, 6), st.floats()))
def test_padding_mask_marks_real_keys_or_is_an_error(lengths, max_len):
    m = raises_naming(lambda: padding_mask(lengths, max_len),
                      ["lengths", "max_len"])
    if m is None:
        return
    assert m.shape == (len(lengths), 1, max_len)
    assert m.sum(-1).flatten().tolist() == list(lengths)


# ------------------------------------------------------------------ MHA
@SETTINGS
@given(b=st.integers(0, 2), t=st.integers(0, 4),
       width=st.sampled_from([8, 7, 16]), data=st.data())
def test_mha_returns_finite_or_names_x(b, t, width, data):
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = data.draw(tensors((b, t, width), st.floats(-10, 10, width=32)))
    out = raises_naming(lambda: mha(x), ["x"])
    if out is None:
        assert width != 8
        return
    assert out.shape == (b, t, 8) and torch.isfinite(out).all()


# ----------------------------------------------------------- RoPE, norms
@SETTINGS
@given(t=st.integers(0, 5), d=st.integers(1, 4).map(lambda n: 2 * n),
       dtype=DTYPES, data=st.data())
def test_rope_preserves_norms(t, d, dtype, data):
    # apply_rope trusts its caller (RotaryEmbedding checks the width once)
    x = data.draw(tensors((t, d), st.floats(-100, 100, width=32), dtype))
    y = apply_rope(x, torch.arange(t))
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
    torch.testing.assert_close(y.double().norm(dim=-1),
                               x.double().norm(dim=-1), rtol=tol,
                               atol=tol * 100)


@SETTINGS
@given(n=st.integers(0, 3), dtype=DTYPES, data=st.data(),
       eps=st.one_of(st.floats(1e-12, 1e-2), SPECIALS))
def test_rmsnorm_output_has_unit_rms_or_rejects_eps(n, dtype, data, eps):
    norm = raises_naming(lambda: RMSNorm(6, eps=eps), ["eps"])
    if norm is None:
        return
    x = data.draw(tensors((n, 6), st.floats(-1e3, 1e3, width=16), dtype))
    y = norm(x)
    assert torch.isfinite(y.float()).all()
    rms = y.double().pow(2).mean(-1).sqrt()
    big = x.double().pow(2).mean(-1) > 1e3 * eps      # eps negligible
    assert ((rms - 1).abs()[big] < 2e-2).all()


# --------------------------------------------------------------- routing
@SETTINGS
@given(n=st.integers(0, 3), e=st.integers(1, 5), k=st.integers(-1, 6),
       data=st.data())
def test_top_k_gates_sum_to_one_or_name_k(n, e, k, data):
    probs = data.draw(tensors((n, e), st.floats(0, 1, width=32)))
    got = raises_naming(lambda: select_top_k(probs, k), ["k"])
    if got is None:
        assert k < 1 or k > e
        return
    idx, gates = got
    assert torch.isfinite(gates).all()
    torch.testing.assert_close(gates.sum(-1), torch.ones(n))


# ---------------------------------------------------------- exercises
@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.one_of(st.text(max_size=12), st.from_regex(
    r"[-+]?\d{1,7}([.,]\d{0,4})?(e[-+]?\d{1,3})?", fullmatch=True)))
def test_parse_number_reads_a_finite_float_or_says_why(text):
    try:
        value = parse_number(text)
    except ValueError as exc:
        assert str(exc)                       # a message, never a crash
        return
    assert math.isfinite(value)

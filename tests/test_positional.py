"""Tests for course_lib.model.rope (chapter 2).

References used: a python double loop with math.sin/math.cos for the
sinusoidal table, complex-number arithmetic for RoPE, an explicit per-pair
rotation for R(k), torch's scaled_dot_product_attention for attention.
"""
import math

import matplotlib
import pytest
import torch

from course_lib.model import rope, sinusoidal
from course_lib.experiments import position_probes

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402
from errors import error_for  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ------------------------------------------------- frequencies/wavelengths
def test_frequencies_closed_form():
    w = sinusoidal.frequencies(8, base=100.0)
    expected = [100.0 ** (-2 * i / 8) for i in range(4)]
    assert w.dtype == torch.float64
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float64))


def test_wavelengths_range_and_paper_rounding():
    lam = sinusoidal.wavelengths(512)
    assert lam.shape == (256,)
    assert math.isclose(lam[0].item(), 2 * math.pi, rel_tol=1e-12)
    exact_max = 2 * math.pi * 10000.0 ** (510 / 512)
    assert math.isclose(lam[-1].item(), exact_max, rel_tol=1e-12)
    # The paper's "10000 * 2 pi" is an upper bound, not the exact maximum.
    assert lam[-1].item() < 10000 * 2 * math.pi
    # Geometric progression: constant ratio base^(2/D).
    ratio = lam[1:] / lam[:-1]
    assert torch.allclose(ratio, torch.full_like(ratio, 10000 ** (2 / 512)))
    # The exercise value: pair 128 of d_model 512 has wavelength 200 pi.
    assert math.isclose(lam[128].item(), 2 * math.pi * 100, rel_tol=1e-12)


# ------------------------------------------------------ sinusoidal table
@pytest.mark.parametrize("length,d_model,base", [(7, 6, 10000.0),
                                                 (50, 16, 100.0),
                                                 (1, 2, 10000.0)])
def test_sinusoidal_matches_double_loop(length, d_model, base):
    ref = torch.empty(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            ref[pos, 2 * i] = math.sin(angle)
            ref[pos, 2 * i + 1] = math.cos(angle)
    pe = sinusoidal.sinusoidal_encoding(length, d_model, base)
    assert pe.shape == (length, d_model)
    assert pe.dtype == torch.float32
    assert torch.allclose(pe.double(), ref, atol=1e-7, rtol=0)
    pe64 = sinusoidal.sinusoidal_encoding(length, d_model, base, dtype=torch.float64)
    assert torch.allclose(pe64, ref, atol=1e-12, rtol=0)


def test_sinusoidal_bounded_and_constant_norm():
    pe = sinusoidal.sinusoidal_encoding(2048, 64, dtype=torch.float64)
    assert pe.abs().max().item() <= 1.0
    norms = pe.norm(dim=-1)
    assert torch.allclose(norms, torch.full_like(norms, math.sqrt(32)))


def test_sinusoidal_positions_unique():
    pe = sinusoidal.sinusoidal_encoding(2048, 64, dtype=torch.float64)
    dist = torch.cdist(pe, pe)
    dist.fill_diagonal_(float("inf"))
    # Smallest distance is between neighbours and equals the closed form.
    w = sinusoidal.frequencies(64)
    step = torch.sqrt((4 * torch.sin(w / 2) ** 2).sum()).item()
    assert math.isclose(dist.min().item(), step, rel_tol=1e-9)
    assert step > 0.5


def test_neighbour_step_is_constant():
    pe = sinusoidal.sinusoidal_encoding(1000, 32, dtype=torch.float64)
    steps = (pe[1:] - pe[:-1]).norm(dim=-1)
    assert torch.allclose(steps, steps[0].expand_as(steps), atol=1e-12)


@pytest.mark.parametrize("bad,match", [
    (dict(length=4, d_model=7), "d_model must be even, got 7"),
    (dict(length=0, d_model=8), "length must be >= 1, got 0"),
    (dict(length=-3, d_model=8), "length must be >= 1, got -3"),
    (dict(length=4.0, d_model=8), "length must be an int, got float"),
    (dict(length=4, d_model=8.0), "d_model must be an int, got float"),
    (dict(length=True, d_model=8), "length must be an int, got bool"),
    (dict(length=4, d_model=8, base=0.0), "base must be > 0, got 0.0"),
    (dict(length=4, d_model=8, base=-2.0), "base must be > 0, got -2.0"),
    (dict(length=4, d_model=8, base="1e4"), "base must be a real number"),
    (dict(length=4, d_model=8, base=float("inf")), "base must be finite"),
])
def test_sinusoidal_bad_input(bad, match):
    with pytest.raises(error_for(match), match=match):
        sinusoidal.sinusoidal_encoding(**bad)


# --------------------------------------------------------- rotation R(k)
@pytest.mark.parametrize("k", [0, 1, 3, 17, 100, -1, -5, -250, 2.5])
def test_rotation_shifts_every_position(k):
    d = 32
    pe = sinusoidal.sinusoidal_encoding(1024, d, dtype=torch.float64)
    r = position_probes.rotation_matrix(k, d, dtype=torch.float64)
    pos = torch.arange(512)
    if k == int(k) and k >= 0:
        target = pe[pos + int(k)]          # a later row of the table
    else:
        # Negative or fractional offsets: evaluate the formula directly.
        ang = (pos.double() + k)[:, None] * sinusoidal.frequencies(d)
        target = torch.stack([ang.sin(), ang.cos()], -1).flatten(-2)
    shifted = pe[pos] @ r.T                   # row form of R(k) PE(p)
    assert torch.allclose(shifted, target, atol=1e-10, rtol=0)


def test_rotation_matches_per_pair_formula():
    d, k = 6, 4
    r = position_probes.rotation_matrix(k, d, base=100.0, dtype=torch.float64)
    for i in range(d // 2):
        c = k * 100.0 ** (-2 * i / d)
        block = torch.tensor([[math.cos(c), math.sin(c)],
                              [-math.sin(c), math.cos(c)]],
                             dtype=torch.float64)
        assert torch.allclose(r[2 * i:2 * i + 2, 2 * i:2 * i + 2], block)
    off_block = r.clone()
    for i in range(d // 2):
        off_block[2 * i:2 * i + 2, 2 * i:2 * i + 2] = 0
    assert off_block.abs().max().item() == 0


def test_rotation_orthogonal_and_group_law():
    d = 16
    eye = torch.eye(d, dtype=torch.float64)
    for a, b in [(3, 4), (-7, 2), (100, -100), (0.5, 1.25)]:
        ra = position_probes.rotation_matrix(a, d, dtype=torch.float64)
        rb = position_probes.rotation_matrix(b, d, dtype=torch.float64)
        rab = position_probes.rotation_matrix(a + b, d, dtype=torch.float64)
        assert torch.allclose(ra @ ra.T, eye, atol=1e-12)
        assert torch.allclose(ra @ rb, rab, atol=1e-12)
    r0 = position_probes.rotation_matrix(0, d, dtype=torch.float64)
    assert torch.equal(r0, eye)


def test_rotation_bad_input():
    with pytest.raises(ValueError, match="d_model must be even, got 5"):
        position_probes.rotation_matrix(1, 5)
    with pytest.raises(TypeError, match="k must be a real number"):
        position_probes.rotation_matrix("1", 8)
    with pytest.raises(ValueError, match="k must be finite, got nan"):
        position_probes.rotation_matrix(float("nan"), 8)


# ------------------------------------------------------ offset dot product
def test_offset_dot_product_matches_table():
    d = 64
    pe = sinusoidal.sinusoidal_encoding(600, d, dtype=torch.float64)
    ks = torch.tensor([-40, -3, 0, 1, 7, 250])
    closed = position_probes.offset_dot_product(ks, d)
    for p in [40, 100, 300]:
        direct = (pe[p] * pe[p + ks]).sum(-1)
        assert torch.allclose(direct, closed, atol=1e-10)
    assert math.isclose(closed[2].item(), d / 2)
    # Even in k: the dot product cannot tell left from right.
    assert torch.allclose(position_probes.offset_dot_product(ks, d),
                          position_probes.offset_dot_product(-ks, d))


def test_offset_dot_product_bad_input():
    with pytest.raises(TypeError, match="offsets must be a torch.Tensor"):
        position_probes.offset_dot_product([1, 2], 8)


# ------------------------------------------------------------------ RoPE
def _rope_complex(x, positions, base):
    """Reference: pairs (2i, 2i+1) as complex numbers times e^{i m theta}."""
    d = x.shape[-1]
    theta = torch.tensor([base ** (-2 * i / d) for i in range(d // 2)],
                         dtype=torch.float64)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2)
                              .contiguous())
    rot = torch.polar(torch.ones_like(theta),
                      positions.double()[..., None] * theta)
    return torch.view_as_real(z * rot).flatten(-2)


@pytest.mark.parametrize("shape,base", [((5, 8), 10000.0),
                                        ((2, 3, 7, 16), 500.0)])
def test_rope_matches_complex_reference(shape, base):
    x = torch.randn(*shape, dtype=torch.float64)
    pos = torch.arange(shape[-2]) * 3 + 2
    out = rope.apply_rope(x, pos, base=base, interleave=True)  # paper's pairs
    assert out.shape == x.shape and out.dtype == x.dtype
    assert torch.allclose(out, _rope_complex(x, pos, base), atol=1e-12)


def test_rope_float_positions_and_broadcast():
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    pos = torch.tensor([[0.0, 1.5, 2.0, 9.25], [3.0, 3.0, 1.0, 0.0]])
    out = rope.apply_rope(x, pos, interleave=True)   # per-batch (2, 4)
    for b in range(2):
        ref = _rope_complex(x[b], pos[b], 10000.0)
        assert torch.allclose(out[b], ref, atol=1e-12)


def test_rope_float32_stays_float32():
    x = torch.randn(3, 6, 8)
    out = rope.apply_rope(x, torch.arange(6), interleave=True)
    assert out.dtype == torch.float32
    ref = _rope_complex(x, torch.arange(6), 10000.0).float()
    assert torch.allclose(out, ref, atol=1e-6)


def test_rope_permutation_relates_conventions():
    perm = rope.rope_permutation(8)
    assert perm.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    d = 12
    perm = rope.rope_permutation(d)
    assert sorted(perm.tolist()) == list(range(d))
    x = torch.randn(2, 9, d, dtype=torch.float64)
    pos = torch.arange(9) + 5
    inter = rope.apply_rope(x, pos, interleave=True)
    split = rope.apply_rope(x[..., perm], pos, interleave=False)
    assert torch.allclose(inter[..., perm], split, atol=1e-12)
    # Without the permutation the two conventions do differ.
    plain = rope.apply_rope(x, pos, interleave=False)
    assert not torch.allclose(inter, plain, atol=1e-3)


def test_rope_split_halves_matches_rotate_half():
    # The Llama-style formula written out: x cos + rotate_half(x) sin.
    d = 8
    x = torch.randn(5, d, dtype=torch.float64)
    pos = torch.arange(5)
    theta = sinusoidal.frequencies(d)
    ang = torch.cat([pos[:, None] * theta] * 2, dim=-1)
    rotate_half = torch.cat([-x[:, d // 2:], x[:, :d // 2]], dim=-1)
    ref = x * ang.cos() + rotate_half * ang.sin()
    out = rope.apply_rope(x, pos, interleave=False)
    assert torch.allclose(out, ref, atol=1e-12)


@pytest.mark.parametrize("interleave", [True, False])
def test_rope_preserves_norms(interleave):
    x = torch.randn(4, 10, 16, dtype=torch.float64)
    out = rope.apply_rope(x, torch.arange(10) * 37, interleave=interleave)
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-12)


@pytest.mark.parametrize("interleave", [True, False])
def test_rope_scores_depend_only_on_offset(interleave):
    d = 32
    q = torch.randn(d, dtype=torch.float64)
    k = torch.randn(d, dtype=torch.float64)

    def score(m, n):
        qm = rope.apply_rope(q[None], torch.tensor([m]), interleave=interleave)
        kn = rope.apply_rope(k[None], torch.tensor([n]), interleave=interleave)
        return (qm * kn).sum().item()

    for m, n in [(5, 2), (0, 9), (3, 3)]:
        base_score = score(m, n)
        for offset in [1, 7, 100, 1000, 12345, -3]:
            assert math.isclose(score(m + offset, n + offset), base_score,
                                rel_tol=1e-9, abs_tol=1e-9)
    # ... and it really does depend on the offset.
    assert abs(score(5, 2) - score(9, 2)) > 1e-3


def test_rotary_embedding_checks_its_arguments_once():
    # apply_rope runs at every layer and step and trusts its caller: the
    # module that holds the width, base and pairing checks them when built.
    with pytest.raises(ValueError, match="head_dim must be even, got 7"):
        rope.RotaryEmbedding(7)
    with pytest.raises(ValueError, match="base must be > 0"):
        rope.RotaryEmbedding(8, base=-1.0)
    with pytest.raises(TypeError, match="interleave must be a bool"):
        rope.RotaryEmbedding(8, interleave="False")
    with pytest.raises(ValueError, match="d_model must be even, got 3"):
        rope.rope_permutation(3)


@pytest.mark.parametrize("base", [10000.0, 100000.0, 500000.0])
@pytest.mark.parametrize("interleave", [False, True])
def test_rotary_embedding_rotates_by_its_own_base(base, interleave):
    # Closed form, pair by pair: pair i at position m turns by
    # m * base^(-2i/d), whichever features the pairing puts together.
    d, T = 8, 5
    x = torch.randn(2, T, d, dtype=torch.float64)
    y = rope.RotaryEmbedding(d, base=base, interleave=interleave)(
        x, torch.arange(T))
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a, b = ((slice(0, d, 2), slice(1, d, 2)) if interleave
            else (slice(0, d // 2), slice(d // 2, d)))
    angle = torch.arange(T, dtype=torch.float64)[:, None] * theta  # (T, P)
    cos, sin = torch.cos(angle), torch.sin(angle)
    torch.testing.assert_close(y[..., a], x[..., a] * cos - x[..., b] * sin)
    torch.testing.assert_close(y[..., b], x[..., a] * sin + x[..., b] * cos)


def test_rope_tables_stay_small_for_far_positions():
    # positions far beyond any table are computed directly, not by growing
    # a table of every position up to them
    far = torch.tensor([10**9, 10**9 + 1])
    cos, sin = rope.rope_cos_sin(far, 8)
    angle = far.double()[:, None] * sinusoidal.frequencies(8, 10000.0)
    assert torch.equal(cos, torch.cos(angle).float())
    assert all(t[0].shape[0] <= 1 << 20 for t in rope._TABLES.values())


# -------------------------------------------------------- self-attention
def _weights(d=8, dk=8):
    return {n: torch.randn(d, dk, dtype=torch.float64) / math.sqrt(d)
            for n in ("w_q", "w_k", "w_v")}


def test_self_attention_matches_torch_sdpa():
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    w = _weights()
    ref = torch.nn.functional.scaled_dot_product_attention(
        x @ w["w_q"], x @ w["w_k"], x @ w["w_v"])
    assert torch.allclose(position_probes.self_attention(x, **w), ref, atol=1e-12)


def test_self_attention_with_rope_matches_manual():
    x = torch.randn(6, 8, dtype=torch.float64)
    w = _weights()
    pos = torch.arange(6)
    q = _rope_complex(x @ w["w_q"], pos, 10000.0)
    k = _rope_complex(x @ w["w_k"], pos, 10000.0)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k, x @ w["w_v"])
    out = position_probes.self_attention(x, **w, positions=pos)
    assert torch.allclose(out, ref, atol=1e-12)


def test_self_attention_is_permutation_equivariant():
    x = torch.randn(7, 8, dtype=torch.float64)
    w = _weights()
    perm = torch.randperm(7)
    out = position_probes.self_attention(x, **w)
    assert torch.allclose(position_probes.self_attention(x[perm], **w), out[perm],
                          atol=1e-12)
    # With RoPE the output is no longer a mere permutation of the old one.
    pos = torch.arange(7)
    out_r = position_probes.self_attention(x, **w, positions=pos)
    out_rp = position_probes.self_attention(x[perm], **w, positions=pos)
    assert not torch.allclose(out_rp, out_r[perm], atol=1e-3)


def test_self_attention_with_rope_is_shift_invariant():
    x = torch.randn(6, 8, dtype=torch.float64)
    w = _weights()
    pos = torch.arange(6)
    out = position_probes.self_attention(x, **w, positions=pos)
    for offset in [1, 50, 4096]:
        shifted = position_probes.self_attention(x, **w, positions=pos + offset)
        assert torch.allclose(shifted, out, atol=1e-9)


def test_self_attention_bad_input():
    w = _weights()
    with pytest.raises(ValueError, match="w_q must have shape \\(6, ...\\)"):
        position_probes.self_attention(torch.randn(3, 6, dtype=torch.float64), **w)
    w["w_k"] = torch.randn(8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="same width, got 8 and 4"):
        position_probes.self_attention(torch.randn(3, 8, dtype=torch.float64), **w)


# ----------------------------------------------------------- the picture
def test_draw_clock_hands_draws_one_hand_per_pair():
    fig = Figure()
    position_probes.draw_clock_hands(fig, position=3, d_model=8)
    axes = fig.get_axes()
    assert len(axes) == 4
    for i, ax in enumerate(axes):
        hand = ax.get_lines()[2]
        x, y = hand.get_xdata()[1], hand.get_ydata()[1]
        a = 3 * 10000.0 ** (-2 * i / 8)
        assert math.isclose(x, math.sin(a), abs_tol=1e-12)
        assert math.isclose(y, math.cos(a), abs_tol=1e-12)
    with pytest.raises(TypeError, match="position must be a real number"):
        position_probes.draw_clock_hands(Figure(), position="3")


# ------------------------------------------- cached RoPE tables (ch. 13)
@pytest.mark.parametrize("d,base", [(64, 1e5), (8, 100.0), (16, 1e4)])
def test_rope_cos_sin_table_equals_direct_computation(d, base):
    for pos in (torch.arange(3000), torch.tensor([5]),
                torch.randint(0, 9000, (2, 7)), torch.arange(4) * 1.5,
                torch.tensor([-3, 0, 2])):
        for dtype in (torch.float32, torch.float64):
            cos, sin = rope.rope_cos_sin(pos, d, base=base, dtype=dtype)
            angle = pos.double()[..., None] * sinusoidal.frequencies(d, base)
            assert cos.shape == sin.shape == (*pos.shape, d // 2)
            assert torch.equal(cos, torch.cos(angle).to(dtype))
            assert torch.equal(sin, torch.sin(angle).to(dtype))


# -------------------------------------------- sizes and dtypes at the call
def test_sinusoidal_encoding_rejects_huge_tables_and_integer_dtypes():
    with pytest.raises(ValueError, match="length"):
        sinusoidal.sinusoidal_encoding(10**9, 8)
    with pytest.raises(ValueError, match="dtype"):
        sinusoidal.sinusoidal_encoding(3, 4, dtype=torch.int64)
    with pytest.raises(TypeError, match="dtype"):
        sinusoidal.sinusoidal_encoding(3, 4, dtype="float32")


def test_position_probes_reject_huge_widths_and_integer_dtypes():
    with pytest.raises(ValueError, match="d_model"):
        position_probes.offset_dot_product(torch.arange(5.0), 10**9)
    with pytest.raises(ValueError, match="d_model"):
        position_probes.rotation_matrix(1.0, 10**6)
    with pytest.raises(ValueError, match="dtype"):
        position_probes.rotation_matrix(1.0, 4, dtype=torch.int64)


def test_function_and_module_share_the_default_pairing():
    # one default: the "rotate half" pairs (i, i + D/2) of the Hugging Face
    # Llama code, for apply_rope and for the module that wraps it
    x, pos = torch.randn(2, 5, 8, dtype=torch.float64), torch.arange(5)
    out = rope.apply_rope(x, pos)
    assert torch.equal(out, rope.RotaryEmbedding(8)(x, pos))
    assert torch.equal(out, rope.apply_rope(x, pos, interleave=False))
    assert not torch.allclose(out, rope.apply_rope(x, pos, interleave=True))

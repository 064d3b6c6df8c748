"""Tests for course_lib.experiments.rnn (chapter 1)."""
import math

import matplotlib
import pytest
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from course_lib.experiments.rnn import (SimpleRNN, draw_seq2seq,  # noqa: E402
                                        gradient_norm_vs_distance,
                                        max_path_length, set_recurrent_scale)
from course_lib.experiments.sequential_cost import (TimingResult, matmul_flops,  # noqa: E402
                                                    fused_recurrence,
                                                    recurrence_and_attention,
                                                    time_recurrence_vs_attention)
from errors import error_for


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def _torch_copy(rnn: SimpleRNN) -> torch.nn.RNN:
    ref = torch.nn.RNN(rnn.input_size, rnn.hidden_size, batch_first=True,
                       nonlinearity=rnn.nonlinearity)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(ref, f"{name}_l0").copy_(getattr(rnn, name))
    return ref


# ---------------------------------------------------------------- SimpleRNN
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("with_h0", [False, True])
def test_simple_rnn_matches_torch_rnn(nonlinearity, with_h0):
    rnn = SimpleRNN(input_size=5, hidden_size=7, nonlinearity=nonlinearity)
    ref = _torch_copy(rnn)
    x = torch.randn(3, 11, 5)
    h0 = torch.randn(3, 7) if with_h0 else None
    out, h_T = rnn(x, h0)
    ref_out, ref_h = ref(x, None if h0 is None else h0.unsqueeze(0))
    assert out.shape == (3, 11, 7) and h_T.shape == (3, 7)
    torch.testing.assert_close(out, ref_out, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(h_T, ref_h[0], atol=1e-6, rtol=1e-5)


def test_simple_rnn_linear_is_closed_form_sum():
    # Linear recurrence from h_0 = 0: h_T = sum_t W^{T-t} (W_xh x_t + b).
    rnn = SimpleRNN(input_size=3, hidden_size=4, nonlinearity="linear")
    x = torch.randn(2, 6, 3)
    _, h_T = rnn(x)
    b = rnn.bias_ih + rnn.bias_hh
    expected = sum(
        (x[:, t] @ rnn.weight_ih.T + b)
        @ torch.linalg.matrix_power(rnn.weight_hh, 5 - t).T
        for t in range(6))
    torch.testing.assert_close(h_T, expected, atol=1e-5, rtol=1e-5)


def test_simple_rnn_is_causal():
    rnn = SimpleRNN(input_size=4, hidden_size=6)
    x = torch.randn(2, 9, 4)
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 4, 4)  # change the future only
    out, _ = rnn(x)
    out2, _ = rnn(x2)
    torch.testing.assert_close(out[:, :5], out2[:, :5])
    assert not torch.allclose(out[:, 5:], out2[:, 5:])


def test_simple_rnn_bad_input():
    with pytest.raises(ValueError, match="nonlinearity must be one of"):
        SimpleRNN(input_size=2, hidden_size=3, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="hidden_size must be >= 1"):
        SimpleRNN(input_size=2, hidden_size=0)
    rnn = SimpleRNN(input_size=2, hidden_size=3)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 2\)"):
        rnn(torch.randn(4, 5, 3))
    with pytest.raises(ValueError, match=r"x must have shape"):
        rnn(torch.randn(5, 2))
    with pytest.raises(ValueError, match=r"h0 must have shape \(4, 3\)"):
        rnn(torch.randn(4, 5, 2), torch.randn(1, 4, 3))


# ------------------------------------------------------ recurrent weight scale
@pytest.mark.parametrize("rho", [0.5, 1.0, 1.3])
def test_set_recurrent_scale_spectrum(rho):
    rnn = SimpleRNN(input_size=2, hidden_size=8)
    g = torch.Generator().manual_seed(0)
    set_recurrent_scale(rnn, rho=rho, generator=g)
    w = rnn.weight_hh.detach().double()
    sv = torch.linalg.svdvals(w)
    eig = torch.linalg.eigvals(w).abs()
    # float32 weights: agreement to ~1e-6, not double precision.
    torch.testing.assert_close(sv, torch.full_like(sv, rho), atol=1e-5, rtol=0)
    torch.testing.assert_close(eig, torch.full_like(eig, rho), atol=1e-5,
                               rtol=0)


def test_set_recurrent_scale_bad_rho():
    rnn = SimpleRNN(input_size=2, hidden_size=3)
    with pytest.raises(ValueError, match="rho must be > 0, got -1"):
        set_recurrent_scale(rnn, rho=-1.0)


# -------------------------------------------------------- gradient vs distance
def test_gradient_norm_linear_closed_form():
    # Linear RNN: dh_T/dx_{T-k} = W_hh^k W_xh exactly, for any W_hh.
    rnn = SimpleRNN(input_size=3, hidden_size=5, nonlinearity="linear")
    x = torch.randn(2, 8, 3)
    norms = gradient_norm_vs_distance(rnn, x)
    w_hh, w_ih = rnn.weight_hh.detach(), rnn.weight_ih.detach()
    expected = torch.stack([
        torch.linalg.matrix_norm(torch.linalg.matrix_power(w_hh, k) @ w_ih)
        for k in range(8)])
    assert norms.shape == (2, 8)
    torch.testing.assert_close(norms, expected.expand(2, 8),
                               atol=1e-6, rtol=1e-5)


def test_gradient_norm_orthogonal_scale_is_rho_power():
    rnn = SimpleRNN(input_size=4, hidden_size=6, nonlinearity="linear")
    set_recurrent_scale(rnn, rho=0.8)
    norms = gradient_norm_vs_distance(rnn, torch.randn(1, 10, 4))[0]
    base = torch.linalg.matrix_norm(rnn.weight_ih.detach())
    expected = base * 0.8 ** torch.arange(10.0)
    torch.testing.assert_close(norms, expected, atol=1e-6, rtol=1e-4)


def test_gradient_norm_tanh_matches_autograd_jacobian():
    rnn = SimpleRNN(input_size=3, hidden_size=4)
    x = torch.randn(2, 5, 3)
    norms = gradient_norm_vs_distance(rnn, x)
    for b in range(2):
        jac = torch.autograd.functional.jacobian(
            lambda xb: rnn(xb.unsqueeze(0))[1][0], x[b])  # (H, T, D)
        ref = jac.pow(2).sum(dim=(0, 2)).sqrt().flip(0)
        torch.testing.assert_close(norms[b], ref, atol=1e-6, rtol=1e-5)
    # |tanh'| <= 1 gives the bound ||J_k|| <= ||W_hh||_2^k ||W_xh||_F.
    w2 = torch.linalg.matrix_norm(rnn.weight_hh.detach(), ord=2)
    base = torch.linalg.matrix_norm(rnn.weight_ih.detach())
    bound = base * w2 ** torch.arange(5.0)
    assert torch.all(norms <= bound + 1e-6)


def test_gradient_norm_accepts_torch_rnn():
    rnn = SimpleRNN(input_size=3, hidden_size=4)
    x = torch.randn(2, 6, 3)
    torch.testing.assert_close(gradient_norm_vs_distance(_torch_copy(rnn), x),
                               gradient_norm_vs_distance(rnn, x),
                               atol=1e-6, rtol=1e-5)


def test_gradient_norm_bad_input():
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, D\)"):
        gradient_norm_vs_distance(SimpleRNN(input_size=3, hidden_size=2),
                                  torch.randn(6, 3))


# ------------------------------------------------------------------- timing
def test_timing_reports_each_path_under_its_own_name(fake_clock,
                                                     monkeypatch):
    # Fake clock: every tanh (one per recurrence step) costs 1 s and every
    # softmax (one per attention call) 100 s. The recurrence over T steps
    # must then take exactly T s and the attention exactly 100 s.
    real_tanh, real_softmax = torch.tanh, torch.softmax

    def tanh(*a, **kw):
        fake_clock.advance(1.0)
        return real_tanh(*a, **kw)

    def softmax(*a, **kw):
        fake_clock.advance(100.0)
        return real_softmax(*a, **kw)

    monkeypatch.setattr(torch, "tanh", tanh)
    monkeypatch.setattr(torch, "softmax", softmax)
    res = time_recurrence_vs_attention([4, 16], d_model=8, batch=2, repeats=2)
    monkeypatch.undo()
    assert [r.length for r in res] == [4, 16]
    for r in res:
        assert isinstance(r, TimingResult)
        assert (r.rnn_seconds, r.attention_seconds) == (r.length, 100.0)
        assert r.ratio == r.length / 100.0


def test_timing_fused_column_times_torch_rnn(fake_clock, monkeypatch):
    # Without fused=True the column stays None (the original two timings);
    # with it, each call of torch.nn.RNN costs 10 fake seconds.
    assert time_recurrence_vs_attention([4], d_model=8, batch=2,
                                        repeats=1)[0].fused_seconds is None
    real_forward = torch.nn.RNN.forward

    def forward(self, *a, **kw):
        fake_clock.advance(10.0)
        return real_forward(self, *a, **kw)

    monkeypatch.setattr(torch.nn.RNN, "forward", forward)
    res = time_recurrence_vs_attention([4, 16], d_model=8, batch=2,
                                       repeats=2, fused=True)
    monkeypatch.undo()
    assert [r.fused_seconds for r in res] == [10.0, 10.0]


@pytest.mark.parametrize("B, T, D", [(1, 3, 4), (2, 17, 8)])
def test_fused_recurrence_equals_the_python_loop(B, T, D):
    # Independent reference: the Python loop of recurrence_and_attention,
    # with the same weights, reaches the same final state.
    x = torch.randn(B, T, D)
    w_ih, w_hh = torch.randn(D, D) / D ** 0.5, torch.randn(D, D) / D ** 0.5
    loop, _ = recurrence_and_attention(x, w_ih, w_hh, torch.randn(D, 3 * D))
    state = torch.get_rng_state()
    fused = fused_recurrence(x, w_ih, w_hh)
    # building the module draws no random initialisation
    assert torch.equal(torch.get_rng_state(), state)
    h = fused()
    assert h.shape == (B, D)
    torch.testing.assert_close(h, loop(), atol=1e-6, rtol=1e-5)


def test_fused_recurrence_bad_input():
    with pytest.raises(TypeError, match="w_hh"):
        fused_recurrence(torch.randn(1, 2, 3), torch.randn(3, 3), [[0.0]])


@pytest.mark.parametrize("B, T, D", [(1, 1, 1), (2, 5, 8), (3, 40, 16)])
def test_matmul_flops_match_torch_flop_counter(B, T, D):
    # Independent reference: torch's FlopCounterMode counts every matmul
    # that the two functions actually run.
    from torch.utils.flop_counter import FlopCounterMode
    x = torch.randn(B, T, D)
    fns = recurrence_and_attention(x, torch.randn(D, D), torch.randn(D, D),
                                   torch.randn(D, 3 * D))
    counted = []
    for fn in fns:
        with FlopCounterMode(display=False) as fc:
            fn()
        counted.append(fc.get_total_flops())
    assert tuple(counted) == matmul_flops(T, d_model=D, batch=B)


def test_recurrence_and_attention_compute_rnn_and_attention():
    B, T, D = 2, 6, 4
    x = torch.randn(B, T, D)
    w_ih, w_hh, w_qkv = torch.randn(D, D), torch.randn(D, D), \
        torch.randn(D, 3 * D)
    recurrence, attention = recurrence_and_attention(x, w_ih, w_hh, w_qkv)
    ref = torch.nn.RNN(D, D, bias=False, batch_first=True)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(w_ih)
        ref.weight_hh_l0.copy_(w_hh)
        h_ref = ref(x)[1][0]
    torch.testing.assert_close(recurrence(), h_ref)
    q, k, v = (x @ w_qkv).split(D, dim=-1)
    torch.testing.assert_close(
        attention(), torch.nn.functional.scaled_dot_product_attention(q, k, v))


def test_matmul_flops_bad_input():
    with pytest.raises(ValueError, match="length"):
        matmul_flops(0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lengths=[]), "lengths must be positive ints"),
    (dict(lengths=[4, 0]), "lengths must be positive ints"),
    (dict(lengths=[4], d_model=0), "d_model must be >= 1, got 0"),
    (dict(lengths=[4], repeats=0), "repeats must be >= 1, got 0"),
    (dict(lengths=[4], fused="yes"), "fused must be a bool, got str 'yes'"),
])
def test_timing_bad_input(kwargs, match):
    with pytest.raises(error_for(match), match=match):
        time_recurrence_vs_attention(**kwargs)


# -------------------------------------------------------------- path length
def _reference_paths(kind, n, k):
    """All-pairs path lengths from products of dense per-layer adjacency.

    A[l][j, i] = 1 if output j of layer l reads input i. The path from i to
    j has L edges for the smallest L with (A[L-1] ... A[0])[j, i] > 0.
    """
    def layer(l):
        a = torch.zeros(n, n)
        d = k ** l if kind == "dilated_cnn" else 1
        for j in range(n):
            for m in range(k):
                if j - m * d >= 0:
                    a[j, j - m * d] = 1
        return a

    dist = torch.full((n, n), -1)
    reach = torch.eye(n)
    for L in range(1, n + 1):
        reach = ((layer(L - 1) @ reach) > 0).float()
        dist[(dist < 0) & (reach > 0)] = L
    return dist


@pytest.mark.parametrize("kind", ["cnn", "dilated_cnn"])
@pytest.mark.parametrize("k", [2, 3, 4])
def test_max_path_is_the_farthest_pair(kind, k):
    for n in (2, 5, 9, 17):
        dist = _reference_paths(kind, n, k)
        assert max_path_length(kind, n, kernel_size=k) == dist.max().item()


@pytest.mark.parametrize("n", [1, 2, 3, 8, 9, 10, 27, 28, 64, 100, 513])
@pytest.mark.parametrize("k", [2, 3, 5])
def test_max_path_length_closed_forms(n, k):
    # Table 1 of Vaswani et al. (2017): O(n), O(n/k), O(log_k n), O(1).
    assert max_path_length("rnn", n, kernel_size=k) == n
    contiguous = max(1, math.ceil((n - 1) / (k - 1)))
    assert max_path_length("cnn", n, kernel_size=k) == contiguous
    assert max_path_length("restricted_attention", n,
                           kernel_size=k) == contiguous
    layers = 1
    while k ** layers < n:  # integer ceil(log_k n), no float rounding
        layers += 1
    assert max_path_length("dilated_cnn", n, kernel_size=k) == layers
    assert max_path_length("attention", n, kernel_size=k) == 1


@pytest.mark.parametrize("args, kwargs, match", [
    (("lstm", 4), {}, "kind must be one of"),
    (("rnn", 0), {}, "length must be >= 1, got 0"),
    (("cnn", 4), dict(kernel_size=1), "kernel_size must be >= 2, got 1"),
])
def test_max_path_length_bad_input(args, kwargs, match):
    with pytest.raises(error_for(match), match=match):
        max_path_length(*args, **kwargs)


# ------------------------------------------------------------------ drawing
def test_draw_seq2seq_draws_every_token():
    fig, ax = plt.subplots()
    draw_seq2seq(ax, ["I", "love", "llamas"], ["j'", "adore", "les", "lamas"])
    texts = [t.get_text() for t in ax.texts]
    for tok in ["I", "love", "llamas", "j'", "adore", "les", "lamas",
                "<bos>", "$c$", "$h_3$", "$s_4$"]:
        assert tok in texts
    plt.close(fig)
    with pytest.raises(ValueError, match="source and target must be non-"):
        draw_seq2seq(ax, [], ["a"])


def test_draw_seq2seq_attention_links_every_pair_and_drops_c():
    arrows = {}
    for attention in (False, True):
        fig, ax = plt.subplots()
        draw_seq2seq(ax, ["a", "b", "c"], ["x", "y"], attention=attention)
        texts = [t.get_text() for t in ax.texts]
        assert ("$c$" in texts) is not attention
        arrows[attention] = sum(1 for t in ax.texts
                                if getattr(t, "arrow_patch", None))
        plt.close(fig)
    # attention: + n*m orange links (3 * 2); h_n -> c -> s_1 (two links)
    # becomes h_n -> s_1 (one)
    assert arrows[True] == arrows[False] + 3 * 2 - 1


# ---------------------------------------------- sizes and flags at the call
def test_max_path_length_bounds_its_search():
    with pytest.raises(ValueError, match="length"):
        max_path_length("rnn", 10**18)
    with pytest.raises(ValueError, match="kernel_size"):
        max_path_length("dilated_cnn", 8, kernel_size=10**9)


def test_time_recurrence_vs_attention_checks_sizes_first():
    with pytest.raises(ValueError, match="lengths"):
        time_recurrence_vs_attention([10**9])


def test_draw_seq2seq_rejects_a_string_flag():
    fig, ax = plt.subplots()
    with pytest.raises(TypeError, match="attention"):
        draw_seq2seq(ax, ["a"], ["b"], attention="False")
    plt.close(fig)


# -- rnn_forward and gru_forward (chapter 1's code exercises) ---------------
from course_lib.experiments.rnn import gru_forward, rnn_forward  # noqa: E402


def _torch_weights(module):
    return tuple(getattr(module, f"{n}_l0").detach()
                 for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))


@pytest.mark.parametrize("B,T,D,d_h", [(1, 1, 2, 3), (3, 7, 4, 5),
                                       (2, 12, 1, 1)])
def test_rnn_forward_matches_torch_rnn(B, T, D, d_h):
    torch.manual_seed(11)
    ref = torch.nn.RNN(D, d_h, batch_first=True).double()
    x = torch.randn(B, T, D, dtype=torch.float64)
    torch.testing.assert_close(rnn_forward(x, *_torch_weights(ref)),
                               ref(x)[0])


@pytest.mark.parametrize("B,T,D,d_h", [(1, 1, 2, 3), (3, 7, 4, 5),
                                       (2, 12, 1, 1), (4, 30, 6, 8)])
def test_gru_forward_matches_torch_gru(B, T, D, d_h):
    torch.manual_seed(12)
    ref = torch.nn.GRU(D, d_h, batch_first=True).double()
    with torch.no_grad():                 # larger weights: gates far from 1/2
        for p in ref.parameters():
            p.mul_(3)
    x = torch.randn(B, T, D, dtype=torch.float64)
    torch.testing.assert_close(gru_forward(x, *_torch_weights(ref)),
                               ref(x)[0])


def test_gru_forward_is_the_equations_written_out():
    """One step by the scalar equations (d_h = 1, D = 1)."""
    w_ih = torch.tensor([[0.5], [-1.0], [2.0]], dtype=torch.float64)
    w_hh = torch.tensor([[1.5], [0.3], [-0.7]], dtype=torch.float64)
    b_ih = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    b_hh = torch.tensor([-0.2, 0.4, 0.6], dtype=torch.float64)
    x = torch.tensor([[[1.0], [-2.0]]], dtype=torch.float64)
    sig = lambda a: 1 / (1 + math.exp(-a))  # noqa: E731
    h, want = 0.0, []
    for xt in (1.0, -2.0):
        r = sig(0.5 * xt + 0.1 + 1.5 * h - 0.2)
        z = sig(-1.0 * xt + 0.2 + 0.3 * h + 0.4)
        n = math.tanh(2.0 * xt + 0.3 + r * (-0.7 * h + 0.6))
        h = (1 - z) * n + z * h
        want.append(h)
    got = gru_forward(x, w_ih, w_hh, b_ih, b_hh)[0, :, 0]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64))


@pytest.mark.parametrize("fn,gates", [(rnn_forward, 1), (gru_forward, 3)])
def test_recurrent_forward_bad_input(fn, gates):
    x = torch.randn(2, 3, 4)
    good = (torch.randn(gates * 5, 4), torch.randn(gates * 5, 5),
            torch.randn(gates * 5), torch.randn(gates * 5))
    assert fn(x, *good).shape == (2, 3, 5)
    assert fn(x[:, :0], *good).shape == (2, 0, 5)
    with pytest.raises(TypeError, match="x must be"):
        fn([1.0], *good)
    with pytest.raises(ValueError, match="x must have shape"):
        fn(x[0], *good)
    with pytest.raises(ValueError, match="weight_ih must have shape"):
        fn(x, torch.randn(gates * 5, 3), *good[1:])
    with pytest.raises(ValueError, match="weight_hh must have shape"):
        fn(x, good[0], torch.randn(gates * 5, 4), *good[2:])
    with pytest.raises(ValueError, match="bias_hh must have shape"):
        fn(x, *good[:3], torch.randn(5 * gates + 1))

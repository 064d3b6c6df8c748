"""Tests for course_lib.generation.sampling (chapter 8)."""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.generation import sampling
from errors import error_for

INF = float("-inf")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


# ---------------------------------------------------------------- references
def ref_top_k(row: list[float], k: int) -> list[bool]:
    """Keep token i iff fewer than k tokens have a strictly larger logit."""
    return [sum(1 for z in row if z > zi) < k for zi in row]


def ref_top_p(row: list[float], p: float) -> tuple[list[bool], float]:
    """Walk the sorted probabilities and keep tokens until the mass >= p.

    Tokens tied with the last kept token are kept as well. Also returns the
    distance between p and the nearest partial sum, so callers can skip rows
    where float rounding could legitimately flip the decision.
    """
    finite = [z for z in row if z != INF]
    m = max(finite)
    w = [math.exp(z - m) if z != INF else 0.0 for z in row]
    total = sum(w)
    probs = [x / total for x in w]
    order = sorted(range(len(row)), key=lambda i: -row[i])
    keep = [False] * len(row)
    mass, last, gap = 0.0, None, float("inf")
    for i in order:
        if mass >= p:
            break
        keep[i] = True
        last = row[i]
        mass += probs[i]
        gap = min(gap, abs(mass - p))
    for i, z in enumerate(row):
        if z == last:
            keep[i] = True
    return keep, gap


def kept(filtered: torch.Tensor) -> list[list[bool]]:
    return (filtered > INF).reshape(-1, filtered.shape[-1]).tolist()


def random_logits(shape, *, ties: bool) -> torch.Tensor:
    if ties:  # few distinct values: many exact ties, also at the boundary
        return torch.randint(-3, 3, shape).float()
    return torch.randn(shape) * 2.0


# ------------------------------------------------------------- temperature
def test_temperature_divides_logits():
    z = torch.randn(4, 7)
    for T in (0.3, 1.0, 2.5):
        torch.testing.assert_close(sampling.apply_temperature(z, T), z / T)


def test_temperature_limits():
    z = torch.tensor([2.0, 1.0, 0.5, -1.0])
    hot = F.softmax(sampling.apply_temperature(z, 1e4), dim=-1)
    torch.testing.assert_close(hot, torch.full((4,), 0.25), atol=1e-3,
                               rtol=0)
    cold = F.softmax(sampling.apply_temperature(z, 1e-3), dim=-1)
    torch.testing.assert_close(cold, torch.tensor([1.0, 0, 0, 0]))
    # T = 0 is the limit itself; ties go to the lowest index like argmax
    zero = F.softmax(sampling.apply_temperature(torch.tensor([1.0, 3.0, 3.0]), 0),
                     dim=-1)
    assert zero.tolist() == [0.0, 1.0, 0.0]


def test_entropy_increases_with_temperature():
    z = torch.randn(8, 20) * 3
    temps = [0.1, 0.3, 0.5, 1.0, 2.0, 5.0, 20.0]
    ents = []
    for T in temps:
        p = F.softmax(sampling.apply_temperature(z, T), dim=-1)
        ents.append(-(p * p.clamp_min(1e-30).log()).sum(-1))
    for a, b in zip(ents, ents[1:]):
        assert torch.all(b >= a - 1e-5)
    assert torch.all(ents[-1] <= math.log(20) + 1e-6)


# -------------------------------------------------------------------- top-k
@pytest.mark.parametrize("ties", [False, True])
def test_top_k_matches_reference(ties):
    for _ in range(30):
        z = random_logits((5, 11), ties=ties)
        for k in (1, 2, 3, 7, 11, 50):
            out = sampling.top_k_filter(z, k)
            want = [ref_top_k(row, k) for row in z.tolist()]
            assert kept(out) == want
            # kept logits are unchanged
            mask = out > INF
            assert torch.equal(out[mask], z[mask])


def test_top_k_ties_keep_all_tied_and_any_shape():
    z = torch.tensor([3.0, 2.0, 2.0, 1.0])
    assert kept(sampling.top_k_filter(z, 2)) == [[True, True, True, False]]
    z3 = torch.randn(2, 3, 9)
    out = sampling.top_k_filter(z3, 4)
    assert out.shape == z3.shape
    assert torch.all((out > INF).sum(-1) == 4)


# -------------------------------------------------------------------- top-p
@pytest.mark.parametrize("ties", [False, True])
def test_top_p_matches_reference(ties):
    checked = skipped = 0
    for _ in range(25):
        z = random_logits((4, 9), ties=ties)
        for p in (1e-6, 0.1, 0.3, 0.5, 0.75, 0.9, 0.99):
            out = sampling.top_p_filter(z, p)
            got = kept(out)
            for row, g in zip(z.tolist(), got):
                want, gap = ref_top_p(row, p)
                if gap < 1e-9:  # p sits on a partial sum: rounding decides
                    skipped += 1
                    continue
                assert g == want, (row, p)
                checked += 1
    assert checked > 600 and skipped < checked // 50


def test_top_p_any_leading_shape_equals_row_by_row():
    # (..., V): a 3-D batch is filtered row by row along the last axis
    # (softmax over any other axis, e.g. torch's implicit dim=0 for 3-D
    # input, would mix rows)
    z3 = torch.randn(2, 3, 9)
    for p in (0.3, 0.8):
        out = sampling.top_p_filter(z3, p)
        rows = torch.stack([sampling.top_p_filter(row, p)
                            for row in z3.reshape(-1, 9)]).reshape(2, 3, 9)
        assert torch.equal(out, rows)
        assert (out > INF).sum() < z3.numel()             # it filters


def test_top_p_boundary_is_strict():
    # Exact dyadic probabilities: with a = log(1/2) in float64, the logits
    # (0, a, 2a, 2a) give softmax (1/2, 1/4, 1/8, 1/8) exactly (checked
    # below) and every partial sum is exact, so the mass before a token
    # can equal p exactly. The docstring's rule keeps a token iff the
    # mass of the likelier tokens is < p (strict), so a token whose
    # preceding mass is exactly p is dropped.
    a = math.log(0.5)
    z = torch.tensor([0.0, a, 2 * a, 2 * a], dtype=torch.float64)
    assert torch.equal(F.softmax(z, -1), torch.tensor(
        [0.5, 0.25, 0.125, 0.125], dtype=torch.float64))  # exact premise
    order = [2, 0, 3, 1]                                 # unsorted input
    z = z[order]
    # mass before token 1 is 1/2, before token 2 (and its tie) 3/4
    assert kept(sampling.top_p_filter(z, 0.5)) == [[False, True, False, False]]
    assert kept(sampling.top_p_filter(z, 0.75)) == [[False, True, False, True]]
    # just above those sums the next token crosses into the nucleus
    assert kept(sampling.top_p_filter(z, 0.5 + 2 ** -40)) == \
        [[False, True, False, True]]
    assert kept(sampling.top_p_filter(z, 0.75 + 2 ** -40)) == [[True] * 4]


def test_top_p_mass_rule_and_crossing_token_kept():
    z = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    # 0.5 < 0.6, 0.5 + 0.3 >= 0.6: the token that crosses p is kept
    assert kept(sampling.top_p_filter(z, 0.6)) == [[True, True, False, False]]
    assert kept(sampling.top_p_filter(z, 0.5)) == [[True, False, False, False]]
    assert kept(sampling.top_p_filter(z, 0.81)) == [[True, True, True, False]]
    # characterisation: keep iff mass of strictly likelier tokens < p
    zr = torch.randn(6, 13)
    probs = F.softmax(zr.double(), -1)
    for p in (0.2, 0.6, 0.95):
        out = kept(sampling.top_p_filter(zr, p))
        for b in range(6):
            for i in range(13):
                above = probs[b][zr[b] > zr[b, i]].sum().item()
                assert out[b][i] == (above < p)


def test_top_p_one_is_identity_and_one_token_survives():
    z = torch.tensor([[0.0, -1000.0, 5.0, INF], [1.0, 1.0, 1.0, 1.0]])
    assert torch.equal(sampling.top_p_filter(z, 1.0), z)
    tiny = sampling.top_p_filter(torch.randn(50, 30), 1e-12)
    assert torch.all((tiny > INF).sum(-1) == 1)
    # a tie for first place keeps both
    assert kept(sampling.top_p_filter(torch.tensor([2.0, 2.0, 0.0]), 0.1)) == \
        [[True, True, False]]


def test_top_p_accepts_already_filtered_logits():
    z = torch.randn(3, 10)
    zk = sampling.top_k_filter(z, 4)
    out = sampling.top_p_filter(zk, 0.7)
    assert torch.all((out > INF) <= (zk > INF))
    assert not torch.isnan(F.softmax(out, -1)).any()


# ------------------------------------------------------ composed distribution
def test_sampling_distribution_order_and_normalisation():
    z = torch.randn(4, 12)
    T, k, p = 0.7, 6, 0.8
    manual = F.softmax(sampling.top_p_filter(sampling.top_k_filter(z / T, k), p), -1)
    got = sampling.sampling_distribution(z, temperature=T, top_k=k, top_p=p)
    torch.testing.assert_close(got, manual)
    torch.testing.assert_close(got.sum(-1), torch.ones(4))
    # no filters: plain softmax of z / T
    torch.testing.assert_close(sampling.sampling_distribution(z, temperature=T),
                               F.softmax(z / T, -1))


def test_order_matters_for_top_p_not_top_k():
    z = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    k_then_p = kept(sampling.top_p_filter(sampling.top_k_filter(z, 3), 0.75))
    p_then_k = kept(sampling.top_k_filter(sampling.top_p_filter(z, 0.75), 3))
    assert k_then_p == [[True, True, False, False]]
    assert p_then_k == [[True, True, True, False]]
    # temperature before top-p changes the nucleus; before top-k it cannot
    t_first = kept(sampling.top_p_filter(sampling.apply_temperature(z, 0.5), 0.75))
    assert t_first != kept(sampling.top_p_filter(z, 0.75))
    zr = torch.randn(5, 9)
    assert kept(sampling.top_k_filter(zr / 3.0, 4)) == kept(sampling.top_k_filter(zr, 4))


# ------------------------------------------------------------- sample_next
# chi-square critical values at significance 0.001 by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46,
            7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59, 11: 31.26}


@pytest.mark.parametrize("settings", [
    {"temperature": 1.0},
    {"temperature": 0.5, "top_k": 4},
    {"temperature": 1.5, "top_p": 0.8},
    {"temperature": 1.0, "top_k": 6, "top_p": 0.7},
])
def test_sample_frequencies_match_filtered_distribution(settings):
    z = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
    n = 40_000
    gen = torch.Generator().manual_seed(7)
    draws = sampling.sample_next(z.expand(n, -1), generator=gen, **settings)
    counts = torch.bincount(draws, minlength=8).double()
    probs = sampling.sampling_distribution(z, **settings).double()
    support = probs > 0
    assert counts[~support].sum() == 0      # filtered tokens never appear
    expected = n * probs[support]
    chi2 = ((counts[support] - expected) ** 2 / expected).sum().item()
    df = int(support.sum()) - 1
    assert chi2 < CHI2_999[df], (chi2, df)


def test_temperature_zero_is_argmax_and_uses_no_randomness():
    z = torch.randn(6, 15)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    for kw in ({}, {"top_k": 3}, {"top_p": 0.5}):
        out = sampling.sample_next(z, temperature=0, generator=gen, **kw)
        assert torch.equal(out, z.argmax(-1))
    assert torch.equal(gen.get_state(), state)
    ties = torch.tensor([0.0, 4.0, 4.0])
    assert sampling.sample_next(ties, temperature=0).item() == 1


def test_sample_next_shapes_and_seeding():
    z = torch.randn(5, 10)
    a = sampling.sample_next(z, generator=torch.Generator().manual_seed(3))
    b = sampling.sample_next(z, generator=torch.Generator().manual_seed(3))
    assert a.shape == (5,) and a.dtype == torch.int64
    assert torch.equal(a, b)
    one = sampling.sample_next(z[0], generator=torch.Generator().manual_seed(3))
    assert one.shape == () and 0 <= one.item() < 10
    with pytest.raises(ValueError, match="logits must have shape"):
        sampling.sample_next(torch.randn(2, 3, 4))


# ---------------------------------------------------------------- generate
class Bigram(torch.nn.Module):
    """A fixed bigram table as a language model: logits depend on x_t only."""

    def __init__(self, table: torch.Tensor, max_len: int | None = None):
        super().__init__()
        self.register_buffer("table", table)                 # (V, V)
        self.seen_lengths: list[int] = []
        if max_len is not None:
            self.config = type(
                "Cfg", (), {"max_position_embeddings": max_len})()

    def forward(self, idx):
        self.seen_lengths.append(idx.shape[1])
        return self.table[idx]                               # (B, T, V)


def test_generate_is_deterministic_and_matches_manual_loop():
    table = torch.randn(6, 6) * 2
    model = Bigram(table)
    prompt = torch.tensor([[0, 3], [5, 1]])
    kw = {"temperature": 0.9, "top_k": 4, "top_p": 0.9}
    a = sampling.generate(model, prompt, 12,
                   generator=torch.Generator().manual_seed(1), **kw)
    b = sampling.generate(model, prompt, 12,
                   generator=torch.Generator().manual_seed(1), **kw)
    assert a.shape == (2, 14) and torch.equal(a, b)
    assert torch.equal(a[:, :2], prompt)
    # reference: the same draws made one step at a time by hand
    gen = torch.Generator().manual_seed(1)
    seq = prompt.clone()
    for _ in range(12):
        nxt = sampling.sample_next(table[seq[:, -1]], generator=gen, **kw)
        seq = torch.cat([seq, nxt[:, None]], 1)
    assert torch.equal(a, seq)
    c = sampling.generate(model, prompt, 12,
                   generator=torch.Generator().manual_seed(2), **kw)
    assert not torch.equal(a, c)


def test_generate_greedy_follows_argmax_chain():
    table = torch.randn(7, 7)
    out = sampling.generate(Bigram(table), torch.tensor([2]), 10, temperature=0)
    assert out.shape == (11,)
    x = 2
    for t in range(1, 11):
        x = int(table[x].argmax())
        assert out[t].item() == x


def test_generate_crops_to_max_len_and_restores_mode():
    model = Bigram(torch.randn(5, 5), max_len=4)
    model.train()
    out = sampling.generate(model, torch.zeros(1, 2, dtype=torch.long), 6,
                     generator=torch.Generator().manual_seed(0))
    assert out.shape == (1, 8)
    assert model.seen_lengths == [2, 3, 4, 4, 4, 4]
    assert model.training
    model.seen_lengths.clear()
    sampling.generate(model, torch.zeros(1, 2, dtype=torch.long), 3, max_len=2)
    assert model.seen_lengths == [2, 2, 2]
    assert sampling.generate(model, torch.tensor([1, 2]), 0).tolist() == [1, 2]


def test_generate_rejects_bad_input():
    model = Bigram(torch.randn(5, 5))
    with pytest.raises(TypeError, match="prompt_ids must be an integer"):
        sampling.generate(model, torch.zeros(1, 3), 2)
    with pytest.raises(ValueError, match="prompt_ids must have shape"):
        sampling.generate(model, torch.zeros(1, 0, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="max_new_tokens must be .* got -1"):
        sampling.generate(model, torch.zeros(1, 3, dtype=torch.long), -1)
    with pytest.raises(ValueError, match="max_len must be .* got 0"):
        sampling.generate(model, torch.zeros(1, 3, dtype=torch.long), 2, max_len=0)
    with pytest.raises(ValueError, match="model must return logits"):
        sampling.generate(lambda x: x.float(), torch.zeros(1, 3, dtype=torch.long),
                   1)


def test_sequence_log_prob_matches_bigram_sum():
    table = torch.randn(6, 6)
    logp = F.log_softmax(table.double(), -1)
    ids = torch.tensor([[1, 4, 0, 5, 2], [3, 3, 1, 0, 4]])
    for prompt_len in (1, 2, 4):
        want = torch.tensor([
            sum(logp[r[t - 1], r[t]].item() for t in range(prompt_len, 5))
            for r in ids.tolist()], dtype=torch.float64)
        got = sampling.sequence_log_prob(Bigram(table), ids, prompt_len=prompt_len)
        torch.testing.assert_close(got, want)
    one = sampling.sequence_log_prob(Bigram(table), ids[0])
    assert one.shape == ()
    with pytest.raises(ValueError, match="prompt_len must be .* got 6"):
        sampling.sequence_log_prob(Bigram(table), ids, prompt_len=6)


def test_default_temperature_is_one():
    # no argument = the model's own distribution, softmax(z), unscaled
    z = torch.randn(4, 7)
    torch.testing.assert_close(sampling.sampling_distribution(z), F.softmax(z, -1),
                               atol=1e-7, rtol=0)
    a = sampling.sample_next(z, generator=torch.Generator().manual_seed(5))
    b = sampling.sample_next(z, temperature=1.0,
                      generator=torch.Generator().manual_seed(5))
    c = sampling.sample_next(z * 0.5, temperature=0.5,
                      generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and torch.equal(a, c)


# --------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, match", [
    (lambda z: sampling.apply_temperature(z, -0.5), "temperature must be .* -0.5"),
    (lambda z: sampling.apply_temperature(z, float("inf")), "temperature must be"),
    (lambda z: sampling.sample_next(z, temperature=-1), "temperature must be .*-1"),
    (lambda z: sampling.top_k_filter(z, 0), "top_k must be >= 1, got 0"),
    (lambda z: sampling.top_k_filter(z, 2.5), "top_k must be an int, got float 2.5"),
    (lambda z: sampling.sample_next(z, top_k=-3), "top_k must be .* got -3"),
    (lambda z: sampling.top_p_filter(z, 0.0), r"top_p must be > 0, got 0.0"),
    (lambda z: sampling.top_p_filter(z, 1.5), r"top_p must be .* got 1.5"),
    (lambda z: sampling.sample_next(z, top_p=-0.1), r"top_p must be .* -0.1"),
    (lambda z: sampling.top_p_filter(z, True), r"top_p must be a real number, got bool True"),
    (lambda z: sampling.top_p_filter(z, "0.5"), r"top_p must be a real number, got str '0.5'"),
    (lambda z: sampling.top_k_filter(z.long(), 2), "logits must be a floating"),
    (lambda z: sampling.top_p_filter(z.tolist(), 0.5),
     "logits must be a torch.Tensor"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(error_for(match), match=match):
        call(torch.randn(3, 5))


def test_bad_logit_values_raise():
    with pytest.raises(ValueError, match="NaN"):
        sampling.sample_next(torch.tensor([0.0, float("nan")]))
    with pytest.raises(ValueError, match="at least one entry above -inf"):
        sampling.sampling_distribution(torch.tensor([[0.0, 1.0], [INF, INF]]))


@pytest.mark.parametrize("dtype, logits, T", [
    (torch.float16, [12.0, 8.0, 0.0], 1e-4),       # fp16 z/T > 65504
    (torch.float16, [1000.0, 990.0, 0.0], 0.01),
    (torch.float32, [12.0, 8.0, 0.0], 1e-39),      # fp32 z/T > 3.4e38
    (torch.bfloat16, [3.0, 2.0, 1.0], 1e-30),
])
def test_tiny_temperature_is_near_greedy_not_nan(dtype, logits, T):
    # With a tiny T, z / T overflowed to inf and softmax gave NaN.
    z = torch.tensor(logits, dtype=dtype)
    p = sampling.sampling_distribution(z, temperature=T)
    assert torch.isfinite(p).all()
    torch.testing.assert_close(p.double(), torch.tensor([1.0, 0.0, 0.0],
                                                        dtype=torch.float64))
    assert sampling.sample_next(z, temperature=T).item() == 0


def test_temperature_in_half_precision_matches_float64():
    z = torch.tensor([[2.0, 1.0, -1.0, 0.5]], dtype=torch.float16)
    p = sampling.sampling_distribution(z, temperature=0.7)
    ref = torch.softmax(z.double() / 0.7, dim=-1)
    torch.testing.assert_close(p.double(), ref, atol=1e-6, rtol=1e-6)


def test_positive_infinite_logits_are_rejected():
    # A +inf logit passed through and softmax returned NaN.
    z = torch.tensor([float("inf"), 0.0])
    for call in (lambda: sampling.sampling_distribution(z),
                 lambda: sampling.sample_next(z), lambda: sampling.apply_temperature(z, 1.0),
                 lambda: sampling.top_k_filter(z, 1)):
        with pytest.raises(ValueError, match=r"logits must not contain \+inf"):
            call()


# -------------------------------------------- edges of the sampling chain
def test_temperature_on_a_batch_that_overflows_matches_each_row_alone():
    # z / tau overflows in row 1 only; the shift by the row's own maximum
    # must give every row the distribution it has on its own
    z = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    tau = 1e-38
    batch = torch.softmax(sampling.apply_temperature(z, tau), dim=-1)
    assert torch.isfinite(batch).all()
    for i in range(2):
        alone = torch.softmax(sampling.apply_temperature(z[i], tau), dim=-1)
        torch.testing.assert_close(batch[i], alone)


def test_temperature_zero_keeps_logit_0_at_the_first_maximum_only():
    out = sampling.apply_temperature(torch.tensor([1.0, 3.0, 2.0, 3.0]), 0)
    assert out.tolist() == [INF, 0.0, INF, INF]


def test_temperature_keeps_float64_precision():
    z = torch.tensor([0.0, 1e-12], dtype=torch.float64)
    out = sampling.apply_temperature(z, 1.0)
    assert out.dtype == torch.float64 and out[1].item() == 1e-12


def test_a_vocabulary_of_one_token_is_valid_and_a_scalar_is_not():
    assert sampling.sample_next(torch.tensor([0.5])).item() == 0
    assert sampling.sample_next(torch.tensor([[0.5], [2.0]]),
                                temperature=0).tolist() == [0, 0]
    with pytest.raises(ValueError, match="logits must have shape"):
        sampling.sample_next(torch.tensor(1.0))


def test_a_context_window_of_one_token_is_allowed():
    seen = []

    class Last(torch.nn.Module):
        def forward(self, idx):
            seen.append(idx.shape[1])
            return F.one_hot((idx + 1) % 5, 5).float()      # (B, T, 5)

    out = sampling.generate(Last(), torch.tensor([[0, 1, 2]]), 3,
                            temperature=0, max_len=1)
    assert out.tolist() == [[0, 1, 2, 3, 4, 0]] and seen == [1, 1, 1]

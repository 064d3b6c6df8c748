"""Tests for chapter 4 (masking): its claims and course_lib.model.masks.

The claims are checked on course_lib.model.attention: causality (inputs after
position i never change output i), padding (padded positions never change
real outputs), the notes' three-position example exactly, fully masked
rows. References used: attention over the prefix x[:i+1] only (python loop)
for the causal mask, each sequence run alone without padding for the
padding mask, torch's fused attention with a float (additive) mask for
additive_mask, a cumulative sum for influence_matrix.
"""
import math

import matplotlib
import pytest
import torch
import torch.nn.functional as F

from course_lib.model import attention, masks, masks as M
from course_lib.experiments import mask_probes

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def _layer(d=8, seed=0):
    """One self-attention layer with fixed random projections."""
    g = torch.Generator().manual_seed(seed)
    w_q, w_k, w_v = (torch.randn(d, d, generator=g, dtype=torch.float64)
                     / math.sqrt(d) for _ in range(3))

    def f(x, mask=None):
        out, _ = attention.scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v,
                                                 mask)
        return out
    return f


# -------------------------------------------- the notes' three-position case
def test_three_position_example_exact():
    q = torch.zeros(3, 2, dtype=torch.float64)     # q = 0: all scores 0
    k = torch.randn(3, 2, dtype=torch.float64)
    v = torch.tensor([[2.0, 0.0], [0.0, 4.0], [99.0, 99.0]],
                     dtype=torch.float64)
    out, w = attention.scaled_dot_product_attention(q, k, v, masks.causal_mask(3))
    assert torch.equal(w[1], torch.tensor([0.5, 0.5, 0.0],
                                          dtype=torch.float64))
    assert torch.equal(out[1], torch.tensor([1.0, 2.0], dtype=torch.float64))
    assert torch.equal(out[0], v[0])
    assert torch.allclose(out[2], v.mean(0))
    # without the mask the 99s leak into position 1
    leaked, _ = attention.scaled_dot_product_attention(q, k, v)
    assert torch.allclose(leaked[1], torch.tensor([101 / 3, 103 / 3],
                                                  dtype=torch.float64))


# ------------------------------------------------------------- causality
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_causal_outputs_ignore_future_inputs(seed):
    g = torch.Generator().manual_seed(seed)
    f = _layer(seed=seed)
    T = 7
    x = torch.randn(2, T, 8, generator=g, dtype=torch.float64)
    mask = masks.causal_mask(T)
    out = f(x, mask)
    for i in range(T - 1):
        x2 = x.clone()
        x2[:, i + 1:] = 10 * torch.randn(2, T - i - 1, 8, generator=g,
                                         dtype=torch.float64)
        out2 = f(x2, mask)
        # exactly equal: a blocked key contributes 0 * v_j = 0
        assert torch.equal(out2[:, :i + 1], out[:, :i + 1])
        assert not torch.allclose(out2[:, i + 1:], out[:, i + 1:])


def test_causal_attention_equals_attention_over_prefix():
    f = _layer()
    x = torch.randn(6, 8, dtype=torch.float64)
    full = f(x, masks.causal_mask(6))
    for i in range(6):
        prefix = f(x[:i + 1])                     # no mask, keys 0..i only
        assert torch.allclose(full[i], prefix[i], atol=1e-12)


def test_without_mask_future_inputs_change_earlier_outputs():
    f = _layer()
    x = torch.randn(6, 8, dtype=torch.float64)
    x2 = x.clone()
    x2[5] += 1.0
    assert (f(x2)[:5] - f(x)[:5]).abs().min() > 0


def test_causal_mask_end_alignment_matches_cached_decoding():
    f = _layer()
    x = torch.randn(5, 8, dtype=torch.float64)
    full = f(x, masks.causal_mask(5))
    # the last two queries against all five keys
    g = torch.Generator().manual_seed(0)
    w_q, w_k, w_v = (torch.randn(8, 8, generator=g, dtype=torch.float64)
                     / math.sqrt(8) for _ in range(3))
    last, _ = attention.scaled_dot_product_attention(x[3:] @ w_q, x @ w_k, x @ w_v,
                                             masks.causal_mask(2, 5))
    assert torch.allclose(last, full[3:], atol=1e-12)


def test_influence_matrix_of_causal_stack_is_lower_triangular():
    f = _layer()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    infl = mask_probes.influence_matrix(lambda z: f(f(z, masks.causal_mask(6)),
                                          masks.causal_mask(6)), x, generator=g)
    assert infl.shape == (6, 6)
    assert torch.equal(infl.triu(1), torch.zeros(6, 6, dtype=infl.dtype))
    assert (infl.tril() > 0).sum() == 21
    open_ = mask_probes.influence_matrix(f, x, generator=g)
    assert (open_ > 0).all()


# ---------------------------------------------------------------- padding
def test_padding_positions_never_change_real_outputs():
    f = _layer()
    lengths = [5, 3, 1]
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    mask = masks.combine_masks(masks.causal_mask(5), masks.padding_mask(lengths, 5))
    out = f(x, mask)
    x2 = x.clone()
    for b, n in enumerate(lengths):
        x2[b, n:] = 100 * torch.randn(5 - n, 8, dtype=torch.float64)
    out2 = f(x2, mask)
    for b, n in enumerate(lengths):
        assert torch.equal(out2[b, :n], out[b, :n])
        # reference: the sequence alone, unpadded, causal
        alone = f(x[b, :n], masks.causal_mask(n))
        assert torch.allclose(out[b, :n], alone, atol=1e-12)


def test_padding_mask_agrees_with_torch_bool_convention():
    q, k, v = torch.randn(3, 2, 4, 5, 8).unbind(0)
    pad = masks.padding_mask([5, 2], 5)[:, None]           # (B, 1, 1, Lk)
    ours, _ = attention.scaled_dot_product_attention(q, k, v, pad)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=pad)
    assert torch.allclose(ours, theirs, atol=1e-5)


# ------------------------------------------------------ fully masked rows
def test_left_padding_with_causal_mask_gives_fully_masked_rows():
    keep = masks.padding_mask([4, 2], 4).flip(-1)          # left padding
    mask = masks.combine_masks(masks.causal_mask(4), keep)     # (2, 4, 4)
    dead = ~mask.any(-1)
    assert dead.tolist() == [[False] * 4, [True, True, False, False]]
    q, k, v = torch.randn(3, 2, 4, 6).unbind(0)
    scores = (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf"))
    naive = scores.softmax(-1) @ v
    assert torch.isnan(naive[1, :2]).all()
    out, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert torch.equal(out[1, :2], torch.zeros(2, 6))


def test_dead_rows_do_not_poison_the_next_layer():
    # Left padding + causal mask leaves sequence 1's first two queries
    # with no allowed key. A second attention layer then reads those
    # positions' outputs as values; its padding mask gives them weight
    # exactly 0, but 0 * NaN = NaN, so a NaN from a naive masked softmax
    # would still reach the real rows. course_lib returns zeros for dead
    # rows, so the real rows of layer 2 stay finite and equal attention
    # over the real positions alone.
    keep = masks.padding_mask([4, 2], 4).flip(-1)          # (2, 1, 4) left pad
    mask = masks.combine_masks(masks.causal_mask(4), keep)     # (2, 4, 4)
    q, k, v = torch.randn(3, 2, 4, 6).unbind(0)
    h, _ = attention.scaled_dot_product_attention(q, k, v, mask)  # layer 1
    naive = (q @ k.transpose(-2, -1) / math.sqrt(6)).masked_fill(
        ~mask, float("-inf")).softmax(-1) @ v
    assert torch.isnan(naive[1, :2]).all()             # what it avoids
    q2 = torch.randn(2, 4, 6)
    out, _ = attention.scaled_dot_product_attention(q2, h, h, keep)     # layer 2
    assert torch.isfinite(out).all()
    naive_out, _ = attention.scaled_dot_product_attention(q2, naive, naive, keep)
    assert torch.isnan(naive_out[1]).all()             # NaN reached rows
    alone, _ = attention.scaled_dot_product_attention(q2[1:], h[1:, 2:], h[1:, 2:])
    assert torch.allclose(out[1], alone[0], atol=1e-6)


# ----------------------------------------------------------- additive_mask
def test_additive_mask_values_and_softmax():
    mask = masks.causal_mask(4)
    add = masks.additive_mask(mask)
    assert add.dtype == torch.float32
    assert torch.equal(add == 0, mask)
    assert torch.isneginf(add[~mask]).all()
    scores = torch.randn(2, 4, 4)
    w = torch.softmax(scores + add, dim=-1)
    assert torch.equal(w[..., ~mask], torch.zeros(2, 6))
    _, ref = attention.scaled_dot_product_attention(
        torch.randn(2, 4, 3), torch.randn(2, 4, 3), torch.randn(2, 4, 3),
        mask)
    assert torch.allclose(ref.sum(-1), torch.ones(2, 4))


def test_additive_mask_against_torch_float_mask():
    q, k, v = torch.randn(3, 2, 5, 4).unbind(0)
    mask = masks.combine_masks(masks.causal_mask(5), masks.padding_mask([5, 3], 5))
    ours, _ = attention.scaled_dot_product_attention(q, k, v, mask)
    theirs = F.scaled_dot_product_attention(
        q, k, v, attn_mask=masks.additive_mask(mask))
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_additive_mask_dtype_and_bad_input():
    add = masks.additive_mask(torch.tensor([True, False]), dtype=torch.float64)
    assert add.dtype == torch.float64
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        masks.additive_mask(torch.tensor([1.0, 0.0]))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        masks.additive_mask([True, False])
    with pytest.raises(ValueError, match="dtype must be a floating"):
        masks.additive_mask(torch.tensor([True]), dtype=torch.int64)


# -------------------------------------------------------- next_token_pairs
def test_next_token_pairs_shift_by_one():
    tokens = torch.tensor([[5, 6, 7, 8], [1, 2, 3, 4]])
    inputs, targets = mask_probes.next_token_pairs(tokens)
    assert inputs.tolist() == [[5, 6, 7], [1, 2, 3]]
    assert targets.tolist() == [[6, 7, 8], [2, 3, 4]]
    # target t is input t + 1: position t never reads its own target
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_next_token_pairs_bad_input():
    with pytest.raises(ValueError, match="T >= 2"):
        mask_probes.next_token_pairs(torch.tensor([3]))
    with pytest.raises(ValueError, match="integer ids"):
        mask_probes.next_token_pairs(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="tokens must be a torch.Tensor"):
        mask_probes.next_token_pairs([1, 2, 3])


# -------------------------------------------------------- influence_matrix
def test_influence_matrix_of_cumsum_closed_form():
    x = torch.zeros(5, 1, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    infl = mask_probes.influence_matrix(lambda z: z.cumsum(-2), x, n_trials=1,
                              generator=g)
    # output i = sum_{j<=i} x_j: replacing x_j by r_j moves outputs i>=j
    # by exactly |r_j| (x = 0), and outputs i<j not at all
    r = torch.randn(5, 1, generator=torch.Generator().manual_seed(0),
                    dtype=torch.float64)
    expected = torch.tril(r.abs().T.expand(5, 5))
    assert torch.allclose(infl, expected)


def test_influence_matrix_bad_input():
    x = torch.randn(4, 3)
    with pytest.raises(TypeError, match="fn must be callable"):
        mask_probes.influence_matrix(3, x)
    with pytest.raises(TypeError, match="x must be a floating tensor"):
        mask_probes.influence_matrix(lambda z: z, torch.ones(4, dtype=torch.int64))
    with pytest.raises(ValueError, match="n_trials must be >= 1"):
        mask_probes.influence_matrix(lambda z: z, x, n_trials=0)
    with pytest.raises(ValueError, match="fn must return shape"):
        mask_probes.influence_matrix(lambda z: z.sum(-2), x)


# --------------------------------------------------------------- draw_mask
def test_draw_mask_cells_and_labels():
    fig = Figure()
    ax = fig.add_subplot()
    mask = masks.causal_mask(3)
    w = torch.softmax(torch.zeros(3, 3).masked_fill(~mask, -math.inf), -1)
    mask_probes.draw_mask(ax, mask, weights=w, title="t")
    texts = [t.get_text() for t in ax.texts]
    assert texts == ["1.00", "-", "-", "0.50", "0.50", "-",
                     "0.33", "0.33", "0.33"]
    assert ax.get_title() == "t"
    ax2 = fig.add_subplot(122)
    mask_probes.draw_mask(ax2, mask, key_labels=list("abc"))
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["a", "b", "c"]
    assert not ax2.texts


def test_draw_mask_bad_input():
    ax = Figure().add_subplot()
    with pytest.raises(ValueError, match=r"mask must have shape \(Lq, Lk\)"):
        mask_probes.draw_mask(ax, torch.ones(2, 2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="weights must have shape"):
        mask_probes.draw_mask(ax, torch.ones(2, 2, dtype=torch.bool),
                    weights=torch.ones(2, 3))


# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.masks survived the ones above.
# (The messages in full and the figures' colours and sizes:
# tests/pins/test_masking_messages.py and tests/pins/test_masking_figures.py.)
def test_masks_are_built_on_the_device_asked_for(device_spy):
    # Only a CPU here, so a dropped device=... would not change any value:
    # a spy on the tensor factories checks that each one is asked for the
    # device the caller gave. (A "meta" device would show it without a
    # spy, but its first comparison takes about 15 s to set up.)
    asked = device_spy(M, "arange", "tensor", "zeros")
    cpu = torch.device("cpu")
    for build, n in ((lambda: masks.causal_mask(3, 5, device=cpu), 2),
                     (lambda: masks.sliding_window_mask(3, 5, window=2,
                                                    device=cpu), 4),
                     (lambda: masks.padding_mask([2, 3], 4, device=cpu), 2),
                     (lambda: masks.additive_mask(torch.ones(2, 2, dtype=bool)
                                              .to(cpu)), 1)):
        asked.clear()
        assert build().device == cpu
        assert asked == [cpu] * n


def test_sliding_window_by_hand():
    # i' = i + Lk - Lq; key j visible iff i' - w < j <= i'
    for Lq, Lk, w in ((4, 4, 2), (2, 6, 3), (5, 3, 1), (3, 3, 5)):
        expected = torch.tensor(
            [[i + Lk - Lq - w < j <= i + Lk - Lq for j in range(Lk)]
             for i in range(Lq)])
        assert torch.equal(masks.sliding_window_mask(Lq, Lk, window=w), expected)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        masks.sliding_window_mask(3, window=0)


def test_padding_mask_full_length_and_bad_lengths():
    # a sequence may fill max_len exactly; one token more is rejected
    assert masks.padding_mask([4, 0], 4).tolist() == [[[True] * 4],
                                                  [[False] * 4]]
    assert masks.padding_mask([1, 0], 1).tolist() == [[[True]], [[False]]]
    with pytest.raises(ValueError, match=r"^max_len must be >= 1, got 0$"):
        masks.padding_mask([0], 0)
    with pytest.raises(ValueError, match=r"^each of lengths must be <= 4, "
                       r"got 5$"):
        masks.padding_mask([5, 1], 4)
    # a long rectangle is refused before allocating (2^29 entries)
    with pytest.raises(ValueError, match="k_len"):
        masks.causal_mask(2**15, 2**14)
    # many sequences times a long max_len is refused before allocating
    # (2^29 values; either factor alone is fine)
    with pytest.raises(ValueError, match="max_len"):
        masks.padding_mask([1] * 4, 2**27)


def test_combine_masks_none_and_bad_shapes():
    c = masks.causal_mask(3)
    assert masks.combine_masks(None, None) is None
    assert masks.combine_masks() is None
    assert torch.equal(masks.combine_masks(None, c, None), c)
    p = masks.padding_mask([2], 3)
    assert torch.equal(masks.combine_masks(c, p), c & p)
    with pytest.raises(ValueError, match="do not broadcast together"):
        masks.combine_masks(c, masks.causal_mask(2))


def test_next_token_pairs_1d_and_shortest():
    inputs, targets = mask_probes.next_token_pairs(torch.tensor([4, 9]))     # T = 2
    assert inputs.tolist() == [4] and targets.tolist() == [9]
    inputs, targets = mask_probes.next_token_pairs(torch.tensor([1, 2, 3]))  # 1-D
    assert inputs.tolist() == [1, 2] and targets.tolist() == [2, 3]
    with pytest.raises(ValueError, match="T >= 2"):
        mask_probes.next_token_pairs(torch.tensor(7))
    with pytest.raises(ValueError, match="integer ids"):
        mask_probes.next_token_pairs(torch.tensor([True, False]))


def test_influence_matrix_checks_and_trials():
    x = torch.zeros(3, 1, dtype=torch.float64)
    f = lambda z: z.cumsum(-2)                              # noqa: E731
    # with n_trials = 2 each entry is the larger of two fresh |r|
    infl = mask_probes.influence_matrix(f, x, n_trials=2,
                              generator=torch.Generator().manual_seed(4))
    r = torch.randn(6, 1, generator=torch.Generator().manual_seed(4),
                    dtype=torch.float64).abs().reshape(3, 2).amax(1)
    assert torch.allclose(infl, torch.tril(r.expand(3, 3)))
    # default: 3 trials
    infl3 = mask_probes.influence_matrix(f, x, generator=torch.Generator()
                               .manual_seed(4))
    r3 = torch.randn(9, 1, generator=torch.Generator().manual_seed(4),
                     dtype=torch.float64).abs().reshape(3, 3).amax(1)
    assert torch.allclose(infl3, torch.tril(r3.expand(3, 3)))
    # batch and features: the max over both
    xb = torch.zeros(2, 3, 2, dtype=torch.float64)
    infl_b = mask_probes.influence_matrix(f, xb, n_trials=1,
                                generator=torch.Generator().manual_seed(5))
    rb = torch.randn(3, 2, 2, generator=torch.Generator().manual_seed(5),
                     dtype=torch.float64).abs().amax((1, 2))   # (T,)
    assert torch.allclose(infl_b, torch.tril(rb.expand(3, 3)))
    for bad, error, message in (
            (True, TypeError, "must be an int, got bool True"),
            (1.0, TypeError, "must be an int, got float 1.0"),
            (0, ValueError, "must be >= 1, got 0")):
        with pytest.raises(error, match=rf"^n_trials {message}$"):
            mask_probes.influence_matrix(f, x, n_trials=bad)
    with pytest.raises(ValueError, match=r"^x must have shape"):
        mask_probes.influence_matrix(f, torch.zeros(3))
    with pytest.raises(ValueError, match="fn must return shape"):
        mask_probes.influence_matrix(lambda z: z.sum((0, 1))[None], x)
    with pytest.raises(TypeError, match="fn must be callable"):
        mask_probes.influence_matrix(3, x)


def _filled(image):
    """An AxesImage's data as a float array, masked cells as NaN."""
    import numpy as np
    return np.ma.filled(np.ma.asarray(image.get_array(), dtype=float),
                        np.nan)


def test_draw_mask_draws_the_mask_and_weights_by_hand():
    # what is drawn, cell by cell (its colours, font sizes and grid are
    # pinned in tests/pins/test_masking_figures.py)
    import numpy as np
    nan = np.nan
    fig = Figure()
    # without weights: one image, blocked 0, allowed 1
    ax = fig.add_subplot(121)
    mask = torch.tensor([[True, False, True], [True, True, False]])
    assert mask_probes.draw_mask(ax, mask) is ax
    (img,) = ax.images
    np.testing.assert_array_equal(_filled(img), [[1, 0, 1], [1, 1, 0]])
    assert img.get_clim() == (0, 1)
    assert not ax.texts and ax.get_title() == ""
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1"]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("key", "query")

    # with weights: the weights of the allowed cells, the blocked ones
    # in an image of their own
    ax = fig.add_subplot(122)
    w = torch.tensor([[0.7, 0.0, 0.3], [0.6, 0.4, 0.0]], dtype=torch.float64)
    mask_probes.draw_mask(ax, mask, weights=w, title="T", fontsize=5,
                query_labels=["p", "q"], key_labels=["a", "b", "c"])
    shade, grey = ax.images
    np.testing.assert_array_equal(_filled(shade),
                                  [[0.7, nan, 0.3], [0.6, 0.4, nan]])
    assert shade.get_clim() == (0, 1)
    np.testing.assert_array_equal(_filled(grey),
                                  [[nan, 1, nan], [nan, nan, 1]])
    assert grey.get_clim() == (0, 1)
    # one label per cell: the weight, or "-" where the mask blocks
    cells = [(t.get_position(), t.get_text()) for t in ax.texts]
    expected = [((j, i), f"{float(w[i, j]):.2f}" if mask[i, j] else "-")
                for i in range(2) for j in range(3)]
    assert cells == expected
    assert ax.get_title() == "T"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["p", "q"]
    # a tick on each cell
    assert list(ax.get_xticks()) == [0, 1, 2]
    assert list(ax.get_yticks()) == [0, 1]


def test_draw_mask_keeps_its_scale_for_a_mask_of_one_value():
    # the colour scale is fixed to [0, 1]: a mask with one value only
    # must not be rescaled to its own range (which would draw an
    # all-allowed mask as blocked; the colours themselves are pinned in
    # tests/pins/test_masking_figures.py)
    fig = Figure()
    for i, value in enumerate((True, False)):
        ax = fig.add_subplot(1, 2, i + 1)
        mask_probes.draw_mask(ax, torch.full((2, 3), value))
        (img,) = ax.images
        assert img.get_clim() == (0, 1)
        assert img.norm(float(value)) == float(value)


def test_draw_mask_rejects_a_float_or_1d_mask_and_list_weights():
    # (the messages in full: tests/pins/test_masking_messages.py)
    ax = Figure().add_subplot()
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        mask_probes.draw_mask(ax, torch.ones(2, 2))
    with pytest.raises(ValueError, match="mask must have shape"):
        mask_probes.draw_mask(ax, torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="weights must be a torch.Tensor"):
        mask_probes.draw_mask(ax, torch.ones(1, 1, dtype=torch.bool), weights=[[1.0]])

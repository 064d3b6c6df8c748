"""Tests for course_lib.experiments.head_analysis (chapter 5).

References used: python loops over positions for the data and the head
scores, hand-built attention patterns whose scores are known, a manual
ablation (zeroed o_proj columns) and exact equality of tied heads.
"""
import pytest
import torch

from course_lib.experiments.head_analysis import (BOS, TinyAttentionModel,
                                                  accuracy, copy_head,
                                                  head_distance, head_scores,
                                                  induction_batch,
                                                  train_induction)
from course_lib.model.mha import MultiHeadAttention
from course_lib.training import IGNORE
from course_lib._util.threads import small_ops
from errors import error_for


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def tiny(n_heads=2):
    return TinyAttentionModel(vocab_size=17, d_model=16, n_heads=n_heads,
                              n_layers=2, max_len=24)


# ------------------------------------------------------------------- data
def test_induction_batch_structure():
    g = torch.Generator().manual_seed(0)
    x, y = induction_batch(20, length=24, vocab_size=17, min_period=3,
                           max_period=8, generator=g)
    assert x.shape == y.shape == (20, 24) and x.dtype == torch.long
    for b in range(20):
        seq, tgt = x[b].tolist(), y[b].tolist()
        assert seq[0] == BOS and BOS not in seq[1:]
        n = seq[1:].index(seq[1], 1) if seq[1] in seq[2:] else None
        assert n is not None and 3 <= n <= 8
        assert len(set(seq[1:n + 1])) == n                  # distinct tokens
        for t in range(24):
            if t >= 1 + n:
                assert seq[t] == seq[t - n]                 # periodic
            if t <= n:
                assert tgt[t] == IGNORE                     # not inferable
            elif t < 23:
                assert tgt[t] == seq[t + 1]
                # the induction rule: the token after x_t's last occurrence
                assert tgt[t] == seq[t - n + 1]


def test_induction_batch_bad_arguments():
    with pytest.raises(ValueError, match=r"vocab_size must be >= 9, got 5"):
        induction_batch(2, vocab_size=5, max_period=8)
    with pytest.raises(ValueError, match=r"max_period must be >= 4, got 3"):
        induction_batch(2, min_period=4, max_period=3)
    with pytest.raises(ValueError, match=r"length must be >= 10"):
        induction_batch(2, length=6)


# ------------------------------------------------------------------ model
def test_model_shapes_and_weights():
    model = tiny()
    x, _ = induction_batch(3)
    logits, ws = model.forward_with_weights(x)
    assert logits.shape == (3, 24, 17)
    assert len(ws) == 2 and all(w.shape == (3, 2, 24, 24) for w in ws)
    # causal: nothing above the diagonal
    upper = torch.triu(torch.ones(24, 24, dtype=torch.bool), diagonal=1)
    assert all(torch.all(w[..., upper] == 0) for w in ws)
    assert torch.equal(model(x), logits)


def test_model_is_causal():
    model = tiny()
    x, _ = induction_batch(2)
    y = x.clone()
    y[:, 10:] = (y[:, 10:] % 16) + 1                        # change future
    assert torch.allclose(model(x)[:, :10], model(y)[:, :10], atol=1e-6)


def test_model_rejects_bad_tokens():
    model = tiny()
    with pytest.raises(ValueError, match=r"tokens must be a long tensor"):
        model(torch.zeros(2, 30, dtype=torch.long))
    with pytest.raises(ValueError, match=r"tokens must be a long tensor"):
        model(torch.zeros(2, 5))


def test_training_reduces_loss():
    model = tiny()
    losses = train_induction(model, steps=30, batch_size=8, lr=1e-2)
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1


def test_train_induction_equals_plain_adamw_loop():
    # The shared loop must reproduce, bit for bit, chapter 5's own loop.
    a = tiny()
    b = tiny()
    b.load_state_dict(a.state_dict())
    losses = train_induction(a, steps=4, batch_size=4, lr=1e-2, seed=2)
    gen = torch.Generator().manual_seed(2)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-2, weight_decay=0.0)
    expected = []
    with small_ops():        # the loop's thread setting: same float sums
        for _ in range(4):
            x, y = induction_batch(4, generator=gen)
            loss = torch.nn.functional.cross_entropy(
                b(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)
            opt.zero_grad()
            loss.backward()
            opt.step()
            expected.append(loss.item())
    assert losses == expected
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


# -------------------------------------------------------------- ablation
def test_accuracy_and_ablation_restore_weights():
    model = tiny()
    x, y = induction_batch(8)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    acc = accuracy(model, x, y)
    pred = model(x).argmax(-1)
    keep = y != IGNORE
    assert acc == pytest.approx((pred[keep] == y[keep]).float().mean().item())
    ablated = accuracy(model, x, y, ablate=((0, 1), (1, 0)))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k                 # restored
    # the ablation equals zeroing the head's o_proj columns by hand
    with torch.no_grad():
        model.layers[0].o_proj.weight[:, 8:16] = 0
        model.layers[1].o_proj.weight[:, 0:8] = 0
    assert ablated == pytest.approx(accuracy(model, x, y))


def test_accuracy_runs_the_small_model_on_one_thread():
    # A forward of this model is a chain of small ops: on two threads a
    # busy machine made the chapter's ablation table ten times slower.
    model = tiny()
    x, y = induction_batch(4)
    seen = []
    model.register_forward_pre_hook(
        lambda module, args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        accuracy(model, x, y, ablate=((0, 1),))
        assert seen == [1]
        assert torch.get_num_threads() == 2                 # restored
    finally:
        torch.set_num_threads(before)


# ------------------------------------------------------------ head scores
def test_head_scores_on_known_patterns():
    B, T = 2, 6
    tokens = torch.tensor([[0, 4, 5, 6, 4, 5], [0, 7, 8, 7, 8, 7]])
    w = torch.zeros(B, 3, T, T)
    t = torch.arange(T)
    w[:, 0, 0, 0] = 1
    w[:, 0, t[1:], t[1:] - 1] = 1                           # previous token
    w[:, 1, :, 0] = 1                                       # all on BOS
    w[:, 2, t, t] = 1                                       # self
    s = head_scores(w, tokens)
    # the BOS head's query 1 looks at key 0 = its previous token
    assert torch.allclose(s["previous"], torch.tensor([1.0, 1 / 5, 0.0]))
    assert torch.allclose(s["bos"], torch.tensor([2 / 6, 1.0, 1 / 6]))
    assert torch.allclose(s["self"], torch.tensor([1 / 6, 1 / 6, 1.0]))


def test_induction_score_matches_loop():
    g = torch.Generator().manual_seed(3)
    x, _ = induction_batch(4, length=12, generator=g)
    w = torch.softmax(torch.randn(4, 2, 12, 12), -1)
    w = w * torch.tril(torch.ones(12, 12))
    total, count = torch.zeros(2), 0
    for b in range(4):
        for t in range(12):
            keys = [j for j in range(2, t + 1) if x[b, j - 1] == x[b, t]]
            if keys:
                total += w[b, :, t, keys].sum(-1)
                count += 1
    assert count > 0
    got = head_scores(w, x)["induction"]
    assert torch.allclose(got, total / count, atol=1e-6)
    # a queries mask restricts the average
    q = torch.zeros(4, 12, dtype=torch.bool)
    q[:, :3] = True
    s = head_scores(w, x, queries=q)
    assert torch.allclose(s["bos"], w[:, :, :3, 0].mean((0, 2)), atol=1e-6)


def test_head_scores_bad_shapes():
    with pytest.raises(ValueError, match=r"weights must be \(B, H, T, T\)"):
        head_scores(torch.zeros(2, 2, 5, 5), torch.zeros(2, 4,
                                                         dtype=torch.long))
    with pytest.raises(TypeError, match=r"queries must be a bool tensor"):
        head_scores(torch.zeros(1, 1, 3, 3), torch.zeros(1, 3,
                                                         dtype=torch.long),
                    queries=torch.ones(1, 3))


# ------------------------------------------------------ symmetric heads
def test_copied_heads_stay_identical_under_training():
    model = tiny()
    for layer in model.layers:
        copy_head(layer, src=0, dst=1)
        assert head_distance(layer, 0, 1) == 0.0
    train_induction(model, steps=15, batch_size=8)
    for layer in model.layers:
        assert head_distance(layer, 0, 1) == 0.0
    untied = tiny()
    assert all(head_distance(layer, 0, 1) > 0.01 for layer in untied.layers)


def test_copy_head_makes_equal_attention():
    mha = MultiHeadAttention(16, 4)
    copy_head(mha, src=2, dst=0)
    _, w = mha.forward_with_weights(torch.randn(2, 5, 16))
    assert torch.equal(w[:, 0], w[:, 2])
    assert not torch.allclose(w[:, 0], w[:, 1])


def test_copy_head_bad_arguments():
    with pytest.raises(ValueError, match=r"dst must be < n_heads=4, got 4"):
        copy_head(MultiHeadAttention(16, 4), src=0, dst=4)
    with pytest.raises(ValueError, match=r"needs n_kv_heads == n_heads"):
        copy_head(MultiHeadAttention(16, 4, n_kv_heads=2), src=0, dst=1)


def test_ablating_a_head_that_does_not_exist_is_an_error():
    # A head index >= n_heads ablated an empty slice, i.e.
    # nothing, and reported the intact model's accuracy as the ablated one.
    model = tiny(n_heads=2)
    x, y = induction_batch(4, generator=torch.Generator().manual_seed(0))
    for pair, match in [((0, 2), "head must be < 2, got 2"),
                        ((0, -1), "head must be >= 0, got -1"),
                        ((2, 0), "layer must be < 2, got 2"),
                        ((0,), r"ablate must hold \(layer, head\) pairs")]:
        with pytest.raises(error_for(match), match=match):
            accuracy(model, x, y, ablate=(pair,))
    with pytest.raises(ValueError, match="at least one target"):
        accuracy(model, x, torch.full_like(y, IGNORE))
    with pytest.raises(ValueError, match="b must be < 2, got 5"):
        head_distance(model.layers[0], 0, 5)


def test_sizes_are_checked_before_allocating():
    with pytest.raises(ValueError, match="n_layers"):
        TinyAttentionModel(vocab_size=17, d_model=16, n_heads=2,
                           n_layers=10**6, max_len=24)
    with pytest.raises(ValueError, match="batch_size"):
        induction_batch(10**9)
    with pytest.raises(ValueError, match="length"):
        induction_batch(4, length=10**9)

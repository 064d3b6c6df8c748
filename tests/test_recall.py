"""Tests for course_lib.experiments.recall (chapter 1): the recall task and its models.

References: torch's scaled_dot_product_attention for the attention
recaller, an oracle and a constant model for the accuracy, bit-equality
with the plain AdamW loop that chapter 1 used before the shared loop.
"""
import pytest
import torch

from course_lib.experiments.recall import (AttentionRecaller, RNNRecaller,
                                           make_recall_batch, recall_accuracy,
                                           train_recall)
from course_lib._util.threads import small_ops
from errors import error_for


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(123)


def test_make_recall_batch_structure():
    g = torch.Generator().manual_seed(0)
    x, y = make_recall_batch(500, 7, vocab_size=5, generator=g)
    assert x.shape == (500, 8) and y.shape == (500,)
    assert x.dtype == torch.int64
    assert torch.all(x[:, -1] == 5)  # QUERY token is id V
    assert torch.all((x[:, :-1] >= 0) & (x[:, :-1] < 5))
    assert torch.equal(y, x[:, 0])
    # All symbols occur as targets (uniform over the alphabet).
    assert set(y.tolist()) == set(range(5))
    x2, _ = make_recall_batch(500, 7, vocab_size=5,
                              generator=torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


@pytest.mark.parametrize("args, kwargs, match", [
    ((0, 3), dict(vocab_size=4), "batch must be >= 1, got 0"),
    ((2, 0), dict(vocab_size=4), "distance must be >= 1, got 0"),
    ((2, 3), dict(vocab_size=1), "vocab_size must be >= 2, got 1"),
])
def test_make_recall_batch_bad_input(args, kwargs, match):
    with pytest.raises(error_for(match), match=match):
        make_recall_batch(*args, **kwargs)


def test_attention_recaller_matches_sdpa():
    model = AttentionRecaller(vocab_size=6, d_model=8, max_len=16)
    x, _ = make_recall_batch(4, 9, vocab_size=6)
    logits = model(x)
    h = model.embed(x) + model.pos.weight[:10]
    q = model.q_proj(h[:, -1:])  # (B, 1, d)
    ctx = torch.nn.functional.scaled_dot_product_attention(
        q, model.k_proj(h), model.v_proj(h))  # (B, 1, d)
    torch.testing.assert_close(logits, model.readout(ctx[:, 0]))
    assert model.last_weights.shape == (4, 10)
    torch.testing.assert_close(model.last_weights.sum(-1), torch.ones(4))


def test_recallers_shapes_and_bad_length():
    x, _ = make_recall_batch(3, 5, vocab_size=4)
    assert RNNRecaller(vocab_size=4, hidden_size=8)(x).shape == (3, 4)
    model = AttentionRecaller(vocab_size=4, d_model=8, max_len=4)
    with pytest.raises(ValueError, match="tokens length must be <= max_len 4"):
        model(x)


def test_train_recall_attention_learns_and_accuracy():
    model = AttentionRecaller(vocab_size=4, d_model=16, max_len=8)
    before = recall_accuracy(model, 5, batch=400)
    losses = train_recall(model, 5, steps=100, batch=32, lr=1e-2, seed=0)
    assert len(losses) == 100
    assert sum(losses[-10:]) / 10 < 0.1 < losses[0]
    assert recall_accuracy(model, 5, batch=400) > 0.95 > before


def test_train_recall_bad_steps():
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        train_recall(RNNRecaller(vocab_size=3, hidden_size=4), 3, steps=0)


class _Oracle(torch.nn.Module):
    vocab_size = 4

    def forward(self, tokens):
        return torch.nn.functional.one_hot(tokens[:, 0], 4).float()


class _Constant(_Oracle):
    def forward(self, tokens):
        return torch.zeros(tokens.shape[0], 4) + torch.arange(4.0)


def test_recall_accuracy_oracle_and_chance():
    assert recall_accuracy(_Oracle(), 6) == 1.0
    # Always answering symbol 3 is right for 1/V of uniform targets.
    assert abs(recall_accuracy(_Constant(), 6, batch=4000) - 0.25) < 0.03



def test_train_recall_equals_plain_adamw_loop():
    # The shared loop must reproduce, bit for bit, the loop chapter 1 was
    # written with: fresh batches, cross-entropy, zero_grad, backward, step.
    torch.manual_seed(0)
    a = RNNRecaller(vocab_size=4, hidden_size=8)
    b = RNNRecaller(vocab_size=4, hidden_size=8)
    b.load_state_dict(a.state_dict())
    losses = train_recall(a, 4, steps=5, batch=8, lr=1e-2, seed=3)
    g = torch.Generator().manual_seed(3)
    opt = torch.optim.AdamW(b.parameters(), lr=1e-2, fused=True)
    expected = []
    with small_ops():        # the loop's thread setting: same float sums
        for _ in range(5):
            x, y = make_recall_batch(8, 4, vocab_size=4, generator=g)
            loss = torch.nn.functional.cross_entropy(b(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            expected.append(loss.item())
    assert losses == expected
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_train_recall_leaves_global_rng_alone():
    model = AttentionRecaller(vocab_size=3, d_model=8)
    state = torch.get_rng_state()
    train_recall(model, 3, steps=2, batch=4)
    assert torch.equal(torch.get_rng_state(), state)


def test_recall_batches_are_checked_before_allocating():
    model = AttentionRecaller(vocab_size=8)
    with pytest.raises(ValueError, match="batch"):
        recall_accuracy(model, 3, batch=10**9)
    with pytest.raises(ValueError, match="batch"):
        make_recall_batch(10**9, 3, vocab_size=8)

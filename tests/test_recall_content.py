"""Chapter 1's recall by content: the symbol after a marker."""
import pytest
import torch

from course_lib.experiments.recall import (AttentionRecaller,
                                           make_marked_recall_batch,
                                           run_marked_recall)
from course_lib.experiments.sweeps import load_sweep


def test_stored_sweep_is_what_the_recipe_makes():
    stored = load_sweep("recall").cell(0, kind="attention")  # the cheapest
    now = run_marked_recall(kind="attention", seed=0)
    assert now["distances"] == stored["distances"]
    assert now["accuracy"] == pytest.approx(stored["accuracy"], rel=1e-3,
                                            abs=1e-6)
    assert now["final_loss"] == pytest.approx(stored["final_loss"],
                                              rel=1e-3)


def test_marked_batch_layout():
    V, L = 6, 12
    x, y = make_marked_recall_batch(200, L, vocab_size=V,
                                    generator=torch.Generator().manual_seed(0))
    assert (x[:, -1] == V + 1).all()
    assert ((x == V).sum(1) == 1).all()              # one marker per row
    p = (x == V).int().argmax(1)                     # marker positions
    assert torch.equal(y, x[torch.arange(200), p + 1])
    assert (y < V).all()
    n = L - 2 - p                                    # distances
    assert n.min() >= 1 and n.max() <= L - 2 and len(set(n.tolist())) > 5
    x5, y5 = make_marked_recall_batch(50, L, vocab_size=V, distance=5)
    assert ((x5 == V).int().argmax(1) == L - 7).all()


def test_previous_token_embedding():
    """h_j = e(x_j) + e'(x_{j-1}) + p_j, checked by writing it out."""
    torch.manual_seed(0)
    m = AttentionRecaller(vocab_size=5, d_model=8, max_len=10,
                          previous_token=True)
    x = torch.randint(5, (2, 7))
    out = m(x)
    h = torch.stack([torch.stack([
        m.embed.weight[x[b, j]] + m.pos.weight[j]
        + m.embed_previous.weight[x[b, j - 1] if j else 5]
        for j in range(7)]) for b in range(2)])      # (B, T, d)
    q = m.q_proj(h[:, -1])
    w = torch.softmax((m.k_proj(h) @ q[:, :, None])[..., 0] / 8 ** 0.5, -1)
    ref = m.readout((w[:, :, None] * m.v_proj(h)).sum(1))
    torch.testing.assert_close(out, ref)


def test_marked_recall_bad_input():
    with pytest.raises(ValueError, match="distance"):
        make_marked_recall_batch(2, 10, vocab_size=4, distance=9)
    with pytest.raises(ValueError, match="length"):
        make_marked_recall_batch(2, 2, vocab_size=4)
    with pytest.raises(ValueError, match="kind"):
        run_marked_recall(kind="lstm", seed=0)
    with pytest.raises(TypeError, match="previous_token"):
        AttentionRecaller(vocab_size=4, previous_token="yes")

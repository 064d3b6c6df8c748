"""head_circuits: the circuit form against the layer itself (batched MHA)
and against a hand computation with the per-head weight slices."""
import math

import pytest
import torch

from course_lib.experiments import head_circuits
from course_lib.model.masks import causal_mask
from course_lib.model.mha import MultiHeadAttention
from course_lib.model.rope import RotaryEmbedding


@pytest.mark.parametrize("n_kv_heads,bias", [(None, True), (None, False),
                                             (2, True), (1, True)])
def test_sum_of_circuit_outputs_is_the_layer(n_kv_heads, bias):
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=n_kv_heads, bias=bias)
    x = torch.randn(2, 5, 16)
    for mask in (None, causal_mask(5)):
        out = sum(head_circuits.circuit_output(mha, x, i, mask)[0] for i in range(4))
        if bias:
            out = out + mha.o_proj.bias
        ref, w = mha.forward_with_weights(x, mask=mask)
        assert torch.allclose(out, ref, atol=1e-5)
        for i in range(4):
            assert torch.allclose(head_circuits.circuit_output(mha, x, i, mask)[1],
                                  w[:, i], atol=1e-6)


def test_circuits_equal_hand_computation():
    torch.manual_seed(1)
    D, H = 8, 2
    mha = MultiHeadAttention(D, H)
    d = D // H
    x_t, x_j = torch.randn(D), torch.randn(D)
    for i in range(H):
        rows = slice(i * d, (i + 1) * d)
        q = mha.q_proj.weight[rows] @ x_t + mha.q_proj.bias[rows]
        k = mha.k_proj.weight[rows] @ x_j + mha.k_proj.bias[rows]
        v = mha.v_proj.weight[rows] @ x_j + mha.v_proj.bias[rows]
        score = (q @ k / math.sqrt(d)).item()
        write = mha.o_proj.weight[:, rows] @ v               # (D,)
        x1_t, x1_j = torch.cat([x_t, torch.ones(1)]), \
            torch.cat([x_j, torch.ones(1)])
        qk, ov = head_circuits.qk_circuit(mha, i), head_circuits.ov_circuit(mha, i)
        assert qk.shape == (D + 1, D + 1) and ov.shape == (D + 1, D)
        assert (x1_t @ qk @ x1_j).item() == pytest.approx(score, abs=1e-5)
        assert torch.allclose(x1_j @ ov, write, atol=1e-5)


def test_ranks_are_at_most_head_width():
    torch.manual_seed(2)
    mha = MultiHeadAttention(32, 8)
    assert torch.linalg.matrix_rank(head_circuits.qk_circuit(mha, 3)).item() == 4
    assert torch.linalg.matrix_rank(head_circuits.ov_circuit(mha, 3)).item() == 4


def test_bad_input():
    mha = MultiHeadAttention(8, 2)
    with pytest.raises(ValueError, match="head"):
        head_circuits.qk_circuit(mha, 2)
    with pytest.raises(ValueError, match="x must"):
        head_circuits.circuit_output(mha, torch.randn(2, 3, 4), 0)
    rope = MultiHeadAttention(8, 2, rope=RotaryEmbedding(4))
    with pytest.raises(ValueError, match="RoPE"):
        head_circuits.ov_circuit(rope, 0)


def test_a_query_row_without_keys_gets_zeros_not_nan():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8)
    out, w = head_circuits.circuit_output(
        mha, x, 0, torch.zeros(3, 3, dtype=torch.bool))
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(w, torch.zeros_like(w))
    mask = torch.tensor([[1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
    out, w = head_circuits.circuit_output(mha, x, 1, mask)
    full, w_full = head_circuits.circuit_output(mha, x, 1,
                                                causal_mask(3))
    assert torch.equal(w[:, 1], torch.zeros(2, 3))
    assert torch.equal(out[:, 1], torch.zeros(2, 8))
    assert torch.equal(w[:, 0], w_full[:, 0])    # rows with keys unchanged
    assert torch.equal(out[:, 2], full[:, 2])

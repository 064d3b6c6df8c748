"""Chapter 14: tensor parallelism (course_lib.distributed.tensor_parallel).

The layers are compared with the single-process modules of the same
weights inside the workers of ``workers``, run once
per world size on spawned processes by the ``parallel_layers`` fixture
(conftest); the other tests need no process group.
"""
import pytest
import torch
from torch import nn

from course_lib.model.block import SwiGLU
from course_lib.model.mha import MultiHeadAttention
from course_lib.distributed.tensor_parallel import (ColumnParallelLinear,
                                                    RowParallelLinear,
                                                    TensorParallelAttention,
                                                    TensorParallelSwiGLU)
from errors import error_for

TOL = 1e-5


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [2, 4])
def test_tensor_parallel_layers_equal_single_process(parallel_layers,
                                                      world_size):
    """SwiGLU and attention (GQA + RoPE + causal mask + biases; fused path
    with a per-head mask): outputs and input gradients equal on every
    rank, each shard's gradient equal to its slice of the full one."""
    results = parallel_layers(world_size)
    assert len(results) == world_size
    # with 4 processes also two groups of 2 ranks side by side
    keys = ["tp"] + (["tp_pairs"] if world_size == 4 else [])
    for rank, res in enumerate(results):
        for key in keys:
            tp = res[key]
            assert set(tp) == {f"{m}_{q}" for m in ("linear", "swiglu",
                                                    "attn", "attn_fused")
                               for q in ("out", "grad_x", "grad_weights")}
            for name, diff in tp.items():
                assert diff < TOL, (rank, key, name, diff)


def _linear(n_in, n_out, bias=True):
    torch.manual_seed(0)
    return nn.Linear(n_in, n_out, bias=bias)


def test_shards_put_back_together_are_the_full_matrices():
    lin = _linear(6, 8)
    cols = [ColumnParallelLinear(lin, rank=r, world_size=4)
            for r in range(4)]
    assert torch.equal(torch.cat([c.weight for c in cols]), lin.weight)
    assert torch.equal(torch.cat([c.bias for c in cols]), lin.bias)
    assert cols[1].out_features == 2 and cols[1].in_features == 6
    rows = [RowParallelLinear(lin, rank=r, world_size=2) for r in range(2)]
    assert torch.equal(torch.cat([r.weight for r in rows], 1), lin.weight)
    assert torch.equal(rows[1].bias, lin.bias)       # replicated
    # the shards own their memory: a rank keeps only its block
    assert cols[0].weight.data_ptr() != lin.weight.data_ptr()
    # column blocks of whole heads: rank 1 of 2 holds query heads 4..7
    # and K/V heads 2..3 of an 8-head, 4-KV-head module
    mha = MultiHeadAttention(32, 8, n_kv_heads=4)
    tp = TensorParallelAttention(mha, rank=1, world_size=2)
    assert (tp.n_heads, tp.n_kv_heads, tp.head_dim) == (4, 2, 4)
    assert torch.equal(tp.q_proj.weight, mha.q_proj.weight[16:32])
    assert torch.equal(tp.k_proj.weight, mha.k_proj.weight[8:16])
    assert torch.equal(tp.o_proj.weight, mha.o_proj.weight[:, 16:32])


def test_sum_of_row_shards_is_the_full_layer_without_a_group():
    """The algebra behind one all-reduce, checked in one process:
    sum_r (SiLU(X W_g,r) * X W_u,r) W_d,r = SwiGLU(X)."""
    torch.manual_seed(0)
    ffn, x = SwiGLU(8, 12), torch.randn(2, 3, 8)
    total = 0
    for r in range(3):
        tp = TensorParallelSwiGLU(ffn, rank=r, world_size=3)
        h = nn.functional.silu(x @ tp.gate_proj.weight.T) \
            * (x @ tp.up_proj.weight.T)
        total = total + h @ tp.down_proj.weight.T
    assert torch.allclose(total, ffn(x), atol=TOL)


@pytest.mark.parametrize("make, match", [
    (lambda: TensorParallelAttention(MultiHeadAttention(32, 8, n_kv_heads=2),
                                     rank=0, world_size=4),
     "world_size=4 must divide n_heads and n_kv_heads, got n_heads=8, "
     "n_kv_heads=2"),
    (lambda: TensorParallelAttention(MultiHeadAttention(24, 6), rank=0,
                                     world_size=4),
     "world_size=4 must divide n_heads"),
    (lambda: TensorParallelSwiGLU(SwiGLU(8, 10), rank=0, world_size=4),
     "world_size=4 must divide the ffn's d_ff, got d_ff=10"),
    (lambda: ColumnParallelLinear(nn.Linear(4, 6), rank=0, world_size=4),
     "world_size=4 must divide linear's out_features, got out_features=6"),
    (lambda: RowParallelLinear(nn.Linear(6, 4), rank=0, world_size=4),
     "world_size=4 must divide linear's in_features, got in_features=6"),
    (lambda: ColumnParallelLinear(nn.Linear(4, 8), rank=2, world_size=2),
     "rank must be < world_size=2, got 2"),
    (lambda: ColumnParallelLinear(nn.Linear(4, 8), rank=0),
     "pass rank and world_size together"),
])
def test_tensor_parallel_rejects_bad_sizes(make, match):
    with pytest.raises(error_for(match), match=match):
        make()


def test_tensor_parallel_rejects_wrong_modules_and_missing_group():
    with pytest.raises(TypeError, match="mha must be a course_lib "
                       "MultiHeadAttention, got Linear"):
        TensorParallelAttention(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="ffn must be a course_lib SwiGLU"):
        TensorParallelSwiGLU(nn.Linear(4, 4))
    tp = TensorParallelSwiGLU(SwiGLU(8, 8), rank=0, world_size=2)
    with pytest.raises(RuntimeError, match="built for world_size=2 but no "
                       "process group is initialised"):
        tp(torch.randn(1, 8))


def test_one_rank_equals_the_full_modules_in_process():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, n_kv_heads=2)
    x = torch.randn(2, 5, 16)
    tp = TensorParallelAttention(mha)                 # no group: W = 1
    assert torch.allclose(tp(x), mha(x), atol=TOL)
    with pytest.raises(ValueError, match="x must have shape"):
        tp(torch.randn(2, 5, 8))


def test_copy_input_must_be_a_bool():
    with pytest.raises(TypeError, match="copy_input"):
        ColumnParallelLinear(nn.Linear(4, 4), rank=0, world_size=1,
                             copy_input="False")

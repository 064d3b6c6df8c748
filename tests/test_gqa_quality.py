"""Tests for the GQA conversion (course_lib.experiments.gqa_quality.mean_pool_kv_heads)
and chapter 5's GQA experiment (course_lib.experiments.gqa_quality).

References: the module itself at g' = g (the identical function), a loop
over heads that averages the weights one group at a time, an MHA whose
K/V heads are already equal within each group (pooling changes nothing),
torch's fused kernel for the timed decode step, and the stored sweep,
which the recipe must reproduce.
"""
import math

import pytest
import torch

from course_lib.experiments import gqa_quality
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.attention import fused_attention
from course_lib.experiments.gqa_quality import mean_pool_kv_heads
from course_lib.model.mha import MultiHeadAttention, grouped_query_attention
from course_lib.model.rope import RotaryEmbedding


def _mha(d_model=32, n_heads=8, n_kv_heads=None, bias=True, seed=0, **kw):
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, n_kv_heads=n_kv_heads,
                              bias=bias, **kw)


@pytest.mark.parametrize("bias", [True, False])
def test_same_number_of_kv_heads_is_the_identical_function(bias):
    mha = _mha(bias=bias)
    x = torch.randn(2, 5, 32)
    out = mean_pool_kv_heads(mha, 8)
    assert out is not mha and out.n_kv_heads == 8
    for a, b in zip(mha.state_dict().values(), out.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(out(x), mha(x))


def _loop_pool(mha, g):
    """Average the K/V heads of each group, one head at a time."""
    d_k, r = mha.head_dim, mha.n_kv_heads // g
    ref = {}
    for name in ("k_proj", "v_proj"):
        proj = getattr(mha, name)
        rows, biases = [], []
        for j in range(g):
            w = torch.zeros(d_k, mha.d_model)
            b = torch.zeros(d_k)
            for i in range(j * r, (j + 1) * r):       # heads of group j
                w += proj.weight[i * d_k:(i + 1) * d_k] / r
                b += proj.bias[i * d_k:(i + 1) * d_k] / r
            rows.append(w)
            biases.append(b)
        ref[name] = (torch.cat(rows), torch.cat(biases))
    return ref


@pytest.mark.parametrize("start, g", [(8, 4), (8, 2), (8, 1), (4, 2),
                                      (4, 1)])
def test_mean_pool_matches_the_loop_form(start, g):
    mha = _mha(n_kv_heads=start)
    out = mean_pool_kv_heads(mha, g)
    with torch.no_grad():
        for name, (w, b) in _loop_pool(mha, g).items():
            torch.testing.assert_close(getattr(out, name).weight, w)
            torch.testing.assert_close(getattr(out, name).bias, b)
        for name in ("q_proj", "o_proj"):
            assert torch.equal(getattr(out, name).weight,
                               getattr(mha, name).weight)
    assert out.n_heads == 8 and out.n_kv_heads == g


def test_heads_equal_within_groups_pool_to_the_same_function():
    """If the K/V heads of each group are already equal, the group mean
    is that head: the converted GQA layer computes what the MHA did
    (query head i reads group i // (h/g) in both)."""
    gqa = _mha(n_kv_heads=2, seed=1)
    mha = _mha(seed=2)
    with torch.no_grad():                  # MHA with K/V copied per group
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).load_state_dict(
                getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            dst.weight.copy_(src.weight.view(2, 1, 4, 32).expand(
                2, 4, 4, 32).reshape(32, 32))
            dst.bias.copy_(src.bias.view(2, 1, 4).expand(2, 4, 4)
                           .reshape(32))
    x = torch.randn(3, 6, 32)
    mask = torch.ones(6, 6, dtype=torch.bool).tril()
    torch.testing.assert_close(mha(x, mask), gqa(x, mask))
    torch.testing.assert_close(mean_pool_kv_heads(mha, 2)(x, mask),
                               mha(x, mask))


def test_keeps_rope_scale_fused_dtype_and_leaves_the_source_alone():
    rope = RotaryEmbedding(head_dim=4)
    mha = _mha(rope=rope, fused=True).double()
    mha.scale = 0.3
    before = {k: v.clone() for k, v in mha.state_dict().items()}
    out = mean_pool_kv_heads(mha, 2)
    assert out.rope is rope and out.fused and out.scale == 0.3
    assert out.q_proj.weight.dtype == torch.float64
    for k, v in mha.state_dict().items():
        assert torch.equal(v, before[k])
    out(torch.randn(1, 3, 32, dtype=torch.float64))       # runs


@pytest.mark.parametrize("mha, g, err, match", [
    (None, 2, TypeError, "mha must be a MultiHeadAttention"),
    ("mha", 3, ValueError, "divisible by n_kv_heads"),
    ("mha", 0, ValueError, "n_kv_heads must be >= 1"),
    ("mha", 2.0, TypeError, "n_kv_heads"),
    ("mha", 16, ValueError, "divisible by n_kv_heads"),
])
def test_mean_pool_rejects_bad_input(mha, g, err, match):
    mha = _mha() if mha == "mha" else mha
    with pytest.raises(err, match=match):
        mean_pool_kv_heads(mha, g)


def test_stored_sweep_is_what_the_recipe_makes():
    """Rerun the cheapest cell (MQA, seed 0: no conversions) and compare
    it with the stored file."""
    sweep = load_sweep("gqa_quality")
    assert sweep.seeds == list(gqa_quality.SEEDS)
    assert [s["n_kv_heads"] for s in sweep.settings()] == \
        list(gqa_quality.KV_HEADS)
    stored = sweep.cell(0, n_kv_heads=1)
    fresh = gqa_quality.gqa_run(n_kv_heads=1, seed=0)
    assert fresh.keys() == stored.keys()
    assert fresh["val_loss"] == pytest.approx(stored["val_loss"], rel=1e-3)
    mha_cell = sweep.cell(0, n_kv_heads=gqa_quality.N_HEADS)
    n = gqa_quality.UPTRAIN_STEPS // 5 + 1
    for g in gqa_quality.KV_HEADS:
        assert len(mha_cell[f"uptrain_g{g}"]) == n
    # pooling at g = h is the identity: it starts at the trained loss
    assert mha_cell[f"uptrain_g{gqa_quality.N_HEADS}"][0] == \
        pytest.approx(mha_cell["val_loss"], rel=1e-5)


def test_gqa_model_shapes_and_bad_input():
    m = gqa_quality.gqa_text_model(2, seed=0)
    assert m.layers[0].n_kv_heads == 2 and m.layers[0].n_heads == 4
    assert m.layers[0].k_proj.out_features == 16
    with pytest.raises(ValueError, match="n_kv_heads must be one of"):
        gqa_quality.gqa_text_model(3, seed=0)
    with pytest.raises(TypeError, match="seed"):
        gqa_quality.gqa_text_model(2, seed="0")
    with pytest.raises(TypeError, match="model must be a TinyAttentionModel"):
        gqa_quality.text_val_loss(torch.nn.Linear(2, 2))


def test_timed_decode_computes_gqa_and_counts_bytes():
    """The fused call that time_kv_heads times is GQA attention (against
    the explicit repeat_kv path); bytes fall with g, MACs do not."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 1, 4, generator=g)
    k, v = torch.randn(2, 2, 2, 9, 4, generator=g).unbind(0)
    torch.testing.assert_close(fused_attention(q, k, v, enable_gqa=True),
                               grouped_query_attention(q, k, v))
    rows = gqa_quality.time_kv_heads((8, 2, 1), d_model=32, n_heads=8,
                                     batch=2, cached=16, prompt=4,
                                     repeats=1)
    assert [r.n_kv_heads for r in rows] == [8, 2, 1]
    assert [r.kv_bytes for r in rows] == [2 * 2 * g_ * 16 * 4 * 4
                                          for g_ in (8, 2, 1)]
    assert len({r.attention_macs for r in rows}) == 1
    assert all(math.isfinite(r.decode_seconds) and r.prefill_seconds > 0
               for r in rows)
    with pytest.raises(ValueError, match="kv_heads must divide"):
        gqa_quality.time_kv_heads((3,), d_model=32, n_heads=8)
    with pytest.raises(TypeError, match="repeats"):
        gqa_quality.time_kv_heads(repeats=1.5)

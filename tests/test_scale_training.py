"""Tests for course_lib.experiments.scale_training (chapter 3): training
with the scores scaled by 1/sqrt(d_k), 1 or 1/sqrt(d_model).

References: the closed forms of the three scales; torch's fused kernel
for the multiplier the attention layer applies; the same initialisation
measured under two scales (the score spread must differ by exactly the
ratio of the scales); the stored sweep, which the recipe must reproduce.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from course_lib.experiments import scale_training
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.mha import MultiHeadAttention, split_heads


def test_score_scale_closed_forms():
    for d_k, h in [(8, 4), (64, 2), (1, 1)]:
        assert scale_training.score_scale("sqrt_dk", head_dim=d_k,
                                          n_heads=h) == 1 / math.sqrt(d_k)
        assert scale_training.score_scale("none", head_dim=d_k,
                                          n_heads=h) == 1.0
        assert scale_training.score_scale(
            "sqrt_dmodel", head_dim=d_k,
            n_heads=h) == pytest.approx(1 / math.sqrt(h * d_k))


def test_the_scale_attribute_is_the_multiplier_attention_applies():
    """Setting ``mha.scale`` (as scale_run does) gives softmax(c Q K^T) V,
    checked against torch's kernel with scale=c."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()
    for c in (1.0, 0.1):
        mha.scale = c
        q, k, v = (split_heads(p(x), 4) for p in
                   (mha.q_proj, mha.k_proj, mha.v_proj))   # (B, H, T, d_k)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             scale=c)
        ref = mha.o_proj(ref.transpose(1, 2).reshape(2, 5, 16))
        torch.testing.assert_close(mha(x, mask), ref)


def test_init_scores_have_the_variance_the_chapter_assumes():
    """Same seed = same initialisation: the score spread of the unscaled
    model is sqrt(d_k) times the scaled one, and the scaled scores have
    standard deviation about 1 (unit-variance q and k, the premise)."""
    d_k = 8
    runs = {s: scale_training.scale_run(scale=s, head_dim=d_k, seed=0,
                                        steps=10)
            for s in ("sqrt_dk", "none")}
    std = {s: r["init_score_std"] for s, r in runs.items()}
    assert std["none"] / std["sqrt_dk"] == pytest.approx(math.sqrt(d_k),
                                                         rel=1e-5)
    assert 0.8 < std["sqrt_dk"] < 1.25
    assert len(runs["none"]["loss"]) == 2          # 10 steps, 5 per point
    assert math.isnan(runs["none"]["steps_to_threshold"])


def test_stored_sweep_is_what_the_recipe_makes():
    """Rerun the cheapest cell (d_k = 8, seed 0) and compare every
    metric with the stored file."""
    sweep = load_sweep("scale_training")
    assert sweep.seeds == list(scale_training.SEEDS)
    assert {(s["scale"], s["head_dim"]) for s in sweep.settings()} == {
        (s, d) for s in scale_training.SCALES
        for d in scale_training.HEAD_DIMS}
    setting = {"scale": "sqrt_dk", "head_dim": min(scale_training.HEAD_DIMS)}
    stored = sweep.cell(0, **setting)
    fresh = scale_training.scale_run(**setting, seed=0)
    assert fresh.keys() == stored.keys()
    assert len(fresh["loss"]) <= 50
    for key, value in fresh.items():
        if isinstance(value, list):
            assert value == pytest.approx(stored[key], rel=1e-3)
        elif math.isnan(value):
            assert math.isnan(stored[key])
        else:
            assert value == pytest.approx(stored[key], rel=1e-3), key


@pytest.mark.parametrize("kwargs, err, match", [
    (dict(scale="sqrt_d", head_dim=8, seed=0), ValueError, "scale must be"),
    (dict(scale="none", head_dim=0, seed=0), ValueError, "head_dim"),
    (dict(scale="none", head_dim=8.0, seed=0), TypeError, "head_dim"),
    (dict(scale="none", head_dim=8, seed=-1), ValueError, "seed"),
    (dict(scale="none", head_dim=8, seed=0, steps=3), ValueError, "steps"),
])
def test_bad_input_names_the_argument(kwargs, err, match):
    with pytest.raises(err, match=match):
        scale_training.scale_run(**kwargs)


def test_score_scale_rejects_bad_input():
    with pytest.raises(ValueError, match="scale must be one of"):
        scale_training.score_scale("dk", head_dim=8, n_heads=4)
    with pytest.raises(TypeError, match="head_dim"):
        scale_training.score_scale("none", head_dim="8", n_heads=4)
    with pytest.raises(ValueError, match="n_heads"):
        scale_training.score_scale("none", head_dim=8, n_heads=0)

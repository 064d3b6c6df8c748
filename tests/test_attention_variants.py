"""course_lib.experiments.attention_variants: the stored sweep is what the
recipe trains now; each variant caches what its metrics say (counted in
a real KV cache) and has the parameters of the closed forms; bad input
is named."""
import math

import pytest
import torch

from course_lib.experiments import attention_variants as av
from course_lib.experiments.sweeps import load_sweep
from course_lib.model.decoder_lm import decoder_lm_param_count
from course_lib.model.kv_cache import KVCache
from course_lib.model.mha import mha_param_count
from course_lib.model.mla import MultiHeadLatentAttention, mla_param_count
from course_lib.sizing.params import num_parameters


@pytest.fixture(scope="module")
def sweep():
    return load_sweep("attention_variants")


def test_stored_cell_is_what_the_recipe_trains(sweep):
    """The cheapest cell (MQA, the fewest parameters), seed 0, rerun: every
    metric equals the stored one (to 1e-3: other CPUs round differently).
    """
    stored = sweep.cell(0, variant="MQA", hidden_size=64)
    now = av.train_attention_variant(variant="MQA", hidden_size=64, seed=0)
    assert set(now) == set(stored)
    for name, value in now.items():
        assert stored[name] == pytest.approx(value, rel=1e-3), name
    # the file holds the whole grid: every variant with every seed
    assert sweep.seeds == [0, 1, 2]
    assert [s["variant"] for s in sweep.settings()] == list(av.VARIANTS)
    assert len(sweep.runs) == len(av.VARIANTS) * 3
    assert all(len(r["metrics"]["val_curve"]) <= 50 for r in sweep.runs)


def _cached_values_per_token(model, n_layers):
    """Values per token and layer that a real prefill leaves in the cache.
    """
    cache = KVCache(n_layers)
    idx = torch.randint(0, model.config.vocab_size, (2, 5))   # (B, T)
    with torch.no_grad():
        model(idx, cache=cache)
    counts = {sum(t.numel() for t in cache[i].tensors) / (2 * 5)
              for i in range(n_layers)}
    assert len(counts) == 1                  # the same in every layer
    return counts.pop()


@pytest.mark.parametrize("variant", av.VARIANTS)
def test_cache_and_parameters_are_what_is_stored(variant, sweep):
    torch.manual_seed(0)
    lm, mla = av.variant_configs(variant, hidden_size=64)
    model = av.build_variant(variant, hidden_size=64)
    L, D, H = lm.num_hidden_layers, lm.hidden_size, lm.num_attention_heads
    cached = _cached_values_per_token(model, L)
    d_k = D // H
    # the closed forms of the module docstring: 2 g d_k, or d_c + d_h^R
    expect = {"MHA": 2 * H * d_k, "GQA": 4 * d_k, "MQA": 2 * d_k,
              "MLA": 4 * d_k, "MLA-wide-RoPE": 4 * d_k,
              "MLA-small": 2 * d_k}[variant]
    assert cached == expect
    # parameters: the decoder's closed form, with MLA in place of MHA
    params = decoder_lm_param_count(lm)
    if mla is not None:
        assert all(isinstance(layer.attention, MultiHeadLatentAttention)
                   for layer in model.layers)
        params += L * (mla_param_count(mla) - mha_param_count(
            d_model=D, n_heads=H, n_kv_heads=lm.num_key_value_heads,
            bias=lm.attention_bias))
    assert num_parameters(model) == params
    for run in sweep.select(variant=variant, hidden_size=64):
        assert run["metrics"]["cache_per_token"] == cached
        assert run["metrics"]["params"] == params
        assert math.isfinite(run["metrics"]["val_loss"])


def test_matched_caches():
    """MLA's latent and RoPE key fill exactly GQA-2's (or MQA's) cache."""
    for mla_name, match, d_rope in (("MLA", "GQA", 8),
                                    ("MLA-wide-RoPE", "GQA", 16),
                                    ("MLA-small", "MQA", 8)):
        _, mla = av.variant_configs(mla_name, hidden_size=64)
        lm, _ = av.variant_configs(match, hidden_size=64)
        assert mla.kv_lora_rank + mla.qk_rope_head_dim == \
            2 * lm.num_key_value_heads * 16
        assert mla.qk_rope_head_dim == d_rope
        assert mla.qk_nope_head_dim == mla.v_head_dim == 16


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="variant"):
        av.variant_configs("MLB")
    with pytest.raises(TypeError, match="variant"):
        av.build_variant(3)
    with pytest.raises(ValueError, match="hidden_size"):
        av.variant_configs("MHA", hidden_size=60)
    with pytest.raises(TypeError, match="hidden_size"):
        av.build_variant("MHA", hidden_size=64.0)
    with pytest.raises(ValueError, match="seed"):
        av.train_attention_variant(variant="MHA", seed=-1)
    with pytest.raises(TypeError, match="seed"):
        av.train_attention_variant(variant="MHA", seed="0")
    with pytest.raises(ValueError, match="variant"):
        av.train_attention_variant(variant="mha")

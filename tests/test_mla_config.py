"""Tests for course_lib.model.mla (chapter 10): MLAConfig and its
DeepSeek presets, and the closed-form parameter count mla_param_count.

References used: the released config.json values (with DeepSeek's YaRN
rope_scaling), the parameters of a built MultiHeadLatentAttention, and
DeepSeek-V3's attention parameters counted by hand.
"""
from types import SimpleNamespace

import pytest
import torch

from course_lib.model.mla import MultiHeadLatentAttention
from course_lib.model.mla import MLAConfig, deepseek_yarn, mla_param_count
from mla_support import tiny
from errors import error_for


# ------------------------------------------------------------------ config
def test_presets_are_the_published_values():
    v3 = MLAConfig.deepseek_v3()
    assert (v3.hidden_size, v3.num_attention_heads, v3.q_lora_rank,
            v3.kv_lora_rank, v3.qk_nope_head_dim, v3.qk_rope_head_dim,
            v3.v_head_dim, v3.rope_theta) == (7168, 128, 1536, 512, 128, 64,
                                               128, 10000.0)
    assert v3.qk_head_dim == 192 and v3.rms_norm_eps == 1e-6
    assert not v3.attention_bias
    assert MLAConfig.deepseek_v2().hidden_size == 5120
    lite = MLAConfig.deepseek_v2_lite()
    assert (lite.hidden_size, lite.num_attention_heads,
            lite.q_lora_rank) == (2048, 16, None)
    assert MLAConfig.deepseek_v3(num_attention_heads=64) \
        .num_attention_heads == 64
    # YaRN rope_scaling exactly as in the released config.json files
    assert v3.rope_scaling == {
        "type": "yarn", "factor": 40, "original_max_position_embeddings":
        4096, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
        "mscale_all_dim": 1.0}
    assert MLAConfig.deepseek_v2().rope_scaling == \
        lite.rope_scaling == dict(v3.rope_scaling, mscale=0.707,
                                  mscale_all_dim=0.707)
    assert MLAConfig().rope_scaling is None               # plain RoPE


@pytest.mark.parametrize("mscale", [0, -0.707, float("nan")])
def test_deepseek_yarn_refuses_an_mscale_that_is_not_positive(mscale):
    # YaRN's attention factor 0.1 ln(s) mscale + 1 must grow with the
    # stretch s: a zero or negative mscale is a typo, not a setting
    with pytest.raises(ValueError, match="mscale"):
        deepseek_yarn(mscale=mscale)
    assert deepseek_yarn(mscale=0.707)["mscale_all_dim"] == 0.707


@pytest.mark.parametrize("kw, match", [
    (dict(qk_rope_head_dim=7), r"qk_rope_head_dim must be even \(RoPE rotates pairs\), got 7"),
    (dict(kv_lora_rank=0), "kv_lora_rank must be >= 1, got 0"),
    (dict(q_lora_rank=0), "q_lora_rank must be >= 1, got 0"),
    (dict(num_attention_heads=2.0), "num_attention_heads must be an int"),
    (dict(rope_theta=-1.0), "rope_theta must be > 0"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps must be > 0"),
    (dict(attention_bias=1), "attention_bias must be a bool"),
    (dict(rope_scaling={"type": "yarn"}), r"rope_scaling must have "
     r"exactly the keys .* missing \['factor'"),
    (dict(rope_scaling=dict(MLAConfig.deepseek_v3().rope_scaling,
                            factor=0)),
     r"rope_scaling\['factor'\] must be >= 1, got 0"),
])
def test_config_rejects_bad_values(kw, match):
    with pytest.raises(error_for(match), match=match):
        tiny(**kw)


# ----------------------------------------------------------- param counts
@pytest.mark.parametrize("cfg", [tiny(), tiny(q_lora_rank=None),
                                 tiny(attention_bias=True),
                                 tiny(q_lora_rank=None, attention_bias=True)])
def test_param_count_closed_form(cfg):
    m = MultiHeadLatentAttention(cfg)
    assert sum(p.numel() for p in m.parameters()) == mla_param_count(cfg)


def test_param_count_deepseek_v3_by_hand():
    with torch.device("meta"):
        m = MultiHeadLatentAttention(MLAConfig.deepseek_v3())
    sizes = {n: p.numel() for n, p in m.named_parameters()}
    assert sizes["q_a_proj.weight"] == 7168 * 1536
    assert sizes["q_b_proj.weight"] == 1536 * 128 * 192
    assert sizes["kv_a_proj_with_mqa.weight"] == 7168 * (512 + 64)
    assert sizes["kv_b_proj.weight"] == 512 * 128 * (128 + 128)
    assert sizes["o_proj.weight"] == 128 * 128 * 7168
    by_hand = (11_010_048 + 1536 + 37_748_736 + 4_128_768 + 512
               + 16_777_216 + 117_440_512)
    assert sum(sizes.values()) == by_hand == \
        mla_param_count(MLAConfig.deepseek_v3())


# ------------------------------------ mutation testing (benchmarks/mutation.md)
# Tests added because a mutant of course_lib.model.mla survived the ones
# above.
# (The messages in full: tests/pins/test_mla_config_messages.py.)
def test_config_without_query_latent_still_checks_every_other_field():
    with pytest.raises(ValueError, match=r"^kv_lora_rank must be >= 1, got "
                       r"0$"):
        MLAConfig(q_lora_rank=None, kv_lora_rank=0)
    with pytest.raises(ValueError, match=r"^rms_norm_eps must be > 0"):
        MLAConfig(q_lora_rank=None, rms_norm_eps=0.0)


def test_param_count_refuses_a_config_without_the_mla_fields():
    # (the message, which lists them: tests/pins/test_mla_config_messages.py)
    with pytest.raises(TypeError, match="config must be an MLA configuration"):
        mla_param_count(SimpleNamespace(hidden_size=8))


def test_mla_rejects_string_flags_and_huge_configs():
    with pytest.raises(TypeError, match="absorb"):
        MultiHeadLatentAttention(tiny(), absorb="False")
    m = MultiHeadLatentAttention(tiny())
    x = torch.randn(1, 3, m.config.hidden_size)
    with pytest.raises(TypeError, match="absorb"):
        m(x, absorb="False")
    with pytest.raises(ValueError, match="config"):
        MultiHeadLatentAttention(tiny(hidden_size=2**16,
                                      num_attention_heads=1024))

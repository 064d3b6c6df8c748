"""course_lib.sizing.params against transformers (test-only reference).

Models are built on the meta device (shapes, no memory), so even the
1T-parameter Kimi K2 takes a fraction of a second. Parameters only:
DeepSeek-V3's ``e_score_correction_bias`` is a buffer in both libraries
and is not counted.
"""
import dataclasses

import pytest
import torch

transformers = pytest.importorskip("transformers")

from course_lib.sizing.configs import (DEEPSEEK_V3, GPT2_SMALL, KIMI_K2,  # noqa: E402
                                       LLAMA2_7B, MIXTRAL_8X7B, ModelConfig)
from course_lib.sizing.params import count_parameters  # noqa: E402

torch.manual_seed(123)


def to_hf(c: ModelConfig):
    """The transformers config and model class for a ModelConfig."""
    t = transformers
    if c.position == "learned":
        return t.GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.max_position_embeddings,
            n_embd=c.hidden_size, n_layer=c.num_hidden_layers,
            n_head=c.num_attention_heads, n_inner=c.intermediate_size,
            tie_word_embeddings=c.tie_word_embeddings), t.GPT2LMHeadModel
    common = dict(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or c.num_attention_heads,
        max_position_embeddings=c.max_position_embeddings,
        tie_word_embeddings=c.tie_word_embeddings,
        attention_bias=c.attention_bias)
    if c.is_mla:
        return t.DeepseekV3Config(
            **common, intermediate_size=c.intermediate_size,
            q_lora_rank=c.q_lora_rank, kv_lora_rank=c.kv_lora_rank,
            qk_nope_head_dim=c.qk_nope_head_dim,
            qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
            n_routed_experts=c.n_routed_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            n_shared_experts=c.n_shared_experts,
            moe_intermediate_size=c.moe_intermediate_size,
            first_k_dense_replace=c.first_k_dense_replace,
            n_group=c.n_group, topk_group=c.topk_group,
            routed_scaling_factor=c.routed_scaling_factor,
        ), t.DeepseekV3ForCausalLM
    if c.is_moe:
        common.pop("attention_bias")
        return t.MixtralConfig(
            **common, intermediate_size=c.moe_intermediate_size,
            num_local_experts=c.n_routed_experts,
            num_experts_per_tok=c.num_experts_per_tok), \
            t.MixtralForCausalLM
    return t.LlamaConfig(**common, intermediate_size=c.intermediate_size,
                         mlp_bias=c.mlp_bias), t.LlamaForCausalLM


def hf_count(c: ModelConfig) -> tuple[int, int]:
    cfg, cls = to_hf(c)
    with torch.device("meta"):
        model = cls(cfg)
    return (sum(p.numel() for p in model.parameters()),
            sum(b.numel() for b in model.buffers()
                if b.dtype.is_floating_point and b.dim() == 1
                and b.numel() == (c.n_routed_experts or -1)))


ALL = [GPT2_SMALL, LLAMA2_7B, MIXTRAL_8X7B, DEEPSEEK_V3, KIMI_K2]


@pytest.mark.parametrize("cfg", ALL, ids=lambda c: c.name)
def test_published_configs_equal_transformers_meta_count(cfg):
    params, bias_buffers = hf_count(cfg)
    assert count_parameters(cfg).total == params
    # the expert-bias buffers: E per MoE layer (DeepSeek-V3 style only)
    expected = cfg.n_moe_layers * cfg.n_routed_experts \
        if cfg.scoring_func == "sigmoid" else 0
    assert bias_buffers == expected


@pytest.mark.parametrize("cfg", ALL, ids=lambda c: c.name)
def test_shrunken_configs_equal_transformers(cfg):
    small = dataclasses.replace(
        cfg, num_hidden_layers=4, vocab_size=101, hidden_size=48,
        num_attention_heads=4, num_key_value_heads=None if
        cfg.num_key_value_heads is None else
        (2 if cfg.num_key_value_heads < cfg.num_attention_heads else 4),
        tie_word_embeddings=not cfg.tie_word_embeddings,
        intermediate_size=40,
        **({"n_routed_experts": 16, "moe_intermediate_size": 24}
           if cfg.is_moe else {}),
        # transformers' Mixtral has no dense layers: DeepSeek-style only
        **({"first_k_dense_replace": 2} if cfg.is_mla else {}))
    assert count_parameters(small).total == hf_count(small)[0]


# Fields of the transformers defaults that ARE the released configs; the
# listed exceptions are where the defaults are not the release.
DEFAULTS = [
    (GPT2_SMALL, "GPT2Config", dict(
        vocab_size="vocab_size", hidden_size="n_embd",
        num_hidden_layers="n_layer", num_attention_heads="n_head",
        max_position_embeddings="n_positions", hidden_act=
        "activation_function", tie_word_embeddings="tie_word_embeddings"),
     {}),
    (LLAMA2_7B, "LlamaConfig", None,
     {"max_position_embeddings": (4096, 2048)}),      # Llama 1's 2048
    (MIXTRAL_8X7B, "MixtralConfig", None,
     {"max_position_embeddings": (32768, 131072)}),
    (DEEPSEEK_V3, "DeepseekV3Config", None,
     {"max_position_embeddings": (163840, 4096),      # before YaRN x40
      "rope_scaling": "yarn"}),    # the release's YaRN is not the default
]


@pytest.mark.parametrize("cfg, name, mapping, exceptions", DEFAULTS,
                         ids=[d[1] for d in DEFAULTS])
def test_fields_match_transformers_defaults(cfg, name, mapping, exceptions):
    hf = getattr(transformers, name)()
    if mapping is None:
        # rope fields are compared below: transformers keeps them in one
        # dict, rope_parameters (rope_theta, rope_type and YaRN's keys)
        mapping = {f.name: f.name for f in dataclasses.fields(cfg)
                   if hasattr(hf, f.name) and f.name not in
                   ("head_dim", "rope_theta", "rope_scaling")}
        if name == "MixtralConfig":
            mapping["n_routed_experts"] = "num_local_experts"
    assert len(mapping) >= 7
    for ours, theirs in mapping.items():
        got, want = getattr(cfg, ours), getattr(hf, theirs)
        if ours in exceptions:
            assert (got, want) == exceptions[ours]
        elif ours == "num_key_value_heads" and want is None:
            assert got in (None, cfg.num_attention_heads)
        else:
            assert got == want, f"{name}.{theirs}: {got} != {want}"
    if cfg.position == "rope":
        rope = hf.rope_parameters
        assert rope["rope_theta"] == cfg.rope_theta, (name, rope)
        if "rope_scaling" in exceptions:        # default: plain RoPE
            assert rope["rope_type"] == "default"
            assert cfg.rope_scaling["type"] == exceptions["rope_scaling"]
        else:
            assert cfg.rope_scaling is None and \
                rope["rope_type"] == "default", (name, rope)

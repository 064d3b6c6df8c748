"""Tests for course_lib.sizing.params.total_and_active and the QK-norm
count (chapter 12's transfer exercise): against ``transformers`` models
built on the meta device, and against the published figures."""
import importlib.util

import pytest
import torch

from course_lib.sizing.configs import MIXTRAL_8X7B, ModelConfig
from course_lib.sizing.params import count_parameters, total_and_active

# released config.json fields (Qwen/Qwen3-30B-A3B, allenai/OLMoE-1B-7B-0924)
QWEN3_30B_A3B = dict(vocab_size=151936, hidden_size=2048,
                     num_hidden_layers=48, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128,
                     n_routed_experts=128, num_experts_per_tok=8,
                     moe_intermediate_size=768, qk_norm="head")
OLMOE_1B_7B = dict(vocab_size=50304, hidden_size=2048, num_hidden_layers=16,
                   num_attention_heads=16, num_key_value_heads=16,
                   n_routed_experts=64, num_experts_per_tok=8,
                   moe_intermediate_size=1024, qk_norm="full")


def test_published_figures():
    total, active = total_and_active(QWEN3_30B_A3B)
    # Qwen: "30.5B in total and 3.3B activated" (3.35B, truncated)
    assert round(total / 1e9, 1) == 30.5 and 3.3 <= active / 1e9 < 3.4
    total, active = total_and_active(OLMOE_1B_7B)
    assert round(total / 1e9, 1) == 6.9 and round(active / 1e9, 1) == 1.3


def test_a_model_config_and_its_fields_agree():
    n = count_parameters(MIXTRAL_8X7B)
    assert total_and_active(MIXTRAL_8X7B) == (n.total, n.active)
    fields = {f: getattr(MIXTRAL_8X7B, f) for f in (
        "vocab_size", "hidden_size", "num_hidden_layers",
        "num_attention_heads", "num_key_value_heads", "n_routed_experts",
        "num_experts_per_tok", "moe_intermediate_size")}
    assert total_and_active(fields) == (n.total, n.active)


def test_every_expert_chosen_means_active_equals_total():
    cfg = dict(QWEN3_30B_A3B, num_experts_per_tok=128)
    total, active = total_and_active(cfg)
    assert total == active


def test_qk_norm_counts():
    base = dict(OLMOE_1B_7B, qk_norm=None)
    t0, _ = total_and_active(base)
    assert total_and_active(dict(base, qk_norm="full"))[0] - t0 == \
        16 * (2048 + 2048)
    assert total_and_active(dict(base, qk_norm="head"))[0] - t0 == \
        16 * 2 * 128


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="needs transformers")
@pytest.mark.parametrize("which", ["qwen3", "olmoe"])
def test_equals_transformers_on_the_meta_device(which):
    """Total from the built model; active = total minus the (E - k)
    unchosen experts' share of every layer's expert tensors."""
    import transformers
    if which == "qwen3":
        cfg, fields = transformers.Qwen3MoeConfig(
            vocab_size=151936, hidden_size=2048, num_hidden_layers=48,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            num_experts=128, num_experts_per_tok=8,
            moe_intermediate_size=768, tie_word_embeddings=False,
            decoder_sparse_step=1, mlp_only_layers=[]), QWEN3_30B_A3B
        build = transformers.Qwen3MoeForCausalLM
    else:
        cfg, fields = transformers.OlmoeConfig(
            vocab_size=50304, hidden_size=2048, num_hidden_layers=16,
            num_attention_heads=16, num_key_value_heads=16, num_experts=64,
            num_experts_per_tok=8, intermediate_size=1024,
            tie_word_embeddings=False), OLMOE_1B_7B
        build = transformers.OlmoeForCausalLM
    with torch.device("meta"):
        model = build(cfg)
    total = sum(p.numel() for p in model.parameters())
    experts = sum(p.numel() for n, p in model.named_parameters()
                  if ".experts." in n)
    E, k = fields["n_routed_experts"], fields["num_experts_per_tok"]
    assert total_and_active(fields) == (total, total - experts * (E - k) // E)


def test_bad_input():
    with pytest.raises(ValueError):
        total_and_active(dict(QWEN3_30B_A3B, qk_norm="layer"))
    with pytest.raises(ValueError):
        total_and_active(dict(QWEN3_30B_A3B, num_experts=128))  # HF name
    with pytest.raises((TypeError, ValueError)):
        total_and_active([("hidden_size", 2048)])
    with pytest.raises((TypeError, ValueError)):
        ModelConfig(name="x", vocab_size=8, hidden_size=8,
                    num_hidden_layers=1, num_attention_heads=2,
                    qk_norm=True)

r"""Published configurations of five decoder-only language models.

Each is a :class:`~course_lib.model_config.ModelConfig` (defined in
:mod:`course_lib.model_config`, importable from here too): the fields of
the model's released ``config.json`` that decide its parameter count and
its KV-cache size, under the Hugging Face names, plus the published sizes
with their source.

The five constants, from small and dense to large and sparse:

==============  =======  ======================================  =========
constant        layers   attention / FFN                         published
==============  =======  ======================================  =========
GPT2_SMALL      12       MHA, GELU MLP, learned positions        124M
LLAMA2_7B       32       MHA, SwiGLU, RoPE                       6.74B
MIXTRAL_8X7B    32       GQA (8 kv heads), 8 experts, top-2      46.7B/12.9B
DEEPSEEK_V3     61       MLA, 256 + 1 shared experts, top-8      671B/37B
KIMI_K2         61       MLA, 384 + 1 shared experts, top-8      1.04T/32B
==============  =======  ======================================  =========

``SMOLLM2_135M`` (30 layers, GQA, tied embeddings, 134.5M) is the real
model chapter 13 loads; it is kept out of ``PUBLISHED``, the list of
chapter 12's tables.

Shape letters used in comments: V vocabulary, D ``hidden_size``, $N$
(``num_hidden_layers``) layers, H query heads, G key/value heads, E
routed experts, k experts per token.

Introduced in chapter 12.
"""
from __future__ import annotations

from .mla_config import deepseek_yarn
from .model_config import ModelConfig, check_model_config

__all__ = ["ModelConfig", "check_model_config", "GPT2_SMALL", "LLAMA2_7B",
           "MIXTRAL_8X7B", "DEEPSEEK_V3", "KIMI_K2", "SMOLLM2_135M",
           "PUBLISHED"]


# GPT-2 small: openai-community/gpt2 config.json (GPT2Config() defaults).
# Its own field names are n_embd, n_layer, n_head, n_positions, n_inner.
GPT2_SMALL = ModelConfig(
    name="GPT-2 small",
    vocab_size=50257,               # 50,000 BPE merges + 256 bytes + <|eot|>
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,         # n_inner = None means 4 * 768
    max_position_embeddings=1024,   # n_positions: rows of the learned table
    hidden_act="gelu_new",          # tanh approximation of GELU
    tie_word_embeddings=True,       # lm_head reuses wte
    position="learned",
    norm="layer",
    attention_bias=True,            # GPT-2's Conv1D layers carry biases
    mlp_bias=True,
    # 124,439,808 with the tied head; the paper's Table 2 says 117M, a
    # figure OpenAI later corrected to 124M (README of openai/gpt-2).
    published_total=124_439_808,
    source="openai-community/gpt2 config.json; Radford et al. (2019)",
)

# Llama-2-7B: meta-llama/Llama-2-7b-hf config.json. LlamaConfig() has
# the same shapes but Llama 1's max_position_embeddings (2048) and
# rms_norm_eps (1e-6); Llama 2 uses 4096 and 1e-5.
LLAMA2_7B = ModelConfig(
    name="Llama-2-7B",
    vocab_size=32000,               # SentencePiece BPE
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,         # GQA only in the 34B and 70B models
    intermediate_size=11008,        # 8/3 * 4096 rounded up to a 256 multiple
    max_position_embeddings=4096,
    hidden_act="silu",
    tie_word_embeddings=False,
    rope_theta=10000.0,
    # Name says 7B; the exact count (model card: 6.74B) is this one.
    published_total=6_738_415_616,
    source="meta-llama/Llama-2-7b-hf config.json; Touvron et al. (2023)",
)

# Mixtral-8x7B: mistralai/Mixtral-8x7B-v0.1 config.json, where the expert
# count is called num_local_experts and intermediate_size is the width of
# each expert. MixtralConfig() matches except max_position_embeddings
# (131072 there, 32768 in the release) and the absent rope_theta = 1e6.
MIXTRAL_8X7B = ModelConfig(
    name="Mixtral-8x7B",
    vocab_size=32000,
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,          # GQA: 4 query heads per kv head
    intermediate_size=14336,        # every layer is MoE: unused when dense
    max_position_embeddings=32768,
    hidden_act="silu",
    tie_word_embeddings=False,
    rope_theta=1e6,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=0,
    moe_intermediate_size=14336,    # each expert is a full-width SwiGLU
    first_k_dense_replace=0,
    norm_topk_prob=True,            # softmax over the top-2 logits only
    scoring_func="softmax",
    published_total=46_700_000_000,   # "46.7B total" (Mistral AI, 2023)
    published_active=12_900_000_000,  # "12.9B per token"
    source="mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. (2024); "
           "Mistral AI announcement (Dec 2023)",
)

# DeepSeek-V3: deepseek-ai/DeepSeek-V3 config.json (DeepseekV3Config()
# defaults, except max_position_embeddings: 4096 there, 163840 after the
# release's YaRN extension by a factor 40).
DEEPSEEK_V3 = ModelConfig(
    name="DeepSeek-V3",
    vocab_size=129280,
    hidden_size=7168,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,        # MLA: every head gets its own K, V
    intermediate_size=18432,        # dense FFN of the first 3 layers
    max_position_embeddings=163840,
    hidden_act="silu",
    tie_word_embeddings=False,
    rope_theta=10000.0,
    rope_scaling=deepseek_yarn(mscale=1.0),   # 4K x 40 = 163,840
    q_lora_rank=1536,               # query latent (not the query width)
    kv_lora_rank=512,               # cached latent c^KV per token
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,            # query head = 128 + 64 = 192 wide
    v_head_dim=128,
    n_routed_experts=256,
    num_experts_per_tok=8,
    n_shared_experts=1,
    moe_intermediate_size=2048,
    first_k_dense_replace=3,        # layers 0-2 dense, 3-60 MoE
    n_group=8,                      # 8 groups of 32 experts ...
    topk_group=4,                   # ... a token may use 4 of them
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    scoring_func="sigmoid",
    num_nextn_predict_layers=1,     # the MTP module: in the 685B checkpoint
    published_total=671_000_000_000,   # main model, without MTP
    published_active=37_000_000_000,
    source="deepseek-ai/DeepSeek-V3 config.json; DeepSeek-AI (2024)",
)

# Kimi K2: moonshotai/Kimi-K2-Instruct config.json (architecture
# DeepseekV3ForCausalLM). Differences from DeepSeek-V3: half the heads,
# 384 experts, one dense layer, no expert groups, no MTP module.
KIMI_K2 = ModelConfig(
    name="Kimi K2",
    vocab_size=163840,
    hidden_size=7168,
    num_hidden_layers=61,
    num_attention_heads=64,         # DeepSeek-V3 has 128
    num_key_value_heads=64,
    intermediate_size=18432,        # dense FFN of layer 0
    max_position_embeddings=131072,
    hidden_act="silu",
    tie_word_embeddings=False,
    rope_theta=50000.0,
    # YaRN like DeepSeek-V3 but 4K x 32 and beta_fast = beta_slow = 1
    # (Kimi-K2-Instruct-0905 extends to 256K with factor 64)
    rope_scaling={"type": "yarn", "factor": 32,
                  "original_max_position_embeddings": 4096,
                  "beta_fast": 1, "beta_slow": 1,
                  "mscale": 1.0, "mscale_all_dim": 1.0},
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    n_routed_experts=384,
    num_experts_per_tok=8,
    n_shared_experts=1,
    moe_intermediate_size=2048,
    first_k_dense_replace=1,
    n_group=1,                      # one group: no group-limited routing
    topk_group=1,
    routed_scaling_factor=2.827,
    norm_topk_prob=True,
    scoring_func="sigmoid",
    num_nextn_predict_layers=0,
    # Technical report: 1.04T total, 32B activated; the model card
    # rounds the total to "1T".
    published_total=1_040_000_000_000,
    published_active=32_000_000_000,
    source="moonshotai/Kimi-K2-Instruct config.json; Kimi Team (2025)",
)

# SmolLM2-135M(-Instruct): HuggingFaceTB/SmolLM2-135M config.json, the
# same numbers as the llama.* metadata of the GGUF file of chapter 13.
# Not in PUBLISHED: chapter 12's tables list the five models above.
SMOLLM2_135M = ModelConfig(
    name="SmolLM2-135M",
    vocab_size=49152,
    hidden_size=576,
    num_hidden_layers=30,           # deep and narrow for its size
    num_attention_heads=9,          # head_dim = 576 / 9 = 64
    num_key_value_heads=3,          # GQA: 3 query heads per kv head
    intermediate_size=1536,
    max_position_embeddings=8192,
    hidden_act="silu",
    tie_word_embeddings=True,       # the embedding is 21% of the model
    rope_theta=100000.0,            # the GGUF's llama.rope.freq_base
    published_total=134_515_008,    # num_parameters of the checkpoint
    source="HuggingFaceTB/SmolLM2-135M config.json; Allal et al. (2025)",
)

PUBLISHED: dict[str, ModelConfig] = {
    c.name: c for c in (GPT2_SMALL, LLAMA2_7B, MIXTRAL_8X7B, DEEPSEEK_V3,
                        KIMI_K2)}

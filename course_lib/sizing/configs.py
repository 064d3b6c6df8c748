r"""The configuration of a decoder-only language model, as released.

A :class:`ModelConfig` holds the fields of a model's released
``config.json`` that decide its parameter count and its KV-cache size,
under the Hugging Face names (``hidden_size``, ``num_hidden_layers``,
``num_key_value_heads``, ``kv_lora_rank``, ``n_routed_experts`` ...), so
that code written for these objects also reads a ``transformers``
config. Three course fields say what the names do not: ``position``
(learned table or RoPE), ``norm`` (LayerNorm with weight and bias, or
RMSNorm with a weight only) and the published sizes with their source.
The published configurations follow the dataclass: GPT-2 small,
Llama-2-7B, Mixtral-8x7B, DeepSeek-V3, Kimi K2 and SmolLM2-135M.

Shape letters used in comments: V vocabulary, D ``hidden_size``, $N$
(``num_hidden_layers``) layers, H query heads, G key/value heads, E
routed experts, k experts per token.
"""
from __future__ import annotations

from dataclasses import dataclass

from .._util.validation import check_bool, check_int, check_real
from ..model.mla import deepseek_yarn
from ..model.yarn import check_rope_scaling

__all__ = ["ModelConfig", "check_model_config", "GPT2_SMALL", "LLAMA2_7B",
           "MIXTRAL_8X7B", "DEEPSEEK_V3", "KIMI_K2", "SMOLLM2_135M",
           "PUBLISHED"]


# hidden_act values of the published configs: "silu" gates a SwiGLU FFN
# (3 matrices); "gelu_new" (GPT-2), "gelu" and "relu" are two-matrix MLPs.
ACTIVATIONS = ("silu", "gelu_new", "gelu", "relu")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a decoder-only LM, under Hugging Face field names.

    Dense fields first, then multi-head latent attention (MLA, chapter
    10: set ``kv_lora_rank`` to switch it on) and mixture of experts
    (MoE, chapter 11: set ``n_routed_experts``). ``published_total`` and
    ``published_active`` are the figures the ``source`` states (None if
    it states none); ``course_lib.sizing.params.count_parameters`` recomputes
    them from the architecture.
    """
    name: str
    vocab_size: int                       # V
    hidden_size: int                      # D (d_model)
    num_hidden_layers: int                # N
    num_attention_heads: int              # H
    num_key_value_heads: int | None = None  # G; None = H (no GQA)
    head_dim: int | None = None           # None = D // H (unused by MLA)
    intermediate_size: int = 0            # dense FFN hidden width
    max_position_embeddings: int = 2048   # context length
    hidden_act: str = "silu"              # "silu" = SwiGLU's gate
    tie_word_embeddings: bool = False     # lm_head shares the (V, D) table
    position: str = "rope"                # "learned" (GPT-2) or "rope"
    rope_theta: float = 10000.0           # RoPE base b (unused if learned)
    rope_scaling: dict | None = None      # YaRN keys of config.json or None
    norm: str = "rms"                     # "layer" (w + b) or "rms" (w)
    attention_bias: bool = False          # biases on q/k/v/o projections
    qk_norm: str | None = None            # RMSNorm on queries and keys:
    #   "head" one of d_h each (Qwen3), "full" over H d_h and G d_h (OLMoE)
    mlp_bias: bool = False                # biases in the dense MLP
    # ---- multi-head latent attention (None = ordinary attention)
    q_lora_rank: int | None = None        # None = full-rank query
    kv_lora_rank: int | None = None       # width of the cached latent
    qk_nope_head_dim: int | None = None   # per-head query/key, no RoPE
    qk_rope_head_dim: int | None = None   # per-head decoupled RoPE part
    v_head_dim: int | None = None         # per-head value width
    # ---- mixture of experts (None = dense FFN in every layer)
    n_routed_experts: int | None = None   # E (Mixtral: num_local_experts)
    num_experts_per_tok: int | None = None  # k
    n_shared_experts: int = 0             # always-on experts per layer
    moe_intermediate_size: int | None = None  # hidden width of an expert
    first_k_dense_replace: int = 0        # layers < this keep a dense FFN
    n_group: int | None = None            # expert groups (None: softmax
    topk_group: int | None = None         #   router, no groups; Mixtral)
    routed_scaling_factor: float = 1.0    # multiplies the routed output
    norm_topk_prob: bool = True           # renormalise the k gates
    scoring_func: str = "softmax"         # router: "softmax" | "sigmoid"
    num_nextn_predict_layers: int = 0     # multi-token prediction modules
    # ---- provenance
    published_total: int | None = None
    published_active: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "max_position_embeddings"):
            check_int(name, getattr(self, name), minimum=1)
        check_int("intermediate_size", self.intermediate_size, minimum=0)
        for name, options in (("position", ("learned", "rope")),
                              ("norm", ("layer", "rms")),
                              ("qk_norm", (None, "head", "full")),
                              ("scoring_func", ("softmax", "sigmoid"))):
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {options}, got "
                                 f"{getattr(self, name)!r}")
        H, G = self.num_attention_heads, self.num_key_value_heads
        if G is not None:
            check_int("num_key_value_heads", G, minimum=1)
            if H % G:
                raise ValueError(f"num_key_value_heads must divide "
                                 f"num_attention_heads={H}, got {G}")
        if self.head_dim is not None:
            check_int("head_dim", self.head_dim, minimum=1)
        elif self.kv_lora_rank is None and self.hidden_size % H:
            raise ValueError(f"hidden_size must be divisible by "
                             f"num_attention_heads={H} (or set head_dim), "
                             f"got {self.hidden_size}")
        if self.kv_lora_rank is not None:
            for name in ("kv_lora_rank", "qk_nope_head_dim",
                         "qk_rope_head_dim", "v_head_dim"):
                check_int(name, getattr(self, name), minimum=1)
            if self.q_lora_rank is not None:
                check_int("q_lora_rank", self.q_lora_rank, minimum=1)
        if self.n_routed_experts is not None:
            E = self.n_routed_experts
            check_int("n_routed_experts", E, minimum=1)
            check_int("num_experts_per_tok", self.num_experts_per_tok,
                      minimum=1)
            if self.num_experts_per_tok > E:
                raise ValueError(f"num_experts_per_tok must be <= "
                                 f"n_routed_experts={E}, got "
                                 f"{self.num_experts_per_tok}")
            check_int("moe_intermediate_size", self.moe_intermediate_size,
                      minimum=1)
            check_int("n_shared_experts", self.n_shared_experts, minimum=0)
            check_int("first_k_dense_replace", self.first_k_dense_replace,
                      minimum=0)
            if self.n_group is not None:
                check_int("n_group", self.n_group, minimum=1)
                if E % self.n_group:
                    raise ValueError(f"n_group must divide n_routed_experts"
                                     f"={E}, got {self.n_group}")
                check_int("topk_group", self.topk_group, minimum=1)
                if self.topk_group > self.n_group:
                    raise ValueError(f"topk_group must be <= n_group="
                                     f"{self.n_group}, got "
                                     f"{self.topk_group}")
        # Values that would make a count silently wrong
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS} "
                             f"(silu = a gated SwiGLU FFN, the others a "
                             f"two-matrix MLP), got {self.hidden_act!r}")
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias",
                     "norm_topk_prob"):
            check_bool(name, getattr(self, name))
        check_int("num_nextn_predict_layers", self.num_nextn_predict_layers,
                  minimum=0)
        check_real("routed_scaling_factor", self.routed_scaling_factor,
                   positive=True)
        check_real("rope_theta", self.rope_theta, positive=True)
        # a copy, so that the frozen config cannot change under its user
        object.__setattr__(self, "rope_scaling", check_rope_scaling(
            "rope_scaling", self.rope_scaling))
        if self.rope_scaling is not None and self.position != "rope":
            raise ValueError(f"rope_scaling needs position='rope', got "
                             f"position={self.position!r}")
        for name in ("published_total", "published_active"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), minimum=1)
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError(f"first_k_dense_replace must be <= "
                             f"num_hidden_layers={self.num_hidden_layers}, "
                             f"got {self.first_k_dense_replace}")
        if (self.n_routed_experts is None
                or self.first_k_dense_replace > 0) \
                and self.intermediate_size < 1:
            raise ValueError(f"intermediate_size must be >= 1 when some "
                             f"layer has a dense FFN, got "
                             f"{self.intermediate_size}")

    # Convenience views used by params.py and kv_cache.py.
    @property
    def is_mla(self) -> bool:
        """True if attention is multi-head latent attention (chapter 10)."""
        return self.kv_lora_rank is not None

    @property
    def attention_head_dim(self) -> int:
        """Width of one query/key/value head: ``head_dim``, or D / H."""
        return self.head_dim if self.head_dim is not None else \
            self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        """True if some layers are mixtures of experts (chapter 11)."""
        return self.n_routed_experts is not None

    @property
    def n_moe_layers(self) -> int:
        """Layers whose FFN is a mixture of experts."""
        if not self.is_moe:
            return 0
        return max(self.num_hidden_layers - self.first_k_dense_replace, 0)


def check_model_config(config) -> ModelConfig:
    """``config`` must be a :class:`ModelConfig`; returns it."""
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got "
                        f"{type(config).__name__}")
    return config


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

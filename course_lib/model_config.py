r"""The configuration of a decoder-only language model, as released.

A :class:`ModelConfig` holds the fields of a model's released
``config.json`` that decide its parameter count and its KV-cache size,
under the Hugging Face names (``hidden_size``, ``num_hidden_layers``,
``num_key_value_heads``, ``kv_lora_rank``, ``n_routed_experts`` ...), so
that code written for these objects also reads a ``transformers``
config. Three course fields say what the names do not: ``position``
(learned table or RoPE), ``norm`` (LayerNorm with weight and bias, or
RMSNorm with a weight only) and the published sizes with their source.
The published values themselves are in :mod:`course_lib.model_configs`.

Shape letters used in comments: V vocabulary, D ``hidden_size``, $N$
(``num_hidden_layers``) layers, H query heads, G key/value heads, E
routed experts, k experts per token.

Introduced in chapter 12.
"""
from __future__ import annotations

from dataclasses import dataclass

from .validation import check_int, check_real
from .yarn import check_rope_scaling

__all__ = ["ModelConfig", "check_model_config"]


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
    it states none); ``course_lib.params.count_parameters`` recomputes
    them from the architecture.

    Introduced in chapter 12.
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
        # Values that would make a count silently wrong (probe finding 15)
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS} "
                             f"(silu = a gated SwiGLU FFN, the others a "
                             f"two-matrix MLP), got {self.hidden_act!r}")
        for name in ("tie_word_embeddings", "attention_bias", "mlp_bias",
                     "norm_topk_prob"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got "
                                 f"{getattr(self, name)!r}")
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
        raise ValueError(f"config must be a ModelConfig, got "
                         f"{type(config).__name__}")
    return config

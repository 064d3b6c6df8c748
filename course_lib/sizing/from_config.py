r"""Build the course's model for a configuration of a published model.

:func:`build_small_model` turns a (shrunken)
:class:`~course_lib.sizing.configs.ModelConfig` into a
:class:`~course_lib.model.decoder_lm.DecoderLM` made of the course's modules:
grouped-query or multi-head latent attention (chapter 10), dense FFNs and
mixture-of-experts layers (chapter 11). Its parameter count must equal
the closed form of :func:`course_lib.sizing.params.count_parameters`, which is
how chapter 12's formulas are tested against real modules.
"""
from __future__ import annotations

from ..model.block import FeedForward, SwiGLU
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..model.mla import MLAConfig, MultiHeadLatentAttention
from ..model.moe import MoE
from ..model.routing import DeepSeekV3Router, TopKRouter
from .configs import ModelConfig, check_model_config
from .params import count_parameters

__all__ = ["build_small_model"]


def build_small_model(config: ModelConfig, *, max_params: int = 20_000_000):
    r"""Build the course_lib model that ``config`` describes, so that
    ``sum(p.numel())`` can be checked against :func:`count_parameters`.

    A :class:`~course_lib.model.decoder_lm.DecoderLM` with the config's shapes;
    ``attention_factory`` gives every layer a
    :class:`~course_lib.model.mla.MultiHeadLatentAttention` for an MLA config,
    and ``ffn_factory`` gives layers $\ge$ ``first_k_dense_replace`` an
    :class:`~course_lib.model.moe.MoE` (DeepSeek-V3 router for
    ``scoring_func="sigmoid"``, softmax top-$k$ otherwise) and the first
    ones a dense SwiGLU. Only shrunken configs fit in memory.

    Args:
        config: a ModelConfig whose biases are all on (GPT-2) or all off,
            with ``head_dim`` None or $D/H$.
        max_params: refuse to build more than this many parameters.

    Returns:
        A ``DecoderLM``.
    """
    c = check_model_config(config)
    total = count_parameters(c).total
    if total > max_params:
        raise ValueError(f"config {c.name!r} has {total:,} parameters, more "
                         f"than max_params={max_params:,}: shrink it first")
    bias = c.attention_bias
    if c.mlp_bias != bias or (c.norm == "layer") != bias:
        raise ValueError(f"build_small_model needs attention_bias, mlp_bias "
                         f"and a LayerNorm all on or all off, got "
                         f"attention_bias={bias}, mlp_bias={c.mlp_bias}, "
                         f"norm={c.norm!r}")
    D, H = c.hidden_size, c.num_attention_heads
    if not c.is_mla and c.attention_head_dim * H != D:
        raise ValueError(f"head_dim must be None or hidden_size / heads = "
                         f"{D // H}, got {c.head_dim}")
    if c.rope_scaling is not None and not c.is_mla:
        raise ValueError("rope_scaling (YaRN) is implemented for MLA "
                         "attention only (course_lib.model.mla); got it on "
                         f"config {c.name!r} without kv_lora_rank")
    swiglu = c.hidden_act == "silu"
    lm_cfg = DecoderLMConfig(
        vocab_size=c.vocab_size, d_model=D, n_heads=H,
        n_kv_heads=c.num_key_value_heads, n_layers=c.num_hidden_layers,
        d_ff=max(c.intermediate_size, 1),
        max_len=c.max_position_embeddings, positions=c.position,
        rope_base=c.rope_theta,
        norm=c.norm, ffn="swiglu" if swiglu else "gelu", bias=bias,
        tie_embeddings=c.tie_word_embeddings)

    mla = None
    if c.is_mla:
        mla = MLAConfig(
            hidden_size=D, num_attention_heads=H, q_lora_rank=c.q_lora_rank,
            kv_lora_rank=c.kv_lora_rank, qk_nope_head_dim=c.qk_nope_head_dim,
            qk_rope_head_dim=c.qk_rope_head_dim, v_head_dim=c.v_head_dim,
            attention_bias=c.attention_bias, rope_theta=c.rope_theta,
            rope_scaling=c.rope_scaling)

    def make_attention(i: int):
        return MultiHeadLatentAttention(mla)

    def make_ffn(i: int):
        E, k = c.n_routed_experts, c.num_experts_per_tok
        if i < c.first_k_dense_replace:
            return SwiGLU(D, c.intermediate_size) if swiglu else \
                FeedForward(D, c.intermediate_size, activation="gelu",
                            bias=c.mlp_bias)
        if c.scoring_func == "sigmoid":
            gate = DeepSeekV3Router(
                D, E, k, n_group=c.n_group or 1,
                topk_group=c.topk_group or 1,
                routed_scaling_factor=c.routed_scaling_factor,
                norm_topk_prob=c.norm_topk_prob)
        else:
            gate = TopKRouter(D, E, k, normalize=c.norm_topk_prob)
        return MoE(D, n_experts=E, top_k=k,
                   d_expert=c.moe_intermediate_size,
                   n_shared_experts=c.n_shared_experts, gate=gate)

    return DecoderLM(lm_cfg,
                     attention_factory=make_attention if c.is_mla else None,
                     ffn_factory=make_ffn if c.is_moe else None)

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
from ..model.moe import moe_from_config
from .configs import ModelConfig, check_model_config
from .params import count_parameters

__all__ = ["build_small_model"]


def build_small_model(config: ModelConfig, *, max_params: int = 20_000_000):
    r"""Build the course_lib model that ``config`` describes, so that
    ``sum(p.numel())`` can be checked against :func:`count_parameters`.

    A :class:`~course_lib.model.decoder_lm.DecoderLM` with the config's shapes
    (its :class:`~course_lib.model.decoder_lm.DecoderLMConfig` has the same
    field names); ``attention_factory`` gives every layer a
    :class:`~course_lib.model.mla.MultiHeadLatentAttention` for an MLA config,
    and ``ffn_factory`` gives layers $\ge$ ``first_k_dense_replace`` an
    :class:`~course_lib.model.moe.MoE` built by
    :func:`~course_lib.model.moe.moe_from_config` (DeepSeek-V3 router for
    ``scoring_func="sigmoid"``, softmax top-$k$ otherwise) and the first
    ones a dense FFN. Only shrunken configs fit in memory.

    Args:
        config: a ModelConfig with ``head_dim`` None or $D/H$;
            ``attention_bias`` and ``mlp_bias`` are passed on, and a
            LayerNorm has its bias.
        max_params: refuse to build more than this many parameters.

    Returns:
        A ``DecoderLM``.
    """
    c = check_model_config(config)
    total = count_parameters(c).total
    if total > max_params:
        raise ValueError(f"config {c.name!r} has {total:,} parameters, more "
                         f"than max_params={max_params:,}: shrink it first")
    D, H = c.hidden_size, c.num_attention_heads
    if not c.is_mla and c.attention_head_dim * H != D:
        raise ValueError(f"head_dim must be None or hidden_size / heads = "
                         f"{D // H}, got {c.head_dim}")
    if c.rope_scaling is not None and not c.is_mla:
        raise ValueError("rope_scaling (YaRN) is implemented for MLA "
                         "attention only (course_lib.model.mla); got it on "
                         f"config {c.name!r} without kv_lora_rank")
    # the course's GELU is the exact one; GPT-2's "gelu_new" (tanh
    # approximation) has the same parameters
    act = "gelu" if c.hidden_act == "gelu_new" else c.hidden_act
    swiglu = act == "silu"
    lm_cfg = DecoderLMConfig(
        vocab_size=c.vocab_size, hidden_size=D, num_attention_heads=H,
        num_key_value_heads=c.num_key_value_heads,
        num_hidden_layers=c.num_hidden_layers,
        intermediate_size=max(c.intermediate_size, 1),
        max_position_embeddings=c.max_position_embeddings,
        position=c.position, rope_theta=c.rope_theta, norm=c.norm,
        hidden_act=act,
        attention_bias=c.attention_bias, mlp_bias=c.mlp_bias,
        tie_word_embeddings=c.tie_word_embeddings)

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
        if i < c.first_k_dense_replace:
            return SwiGLU(D, c.intermediate_size, bias=c.mlp_bias) \
                if swiglu else FeedForward(D, c.intermediate_size,
                                           activation=act, bias=c.mlp_bias)
        return moe_from_config(c)

    return DecoderLM(lm_cfg,
                     attention_factory=make_attention if c.is_mla else None,
                     ffn_factory=make_ffn if c.is_moe else None)

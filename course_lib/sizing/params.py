r"""Counting parameters: total, active per token, and the bytes they take.

A decoder-only model's weights sit in a few kinds of places. With $V$
the vocabulary, $D$ the width, $N$ layers, $H$ query heads, $G$
key/value heads of width $d_h$, a dense FFN of width $I$, and $E$
routed experts of width $I_e$ of which $k$ serve each token:

- embedding $VD$ (plus $PD$ for a learned table of $P$ positions);
- attention per layer: $2DHd_h + 2DGd_h$ for MHA/GQA, or the q path,
  kv path and $W^O$ of multi-head latent attention (chapter 10);
- FFN per layer: $3DI$ for SwiGLU, $2DI$ for a GELU MLP; in a mixture
  of experts (chapter 11) a router $ED$, $E \cdot 3DI_e$ routed and
  $n_s \cdot 3DI_e$ shared expert weights;
- norms: $D$ (RMSNorm) or $2D$ (LayerNorm) each, two per layer + one;
- ``lm_head`` $DV$, unless tied to the embedding.

**Active** parameters are those one token's forward pass uses: every
parameter except the routed experts the router did not choose, i.e. the
total minus $(E - k) \cdot 3DI_e$ per MoE layer. Conventions differ on
the input embedding table, of which a token reads a single row (no
multiplication), so both are given: ``active`` counts it (Mistral AI's
12.9B for Mixtral-8x7B is consistent with this), ``active_non_embedding``
does not (DeepSeek-V3's 37B and Kimi K2's 32B are consistent with this;
it is also the $N$ of Kaplan et al.'s $C \approx 6ND$). ``lm_head`` is
a full matrix product, so both count it.

Buffers (DeepSeek-V3's expert-bias $b_i$, RoPE tables) are not
parameters: they are not trained by gradient descent and are not counted.

Config attributes are read as in :mod:`course_lib.sizing.configs`
(Hugging Face names). Letters: V, D, N, H, G, d_h, I, E, k as above.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from numbers import Real

from torch import nn

from .._util.validation import check_bool, check_int, check_type
from ..model.block import ffn_param_count, swiglu_param_count
from ..model.mha import mha_param_count
from ..model.mla import mla_param_count
from .configs import ModelConfig, check_model_config

__all__ = ["BYTES_PER_PARAM", "embedding_params", "mla_attention_params",
           "attention_params", "dense_ffn_params", "expert_params",
           "moe_layer_params", "norm_params", "lm_head_params", "mtp_params",
           "num_parameters", "ParamCount", "count_parameters",
           "total_and_active", "weights_bytes"]

# Storage per parameter; fp8 is DeepSeek-V3's and Kimi K2's release format.
BYTES_PER_PARAM = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int4": 0.5}


# ------------------------------------------------------------ components
def embedding_params(config: ModelConfig) -> int:
    r"""Token table $VD$, plus $PD$ for learned positions (GPT-2).
    """
    c = check_model_config(config)
    n = c.vocab_size * c.hidden_size                          # E: (V, D)
    if c.position == "learned":
        n += c.max_position_embeddings * c.hidden_size        # P: (P, D)
    return n


def mla_attention_params(config: ModelConfig) -> int:
    r"""One multi-head latent attention layer: chapter 10's closed form,
    :func:`course_lib.model.mla.mla_param_count`, applied to a published
    configuration.
    """
    c = check_model_config(config)
    if not c.is_mla:
        raise ValueError(f"config must be MLA (kv_lora_rank set), got "
                         f"kv_lora_rank=None for {c.name!r}")
    return mla_param_count(c)


def attention_params(config: ModelConfig) -> int:
    r"""One attention layer: $D H d_h + 2 D G d_h + H d_h D$ (+ biases
    $H d_h + 2 G d_h + D$) for MHA/GQA/MQA, chapter 5's closed form
    :func:`~course_lib.model.mha.mha_param_count`; MLA is delegated to
    :func:`mla_attention_params`.
    """
    c = check_model_config(config)
    if c.is_mla:
        return mla_attention_params(c)
    return mha_param_count(d_model=c.hidden_size,
                           n_heads=c.num_attention_heads,
                           n_kv_heads=c.num_key_value_heads,
                           bias=c.attention_bias,
                           head_dim=c.attention_head_dim)


def dense_ffn_params(config: ModelConfig, *, width: int | None = None
                     ) -> int:
    r"""One dense FFN of hidden width $I$ (default ``intermediate_size``):
    SwiGLU $3DI$ (``hidden_act`` silu; + biases $2I + D$ with
    ``mlp_bias``), else a two-matrix MLP $2DI$ (+ biases $I + D$): chapter
    6's closed forms :func:`~course_lib.model.block.swiglu_param_count`
    and :func:`~course_lib.model.block.ffn_param_count`. Width 0 (a model
    without dense layers) has none.
    """
    c = check_model_config(config)
    I = c.intermediate_size if width is None else width
    check_int("width", I, minimum=0)
    if I == 0:
        return 0
    if c.hidden_act == "silu":
        # gate_proj, up_proj (D, I); down_proj (I, D)
        return swiglu_param_count(d_model=c.hidden_size, d_ff=I,
                                  bias=c.mlp_bias)
    # c_fc (D, I), c_proj (I, D)
    return ffn_param_count(d_model=c.hidden_size, d_ff=I, bias=c.mlp_bias)


def expert_params(config: ModelConfig) -> int:
    r"""One expert: a SwiGLU of width ``moe_intermediate_size``, $3DI_e$
    (:func:`~course_lib.model.block.swiglu_param_count`).
    """
    c = check_model_config(config)
    if not c.is_moe:
        raise ValueError(f"config must be MoE (n_routed_experts set), got "
                         f"n_routed_experts=None for {c.name!r}")
    return swiglu_param_count(d_model=c.hidden_size,
                              d_ff=c.moe_intermediate_size)


def moe_layer_params(config: ModelConfig) -> dict[str, int]:
    r"""One MoE layer: router $ED$ (``gate``), routed experts $E \cdot
    3DI_e$, shared experts $n_s \cdot 3DI_e$. Returns the three parts.
    """
    c = check_model_config(config)
    e = expert_params(c)
    return {"router": c.n_routed_experts * c.hidden_size,   # (E, D)
            "routed_experts": c.n_routed_experts * e,
            "shared_experts": c.n_shared_experts * e}


def norm_params(config: ModelConfig) -> int:
    r"""All block norms: $(2N + 1)$ norms of $D$ (RMSNorm) or $2D$
    (LayerNorm, weight and bias), plus the QK-norms of ``qk_norm``: per
    layer $2 d_h$ (``"head"``: one RMSNorm of $d_h$ shared by the query
    heads, one by the key heads, as in Qwen3) or $H d_h + G d_h$
    (``"full"``: over the whole projections, as in OLMoE). MLA's two
    latent norms are counted in :func:`mla_attention_params`.
    """
    c = check_model_config(config)
    per = c.hidden_size * (2 if c.norm == "layer" else 1)
    n = (2 * c.num_hidden_layers + 1) * per
    if c.qk_norm is not None:
        d_h = c.attention_head_dim
        G = c.num_key_value_heads or c.num_attention_heads
        per_layer = 2 * d_h if c.qk_norm == "head" else \
            (c.num_attention_heads + G) * d_h
        n += c.num_hidden_layers * per_layer
    return n


def lm_head_params(config: ModelConfig) -> int:
    r"""Output projection $DV$, or 0 when tied to the embedding.
    """
    c = check_model_config(config)
    return 0 if c.tie_word_embeddings else c.hidden_size * c.vocab_size


def mtp_params(config: ModelConfig, *, with_copies: bool = True) -> int:
    r"""The multi-token-prediction modules (DeepSeek-V3 sec. 2.2), which
    the published totals leave out. Each holds a projection $M \in
    \mathbb{R}^{D \times 2D}$ (``eh_proj``), three norms (two on its
    inputs, one before the head) and one MoE block. Embedding and output
    head are shared with the main model, but the released checkpoint
    stores copies of both ($2VD$): ``with_copies`` counts them.
    """
    c = check_model_config(config)
    check_bool("with_copies", with_copies)
    D = c.hidden_size
    block = attention_params(c) + 2 * D
    block += sum(moe_layer_params(c).values()) if c.is_moe \
        else dense_ffn_params(c)
    one = 2 * D * D + 3 * D + block
    if with_copies:
        one += 2 * c.vocab_size * D
    return c.num_nextn_predict_layers * one


# ------------------------------------------------------------ the total
def num_parameters(model: nn.Module) -> int:
    """Distinct parameter scalars of a built model (a tied matrix counts
    once): what every closed form here must equal, from chapter 5's
    attention to :func:`count_parameters` of a whole configuration.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    return sum(p.numel() for p in model.parameters())



@dataclass(frozen=True)
class ParamCount:
    """Parameters of a model by component, the total and the active count
    per token with and without the input embedding table (see the module
    docstring for the two conventions).
    """
    embedding: int
    attention: int
    dense_ffn: int
    routed_experts: int
    shared_experts: int
    router: int
    norms: int
    lm_head: int
    total: int
    active: int
    active_non_embedding: int

    def as_dict(self) -> dict[str, int]:
        """Field name -> count, in declaration order."""
        return asdict(self)

    def components(self) -> dict[str, int]:
        """The eight components (they sum to ``total``)."""
        d = self.as_dict()
        for key in ("total", "active", "active_non_embedding"):
            del d[key]
        return d

    def table(self) -> str:
        """A fixed-width table: component, count in billions, share."""
        lines = [f"{'component':<15}{'params (B)':>13}{'share':>9}"]
        for name, n in self.components().items():
            lines.append(f"{name:<15}{n / 1e9:>13.3f}"
                         f"{n / self.total:>9.1%}")
        lines.append(f"{'total':<15}{self.total / 1e9:>13.3f}")
        lines.append(f"{'active':<15}{self.active / 1e9:>13.3f}")
        lines.append(f"{'active non-emb':<15}"
                     f"{self.active_non_embedding / 1e9:>13.3f}")
        return "\n".join(lines)


def count_parameters(config: ModelConfig) -> ParamCount:
    r"""Analytic parameter count of the model ``config`` describes.

    $$N_\text{total} = VD\,[+PD] + N\,A + N_d F + N_m (ED + (E + n_s)
    \,3DI_e) + (2N + 1)\,n_\text{norm} + [\text{untied}]\,DV,$$

    with $A$ one attention layer, $F$ one dense FFN, $N_d$ =
    ``first_k_dense_replace`` dense layers and $N_m = N - N_d$ MoE layers
    (for a dense model $N_d = N$). Active per token:
    $N_\text{total} - N_m (E - k)\,3DI_e$.

    Args:
        config: a :class:`~course_lib.sizing.configs.ModelConfig`.

    Returns:
        A :class:`ParamCount`.
    """
    c = check_model_config(config)
    N = c.num_hidden_layers
    n_moe = c.n_moe_layers
    n_dense = N - n_moe
    moe = moe_layer_params(c) if c.is_moe else \
        {"router": 0, "routed_experts": 0, "shared_experts": 0}
    parts = dict(
        embedding=embedding_params(c),
        attention=N * attention_params(c),
        dense_ffn=n_dense * dense_ffn_params(c) if n_dense else 0,
        routed_experts=n_moe * moe["routed_experts"],
        shared_experts=n_moe * moe["shared_experts"],
        router=n_moe * moe["router"],
        norms=norm_params(c),
        lm_head=lm_head_params(c))
    total = sum(parts.values())
    unused = 0
    if c.is_moe:
        # experts the router did not pick: (E - k) 3 D I_e per MoE layer
        unused = n_moe * (c.n_routed_experts - c.num_experts_per_tok) \
            * expert_params(c)
    active = total - unused
    return ParamCount(**parts, total=total, active=active,
                      active_non_embedding=active - parts["embedding"])


def total_and_active(config) -> tuple[int, int]:
    r"""``(total, active)`` parameters of a model, from a
    :class:`~course_lib.sizing.configs.ModelConfig` or a mapping of its
    fields (Hugging Face names, as in a ``config.json``; ``name`` may be
    left out).

    ``active`` counts everything one token uses, the input embedding table
    included (the convention of Mistral AI, Qwen and OLMoE; see the module
    docstring): $N_\text{total} - N_\text{MoE}\,(E - k)\,3DI_e$.
    :func:`count_parameters` gives the breakdown and the count without
    the embedding.
    """
    if isinstance(config, Mapping):
        fields = dict(config)
        fields.setdefault("name", "config")
        try:
            config = ModelConfig(**fields)
        except TypeError as exc:       # a field ModelConfig does not have
            raise ValueError(f"config has a field ModelConfig does not "
                             f"know: {exc}") from None
    n = count_parameters(config)
    return n.total, n.active


def weights_bytes(config: ModelConfig, *, bytes_per_param: float,
                  active: bool = False) -> float:
    r"""Bytes to store the weights: $N_\text{total} \times$ bytes per
    parameter (``active=True``: the active ones, what one token reads).

    Args:
        config: a ModelConfig. bytes_per_param: e.g. 2 (bf16), 1 (fp8),
            0.5 (int4); see ``BYTES_PER_PARAM``.
    """
    if isinstance(bytes_per_param, bool) or not isinstance(
            bytes_per_param, Real) or not 0 < bytes_per_param < 1e3:
        raise ValueError(f"bytes_per_param must be a number > 0, got "
                         f"{bytes_per_param!r}")
    check_bool("active", active)
    n = count_parameters(config)
    return (n.active if active else n.total) * bytes_per_param

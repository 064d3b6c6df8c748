r"""The configuration of multi-head latent attention (MLA) and its one
parameter formula: :class:`MLAConfig` (the field names of DeepSeek-V3's
``config.json``), DeepSeek's YaRN ``rope_scaling`` and
:func:`mla_param_count`, the closed form that chapter 12 reuses. The
layer itself is :class:`course_lib.mla.MultiHeadLatentAttention`.

Shape letters as in :mod:`course_lib.mla`: D hidden size, H heads,
$d_c$ ``kv_lora_rank``, $r_q$ ``q_lora_rank``.

Introduced in chapter 10.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .validation import check_attrs, check_int, check_real
from .yarn import check_rope_scaling

__all__ = ["MLAConfig", "mla_param_count", "deepseek_yarn"]


@dataclass
class MLAConfig:
    r"""Hyperparameters of :class:`MultiHeadLatentAttention`, with the
    names of DeepSeek-V3's ``config.json``. Defaults: a small model with
    DeepSeek-V2's ratios ($d_c = 4 d_h$, $d_h^R = d_h / 2$).

    ``rope_interleave=True`` rotates adjacent pairs $(2i, 2i+1)$
    (``apply_rope(..., interleaved=True)``), the layout of DeepSeek's
    checkpoints and of Hugging Face's ``rope_interleave=True``; the
    rotate-half pairing gives different scores with the same weights.

    ``rope_scaling`` is None (plain RoPE) or the YaRN dict of the
    released ``config.json``, same keys and meaning (see
    :mod:`course_lib.yarn`): DeepSeek-V3's (factor 40, 4096 original
    positions, ``mscale`` = ``mscale_all_dim`` = 1) corrects the slow RoPE
    frequencies and multiplies the softmax scale by $(1 + 0.1 \ln 40)^2
    \approx 1.874$. It changes no weight or shape.

    Introduced in chapter 10.
    """
    hidden_size: int = 256          # D, width of the residual stream
    num_attention_heads: int = 8    # H
    q_lora_rank: int | None = 96    # r_q = d_c': query latent; None = q_proj
    kv_lora_rank: int = 128         # d_c: width of the cached latent c^KV
    qk_nope_head_dim: int = 32      # d_h: per-head q^C, k^C (no position)
    qk_rope_head_dim: int = 16      # d_h^R: per-head q^R and shared k^R
    v_head_dim: int = 32            # d_v: per-head value width
    rope_theta: float = 10000.0     # RoPE base b
    rms_norm_eps: float = 1e-6      # epsilon of both latent RMSNorms
    attention_bias: bool = False    # bias on q_a, kv_a and o (not b) projs
    rope_interleave: bool = True    # RoPE pairs (2i, 2i+1), as released
    rope_scaling: dict | None = None  # YaRN keys of config.json; None: off

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "q_lora_rank" and v is None:
                continue
            if f.name == "rope_scaling":
                self.rope_scaling = check_rope_scaling(f.name, v)
                continue
            if f.name in ("rope_theta", "rms_norm_eps"):
                check_real(f.name, v, positive=True)
            elif f.name in ("attention_bias", "rope_interleave"):
                if not isinstance(v, bool):
                    raise ValueError(f"{f.name} must be a bool, got {v!r}")
            else:
                check_int(f.name, v, minimum=1)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates "
                             f"pairs), got {self.qk_rope_head_dim}")

    @property
    def qk_head_dim(self) -> int:
        """$d_h + d_h^R$: width of one head's query and key."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @classmethod
    def deepseek_v3(cls, **overrides) -> "MLAConfig":
        """DeepSeek-V3 (and R1): 7168 wide, 128 heads, $r_q = 1536$,
        $d_c = 512$, $d_h = 128$, $d_h^R = 64$, $d_v = 128$, and the
        released YaRN ``rope_scaling``."""
        return cls(**{**dict(hidden_size=7168, num_attention_heads=128,
                             q_lora_rank=1536, kv_lora_rank=512,
                             qk_nope_head_dim=128, qk_rope_head_dim=64,
                             v_head_dim=128,
                             rope_scaling=deepseek_yarn(mscale=1.0)),
                      **overrides})

    @classmethod
    def deepseek_v2(cls, **overrides) -> "MLAConfig":
        """DeepSeek-V2: as V3 but 5120 wide, YaRN ``mscale`` 0.707."""
        return cls.deepseek_v3(**{"hidden_size": 5120, "rope_scaling":
                                  deepseek_yarn(mscale=0.707), **overrides})

    @classmethod
    def deepseek_v2_lite(cls, **overrides) -> "MLAConfig":
        """DeepSeek-V2-Lite: 2048 wide, 16 heads, full-rank queries."""
        return cls.deepseek_v2(**{"hidden_size": 2048,
                                  "num_attention_heads": 16,
                                  "q_lora_rank": None, **overrides})


def deepseek_yarn(*, mscale: float) -> dict:
    """The ``rope_scaling`` of DeepSeek's config.json files (V2 and
    V2-Lite: ``mscale`` 0.707; V3: 1.0): 4K pretraining extended 40-fold.
    """
    return {"type": "yarn", "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1,
            "mscale": mscale, "mscale_all_dim": mscale}


def mla_param_count(config) -> int:
    r"""Closed-form parameter count of one MLA layer (DeepSeek-V2/V3 names).

    q path: $D r_q + r_q + r_q H (d^{nope} + d^R)$ (``q_a_proj``,
    ``q_a_layernorm``, ``q_b_proj``; or $D H (d^{nope} + d^R)$ without a
    query latent); kv path: $D (d_c + d^R) + d_c + d_c H (d^{nope} +
    d^v)$ (``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``);
    output: $H d^v D$ (``o_proj``). ``attention_bias`` adds biases to
    ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj``, as in
    ``transformers``.

    Args:
        config: an :class:`MLAConfig`, or any configuration with the same
            field names (chapter 12's
            :class:`~course_lib.model_configs.ModelConfig`).

    Returns:
        The number of scalars of :class:`MultiHeadLatentAttention`.

    Introduced in chapter 10.
    """
    check_attrs("config", config, (
        "hidden_size", "num_attention_heads", "kv_lora_rank", "q_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
        "attention_bias"), "an MLA configuration (MLAConfig or ModelConfig)")
    c = config
    D, H, r_kv = c.hidden_size, c.num_attention_heads, c.kv_lora_rank
    d_qk = c.qk_nope_head_dim + c.qk_rope_head_dim            # 192 in V3
    b = int(c.attention_bias)
    if c.q_lora_rank is None:
        q = D * H * d_qk                                      # W^Q
    else:
        r_q = c.q_lora_rank
        # W^{DQ} (+ bias), RMSNorm on c^Q, W^{UQ}
        q = (D * r_q + b * r_q) + r_q + r_q * H * d_qk
    # W^{DKV} and W^{KR} fused (+ bias), RMSNorm on c^KV, W^{UK};W^{UV}
    kv = (D * (r_kv + c.qk_rope_head_dim)
          + b * (r_kv + c.qk_rope_head_dim)) + r_kv \
        + r_kv * H * (c.qk_nope_head_dim + c.v_head_dim)
    o = H * c.v_head_dim * D + b * D                          # W^O
    return q + kv + o

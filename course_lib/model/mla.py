r"""Multi-head latent attention (MLA, DeepSeek-V2 and V3): its
configuration, its parameter formula and the layer.

:class:`MLAConfig` holds the field names of DeepSeek-V3's ``config.json``
(with DeepSeek's YaRN ``rope_scaling``); :func:`mla_param_count` is the
closed form that chapter 12 reuses; :class:`MultiHeadLatentAttention` is
the layer, with an explicit and an absorbed path.

Shape letters: D hidden size, H heads, $d_c$ ``kv_lora_rank``, $r_q$
``q_lora_rank``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn

from .._util.validation import (
    check_alloc,
    check_attrs,
    check_bool,
    check_int,
    check_real,
)
from .attention import scaled_dot_product_attention
from .block import RMSNorm
from .kv_cache import LayerKVCache
from .mha import mask_to_4d, query_positions
from .rope import apply_rope
from .yarn import check_rope_scaling, yarn_frequencies, yarn_rope, yarn_scales

__all__ = ["MLAConfig", "deepseek_yarn", "mla_param_count",
           "MultiHeadLatentAttention"]


@dataclass
class MLAConfig:
    r"""Hyperparameters of :class:`MultiHeadLatentAttention`, with the
    names of DeepSeek-V3's ``config.json``. Defaults: a small model with
    DeepSeek-V2's ratios ($d_c = 4 d_h$, $d_h^R = d_h / 2$).

    ``rope_interleave=True`` rotates adjacent pairs $(2i, 2i+1)$
    (``apply_rope(..., interleave=True)``), the layout of DeepSeek's
    checkpoints and of Hugging Face's ``rope_interleave=True``; the
    rotate-half pairing gives different scores with the same weights.

    ``rope_scaling`` is None (plain RoPE) or the YaRN dict of the
    released ``config.json``, same keys and meaning (see
    :mod:`course_lib.model.yarn`): DeepSeek-V3's (factor 40, 4096 original
    positions, ``mscale`` = ``mscale_all_dim`` = 1) corrects the slow RoPE
    frequencies and multiplies the softmax scale by $(1 + 0.1 \ln 40)^2
    \approx 1.874$. It changes no weight or shape.
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
                check_bool(f.name, v)
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
    check_real("mscale", mscale, positive=True)
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
            :class:`~course_lib.sizing.configs.ModelConfig`).

    Returns:
        The number of scalars of :class:`MultiHeadLatentAttention`.
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


class MultiHeadLatentAttention(nn.Module):
    r"""MLA self-attention with an explicit and an absorbed path.

    ``forward(x, mask, positions=..., cache=..., absorb=...)``. The
    explicit path up-projects $k^C, v^C$ for every head from the latents,
    as in the paper's equations. The absorbed path never forms them: it
    folds $W^{UK}$ into the query ($\tilde q_{t,i} = W^{UK\top}_i
    q^C_{t,i}$, width $d_c$), attends over the latents, and applies
    $W^{UV}$ after the weighted sum. Both give the same output (up to
    rounding) and both cache only $c^{KV}$ ``(B, S, d_c)`` and $k^R$
    ``(B, 1, S, d_r)``.

    Args:
        config: an :class:`MLAConfig`.
        absorb: default path of :meth:`forward` (False: explicit).
    """

    def __init__(self, config: MLAConfig, *, absorb: bool = False) -> None:
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise TypeError(f"config must be an MLAConfig, got "
                            f"{type(config).__name__}")
        check_bool("absorb", absorb)
        check_alloc("the parameters of config", mla_param_count(config))
        c = self.config = config
        self.absorb = bool(absorb)
        D, H, bias = c.hidden_size, c.num_attention_heads, c.attention_bias
        if c.q_lora_rank is None:
            # W^Q: [W^{UQ}; W^{QR}] applied to h_t directly (no latent)
            self.q_proj = nn.Linear(D, H * c.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(D, c.q_lora_rank, bias=bias)  # W^{DQ}
            self.q_a_layernorm = RMSNorm(c.q_lora_rank, c.rms_norm_eps)
            # [W^{UQ}; W^{QR}] per head: rows (head i, [nope | rope])
            self.q_b_proj = nn.Linear(c.q_lora_rank, H * c.qk_head_dim,
                                      bias=False)
        # [W^{DKV}; W^{KR}]: latent c^KV and the single shared k^R
        self.kv_a_proj_with_mqa = nn.Linear(
            D, c.kv_lora_rank + c.qk_rope_head_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(c.kv_lora_rank, c.rms_norm_eps)
        # [W^{UK}; W^{UV}] per head: rows (head i, [d_n keys | d_v values])
        self.kv_b_proj = nn.Linear(
            c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim),
            bias=False)
        self.o_proj = nn.Linear(H * c.v_head_dim, D, bias=bias)  # W^O
        # 1 / sqrt(d_h + d_h^R): the width of the concatenated q.k
        self.scale = c.qk_head_dim ** -0.5
        self.omega = None                   # plain RoPE: apply_rope
        if c.rope_scaling is not None:
            # YaRN: corrected frequencies w'_i (float64, not a buffer, so
            # .float() or .half() cannot round them), cos/sin factor and
            # softmax scale x m(s, mscale_all_dim)^2
            self.omega = yarn_frequencies(
                c.qk_rope_head_dim, base=c.rope_theta, **c.rope_scaling)
            self.rope_factor, softmax_factor = yarn_scales(c.rope_scaling)
            self.scale *= softmax_factor

    def extra_repr(self) -> str:
        return f"absorb={self.absorb}"

    def _rope(self, x: torch.Tensor, positions: torch.Tensor):
        if self.omega is not None:                        # YaRN
            return yarn_rope(x, positions, self.omega,
                             interleave=self.config.rope_interleave,
                             rope_factor=self.rope_factor)
        return apply_rope(x, positions, base=self.config.rope_theta,
                          interleave=self.config.rope_interleave)

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        r"""$W^{UK}$ ``(H, d_n, d_c)`` and $W^{UV}$ ``(H, d_v, d_c)``,
        views of ``kv_b_proj.weight``."""
        c = self.config
        w = self.kv_b_proj.weight.view(                      # (H, dn+dv, dc)
            c.num_attention_heads, -1, c.kv_lora_rank)
        return w[:, :c.qk_nope_head_dim], w[:, c.qk_nope_head_dim:]

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
                positions: torch.Tensor | None = None,
                cache: LayerKVCache | None = None,
                absorb: bool | None = None) -> torch.Tensor:
        r"""x ``(B, T, D)`` -> ``(B, T, D)``.

        Args:
            x: hidden states (normalised by the block).
            mask: bool, True = may attend, ``(T, S)``, ``(B, T, S)``,
                ``(B, 1, S)`` or ``(B, 1, T, S)`` over all $S$ keys.
            positions: ``(T,)`` absolute positions for RoPE; default the
                $T$ positions after those already in ``cache``.
            cache: a :class:`~course_lib.model.kv_cache.LayerKVCache`; $c^{KV}$
                and the rotated $k^R$ of the new tokens are appended.
            absorb: path to use; ``None`` means ``self.absorb``.
        """
        c = self.config
        H, dn, dr = c.num_attention_heads, c.qk_nope_head_dim, \
            c.qk_rope_head_dim
        if not isinstance(x, torch.Tensor) or x.dim() != 3 \
                or x.shape[-1] != c.hidden_size:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else x
            raise ValueError(f"x must have shape (B, T, hidden_size="
                             f"{c.hidden_size}), got {got!r:.60}")
        if cache is not None and not isinstance(cache, LayerKVCache):
            raise TypeError(f"cache must be a LayerKVCache, got "
                            f"{type(cache).__name__}")
        if absorb is not None and not isinstance(absorb, bool):
            # the string 'False' would be truthy and pick the other path
            raise TypeError(f"absorb must be None or a bool, got "
                            f"{type(absorb).__name__} {absorb!r:.40}")
        B, T, _ = x.shape
        positions = query_positions(positions, T, cache, x.device)  # (T,)
        absorb = self.absorb if absorb is None else absorb

        # 1) Queries. c^Q = Norm(W^{DQ} h); [q^C; q^R] = [W^{UQ}; W^{QR}] c^Q
        if c.q_lora_rank is None:
            q = self.q_proj(x)                               # (B, T, H*dqk)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q = q.view(B, T, H, c.qk_head_dim).transpose(1, 2)   # (B, H, T, dqk)
        q_nope, q_rope = q.split([dn, dr], dim=-1)           # (B, H, T, dn|dr)
        # 2) q^R_{t,i} = RoPE_t(W^{QR}_i c^Q_t): rotated per head, after W
        q_rope = self._rope(q_rope, positions)               # (B, H, T, dr)

        # 3) [c^KV; k^R] = [W^{DKV}; W^{KR}] h: one latent, one shared key
        kv, k_rope = self.kv_a_proj_with_mqa(x).split(
            [c.kv_lora_rank, dr], dim=-1)                    # (B, T, dc|dr)
        # c^KV = Norm(W^{DKV} h): only the latent is normalised
        kv = self.kv_a_layernorm(kv)                         # (B, T, dc)
        # 4) k^R_t = RoPE_t(W^{KR} h_t), one head shared by all H (as MQA)
        k_rope = self._rope(k_rope[:, None], positions)      # (B, 1, T, dr)
        # 5) The cache holds exactly these two: d_c + d_r numbers per token.
        if cache is not None:
            kv, k_rope = cache.update(kv, k_rope)  # (B,S,dc) (B,1,S,dr)
        S = kv.shape[1]
        mask = mask_to_4d(mask, B, 1, T, S)  # one mask for all heads
        w_uk, w_uv = self.up_weights()              # (H,dn,dc) (H,dv,dc)

        if not absorb:
            # 6e) k^C_{j,i} = W^{UK}_i c^KV_j ; v^C_{j,i} = W^{UV}_i c^KV_j
            k_nope = torch.einsum("bsc,hdc->bhsd", kv, w_uk)  # (B, H, S, dn)
            v = torch.einsum("bsc,hdc->bhsd", kv, w_uv)       # (B, H, S, dv)
            # 7e) k_{j,i} = [k^C_{j,i}; k^R_j] (k^R broadcast to all heads),
            #     q_{t,i} = [q^C_{t,i}; q^R_{t,i}]
            k = torch.cat([k_nope, k_rope.expand(B, H, S, dr)],
                          dim=-1)                            # (B, H, S, dqk)
            q = torch.cat([q_nope, q_rope], dim=-1)          # (B, H, T, dqk)
            # 8e) o_{t,i} = sum_j softmax_j(q.k / sqrt(dn + dr)) v^C_{j,i}
            out, _ = scaled_dot_product_attention(
                q, k, v, mask, scale=self.scale)             # (B, H, T, dv)
        else:
            # 6a) q^C.(W^{UK} c) = (W^{UK,T} q^C).c : fold W^{UK} into q
            q_lat = torch.einsum("bhtd,hdc->bhtc", q_nope, w_uk)  # (B,H,T,dc)
            # 7a) MQA in latent space: one shared key [c^KV; k^R] of width
            #     d_c + d_r and one shared value c^KV for all heads
            q = torch.cat([q_lat, q_rope], dim=-1)           # (B, H, T, dc+dr)
            k = torch.cat([kv[:, None], k_rope], dim=-1)     # (B, 1, S, dc+dr)
            # 8a) sum_j a_{tj} c^KV_j: attention-weighted sum of latents
            lat, _ = scaled_dot_product_attention(
                q, k, kv[:, None], mask, scale=self.scale)   # (B, H, T, dc)
            # 9a) o_{t,i} = W^{UV}_i (sum_j a_{tj} c^KV_j)
            out = torch.einsum("bhtc,hvc->bhtv", lat, w_uv)  # (B, H, T, dv)
        # 10) u_t = W^O [o_{t,1}; ...; o_{t,H}]
        out = out.transpose(1, 2).reshape(B, T, -1)          # (B, T, H*dv)
        return self.o_proj(out)                              # (B, T, D)

r"""Multi-head latent attention (MLA), as in DeepSeek-V2 and DeepSeek-V3.

MLA caches one small *latent* vector per token instead of every head's
keys and values. For token $t$ with hidden state $h_t$ (equations of the
DeepSeek-V2 paper, sec. 2.1, with the RMSNorms of the released code):

$$c^Q_t = \mathrm{Norm}(W^{DQ} h_t), \quad
q^C_{t,i} = W^{UQ}_i c^Q_t, \quad
q^R_{t,i} = \mathrm{RoPE}_t(W^{QR}_i c^Q_t),$$
$$c^{KV}_t = \mathrm{Norm}(W^{DKV} h_t), \quad
k^R_t = \mathrm{RoPE}_t(W^{KR} h_t), \quad
k^C_{t,i} = W^{UK}_i c^{KV}_t, \quad v^C_{t,i} = W^{UV}_i c^{KV}_t,$$
$$o_{t,i} = \sum_{j \le t} \mathrm{softmax}_j\Big(
\frac{q^C_{t,i} \cdot k^C_{j,i} + q^R_{t,i} \cdot k^R_j}
{\sqrt{d_h + d_h^R}}\Big)\, v^C_{j,i}, \qquad
u_t = W^O [o_{t,1}; \dots; o_{t,H}].$$

With YaRN ``rope_scaling`` (DeepSeek-V3's 128K context) RoPE uses
corrected frequencies and the scale is multiplied by $m^2 \approx 1.874$
(:mod:`course_lib.yarn`).

Only $c^{KV}_t$ and $k^R_t$ are cached: $d_c + d_h^R$ numbers per token
and layer (576 in DeepSeek-V3, against $2 \cdot 128 \cdot 128 = 32768$
for multi-head attention with the same heads). Because
$q^C \cdot (W^{UK} c) = (W^{UK\top} q^C) \cdot c$, the key up-projection
can be moved to the query side ("absorbed") and the value up-projection
applied after the weighted sum, so scores are computed in the latent
space. RoPE sits on separate, decoupled dimensions: a position-dependent
rotation between $W^{UQ}$ and $W^{UK}$ would make that product depend on
the positions, and no fixed matrix could be absorbed.

Shape letters: B batch, T new tokens, S cached + new tokens, D hidden
size, H heads, $d_n$ ``qk_nope_head_dim`` ($d_h$), $d_r$
``qk_rope_head_dim`` ($d_h^R$), $d_v$ ``v_head_dim``, $d_c$
``kv_lora_rank``, $r_q$ ``q_lora_rank`` ($d_c'$).

Module names follow Hugging Face's ``DeepseekV3Attention`` (and hence
the released checkpoints); DeepSeek's own ``inference/model.py`` calls
them ``wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo``. The configuration
and the parameter formula are in :mod:`course_lib.mla_config` (importable
from here too).

Introduced in chapter 10.
"""
from __future__ import annotations

import torch
from torch import nn

from .attention import scaled_dot_product_attention
from .kv_cache import LayerKVCache
from .layers import RMSNorm
from .mha import mask_to_4d, query_positions
from .mla_config import MLAConfig, deepseek_yarn, mla_param_count
from .positional import apply_rope
from .yarn import yarn_frequencies, yarn_rope, yarn_scales

__all__ = ["MLAConfig", "MultiHeadLatentAttention", "mla_param_count",
           "deepseek_yarn"]


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

    Introduced in chapter 10.
    """

    def __init__(self, config: MLAConfig, *, absorb: bool = False) -> None:
        super().__init__()
        if not isinstance(config, MLAConfig):
            raise ValueError(f"config must be an MLAConfig, got "
                             f"{type(config).__name__}")
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
                             interleaved=self.config.rope_interleave,
                             rope_factor=self.rope_factor)
        return apply_rope(x, positions, base=self.config.rope_theta,
                          interleaved=self.config.rope_interleave)

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
            cache: a :class:`~course_lib.kv_cache.LayerKVCache`; $c^{KV}$
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
            raise ValueError(f"cache must be a LayerKVCache, got "
                             f"{type(cache).__name__}")
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

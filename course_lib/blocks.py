r"""Transformer layers: the paper's post-norm encoder and decoder layers,
and the pre-norm block of today's decoder-only models.

The paper (Vaswani et al. 2017, sec. 3.1) wraps every sub-layer in a
residual connection followed by LayerNorm, $\mathrm{LN}(x +
\mathrm{Sublayer}(x))$, with dropout on the sub-layer output (sec. 5.4).
An encoder layer $l$ maps $H^{l-1}$ to $H^l$:

$$A = \mathrm{LN}\big(H^{l-1} + \mathrm{Drop}(\mathrm{MHA}(H^{l-1}))\big),
\qquad H^l = \mathrm{LN}\big(A + \mathrm{Drop}(\mathrm{FFN}(A))\big).$$

A decoder layer adds, between the two, cross-attention whose queries come
from the decoder and whose keys and values come from the encoder output
$H_E^N$ (the *memory*). GPT-2 and Llama moved the norm *inside* the
residual branch (*pre-norm*), $x + \mathrm{Sublayer}(\mathrm{Norm}(x))$,
which keeps an identity path from the output to the input.

Shape letters: B batch, T target (decoder) length, S source (encoder)
length, D = ``d_model``, H heads.

Introduced in chapter 6.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .attention import scaled_dot_product_attention
from .kv_cache import LayerKVCache
from .layers import FeedForward, make_norm
from .mha import MultiHeadAttention, merge_heads, repeat_kv, split_heads
from .positional import apply_rope

__all__ = ["EncoderLayer", "DecoderLayer", "DecoderBlock", "RoPEAttention"]


class EncoderLayer(nn.Module):
    r"""Post-norm encoder layer of the paper: self-attention, then FFN,
    each followed by dropout, the residual sum and LayerNorm.

    Submodule names match ``torch.nn.TransformerEncoderLayer``
    (``norm1``, ``norm2``, ``dropout1``, ``dropout2``; the FFN's
    ``linear1``, ``linear2``), so weights copy across.

    Args:
        d_model: $D$ (512 in the paper). n_heads: $h$ (8).
        d_ff: FFN hidden width (2048). dropout: $P_{drop}$ (0.1).
        eps: LayerNorm epsilon.

    Introduced in chapter 6.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *,
                 dropout: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, S, D) -> (B, S, D). mask: bool, True = may attend,
        usually the source padding mask (B, 1, S)."""
        # A = LN(H + Drop(MHA(H, H, H)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, mask=mask)))
        # H' = LN(A + Drop(FFN(A)))
        return self.norm2(x + self.dropout2(self.ffn(x)))     # (B, S, D)


class DecoderLayer(nn.Module):
    r"""Post-norm decoder layer: masked self-attention, cross-attention on
    the encoder output, FFN; each followed by dropout, residual, LayerNorm.

    Names match ``torch.nn.TransformerDecoderLayer`` (``self_attn``,
    ``multihead_attn`` is here ``cross_attn``, ``norm1..3``,
    ``dropout1..3``).

    Args: as :class:`EncoderLayer`.

    Introduced in chapter 6.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *,
                 dropout: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.ffn = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=eps)
        self.norm2 = nn.LayerNorm(d_model, eps=eps)
        self.norm3 = nn.LayerNorm(d_model, eps=eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                tgt_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None, *,
                return_weights: bool = False):
        """One decoder layer.

        Args:
            x: ``(B, T, D)`` decoder states. memory: ``(B, S, D)``, the
                encoder output $H_E^N$.
            tgt_mask: bool (T, T) or (B, T, T): causal (AND padding).
            memory_mask: bool, usually the source padding mask (B, 1, S).
            return_weights: also return the cross-attention weights.

        Returns:
            ``(B, T, D)``, and with ``return_weights`` the cross-attention
            weights ``(B, H, T, S)``.
        """
        # 1) A = LN(X + Drop(MaskedMHA(X, X, X)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, mask=tgt_mask)))
        # 2) C = LN(A + Drop(MHA(A, H_E, H_E))): Q from the decoder,
        #    K and V from the encoder output.
        c, w = self.cross_attn(x, memory, mask=memory_mask,
                               return_weights=True)          # (B, T, D)
        x = self.norm2(x + self.dropout2(c))
        # 3) H' = LN(C + Drop(FFN(C)))
        x = self.norm3(x + self.dropout3(self.ffn(x)))       # (B, T, D)
        return (x, w) if return_weights else x


class RoPEAttention(MultiHeadAttention):
    r"""Self-attention with rotary positions applied to $q$ and $k$.

    Same weights and arguments as :class:`MultiHeadAttention` (GQA
    included); after the projections, each head's queries and keys are
    rotated by :func:`~course_lib.positional.apply_rope` (never the
    values). Uses the "rotate half" pairing $(i, i + d_k/2)$ of the
    Llama code, or with ``interleaved=True`` the pairs $(2i, 2i+1)$ of
    the RoPE paper and llama.cpp (chapter 13); ``fused=True`` runs the
    attention itself in torch's fused kernel. ``base`` is $b$ in
    $\theta_i = b^{-2i/d_k}$. ``positions`` (T,) default to $0, \dots,
    T-1$, or with a KV cache (chapter 9) to the $T$ positions after the
    cached ones.

    Introduced in chapter 6.
    """

    def __init__(self, d_model: int, n_heads: int, *,
                 n_kv_heads: int | None = None, bias: bool = False,
                 base: float = 10000.0, interleaved: bool = False,
                 fused: bool = False) -> None:
        super().__init__(d_model, n_heads, n_kv_heads=n_kv_heads, bias=bias)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got "
                             f"{self.head_dim}")
        for name, flag in (("interleaved", interleaved), ("fused", fused)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be a bool, got {flag!r}")
        self.base = base
        self.interleaved = interleaved
        self.fused = fused            # torch's fused kernel (chapter 13)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, positions: torch.Tensor | None = None,
                cache: LayerKVCache | None = None) -> torch.Tensor:
        """x (B, T, D) -> (B, T, D); mask as in MultiHeadAttention, over
        all $S$ keys (cached + new). With ``cache``, the rotated keys and
        the values are appended to it, so cached keys are never rotated
        again: their positions were fixed when they were computed."""
        self._inputs(x, None)
        B, T, D = x.shape
        if positions is None:
            # the T positions after those already cached (0.. without one)
            past = len(cache) if cache is not None else 0
            positions = torch.arange(past, past + T, device=x.device)  # (T,)
        q = split_heads(self.q_proj(x), self.n_heads)        # (B, H, T, d_k)
        k = split_heads(self.k_proj(x), self.n_kv_heads)     # (B, G, T, d_k)
        v = split_heads(self.v_proj(x), self.n_kv_heads)     # (B, G, T, d_k)
        # Rotate q and k by their positions: q_m . k_n depends on m - n.
        q = apply_rope(q, positions, base=self.base,
                       interleaved=self.interleaved)
        k = apply_rope(k, positions, base=self.base,
                       interleaved=self.interleaved)
        if cache is not None:
            k, v = cache.update(k, v)                        # (B, G, S, d_k)
        mask = self._mask4d(mask, B, T, k.shape[2])
        if self.fused:
            out = _fused_gqa(q, k, v, mask)                  # (B, H, T, d_k)
            return self.o_proj(merge_heads(out))             # (B, T, D)
        k = repeat_kv(k, self.n_rep)                         # (B, H, S, d_k)
        v = repeat_kv(v, self.n_rep)                         # (B, H, S, d_k)
        out = scaled_dot_product_attention(q, k, v, mask)    # (B, H, T, d_k)
        return self.o_proj(merge_heads(out))                 # (B, T, D)


def _fused_gqa(q, k, v, mask):
    """torch's fused attention, each K/V head read by its query heads in
    the kernel (``enable_gqa``: no repeated copies, as ``transformers``
    runs Llama); a query row with no allowed key gives zeros, as in
    :func:`~course_lib.attention.scaled_dot_product_attention`."""
    gqa = q.shape[1] != k.shape[1]
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
    has_key = mask.any(dim=-1, keepdim=True)                 # (.., T, 1)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | ~has_key, enable_gqa=gqa)  # (B, H, T, d_k)
    return out * has_key


class DecoderBlock(nn.Module):
    r"""Pre-norm block with injected attention and FFN:

    $$x \leftarrow x + \mathrm{Drop}(\mathrm{Attn}(\mathrm{Norm}_1(x))),
    \qquad x \leftarrow x + \mathrm{Drop}(\mathrm{FFN}(\mathrm{Norm}_2(x))).$$

    The attention module is called as ``attention(h, mask=mask,
    **attn_kwargs)`` (:class:`MultiHeadAttention`, :class:`RoPEAttention`,
    later MLA) and the FFN as ``ffn(h)`` (:class:`FeedForward`,
    :class:`SwiGLU`, later a mixture of experts). An FFN may return a
    tuple ``(out, aux)`` (e.g. an MoE's load-balancing loss); the block
    then returns ``(x, aux)`` instead of ``x``.

    Args:
        d_model: $D$. attention, ffn: the two sub-layers.
        norm: ``"rms"`` (Llama) or ``"layer"`` (GPT-2).
        norm_bias: LayerNorm bias (ignored for RMSNorm).
        eps: norm epsilon (default $10^{-6}$ rms, $10^{-5}$ layer).
        dropout: residual dropout on each sub-layer output.

    Introduced in chapter 6.
    """

    def __init__(self, d_model: int, *, attention: nn.Module,
                 ffn: nn.Module, norm: str = "rms", norm_bias: bool = True,
                 eps: float | None = None, dropout: float = 0.0) -> None:
        super().__init__()
        for name, mod in (("attention", attention), ("ffn", ffn)):
            if not isinstance(mod, nn.Module):
                raise ValueError(f"{name} must be an nn.Module, got "
                                 f"{type(mod).__name__}")
        self.norm1 = make_norm(norm, d_model, eps=eps, bias=norm_bias)
        self.attention = attention
        self.norm2 = make_norm(norm, d_model, eps=eps, bias=norm_bias)
        self.ffn = ffn
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                **attn_kwargs):
        """x (B, T, D) -> (B, T, D), or ((B, T, D), aux); see above."""
        # x = x + Attn(Norm1(x)): the identity path is never normalised.
        a = self.attention(self.norm1(x), mask=mask, **attn_kwargs)
        x = x + self.dropout(a)                              # (B, T, D)
        # x = x + FFN(Norm2(x))
        f = self.ffn(self.norm2(x))
        f, aux = f if isinstance(f, tuple) else (f, None)
        x = x + self.dropout(f)                              # (B, T, D)
        return x if aux is None else (x, aux)

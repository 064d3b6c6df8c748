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
from torch import nn

from typing import TYPE_CHECKING

from .layers import FeedForward, make_norm
from .mha import MultiHeadAttention

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    from .kv_cache import LayerKVCache

__all__ = ["EncoderLayer", "DecoderLayer", "DecoderBlock"]


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
        self.norm1 = make_norm("layer", d_model, eps=eps)
        self.norm2 = make_norm("layer", d_model, eps=eps)
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
        self.norm1 = make_norm("layer", d_model, eps=eps)
        self.norm2 = make_norm("layer", d_model, eps=eps)
        self.norm3 = make_norm("layer", d_model, eps=eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                tgt_mask: torch.Tensor | None = None,
                memory_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One decoder layer: ``(B, T, D)`` states in, ``(B, T, D)`` out.

        Args:
            x: ``(B, T, D)`` decoder states. memory: ``(B, S, D)``, the
                encoder output $H_E^N$.
            tgt_mask: bool (T, T) or (B, T, T): causal (AND padding).
            memory_mask: bool, usually the source padding mask (B, 1, S).

        :meth:`forward_with_weights` returns the cross-attention weights
        too.
        """
        x, _ = self.forward_with_weights(x, memory, tgt_mask, memory_mask)
        return x                                             # (B, T, D)

    def forward_with_weights(
            self, x: torch.Tensor, memory: torch.Tensor,
            tgt_mask: torch.Tensor | None = None,
            memory_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`, and the cross-attention weights ``(B, H, T,
        S)``: row $t$ of head $i$ says which source positions target
        position $t$ read."""
        # 1) A = LN(X + Drop(MaskedMHA(X, X, X)))
        x = self.norm1(x + self.dropout1(self.self_attn(x, mask=tgt_mask)))
        # 2) C = LN(A + Drop(MHA(A, H_E, H_E))): Q from the decoder,
        #    K and V from the encoder output.
        c, w = self.cross_attn.forward_with_weights(
            x, memory_mask, context=memory)                  # (B, T, D)
        x = self.norm2(x + self.dropout2(c))
        # 3) H' = LN(C + Drop(FFN(C)))
        x = self.norm3(x + self.dropout3(self.ffn(x)))       # (B, T, D)
        return x, w


class DecoderBlock(nn.Module):
    r"""Pre-norm block with injected attention and FFN:

    $$x \leftarrow x + \mathrm{Drop}(\mathrm{Attn}(\mathrm{Norm}_1(x))),
    \qquad x \leftarrow x + \mathrm{Drop}(\mathrm{FFN}(\mathrm{Norm}_2(x))).$$

    The attention module is called as ``attention(h, mask,
    positions=positions, cache=cache)`` (a
    :class:`~course_lib.mha.MultiHeadAttention`, with or without its RoPE
    hook; later MLA) and the FFN as ``ffn(h)`` (:class:`FeedForward`,
    :class:`SwiGLU`, later a mixture of experts). The block always returns
    ``(x, aux)``: ``aux`` is what the FFN reports besides its output (an
    MoE returns ``(out, info)``, chapter 11), ``None`` for a dense FFN.

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
                *, positions: torch.Tensor | None = None,
                cache: LayerKVCache | None = None):
        """x (B, T, D) -> (x (B, T, D), aux); see above. ``mask``,
        ``positions``, ``cache``: passed to the attention."""
        # x = x + Attn(Norm1(x)): the identity path is never normalised.
        a = self.attention(self.norm1(x), mask, positions=positions,
                           cache=cache)
        x = x + self.dropout(a)                              # (B, T, D)
        # x = x + FFN(Norm2(x))
        f = self.ffn(self.norm2(x))
        f, aux = f if isinstance(f, tuple) else (f, None)    # MoE: (out, info)
        x = x + self.dropout(f)                              # (B, T, D)
        return x, aux

r"""Attention maps of a :class:`~course_lib.model.decoder_lm.DecoderLM`.

A forward pass of a decoder-only model computes one attention matrix per
layer and head, $A^{(\ell, i)} = \mathrm{softmax}(Q_i K_i^\top /
\sqrt{d_k} + M)$, and throws it away. :func:`attention_maps` runs the
same computation as :meth:`DecoderLM.forward` block by block, asks each
block's attention for its weights (``forward_with_weights``) on exactly
the input the block gives it, $\mathrm{Norm}_1(x)$, and keeps them. The
rest of each block (residual, FFN) is the block's own code, so the
hidden states, and the logits, are those of the model.

Shape letters: N layers, B batch, H query heads, T length.
"""
from __future__ import annotations

import torch

from .._util.validation import check_token_ids
from ..model.decoder_lm import DecoderLM
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention

__all__ = ["attention_maps"]


@torch.no_grad()
def attention_maps(model: DecoderLM, idx: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Attention weights of every layer and head of ``model`` on ``idx``.

    Block $\ell$ computes $a = \mathrm{Attn}(\mathrm{Norm}_1(x))$, then
    $x \leftarrow x + a$ and $x \leftarrow x + \mathrm{FFN}(\mathrm{Norm}_2
    (x))$, with the causal mask and positions $0, \dots, T-1$ that
    ``model(idx)`` uses; the weights of that attention call are row
    $\ell$ of the result. Every row of each (T, T) map sums to 1 over the
    keys $j \le t$ and is 0 above the diagonal.

    Args:
        model: a :class:`DecoderLM` with dense FFNs or MoE (dropout is
            off: the model should be in eval mode).
        idx: (B, T) token ids, no cache.

    Returns:
        ``(maps, logits)``: the (N, B, H, T, T) weights and the logits
        (B, T, V) of the same pass, equal to ``model(idx)``.
    """
    if not isinstance(model, DecoderLM) or not all(
            isinstance(b.attention, MultiHeadAttention) for b in model.layers):
        raise ValueError(f"model must be a DecoderLM with MultiHeadAttention "
                         f"blocks, got {type(model).__name__}")
    c = model.config
    check_token_ids("idx", idx, c.vocab_size, c.max_position_embeddings)
    T = idx.shape[1]
    positions = torch.arange(T, device=idx.device)           # (T,)
    x = model.embed_tokens(idx)                              # (B, T, D)
    if model.embed_positions is not None:
        x = x + model.embed_positions(positions)             # (B, T, D)
    mask = causal_mask(T, T, device=idx.device)              # (T, T)
    maps = []
    for block in model.layers:
        # 1) the block's attention on its normed input, keeping weights
        a, w = block.attention.forward_with_weights(
            block.norm1(x), mask, positions=positions)  # (B,T,D), (B,H,T,T)
        maps.append(w)
        # 2) the rest of the block, as DecoderBlock.forward computes it
        x = x + block.dropout(a)                             # (B, T, D)
        f = block.ffn(block.norm2(x))                        # (B, T, D)
        x = x + block.dropout(f)                             # (B, T, D)
    maps = torch.stack(maps)                                 # (N, B, H, T, T)
    return maps, model.lm_head(model.norm(x))               # (B, T, V)

r"""The paper's encoder-decoder Transformer (post-norm).

The paper (Vaswani et al. 2017, sec. 3.1) wraps every sub-layer in a
residual connection followed by LayerNorm, $\mathrm{LN}(x +
\mathrm{Sublayer}(x))$, with dropout on the sub-layer output (sec. 5.4).
An encoder layer $l$ maps $H^{l-1}$ to $H^l$:

$$A = \mathrm{LN}\big(H^{l-1} + \mathrm{Drop}(\mathrm{MHA}(H^{l-1}))\big),
\qquad H^l = \mathrm{LN}\big(A + \mathrm{Drop}(\mathrm{FFN}(A))\big).$$

A decoder layer adds, between the two, cross-attention whose queries come
from the decoder and whose keys and values come from the encoder output
$H_E^N$ (the *memory*).

Token embeddings multiplied by $\sqrt{D}$, plus the sinusoidal encoding,
added ONCE at the input,

$$H^0 = \mathrm{Drop}(\sqrt{D}\,E[x] + PE),$$

then $N$ post-norm :class:`~course_lib.model.transformer.EncoderLayer` s; the decoder
does the same on the shifted target and reads $H_E^N$ in every layer; a
linear map to the vocabulary gives logits. The paper shares one matrix
between both embeddings and the output projection (sec. 3.4).

Shape letters: B batch, S source length, T target length,
D = ``hidden_size``, V vocabulary size; $N$ in the prose is
``num_hidden_layers``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._util.threads import small_ops
from .._util.validation import (
    check_alloc,
    check_bool,
    check_dropout,
    check_int,
    check_token_ids,
    check_type,
)
from .block import FeedForward, ffn_param_count, make_norm
from .masks import causal_mask, combine_masks, padding_mask
from .mha import MultiHeadAttention, mha_param_count
from .sinusoidal import sinusoidal_encoding

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    pass

__all__ = ["TransformerConfig", "Transformer", "greedy_decode",
           "transformer_param_count", "EncoderLayer", "DecoderLayer"]


@dataclass
class TransformerConfig:
    """Hyperparameters of :class:`Transformer`, under Hugging Face field
    names; defaults: the base model."""
    src_vocab_size: int = 37000   # shared English-German BPE (sec. 5.1)
    tgt_vocab_size: int = 37000
    hidden_size: int = 512        # D (the paper's d_model)
    num_attention_heads: int = 8  # h; d_k = d_v = 512 / 8 = 64
    intermediate_size: int = 2048  # d_ff
    num_hidden_layers: int = 6    # N, on each side
    dropout: float = 0.1          # P_drop (sec. 5.4)
    max_position_embeddings: int = 512  # rows of the sinusoidal table
    tie_word_embeddings: bool = True  # output projection = target embedding
    share_src_tgt_embeddings: bool = True  # one table (needs equal vocabs)

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "hidden_size",
                     "num_attention_heads", "intermediate_size",
                     "num_hidden_layers", "max_position_embeddings"):
            check_int(name, getattr(self, name), minimum=1)
        check_dropout("dropout", self.dropout)
        check_bool("tie_word_embeddings", self.tie_word_embeddings)
        check_bool("share_src_tgt_embeddings", self.share_src_tgt_embeddings)


class Transformer(nn.Module):
    r"""The encoder-decoder Transformer of the paper (post-norm).

    Weights: Xavier-uniform for matrices (as the Annotated Transformer),
    embeddings $N(0, D^{-1})$ so that $\sqrt{D}\,E[x]$ has unit-variance
    entries, like the sinusoidal table it is added to.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        check_type("config", config, TransformerConfig, "a TransformerConfig")
        # Sizes are checked before any layer is built:
        # num_hidden_layers=10**6 would take minutes and
        # max_position_embeddings=10**9 gigabytes.
        check_alloc("config.max_position_embeddings * config.hidden_size "
                    "(the position table)",
                    config.max_position_embeddings * config.hidden_size)
        check_alloc("config's parameters (num_hidden_layers, hidden_size, "
                    "intermediate_size and the vocabulary sizes)",
                    transformer_param_count(config))
        c = self.config = config
        if c.share_src_tgt_embeddings and c.src_vocab_size != c.tgt_vocab_size:
            raise ValueError(
                f"share_src_tgt_embeddings needs src_vocab_size == "
                f"tgt_vocab_size, got {c.src_vocab_size} and "
                f"{c.tgt_vocab_size}")
        D = c.hidden_size
        self.src_embed = nn.Embedding(c.src_vocab_size, D)
        self.tgt_embed = (self.src_embed if c.share_src_tgt_embeddings
                          else nn.Embedding(c.tgt_vocab_size, D))
        # Fixed table, not a parameter; not saved in the state dict.
        self.register_buffer("pe", sinusoidal_encoding(
            c.max_position_embeddings, D).float(),
            persistent=False)                                 # (L, D)
        self.dropout = nn.Dropout(c.dropout)
        layer_args = (D, c.num_attention_heads, c.intermediate_size)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(*layer_args, dropout=c.dropout)
            for _ in range(c.num_hidden_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(*layer_args, dropout=c.dropout)
            for _ in range(c.num_hidden_layers))
        self.out_proj = nn.Linear(D, c.tgt_vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        # dict.fromkeys: each table once (they may be shared), in a fixed
        # order, so that a seeded model is reproducible.
        for emb in dict.fromkeys([self.src_embed, self.tgt_embed]):
            nn.init.normal_(emb.weight, std=D ** -0.5)
        if c.tie_word_embeddings:
            self.out_proj.weight = self.tgt_embed.weight      # (V, D) shared

    def _embed(self, ids: torch.Tensor, table: nn.Embedding) -> torch.Tensor:
        T = ids.shape[1]
        # H^0 = Drop(sqrt(D) E[x] + PE): positions enter here, once.
        h = table(ids) * math.sqrt(self.config.hidden_size)  # (B, T, D)
        return self.dropout(h + self.pe[:T])                 # (B, T, D)

    def encode(self, src: torch.Tensor,
               src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S) ids -> memory $H_E^N$ (B, S, D). src_mask: bool
        (B, 1, S), True at real tokens."""
        c = self.config
        check_token_ids("src", src, c.src_vocab_size,
                        c.max_position_embeddings)
        h = self._embed(src, self.src_embed)                 # (B, S, D)
        for layer in self.encoder_layers:
            h = layer(h, mask=src_mask)                      # (B, S, D)
        return h

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               src_mask: torch.Tensor | None = None,
               tgt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """tgt_in (B, T) ids (BOS first) -> logits (B, T, V); tgt_mask
        defaults to causal."""
        logits, _ = self.decode_with_weights(tgt_in, memory, src_mask,
                                             tgt_mask)
        return logits                                        # (B, T, V)

    def decode_with_weights(
            self, tgt_in: torch.Tensor, memory: torch.Tensor,
            src_mask: torch.Tensor | None = None,
            tgt_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`decode`, and the N layers' cross-attention weights, a
        list of (B, H, T, S)."""
        c = self.config
        check_token_ids("tgt_in", tgt_in, c.tgt_vocab_size,
                        c.max_position_embeddings)
        if tgt_mask is None:
            tgt_mask = causal_mask(tgt_in.shape[1], device=tgt_in.device)
        h = self._embed(tgt_in, self.tgt_embed)              # (B, T, D)
        weights = []
        for layer in self.decoder_layers:
            h, w = layer.forward_with_weights(h, memory, tgt_mask, src_mask)
            weights.append(w)                                # (B, H, T, S)
        return self.out_proj(h), weights                     # (B, T, V)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *,
                src_lengths=None, tgt_lengths=None) -> torch.Tensor:
        """Teacher-forced logits (B, T, V). src (B, S) ids; tgt_in (B, T)
        = BOS + target[:-1]; src_lengths, tgt_lengths: B ints (real tokens,
        right-padded; None = no padding)."""
        logits, _ = self.forward_with_weights(
            src, tgt_in, src_lengths=src_lengths, tgt_lengths=tgt_lengths)
        return logits                                        # (B, T, V)

    def forward_with_weights(
            self, src: torch.Tensor, tgt_in: torch.Tensor, *,
            src_lengths=None, tgt_lengths=None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward`, and the cross-attention weights as in
        :meth:`decode_with_weights`."""
        src_mask = _padding(src_lengths, src, "src_lengths")  # (B, 1, S)
        T = tgt_in.shape[1]
        tgt_mask = causal_mask(T, device=tgt_in.device)      # (T, T)
        if tgt_lengths is not None:
            tgt_mask = combine_masks(tgt_mask, _padding(
                tgt_lengths, tgt_in, "tgt_lengths"))         # (B, T, T)
        memory = self.encode(src, src_mask)                  # (B, S, D)
        return self.decode_with_weights(tgt_in, memory, src_mask, tgt_mask)


def _padding(lengths, ids: torch.Tensor, name: str):
    """Key-padding mask (B, 1, L) for ``ids`` (B, L), or None; ``lengths``
    must hold one entry per sequence (one entry would broadcast silently
    over the whole batch)."""
    if lengths is None:
        return None
    n = len(lengths) if hasattr(lengths, "__len__") else None
    if n != ids.shape[0]:
        raise ValueError(f"{name} must hold one length per sequence "
                         f"(B={ids.shape[0]}), got {lengths!r:.60}")
    return padding_mask(lengths, ids.shape[1]).to(ids.device)


@torch.no_grad()
@small_ops()  # one small decoder call per token: see course_lib._util.threads
def greedy_decode(model: Transformer, src: torch.Tensor, *, max_len: int,
                  bos_id: int, eos_id: int, src_lengths=None) -> torch.Tensor:
    r"""Translate by taking $\arg\max$ of the logits one token at a time.

    The encoder runs once; the decoder re-reads the growing prefix at
    every step (no cache). Sequences that emitted EOS keep emitting EOS;
    decoding stops when all have, or after ``max_len`` new tokens.

    Returns:
        (B, 1 + n) ids starting with BOS, n <= max_len.
    """
    check_int("max_len", max_len, minimum=1)
    was_training = model.training
    model.eval()
    src_mask = _padding(src_lengths, src, "src_lengths")     # (B, 1, S)
    memory = model.encode(src, src_mask)                     # (B, S, D)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long,
                    device=src.device)                       # (B, 1)
    done = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for _ in range(max_len):
        logits = model.decode(ys, memory, src_mask)          # (B, t, V)
        nxt = logits[:, -1].argmax(-1)                       # (B,)
        nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
        ys = torch.cat([ys, nxt[:, None]], dim=1)            # (B, t+1)
        done |= nxt == eos_id
        if done.all():
            break
    model.train(was_training)
    return ys


def transformer_param_count(config: TransformerConfig) -> int:
    r"""Closed-form parameter count of :class:`Transformer`.

    Per encoder layer: MHA $4D^2 + 4D$, FFN $2Dd_{ff} + d_{ff} + D$, two
    LayerNorms $2 \cdot 2D$; a decoder layer has a second MHA and a third
    LayerNorm. Embeddings: $V D$ per distinct table; the sinusoidal
    table has no parameters.
    """
    check_type("config", config, TransformerConfig, "a TransformerConfig")
    c = config
    D = c.hidden_size
    attn = mha_param_count(d_model=D, n_heads=c.num_attention_heads,
                           bias=True)
    ffn = ffn_param_count(d_model=D, d_ff=c.intermediate_size, bias=True)
    enc = attn + ffn + 2 * (2 * D)
    dec = 2 * attn + ffn + 3 * (2 * D)
    emb = c.src_vocab_size * D
    if not c.share_src_tgt_embeddings:
        emb += c.tgt_vocab_size * D
    if not c.tie_word_embeddings:
        emb += D * c.tgt_vocab_size                  # separate out_proj
    return c.num_hidden_layers * (enc + dec) + emb


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
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *,
                 dropout: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        check_dropout("dropout", dropout)
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
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, *,
                 dropout: float = 0.1, eps: float = 1e-5) -> None:
        super().__init__()
        check_dropout("dropout", dropout)
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
        # memory=None would make the cross-attention attend over the
        # decoder's own states; a decoder-only block is DecoderBlock.
        check_type("memory", memory, torch.Tensor,
                   "the encoder output, a tensor (B, S, D)")
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

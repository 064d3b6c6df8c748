r"""Whole models: the paper's encoder-decoder Transformer and a decoder-only
language model (GPT-2 / Llama family).

Encoder-decoder (Vaswani et al. 2017): token embeddings multiplied by
$\sqrt{D}$, plus the sinusoidal encoding, added ONCE at the input,

$$H^0 = \mathrm{Drop}(\sqrt{D}\,E[x] + PE),$$

then $N$ post-norm :class:`~course_lib.blocks.EncoderLayer` s; the decoder
does the same on the shifted target and reads $H_E^N$ in every layer; a
linear map to the vocabulary gives logits. The paper shares one matrix
between both embeddings and the output projection (sec. 3.4).

Decoder-only: $h^0 = E[x] + P$ (learned positions, GPT-2) or $E[x]$ alone
with RoPE inside every attention layer (Llama); $N$ pre-norm
:class:`~course_lib.blocks.DecoderBlock` s; a final norm; ``lm_head``.

Shape letters: B batch, S source length, T target length, D = ``d_model``,
V vocabulary size, N layers.

Introduced in chapter 6.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from .attention import causal_mask, combine_masks, padding_mask
from .blocks import DecoderBlock, DecoderLayer, EncoderLayer, RoPEAttention
from .kv_cache import KVCache
from .layers import (FeedForward, SwiGLU, ffn_param_count,
                     llama_hidden_dim, make_norm, swiglu_param_count)
from .mha import MultiHeadAttention, mha_param_count
from .positional import sinusoidal_encoding
from .threads import small_ops

__all__ = ["TransformerConfig", "Transformer", "greedy_decode",
           "DecoderLMConfig", "DecoderLM", "num_parameters",
           "transformer_param_count", "decoder_lm_param_count"]


def num_parameters(model: nn.Module) -> int:
    """Distinct parameter scalars of a built model (a tied matrix counts
    once). Chapter 12's :func:`course_lib.params.count_parameters`
    computes the same number from a configuration, without building.

    Introduced in chapter 6.
    """
    return sum(p.numel() for p in model.parameters())


def _check_tokens(name: str, ids, vocab: int, max_len: int) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 \
            or ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{name} must be an int64 tensor (B, T), got "
                         f"{getattr(ids, 'dtype', type(ids).__name__)} "
                         f"{tuple(getattr(ids, 'shape', ()))}")
    if ids.shape[1] > max_len:
        raise ValueError(f"{name} has length {ids.shape[1]}, more than "
                         f"max_len={max_len}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"{name} must hold ids in [0, {vocab}), got "
                         f"[{ids.min().item()}, {ids.max().item()}]")


# ========================================================= encoder-decoder
@dataclass
class TransformerConfig:
    """Hyperparameters of :class:`Transformer`; defaults: the base model."""
    src_vocab_size: int = 37000   # shared English-German BPE (sec. 5.1)
    tgt_vocab_size: int = 37000
    d_model: int = 512
    n_heads: int = 8              # d_k = d_v = 512 / 8 = 64
    d_ff: int = 2048
    n_layers: int = 6             # N, on each side
    dropout: float = 0.1          # P_drop (sec. 5.4)
    max_len: int = 512            # rows of the sinusoidal table
    tie_embeddings: bool = True   # output projection = target embedding
    share_src_tgt_embeddings: bool = True  # one table (needs equal vocabs)


class Transformer(nn.Module):
    r"""The encoder-decoder Transformer of the paper (post-norm).

    Weights: Xavier-uniform for matrices (as the Annotated Transformer),
    embeddings $N(0, D^{-1})$ so that $\sqrt{D}\,E[x]$ has unit-variance
    entries, like the sinusoidal table it is added to.

    Introduced in chapter 6.
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        if c.share_src_tgt_embeddings and c.src_vocab_size != c.tgt_vocab_size:
            raise ValueError(
                f"share_src_tgt_embeddings needs src_vocab_size == "
                f"tgt_vocab_size, got {c.src_vocab_size} and "
                f"{c.tgt_vocab_size}")
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = (self.src_embed if c.share_src_tgt_embeddings
                          else nn.Embedding(c.tgt_vocab_size, c.d_model))
        # Fixed table, not a parameter; not saved in the state dict.
        self.register_buffer("pe", sinusoidal_encoding(
            c.max_len, c.d_model).float(), persistent=False)  # (L, D)
        self.dropout = nn.Dropout(c.dropout)
        layer_args = (c.d_model, c.n_heads, c.d_ff)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(*layer_args, dropout=c.dropout)
            for _ in range(c.n_layers))
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(*layer_args, dropout=c.dropout)
            for _ in range(c.n_layers))
        self.out_proj = nn.Linear(c.d_model, c.tgt_vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        # dict.fromkeys: each table once (they may be shared), in a fixed
        # order, so that a seeded model is reproducible.
        for emb in dict.fromkeys([self.src_embed, self.tgt_embed]):
            nn.init.normal_(emb.weight, std=c.d_model ** -0.5)
        if c.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight      # (V, D) shared

    def _embed(self, ids: torch.Tensor, table: nn.Embedding) -> torch.Tensor:
        T = ids.shape[1]
        # H^0 = Drop(sqrt(D) E[x] + PE): positions enter here, once.
        h = table(ids) * math.sqrt(self.config.d_model)      # (B, T, D)
        return self.dropout(h + self.pe[:T])                 # (B, T, D)

    def encode(self, src: torch.Tensor,
               src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """src (B, S) ids -> memory $H_E^N$ (B, S, D). src_mask: bool
        (B, 1, S), True at real tokens."""
        c = self.config
        _check_tokens("src", src, c.src_vocab_size, c.max_len)
        h = self._embed(src, self.src_embed)                 # (B, S, D)
        for layer in self.encoder_layers:
            h = layer(h, mask=src_mask)                      # (B, S, D)
        return h

    def decode(self, tgt_in: torch.Tensor, memory: torch.Tensor,
               src_mask: torch.Tensor | None = None,
               tgt_mask: torch.Tensor | None = None, *,
               return_weights: bool = False):
        """tgt_in (B, T) ids (BOS first) -> logits (B, T, V); tgt_mask
        defaults to causal; ``return_weights`` adds the N cross-attention
        weights (B, H, T, S) as a list."""
        c = self.config
        _check_tokens("tgt_in", tgt_in, c.tgt_vocab_size, c.max_len)
        if tgt_mask is None:
            tgt_mask = causal_mask(tgt_in.shape[1], device=tgt_in.device)
        h = self._embed(tgt_in, self.tgt_embed)              # (B, T, D)
        weights = []
        for layer in self.decoder_layers:
            h, w = layer(h, memory, tgt_mask, src_mask, return_weights=True)
            weights.append(w)                                # (B, H, T, S)
        logits = self.out_proj(h)                            # (B, T, V)
        return (logits, weights) if return_weights else logits

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *,
                src_lengths=None, tgt_lengths=None,
                return_weights: bool = False):
        """Teacher-forced logits (B, T, V). src (B, S) ids; tgt_in (B, T)
        = BOS + target[:-1]; src_lengths, tgt_lengths: B ints (real tokens,
        right-padded; None = no padding); return_weights as in decode."""
        src_mask = None if src_lengths is None else \
            padding_mask(src_lengths, src.shape[1]).to(src.device)
        T = tgt_in.shape[1]
        tgt_mask = causal_mask(T, device=tgt_in.device)      # (T, T)
        if tgt_lengths is not None:
            tgt_mask = combine_masks(tgt_mask, padding_mask(
                tgt_lengths, T).to(tgt_in.device))           # (B, T, T)
        memory = self.encode(src, src_mask)                  # (B, S, D)
        return self.decode(tgt_in, memory, src_mask, tgt_mask,
                           return_weights=return_weights)


@torch.no_grad()
@small_ops()  # one small decoder call per token: see course_lib.threads
def greedy_decode(model: Transformer, src: torch.Tensor, *, max_len: int,
                  bos_id: int, eos_id: int, src_lengths=None) -> torch.Tensor:
    r"""Translate by taking $\arg\max$ of the logits one token at a time.

    The encoder runs once; the decoder re-reads the growing prefix at
    every step (no cache). Sequences that emitted EOS keep emitting EOS;
    decoding stops when all have, or after ``max_len`` new tokens.

    Returns:
        (B, 1 + n) ids starting with BOS, n <= max_len.

    Introduced in chapter 6.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    was_training = model.training
    model.eval()
    src_mask = None if src_lengths is None else \
        padding_mask(src_lengths, src.shape[1]).to(src.device)
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


# ============================================================ decoder-only
@dataclass
class DecoderLMConfig:
    """Hyperparameters of :class:`DecoderLM`. Defaults: a small Llama-style
    model; :meth:`gpt2_small` gives GPT-2's published shape."""
    vocab_size: int
    d_model: int = 128
    n_heads: int = 4
    n_kv_heads: int | None = None  # None = n_heads (MHA); fewer = GQA
    n_layers: int = 4
    d_ff: int | None = None        # None: 4*d_model, or 8/3 d for swiglu
    max_len: int = 256             # context length (rows of learned P)
    positions: str = "rope"        # "learned" (GPT-2) or "rope" (Llama)
    norm: str = "rms"              # "rms" (Llama) or "layer" (GPT-2)
    ffn: str = "swiglu"            # "swiglu", "gelu" or "relu"
    bias: bool = False             # biases in attention/FFN/LayerNorm
    tie_embeddings: bool = True    # lm_head.weight is embed_tokens.weight
    dropout: float = 0.0
    multiple_of: int = 32          # swiglu d_ff rounding (Llama-2: 256)

    def __post_init__(self) -> None:
        for name, options in (("positions", ("learned", "rope")),
                              ("norm", ("rms", "layer")),
                              ("ffn", ("swiglu", "gelu", "relu"))):
            if getattr(self, name) not in options:
                raise ValueError(f"{name} must be one of {options}, got "
                                 f"{getattr(self, name)!r}")
        if self.d_ff is None:
            self.d_ff = (llama_hidden_dim(self.d_model,
                                          multiple_of=self.multiple_of)
                         if self.ffn == "swiglu" else 4 * self.d_model)

    @classmethod
    def gpt2_small(cls, **overrides) -> "DecoderLMConfig":
        """GPT-2 small (124M): vocab 50257, context 1024, 12 x 768."""
        cfg = dict(vocab_size=50257, d_model=768, n_heads=12, n_layers=12,
                   d_ff=3072, max_len=1024, positions="learned",
                   norm="layer", ffn="gelu", bias=True,
                   tie_embeddings=True, dropout=0.1)
        return cls(**{**cfg, **overrides})


class DecoderLM(nn.Module):
    r"""Decoder-only language model: idx (B, T) -> logits (B, T, V).

    By default every block has the attention and FFN the config names.
    ``attention_factory(i)`` and ``ffn_factory(i)``, if given, build
    layer ``i``'s modules instead: multi-head latent attention (chapter
    10), a mixture of experts (chapter 11), or dense layers first and
    MoE layers after, as in DeepSeek-V3. A factory attention is called
    as ``attn(h, mask=..., positions=..., cache=...)``.

    Init as GPT-2: $N(0, 0.02^2)$ weights, zero biases, and the two
    projections that write into the residual stream (``o_proj`` and the
    FFN's output) scaled by $1/\sqrt{2N}$ so the stream's variance does
    not grow with depth.

    Introduced in chapter 6.
    """

    def __init__(self, config: DecoderLMConfig, *,
                 attention_factory: Callable[[int], nn.Module] | None = None,
                 ffn_factory: Callable[[int], nn.Module] | None = None
                 ) -> None:
        super().__init__()
        c = self.config = config
        for name, f in (("attention_factory", attention_factory),
                        ("ffn_factory", ffn_factory)):
            if f is not None and not callable(f):
                raise ValueError(f"{name} must be a callable layer_idx -> "
                                 f"nn.Module, got {type(f).__name__}")
        self._factories = (attention_factory, ffn_factory)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)  # E
        self.embed_positions = (nn.Embedding(c.max_len, c.d_model)
                                if c.positions == "learned" else None)
        self.dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(self._block(i) for i in range(c.n_layers))
        self.norm = make_norm(c.norm, c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "linear2.weight",
                              "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight   # (V, D) shared

    def _block(self, i: int) -> DecoderBlock:
        c = self.config
        kw = dict(n_kv_heads=c.n_kv_heads, bias=c.bias)
        make_attn, make_ffn = self._factories
        if make_attn is not None:
            attn = make_attn(i)
        elif c.positions == "rope":
            attn = RoPEAttention(c.d_model, c.n_heads, **kw)
        else:
            attn = MultiHeadAttention(c.d_model, c.n_heads, **kw)
        if make_ffn is not None:
            ffn = make_ffn(i)
        elif c.ffn == "swiglu":
            ffn = SwiGLU(c.d_model, c.d_ff)
        else:
            ffn = FeedForward(c.d_model, c.d_ff, activation=c.ffn,
                              bias=c.bias)
        return DecoderBlock(c.d_model, attention=attn, ffn=ffn, norm=c.norm,
                            norm_bias=c.bias, dropout=c.dropout)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def _positions(self, idx: torch.Tensor, positions, cache):
        """Validate ``cache`` and ``positions``; return (cached length,
        positions (T,)), by default the T positions after the cache."""
        c = self.config
        B, T = idx.shape
        past = 0
        if cache is not None:
            if not isinstance(cache, KVCache) or len(cache) != c.n_layers:
                raise ValueError(f"cache must be a KVCache with n_layers="
                                 f"{c.n_layers} layers, got {cache!r}")
            past = cache.seq_len
            if past and cache[0].batch_size != B:
                raise ValueError(f"idx has batch size {B} but the cache "
                                 f"holds batch size {cache[0].batch_size}")
        if positions is None:
            positions = torch.arange(past, past + T,
                                     device=idx.device)      # (T,)
        if cache is not None:
            cache.check_next(positions)
        if positions.max() >= c.max_len:
            raise ValueError(f"positions must be < max_len={c.max_len}, "
                             f"got {positions.max().item()}")
        return past, positions

    def forward(self, idx: torch.Tensor,
                positions: torch.Tensor | None = None, *,
                cache: KVCache | None = None, return_aux: bool = False):
        """idx (B, T) ids -> next-token logits (B, T, V).

        ``positions`` (T,): absolute positions, default $0..T-1$, or with
        a ``cache`` the $T$ positions after the cached ones.
        ``cache``: a :class:`~course_lib.kv_cache.KVCache` with one layer
        per block; the new keys/values are appended to it and the new
        queries attend to all $S$ cached + new positions (chapter 9).
        ``return_aux``: also return the list of what the blocks' FFNs
        returned besides their output (an MoE's routing information,
        chapter 11); empty for dense FFNs.
        """
        c = self.config
        _check_tokens("idx", idx, c.vocab_size, c.max_len)
        T = idx.shape[1]
        past, positions = self._positions(idx, positions, cache)
        h = self.embed_tokens(idx)                           # (B, T, D)
        if self.embed_positions is not None:
            # h^0 = E[x] + P[pos]: learned positions, added once.
            h = h + self.embed_positions(positions)          # (B, T, D)
        h = self.dropout(h)
        # new token i (position past + i) sees keys 0 .. past + i
        mask = causal_mask(T, past + T, device=idx.device)   # (T, S)
        kw = {"positions": positions} if (
            c.positions == "rope" or self._factories[0] is not None) else {}
        aux = []
        for i, block in enumerate(self.layers):
            if cache is not None:
                kw["cache"] = cache[i]
            h = block(h, mask=mask, **kw)
            if isinstance(h, tuple):
                h, a = h
                aux.append(a)
        logits = self.lm_head(self.norm(h))                  # (B, T, V)
        return (logits, aux) if return_aux else logits


# ======================================================= closed-form counts
def transformer_param_count(config: TransformerConfig) -> int:
    r"""Closed-form parameter count of :class:`Transformer`.

    Per encoder layer: MHA $4D^2 + 4D$, FFN $2Dd_{ff} + d_{ff} + D$, two
    LayerNorms $2 \cdot 2D$; a decoder layer has a second MHA and a third
    LayerNorm. Embeddings: $V D$ per distinct table; the sinusoidal
    table has no parameters.

    Introduced in chapter 6.
    """
    c = config
    D = c.d_model
    attn = mha_param_count(d_model=D, n_heads=c.n_heads, bias=True)
    ffn = ffn_param_count(d_model=D, d_ff=c.d_ff, bias=True)
    enc = attn + ffn + 2 * (2 * D)
    dec = 2 * attn + ffn + 3 * (2 * D)
    emb = c.src_vocab_size * D
    if not c.share_src_tgt_embeddings:
        emb += c.tgt_vocab_size * D
    if not c.tie_embeddings:
        emb += D * c.tgt_vocab_size                  # separate out_proj
    return c.n_layers * (enc + dec) + emb


def decoder_lm_param_count(config: DecoderLMConfig) -> int:
    r"""Closed-form parameter count of :class:`DecoderLM`.

    $VD$ (tokens) $+\,[\text{learned}]\,LD$ (positions) $+\,N \times$
    (attention + FFN + two norms) + final norm $+\,[\text{untied}]\,DV$;
    a norm has $2D$ parameters (LayerNorm with bias) or $D$.

    Introduced in chapter 6.
    """
    c = config
    D = c.d_model
    norm = 2 * D if (c.norm == "layer" and c.bias) else D
    attn = mha_param_count(d_model=D, n_heads=c.n_heads,
                           n_kv_heads=c.n_kv_heads, bias=c.bias)
    ffn = (swiglu_param_count(d_model=D, d_hidden=c.d_ff)
           if c.ffn == "swiglu"
           else ffn_param_count(d_model=D, d_ff=c.d_ff, bias=c.bias))
    n = c.vocab_size * D + c.n_layers * (attn + ffn + 2 * norm) + norm
    if c.positions == "learned":
        n += c.max_len * D
    if not c.tie_embeddings:
        n += D * c.vocab_size
    return n

r"""A decoder-only language model (GPT-2 / Llama family).

$h^0 = E[x] + P$ (learned positions, GPT-2) or $E[x]$ alone with RoPE
inside every attention layer (Llama); $N$ pre-norm
:class:`~course_lib.model.block.DecoderBlock` s; a final norm; ``lm_head``
maps each position's hidden state to next-token logits.

Shape letters: B batch, T new tokens, S cached + new positions,
D = ``d_model``, V vocabulary size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn

from .._util.validation import (
    check_alloc,
    check_bool,
    check_callable,
    check_choice,
    check_dropout,
    check_equal,
    check_int,
    check_real,
    check_token_ids,
    check_type,
)
from .block import (
    DecoderBlock,
    FeedForward,
    SwiGLU,
    ffn_param_count,
    llama_hidden_dim,
    make_norm,
    swiglu_param_count,
)
from .masks import causal_mask
from .mha import MultiHeadAttention, mha_param_count
from .rope import RotaryEmbedding

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    from .kv_cache import KVCache

__all__ = ["DecoderLMConfig", "DecoderLM", "decoder_lm_param_count"]


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
    rope_base: float = 10000.0     # RoPE's b (Llama-3: 500000)
    rope_interleaved: bool = False  # RoPE pairs: False (i, i+d/2) as HF
    #                                 Llama, True (2i, 2i+1) as llama.cpp
    norm_eps: float | None = None  # None: 1e-6 (rms) or 1e-5 (layer)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_layers",
                     "max_len", "multiple_of"):
            check_int(name, getattr(self, name), minimum=1)
        check_dropout("dropout", self.dropout)
        check_real("rope_base", self.rope_base, positive=True)
        if self.norm_eps is not None:
            check_real("norm_eps", self.norm_eps, positive=True)
        for name in ("bias", "tie_embeddings", "rope_interleaved"):
            check_bool(name, getattr(self, name))
        check_choice("positions", self.positions, ("learned", "rope"))
        check_choice("norm", self.norm, ("rms", "layer"))
        check_choice("ffn", self.ffn, ("swiglu", "gelu", "relu"))
        if self.d_ff is None:
            self.d_ff = (llama_hidden_dim(self.d_model,
                                          multiple_of=self.multiple_of)
                         if self.ffn == "swiglu" else 4 * self.d_model)
        check_int("d_ff", self.d_ff, minimum=1)

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
    as ``attn(h, mask, positions=..., cache=...)``.

    Init as GPT-2: $N(0, 0.02^2)$ weights, zero biases, and the two
    projections that write into the residual stream (``o_proj`` and the
    FFN's output) scaled by $1/\sqrt{2N}$ so the stream's variance does
    not grow with depth.
    """

    def __init__(self, config: DecoderLMConfig, *,
                 attention_factory: Callable[[int], nn.Module] | None = None,
                 ffn_factory: Callable[[int], nn.Module] | None = None
                 ) -> None:
        super().__init__()
        check_type("config", config, DecoderLMConfig, "a DecoderLMConfig")
        # refuse a size typo before building anything (n_layers=10**6)
        check_alloc("the model's parameters", decoder_lm_param_count(config))
        for name, f in (("attention_factory", attention_factory),
                        ("ffn_factory", ffn_factory)):
            if f is not None:
                check_callable(name, f)
        c = self.config = config
        self._factories = (attention_factory, ffn_factory)
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)  # E
        self.embed_positions = (nn.Embedding(c.max_len, c.d_model)
                                if c.positions == "learned" else None)
        self.dropout = nn.Dropout(c.dropout)
        # RoPE has no weights: one module serves every layer's attention
        rope = None if c.positions == "learned" else RotaryEmbedding(
            c.d_model // c.n_heads, base=c.rope_base,
            interleaved=c.rope_interleaved)
        self.layers = nn.ModuleList(self._block(i, rope)
                                    for i in range(c.n_layers))
        self.norm = make_norm(c.norm, c.d_model, eps=c.norm_eps,
                              bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "linear2.weight",
                              "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight   # (V, D) shared

    def _block(self, i: int, rope: RotaryEmbedding | None) -> DecoderBlock:
        c = self.config
        make_attn, make_ffn = self._factories
        if make_attn is not None:
            attn = make_attn(i)
        else:
            attn = MultiHeadAttention(c.d_model, c.n_heads, bias=c.bias,
                                      n_kv_heads=c.n_kv_heads, rope=rope)
        if make_ffn is not None:
            ffn = make_ffn(i)
        elif c.ffn == "swiglu":
            ffn = SwiGLU(c.d_model, c.d_ff)
        else:
            ffn = FeedForward(c.d_model, c.d_ff, activation=c.ffn,
                              bias=c.bias)
        return DecoderBlock(c.d_model, attention=attn, ffn=ffn, norm=c.norm,
                            norm_bias=c.bias, eps=c.norm_eps,
                            dropout=c.dropout)

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
            from .kv_cache import KVCache
            check_type("cache", cache, KVCache, "a KVCache")
            check_equal("the cache's number of layers", len(cache),
                        c.n_layers)
            past = cache.seq_len
            if past:
                check_equal("idx's batch size (the cache's)", B,
                            cache[0].batch_size)
        if positions is None:
            positions = torch.arange(past, past + T,
                                     device=idx.device)      # (T,)
        if cache is not None:
            cache.check_next(positions)
        check_int("positions.max()", int(positions.max()), minimum=0,
                  maximum=c.max_len - 1)                     # < max_len
        return past, positions

    def forward(self, idx: torch.Tensor,
                positions: torch.Tensor | None = None, *,
                cache: KVCache | None = None) -> torch.Tensor:
        """idx (B, T) ids -> next-token logits (B, T, V).

        ``positions`` (T,): absolute positions, default $0..T-1$, or with
        a ``cache`` the $T$ positions after the cached ones.
        ``cache``: a :class:`~course_lib.model.kv_cache.KVCache` with one layer
        per block; the new keys/values are appended to it and the new
        queries attend to all $S$ cached + new positions (chapter 9).
        An MoE layer keeps what its router did on the call;
        :func:`~course_lib.model.moe.moe_infos` collects it (chapter 11).
        """
        c = self.config
        check_token_ids("idx", idx, c.vocab_size, c.max_len)
        T = idx.shape[1]
        past, positions = self._positions(idx, positions, cache)
        h = self.embed_tokens(idx)                           # (B, T, D)
        if self.embed_positions is not None:
            # h^0 = E[x] + P[pos]: learned positions, added once.
            h = h + self.embed_positions(positions)          # (B, T, D)
        h = self.dropout(h)
        # new token i (position past + i) sees keys 0 .. past + i; one
        # new token (a decoding step) sees every key: no mask needed.
        mask = (causal_mask(T, past + T, device=idx.device)  # (T, S)
                if T > 1 else None)
        for i, block in enumerate(self.layers):
            h = block(h, mask, positions=positions,
                      cache=None if cache is None else cache[i])  # (B, T, D)
        return self.lm_head(self.norm(h))                    # (B, T, V)


def decoder_lm_param_count(config: DecoderLMConfig) -> int:
    r"""Closed-form parameter count of :class:`DecoderLM`.

    $VD$ (tokens) $+\,[\text{learned}]\,LD$ (positions) $+\,N \times$
    (attention + FFN + two norms) + final norm $+\,[\text{untied}]\,DV$;
    a norm has $2D$ parameters (LayerNorm with bias) or $D$.
    """
    check_type("config", config, DecoderLMConfig, "a DecoderLMConfig")
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

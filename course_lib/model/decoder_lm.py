r"""A decoder-only language model (GPT-2 / Llama family).

$h^0 = E[x] + P$ (learned positions, GPT-2) or $E[x]$ alone with RoPE
inside every attention layer (Llama); $N$ pre-norm
:class:`~course_lib.model.block.DecoderBlock` s; a final norm; ``lm_head``
maps each position's hidden state to next-token logits.

Shape letters: B batch, T new tokens, S cached + new positions,
D = ``hidden_size``, V vocabulary size.
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
    check_key_mask,
    check_real,
    check_shape,
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
    """Hyperparameters of :class:`DecoderLM`, under the Hugging Face field
    names of :class:`~course_lib.sizing.configs.ModelConfig`. Defaults: a
    small Llama-style model; :meth:`gpt2_small` gives GPT-2's published
    shape. A LayerNorm (``norm="layer"``) always has its bias, an RMSNorm
    never."""
    vocab_size: int
    hidden_size: int = 128                 # D
    num_attention_heads: int = 4           # H
    num_key_value_heads: int | None = None  # None = H (MHA); fewer = GQA
    num_hidden_layers: int = 4             # N
    intermediate_size: int | None = None   # FFN width; None: 4D, or 8D/3
    #                                        for silu (llama_hidden_dim)
    max_position_embeddings: int = 256     # context (rows of learned P)
    position: str = "rope"                 # "learned" (GPT-2) or "rope"
    norm: str = "rms"                      # "rms" (Llama) or "layer"
    hidden_act: str = "silu"               # "silu" (SwiGLU), "gelu", "relu"
    attention_bias: bool = False           # biases on q/k/v/o projections
    mlp_bias: bool = False                 # biases in the FFN's linears
    tie_word_embeddings: bool = True       # lm_head is embed_tokens
    dropout: float = 0.0
    multiple_of: int = 32                  # silu width rounding (Llama-2:
    #                                        256)
    rope_theta: float = 10000.0            # RoPE's b (Llama-3: 500000)
    rope_interleave: bool = False          # RoPE pairs: False (i, i+d/2)
    #                                        as HF Llama, True (2i, 2i+1)
    rms_norm_eps: float = 1e-6             # RMSNorm's eps (LayerNorm: 1e-5)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_attention_heads",
                     "num_hidden_layers", "max_position_embeddings",
                     "multiple_of"):
            check_int(name, getattr(self, name), minimum=1)
        check_dropout("dropout", self.dropout)
        for name in ("rope_theta", "rms_norm_eps"):
            check_real(name, getattr(self, name), positive=True)
        for name in ("attention_bias", "mlp_bias", "tie_word_embeddings",
                     "rope_interleave"):
            check_bool(name, getattr(self, name))
        check_choice("position", self.position, ("learned", "rope"))
        check_choice("norm", self.norm, ("rms", "layer"))
        check_choice("hidden_act", self.hidden_act, ("silu", "gelu", "relu"))
        if self.intermediate_size is None:
            self.intermediate_size = (
                llama_hidden_dim(self.hidden_size,
                                 multiple_of=self.multiple_of)
                if self.hidden_act == "silu" else 4 * self.hidden_size)
        check_int("intermediate_size", self.intermediate_size, minimum=1)

    @classmethod
    def gpt2_small(cls, **overrides) -> "DecoderLMConfig":
        """GPT-2 small (124M): vocab 50257, context 1024, 12 x 768."""
        cfg = dict(vocab_size=50257, hidden_size=768, num_attention_heads=12,
                   num_hidden_layers=12, intermediate_size=3072,
                   max_position_embeddings=1024, position="learned",
                   norm="layer", hidden_act="gelu", attention_bias=True,
                   mlp_bias=True, tie_word_embeddings=True, dropout=0.1)
        return cls(**{**cfg, **overrides})


def _norm_epsilon(c: DecoderLMConfig) -> float:
    """The eps of the model's norms: ``rms_norm_eps`` for RMSNorm, 1e-5
    for LayerNorm (GPT-2's ``layer_norm_epsilon``)."""
    return c.rms_norm_eps if c.norm == "rms" else 1e-5


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
        # The closed-form count checks the config's type; a size typo
        # (num_hidden_layers=10**6) is refused before anything is built.
        check_alloc("the model's parameters", decoder_lm_param_count(config))
        for name, f in (("attention_factory", attention_factory),
                        ("ffn_factory", ffn_factory)):
            if f is not None:
                check_callable(name, f)
        c = self.config = config
        self._factories = (attention_factory, ffn_factory)
        D = c.hidden_size
        self.embed_tokens = nn.Embedding(c.vocab_size, D)    # E
        self.embed_positions = (
            nn.Embedding(c.max_position_embeddings, D)
            if c.position == "learned" else None)
        self.dropout = nn.Dropout(c.dropout)
        # RoPE has no weights: one module serves every layer's attention
        rope = None if c.position == "learned" else RotaryEmbedding(
            D // c.num_attention_heads, base=c.rope_theta,
            interleave=c.rope_interleave)
        self.layers = nn.ModuleList(self._block(i, rope)
                                    for i in range(c.num_hidden_layers))
        self.norm = make_norm(c.norm, D, eps=_norm_epsilon(c))
        self.lm_head = nn.Linear(D, c.vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("o_proj.weight", "linear2.weight",
                              "down_proj.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(
                    2 * c.num_hidden_layers))
        if c.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight   # (V, D) shared

    def _block(self, i: int, rope: RotaryEmbedding | None) -> DecoderBlock:
        c = self.config
        make_attn, make_ffn = self._factories
        if make_attn is not None:
            attn = make_attn(i)
        else:
            attn = MultiHeadAttention(
                c.hidden_size, c.num_attention_heads,
                bias=c.attention_bias, n_kv_heads=c.num_key_value_heads,
                rope=rope)
        if make_ffn is not None:
            ffn = make_ffn(i)
        elif c.hidden_act == "silu":
            ffn = SwiGLU(c.hidden_size, c.intermediate_size,
                         bias=c.mlp_bias)
        else:
            ffn = FeedForward(c.hidden_size, c.intermediate_size,
                              activation=c.hidden_act, bias=c.mlp_bias)
        return DecoderBlock(c.hidden_size, attention=attn, ffn=ffn,
                            norm=c.norm, eps=_norm_epsilon(c),
                            dropout=c.dropout)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def _positions(self, idx: torch.Tensor, positions, cache,
                   attention_mask=None):
        """Validate ``cache``, ``positions`` and ``attention_mask``; return
        (cached length, positions). By default the T positions after the
        cache, (T,); with an ``attention_mask``, each row's own count of
        real tokens before each new one, (B, T)."""
        c = self.config
        B, T = idx.shape
        past = 0
        if cache is not None:
            from .kv_cache import KVCache
            check_type("cache", cache, KVCache, "a KVCache")
            check_equal("the cache's number of layers", len(cache),
                        c.num_hidden_layers)
            past = cache.seq_len     # its batch size: checked by each layer
        if attention_mask is not None:     # (B, S): False on pad slots
            check_key_mask("attention_mask", attention_mask, B, past + T)
        if positions is None and attention_mask is not None:
            positions = self.padded_positions(attention_mask, T)  # (B, T)
        elif positions is None:
            positions = torch.arange(past, past + T,
                                     device=idx.device)      # (T,)
        per_row = getattr(positions, "ndim", 1) == 2  # (B, T): one per row
        check_shape("positions", positions, (B, T) if per_row else (T,),
                    f"(T,) = ({T},) or (B, T) = ({B}, {T})")
        if cache is not None and not per_row:
            cache.check_next(positions)
        check_int("positions.max()", int(positions.max()), minimum=0,
                  maximum=c.max_position_embeddings - 1)
        return past, positions

    @staticmethod
    def padded_positions(attention_mask: torch.Tensor,
                         T: int) -> torch.Tensor:
        r"""Per-row positions of the last ``T`` slots of a padded batch.

        A slot's position is the number of real tokens before it in its
        row, $p_{b,s} = \sum_{s' \le s} m_{b,s'} - 1$, so every row counts
        $0, 1, \dots$ from its own first token, whatever its padding.
        Pad slots before the first token get 0 (no query reads them).

        Args:
            attention_mask: ``(B, S)`` bool, True on real tokens.
            T: how many of the last slots to return.

        Returns:
            ``(B, T)`` int64 positions.
        """
        count = attention_mask.long().cumsum(-1) - 1         # (B, S)
        return count[:, -T:].clamp(min=0)                    # (B, T)

    def forward(self, idx: torch.Tensor,
                positions: torch.Tensor | None = None, *,
                cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        """idx (B, T) ids -> next-token logits (B, T, V).

        ``positions`` (T,): absolute positions, default $0..T-1$, or with
        a ``cache`` the $T$ positions after the cached ones; or (B, T),
        one row of positions per sequence.
        ``cache``: a :class:`~course_lib.model.kv_cache.KVCache` with one layer
        per block; the new keys/values are appended to it and the new
        queries attend to all $S$ cached + new positions (chapter 9).
        ``attention_mask`` (B, S) bool, S = cached + T: False marks a
        padding slot, which no query attends to (cached slots included).
        With it the default positions are per row, (B, T): row $b$'s
        $j$-th real token has position $j$ wherever its padding puts it
        (left-padded batches of prompts of different lengths, chapter 9).
        An MoE layer keeps what its router did on the call;
        :func:`~course_lib.model.moe.moe_infos` collects it (chapter 11).
        ``logits_to_keep`` $n > 0$: the head runs on the last $n$
        positions only and the logits are (B, n, V); 0 (the default)
        keeps all $T$. A prefill needs only the last position's logits,
        and the head ($D \times V$) is the largest matrix of a small
        model (chapter 15; Hugging Face's argument of the same name).
        """
        c = self.config
        check_token_ids("idx", idx, c.vocab_size, c.max_position_embeddings)
        check_int("logits_to_keep", logits_to_keep, minimum=0)
        T = idx.shape[1]
        past, positions = self._positions(idx, positions, cache,
                                          attention_mask)
        h = self.embed_tokens(idx)                           # (B, T, D)
        if self.embed_positions is not None:
            # h^0 = E[x] + P[pos]: learned positions, added once.
            h = h + self.embed_positions(positions)          # (B, T, D)
        h = self.dropout(h)
        # new token i (position past + i) sees keys 0 .. past + i; one
        # new token (a decoding step) sees every key: no mask needed.
        mask = (causal_mask(T, past + T, device=idx.device)  # (T, S)
                if T > 1 else None)
        if attention_mask is not None:
            # ... and never a padding slot, new or cached.
            pad = attention_mask[:, None, :]                 # (B, 1, S)
            mask = pad if mask is None else mask & pad       # (B, T|1, S)
        for i, block in enumerate(self.layers):
            h = block(h, mask, positions=positions,
                      cache=None if cache is None else cache[i])  # (B, T, D)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]                       # (B, n, D)
        return self.lm_head(self.norm(h))                    # (B, T|n, V)


def decoder_lm_param_count(config: DecoderLMConfig) -> int:
    r"""Closed-form parameter count of :class:`DecoderLM`.

    $VD$ (tokens) $+\,[\text{learned}]\,LD$ (positions) $+\,N \times$
    (attention + FFN + two norms) + final norm $+\,[\text{untied}]\,DV$;
    a norm has $2D$ parameters (LayerNorm, weight and bias) or $D$
    (RMSNorm).
    """
    check_type("config", config, DecoderLMConfig, "a DecoderLMConfig")
    c = config
    D, F = c.hidden_size, c.intermediate_size
    norm = 2 * D if c.norm == "layer" else D
    attn = mha_param_count(d_model=D, n_heads=c.num_attention_heads,
                           n_kv_heads=c.num_key_value_heads,
                           bias=c.attention_bias)
    ffn = (swiglu_param_count(d_model=D, d_ff=F, bias=c.mlp_bias)
           if c.hidden_act == "silu"
           else ffn_param_count(d_model=D, d_ff=F, bias=c.mlp_bias))
    n = (c.vocab_size * D + c.num_hidden_layers * (attn + ffn + 2 * norm)
         + norm)
    if c.position == "learned":
        n += c.max_position_embeddings * D
    if not c.tie_word_embeddings:
        n += D * c.vocab_size
    return n

r"""The key-value cache: keep what past tokens contributed to attention.

During generation, token $t$ attends to the keys and values of tokens
$1 \dots t$. Those of tokens $1 \dots t-1$ were computed at earlier steps
and do not change (causal attention: a token never sees the future), so a
layer can store them and compute only the new token's $q_t, k_t, v_t$.
Queries are not stored: $q_t$ is used once, by token $t$ itself.

A :class:`KVCache` holds one :class:`LayerKVCache` per layer. A layer
cache stores whatever tensors its attention needs later, each with the
time axis at dim ``-2``: $K$ and $V$ ``(B, G, S, d_k)`` for multi-head
attention (the $G$ key/value heads, before GQA's repetition), or the
latent $c^{KV}$ ``(B, S, d_c)`` and the shared RoPE key ``(B, 1, S,
d^R)`` for multi-head latent attention (chapter 10).

Its size follows from the config alone (:func:`kv_cache_bytes`): per
token and layer, $2 \cdot G \cdot d_h$ values for MHA ($G = h$), GQA and
MQA ($G = 1$), $d_c + d_h^R$ for MLA.

Generation with a cache (prefill, then one token per call), prefix reuse
and decode-speed measurements live in :mod:`course_lib.decoding`, which
builds on this module (never the other way round).

Shape letters: B batch, T new tokens in this call, S cached + new tokens,
G key/value heads, d_k (= $d_h$) head width.

Introduced in chapter 9.
"""
from __future__ import annotations

from numbers import Real

import torch

from .validation import check_int, config_field

__all__ = ["LayerKVCache", "KVCache", "kv_cache_bytes",
           "kv_values_per_token"]


def _check_continues(positions, start: int, max_len: int | None) -> None:
    """``positions`` must be the 1-D run ``start, start + 1, ...`` and fit
    in ``max_len`` (None: no limit)."""
    if not isinstance(positions, torch.Tensor) or positions.dim() != 1:
        got = getattr(positions, "shape", positions)
        raise ValueError(f"positions must be a 1-D tensor (T,), got {got}")
    expected = torch.arange(start, start + positions.numel(),
                            device=positions.device)
    if not torch.equal(positions.long(), expected):
        shown = positions.tolist()
        shown = shown if len(shown) <= 8 else shown[:8] + ["..."]
        raise ValueError(
            f"positions must continue the cache, i.e. start at "
            f"{start} and increase by 1, got {shown}")
    if max_len is not None and start + positions.numel() > max_len:
        raise ValueError(
            f"cache overflow: {start} cached + {positions.numel()} new "
            f"positions exceeds max_len={max_len}")


class LayerKVCache:
    r"""The cache of one attention layer: a tuple of tensors grown along
    the time axis (dim ``-2``).

    :meth:`update` appends the new tokens' entries and returns the full
    tensors, past and new, for the attention to use:

    $$K_{1:t} = \mathrm{concat}(K_{1:t-1}, k_t), \qquad
    V_{1:t} = \mathrm{concat}(V_{1:t-1}, v_t).$$

    Args:
        max_len: most positions it may hold (``None``: no limit).

    Introduced in chapter 9.
    """

    def __init__(self, *, max_len: int | None = None) -> None:
        if max_len is not None:
            check_int("max_len", max_len, minimum=1)
        self.max_len = max_len
        self.tensors: tuple[torch.Tensor, ...] = ()

    def __len__(self) -> int:
        """Number of cached positions (0 when empty)."""
        return self.tensors[0].shape[-2] if self.tensors else 0

    @property
    def batch_size(self) -> int | None:
        return self.tensors[0].shape[0] if self.tensors else None

    def update(self, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Append ``new`` (each ``(B, ..., T, d)``) and return the full
        tensors ``(B, ..., S, d)`` with $S$ = cached + $T$.

        Raises:
            ValueError: no tensors, tensors that disagree in batch or
                length, a different number or batch size than the cached
                ones, or more than ``max_len`` positions in total.
        """
        if not new or not all(isinstance(t, torch.Tensor) and t.dim() >= 2
                              for t in new):
            raise ValueError("update needs one or more tensors with a time "
                             "axis at dim -2")
        B, T = new[0].shape[0], new[0].shape[-2]
        for t in new:
            if t.shape[0] != B or t.shape[-2] != T:
                raise ValueError(
                    f"tensors passed to update must share batch and length, "
                    f"got shapes {[tuple(x.shape) for x in new]}")
        if self.tensors:
            if len(new) != len(self.tensors):
                raise ValueError(f"this cache holds {len(self.tensors)} "
                                 f"tensors per layer, got {len(new)}")
            if B != self.batch_size:
                raise ValueError(f"batch size {B} does not match the "
                                 f"cache's batch size {self.batch_size}")
        if self.max_len is not None and len(self) + T > self.max_len:
            raise ValueError(
                f"cache overflow: {len(self)} cached + {T} new positions "
                f"exceeds max_len={self.max_len}")
        if self.tensors:
            # K_{1:t} = concat(K_{1:t-1}, k_t) along time (dim -2)
            self.tensors = tuple(torch.cat([old, t], dim=-2)
                                 for old, t in zip(self.tensors, new))
        else:
            self.tensors = tuple(new)
        return self.tensors

    def check_next(self, positions: torch.Tensor) -> None:
        """Reject ``positions`` (T,) that do not continue this cache: they
        must be ``len, len + 1, ...`` (a gap or a repeat would pair new
        queries with the wrong keys), and fit in ``max_len``."""
        _check_continues(positions, len(self), self.max_len)

    def crop(self, n: int) -> None:
        """Keep only the first ``n`` positions (``0 <= n <= len``)."""
        check_int("n", n, minimum=0)
        if n > len(self):
            raise ValueError(f"n must be <= the {len(self)} cached "
                             f"positions, got {n}")
        self.tensors = tuple(t[..., :n, :] for t in self.tensors) if n else ()

    def nbytes(self) -> int:
        """Bytes held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


class KVCache:
    r"""Per-layer caches of a whole model, plus the bookkeeping a model
    needs: how many positions are cached, so that the next call's
    positions (for RoPE or learned position embeddings) and causal mask
    start there.

    Usage with :class:`~course_lib.decoder_lm.DecoderLM`::

        cache = KVCache(model.config.n_layers, max_len=model.config.max_len)
        logits = model(prompt, cache=cache)          # prefill: T0 tokens
        logits = model(next_id[:, None], cache=cache)  # decode: 1 token

    Args:
        n_layers: number of attention layers.
        max_len: most positions each layer may hold (``None``: no limit).

    Introduced in chapter 9.
    """

    def __init__(self, n_layers: int, *, max_len: int | None = None) -> None:
        check_int("n_layers", n_layers, minimum=1)
        self.max_len = max_len
        self.layers = [LayerKVCache(max_len=max_len) for _ in range(n_layers)]

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> LayerKVCache:
        return self.layers[i]

    @property
    def seq_len(self) -> int:
        """Positions cached so far (read from layer 0, which a forward
        pass updates first)."""
        return len(self.layers[0])

    def check_next(self, positions: torch.Tensor) -> None:
        """Reject ``positions`` (T,) that do not continue the cache:
        they must be ``seq_len, seq_len + 1, ...``. A gap or a repeat
        would pair new queries with the wrong keys."""
        _check_continues(positions, self.seq_len, self.max_len)

    def fork(self) -> "KVCache":
        """An independent copy (e.g. after a shared prefix): appending to
        one does not change the other."""
        other = KVCache(len(self.layers), max_len=self.max_len)
        for mine, theirs in zip(self.layers, other.layers):
            theirs.tensors = tuple(t.clone() for t in mine.tensors)
        return other

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions in every layer: the entries of a
        prefix do not depend on anything after it."""
        for layer in self.layers:
            layer.crop(n)

    def nbytes(self) -> int:
        """Bytes held by all layers."""
        return sum(layer.nbytes() for layer in self.layers)


# ------------------------------------------------------------ cache size
def _config_int(config, *names, required=True):
    value = config_field(config, *names, **({} if required else
                                            {"default": None}))
    if value is not None:
        check_int(f"config.{names[0]}", value, minimum=1)
    return value


def kv_values_per_token(config, *, n_layers: int | None = None) -> int:
    r"""Cached values per token, summed over layers (batch 1).

    Multi-head, grouped-query and multi-query attention cache a key and a
    value of width $d_h$ for each of the $G$ key/value heads in each of
    the $l$ layers; multi-head latent attention caches the latent
    $c^{KV}$ and the shared RoPE key $k^R$:

    $$\text{MHA/GQA/MQA: } 2 \cdot G \cdot d_h \cdot l, \qquad
    \text{MLA: } (d_c + d_h^R) \cdot l.$$

    Attributes are read Hugging Face names first: layers
    ``num_hidden_layers`` / ``n_layers``; width ``hidden_size`` /
    ``d_model``; heads ``num_attention_heads`` / ``n_heads``; K/V heads
    ``num_key_value_heads`` / ``n_kv_heads`` (None: $G = h$); $d_h$ =
    ``head_dim`` if set, else width // heads. A config with a
    ``kv_lora_rank`` that is not None is MLA: $d_c$ = ``kv_lora_rank``,
    $d_h^R$ = ``qk_rope_head_dim``.

    Args:
        config: a config object (``DecoderLMConfig``, an MLA config, a
            Hugging Face config, ``ModelConfig``, a namespace...).
        n_layers: count this many layers instead of the config's.

    Returns:
        Values (not bytes) per token.

    Introduced in chapter 9.
    """
    if n_layers is None:
        n_layers = _config_int(config, "num_hidden_layers", "n_layers")
    else:
        check_int("n_layers", n_layers, minimum=0)
    if config_field(config, "kv_lora_rank", default=None) is not None:
        # MLA: c^KV (d_c) and the shared k^R (d_h^R), one of each per layer
        d_c = _config_int(config, "kv_lora_rank")
        d_rope = _config_int(config, "qk_rope_head_dim")
        return (d_c + d_rope) * n_layers
    heads = _config_int(config, "num_attention_heads", "n_heads")
    kv_heads = _config_int(config, "num_key_value_heads", "n_kv_heads",
                           required=False) or heads
    head_dim = _config_int(config, "head_dim", required=False)
    if head_dim is None:
        width = _config_int(config, "hidden_size", "d_model")
        head_dim = width // heads
    # K and V: 2 G d_h values per layer
    return 2 * kv_heads * head_dim * n_layers


def kv_cache_bytes(config, n_tokens: int, *, bytes_per_value: float = 2,
                   n_layers: int | None = None) -> int | float:
    r"""Bytes of the KV cache for ``n_tokens`` tokens of one sequence.

    $$\text{bytes} = \text{values per token} \times n_{\text{tokens}}
    \times \text{bytes per value},$$

    with the values per token of :func:`kv_values_per_token`. A batch of
    $B$ sequences needs $B$ times as much. Example: Llama-2-7B (32 layers,
    32 heads, $d_h = 128$) at fp16 needs $2 \cdot 32 \cdot 128 \cdot 32
    \cdot 2$ B = 512 KiB per token.

    Args:
        config: as in :func:`kv_values_per_token`.
        n_tokens: cached positions, an int $\ge 0$.
        bytes_per_value: 2 for fp16/bf16 (default), 4 for fp32, 1 for
            8-bit; fractions (0.5 for 4-bit) are allowed.
        n_layers: count this many layers instead of the config's.

    Returns:
        Bytes (an int when ``bytes_per_value`` is an int).

    Introduced in chapter 9.
    """
    check_int("n_tokens", n_tokens, minimum=0)
    if isinstance(bytes_per_value, bool) or not isinstance(
            bytes_per_value, Real) or not 0 < bytes_per_value < float("inf"):
        raise ValueError(f"bytes_per_value must be a number > 0, got "
                         f"{bytes_per_value!r}")
    per_token = kv_values_per_token(config, n_layers=n_layers)
    return per_token * n_tokens * bytes_per_value

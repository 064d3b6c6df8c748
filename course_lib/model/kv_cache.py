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
and decode-speed measurements live in :mod:`course_lib.generation.decoding`, which
builds on this module (never the other way round).

Shape letters: B batch, T new tokens in this call, S cached + new tokens,
G key/value heads, d_k (= $d_h$) head width.
"""
from __future__ import annotations

import torch

from .._util.validation import (
    check_continues,
    check_equal,
    check_fits,
    check_int,
)

# A bound on layers far above any published model (Llama 3 405B has 126),
# so a size typo fails at once instead of building millions of caches.
MAX_LAYERS = 4096

__all__ = ["LayerKVCache", "KVCache"]


class LayerKVCache:
    r"""The cache of one attention layer: a tuple of tensors grown along
    the time axis (dim ``-2``).

    :meth:`update` appends the new tokens' entries and returns the full
    tensors, past and new, for the attention to use:

    $$K_{1:t} = \mathrm{concat}(K_{1:t-1}, k_t), \qquad
    V_{1:t} = \mathrm{concat}(V_{1:t-1}, v_t).$$

    Args:
        max_len: most positions it may hold (``None``: no limit).
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

        The attention layer that owns the cache calls this with tensors it
        made, so only the errors a caller can cause are checked (a
        ``ValueError``): more than ``max_len`` positions in total, or a
        batch size other than the cached one.
        """
        check_fits(len(self), new[0].shape[-2], self.max_len)
        if self.tensors:        # a cache made for another batch
            check_equal("the batch size", new[0].shape[0], self.batch_size)
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
        check_continues(positions, len(self), self.max_len)

    def crop(self, n: int) -> None:
        """Keep only the first ``n`` positions (``0 <= n <= len``)."""
        check_int("n", n, minimum=0, maximum=len(self))   # cached positions
        self.tensors = tuple(t[..., :n, :] for t in self.tensors) if n else ()

    def nbytes(self) -> int:
        """Bytes held by the cached tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors)


class KVCache:
    r"""Per-layer caches of a whole model, plus the bookkeeping a model
    needs: how many positions are cached, so that the next call's
    positions (for RoPE or learned position embeddings) and causal mask
    start there.

    Usage with :class:`~course_lib.model.decoder_lm.DecoderLM`::

        c = model.config
        cache = KVCache(c.num_hidden_layers,
                        max_len=c.max_position_embeddings)
        logits = model(prompt, cache=cache)          # prefill: T0 tokens
        logits = model(next_id[:, None], cache=cache)  # decode: 1 token

    Args:
        n_layers: number of attention layers.
        max_len: most positions each layer may hold (``None``: no limit).
    """

    def __init__(self, n_layers: int, *, max_len: int | None = None) -> None:
        check_int("n_layers", n_layers, minimum=1, maximum=MAX_LAYERS)
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
        check_continues(positions, self.seq_len, self.max_len)

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

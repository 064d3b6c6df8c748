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

from .._util.validation import check_int

__all__ = ["LayerKVCache", "KVCache"]


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

    Usage with :class:`~course_lib.model.decoder_lm.DecoderLM`::

        cache = KVCache(model.config.n_layers, max_len=model.config.max_len)
        logits = model(prompt, cache=cache)          # prefill: T0 tokens
        logits = model(next_id[:, None], cache=cache)  # decode: 1 token

    Args:
        n_layers: number of attention layers.
        max_len: most positions each layer may hold (``None``: no limit).
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

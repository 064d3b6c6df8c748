r"""Head ablation in a :class:`~course_lib.model.decoder_lm.DecoderLM`.

Multi-head attention ends with $\mathrm{MHA}(x) = [o_1; \dots; o_H]\,W^O$,
so head $i$ reaches the residual stream only through its $d_h$ rows of
$W^O$, i.e. the columns ``i*d_h : (i+1)*d_h`` of ``o_proj.weight``
(which stores $W^{O\top}$, shape ``(D, H*d_h)``). Zeroing those columns
removes head $i$'s output, $o_i W^O_i$, from every position and leaves
every other head unchanged: *zero ablation*. Comparing a measurement with
and without a set of heads tests whether the model's behaviour depends on
them, which attention patterns alone cannot show.

Shape letters: D = ``hidden_size``, H query heads, d_h = D / H.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from numbers import Integral

import torch

from .._util.validation import check_type
from ..model.decoder_lm import DecoderLM

__all__ = ["ablate_heads"]


def _heads(heads, n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """``heads`` as a list of in-range ``(layer, head)`` int pairs."""
    if isinstance(heads, (str, bytes)) or not isinstance(heads, Iterable):
        raise TypeError(f"heads must be an iterable of (layer, head) "
                        f"pairs, got {type(heads).__name__}")
    pairs = []
    for pair in heads:
        if (not isinstance(pair, (tuple, list)) or len(pair) != 2 or any(
                isinstance(v, bool) or not isinstance(v, Integral)
                for v in pair)):
            raise TypeError(f"heads must hold (layer, head) pairs of ints, "
                            f"got {pair!r:.60}")
        layer, head = int(pair[0]), int(pair[1])
        if not 0 <= layer < n_layers:
            raise ValueError(f"heads: layer must be in [0, {n_layers}), "
                             f"got {layer}")
        if not 0 <= head < n_heads:
            raise ValueError(f"heads: head must be in [0, {n_heads}), "
                             f"got {head}")
        pairs.append((layer, head))
    return pairs


@contextmanager
def ablate_heads(model: DecoderLM,
                 heads: Iterable[tuple[int, int]]) -> Iterator[DecoderLM]:
    r"""Switch off attention heads of ``model`` inside a ``with`` block.

    For each ``(layer, head)`` (0-based) the columns of that head in the
    layer's ``o_proj.weight`` are set to zero, so the head's output
    $o_i W^O_i$ is removed from the attention output; on exit the saved
    columns are written back, bit for bit, even if the block raised.
    The weights are changed in place (no copy of the model), so the
    model must not be used by other code during the block.

    Args:
        model: a :class:`DecoderLM`.
        heads: ``(layer, head)`` pairs, ``0 <= layer < N``,
            ``0 <= head < H``; empty means no change.

    Yields:
        ``model`` itself, with the heads switched off.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    c = model.config
    pairs = _heads(heads, c.num_hidden_layers, c.num_attention_heads)
    saved = []
    try:
        with torch.no_grad():
            for layer, head in pairs:
                attn = model.layers[layer].attention
                d_h = attn.head_dim
                cols = slice(head * d_h, (head + 1) * d_h)
                w = attn.o_proj.weight                           # (D, H*d_h)
                saved.append((w, cols, w[:, cols].clone()))
                w[:, cols] = 0.0
        yield model
    finally:
        with torch.no_grad():
            for w, cols, old in reversed(saved):
                w[:, cols] = old

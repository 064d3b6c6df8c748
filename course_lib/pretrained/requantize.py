r"""Round-to-nearest 4-bit block quantization (llama.cpp's Q4_0 and Q4_1)
in torch.

Q4_0 cuts a row into blocks of 32 weights and stores each block as one
fp16 scale $d$ and 32 signed 4-bit integers $q_j \in \{-8, \dots, 7\}$,
$w_j \approx d\,q_j$. The scale maps the block's value of largest
magnitude, $w_{\max}$ (with its sign), to $-8$: $d = w_{\max} / (-8)$, and
$q_j = \lfloor w_j / d + 8.5 \rfloor - 8$ clipped to $[-8, 7]$, i.e.
$w_j / d$ rounded to the nearest integer. Unlike Q4_1 ($w = d\,q + m$)
there is no per-block minimum: the 16 levels are symmetric around 0.

:func:`q4_0_roundtrip` quantizes and dequantizes in one step, bit for bit
as ``gguf.quants`` does it (the scale is rounded to fp16 for the
dequantization, as in the file). :func:`q4_1_roundtrip` does the same for
Q4_1, the format of SmolLM2's file: $m$ the block's minimum,
$d = (\max - m)/15$, $q_j = \lfloor (w_j - m)/d + 1/2 \rfloor$ in
$[0, 15]$, and $w_j \approx d\,q_j + m$ with $d$ and $m$ stored in fp16. :func:`requantized` applies it to every
linear layer of a model's blocks for the duration of a ``with`` block,
which measures what one more 4-bit quantization step costs.

Shape letters: R rows, C columns (a multiple of 32).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .._util.validation import check_callable, check_type
from ..model.decoder_lm import DecoderLM

__all__ = ["QK4_0", "q4_0_roundtrip", "q4_1_roundtrip", "requantized"]

QK4_0 = 32          # weights per Q4_0 block


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (..., C), checked, as float32 blocks of 32: (n, 32)."""
    check_type("weight", weight, torch.Tensor, "a torch.Tensor")
    if not weight.is_floating_point():
        raise TypeError(f"weight must be a floating tensor, got "
                        f"{weight.dtype}")
    if weight.dim() == 0 or weight.shape[-1] % QK4_0:
        raise ValueError(f"weight's last dimension must be a multiple of "
                         f"{QK4_0}, got shape {tuple(weight.shape)}")
    blocks = weight.detach().float().reshape(-1, QK4_0)      # (n, 32)
    return blocks


def q4_0_roundtrip(weight: torch.Tensor) -> torch.Tensor:
    r"""``weight`` quantized to Q4_0 and dequantized again.

    Args:
        weight: ``(..., C)`` floating tensor, ``C`` a multiple of 32.

    Returns:
        ``(..., C)`` float32: $d\,q_j$ for every weight, the value the
        Q4_0 block of that weight decodes to.
    """
    blocks = _blocks(weight)                                  # (n, 32)
    # the signed value of largest magnitude; on a tie between +a and -a
    # the first one in the block, as NumPy's argmax picks it
    hi = blocks.amax(-1, keepdim=True)                        # (n, 1)
    lo = blocks.amin(-1, keepdim=True)                        # (n, 1)
    w_max = torch.where(hi >= -lo, hi, lo)                    # (n, 1)
    tie = ((hi == -lo) & (hi != 0)).squeeze(-1)               # (n,)
    if tie.any():
        b = blocks[tie]                                       # (k, 32)
        w_max[tie] = b.gather(-1, b.abs().argmax(-1, keepdim=True))
    d = w_max / -8                                            # (n, 1)
    inv = torch.where(d == 0, 0.0, 1 / d)                     # (n, 1)
    # w/d lies in [-8, 8]: +8.5 and floor round it to the nearest integer
    q = (blocks * inv).add_(8.5).floor_().clamp_(max=15).sub_(8)  # (n, 32)
    d16 = d.to(torch.float16).float()                         # stored scale
    return q.mul_(d16).reshape(weight.shape)                  # (..., C)


def q4_1_roundtrip(weight: torch.Tensor) -> torch.Tensor:
    r"""``weight`` quantized to Q4_1 and dequantized again.

    Each block of 32 consecutive weights along the last axis gets its
    minimum $m$ and the scale $d = (\max_j w_j - m)/15$; each weight is
    rounded to the nearest of the 16 levels $m + d\,q$,
    $q_j = \lfloor (w_j - m)/d + 1/2 \rfloor$ clipped to $[0, 15]$ (all
    $q_j = 0$ when $d = 0$), computed in float32 as ``gguf.quants`` does.
    The file stores $d$ and $m$ as fp16, so the decoded weight is
    $\hat w_j = \mathrm{fp16}(d)\,q_j + \mathrm{fp16}(m)$, bit for bit
    what ``gguf.quants`` quantizes and dequantizes.

    Args:
        weight: ``(..., C)`` floating tensor, ``C`` a multiple of 32.

    Returns:
        ``(..., C)`` float32: the value each weight's Q4_1 block decodes
        to.
    """
    blocks = _blocks(weight)                                  # (n, 32)
    lo = blocks.amin(-1, keepdim=True)                        # (n, 1) m
    d = (blocks.amax(-1, keepdim=True) - lo) / 15             # (n, 1)
    inv = torch.where(d == 0, 0.0, 1 / d)                     # (n, 1)
    q = ((blocks - lo) * inv + 0.5).floor_().clamp_(0, 15)    # (n, 32)
    d16, m16 = d.half().float(), lo.half().float()            # stored
    return (d16 * q + m16).reshape(weight.shape)              # (..., C)


@contextmanager
def requantized(model: DecoderLM,
                roundtrip: Callable[[torch.Tensor], torch.Tensor]
                = q4_0_roundtrip) -> Iterator[DecoderLM]:
    r"""Every ``nn.Linear`` weight inside ``model.layers`` replaced by
    ``roundtrip(weight)`` for the duration of a ``with`` block.

    These are the projections of attention and of the feed-forward
    layers (in a GGUF file, the Q4_1 tensors); the embedding, the output
    head and the norms are left as they are. The original tensors are
    kept and put back on exit, even if the block raised.

    Args:
        model: a :class:`DecoderLM`.
        roundtrip: maps a ``(R, C)`` weight to a tensor of the same shape.

    Yields:
        ``model`` itself, with re-quantized weights.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_callable("roundtrip", roundtrip)
    saved = []
    try:
        for module in model.layers.modules():
            if isinstance(module, nn.Linear):
                w = module.weight
                new = roundtrip(w.data).to(w.dtype)               # (R, C)
                if new.shape != w.shape:
                    raise ValueError(
                        f"roundtrip must keep the weight's shape "
                        f"{tuple(w.shape)}, got {tuple(new.shape)}")
                saved.append((w, w.data))
                w.data = new
        yield model
    finally:
        for w, old in reversed(saved):
            w.data = old

r"""FP8 weights with one scale per block, as DeepSeek-V3 releases them.

DeepSeek-V3's checkpoint stores most projection matrices in FP8 (E4M3)
next to a float32 tensor ``weight_scale_inv`` that holds one scale per
$128 \times 128$ block (chapter 10). The true weight is the stored value
times its block's scale,

$$W_{r,c} = Q_{r,c} \cdot s_{\lfloor r / b \rfloor, \lfloor c / b
\rfloor}, \qquad s \in \mathbb{R}^{\lceil R / b \rceil \times \lceil C / b
\rceil},$$

and a matrix whose sides are not multiples of $b$ has partial blocks at
its bottom and right edges, each with a scale of its own (DeepSeek's
``inference/kernel.py``, ``weight_dequant``, does the same with a GPU
kernel). :func:`quantize_fp8_blocks` goes the other way: each block is
divided by its largest magnitude over 448, the largest E4M3 number.

Shape letters: R rows (output features), C columns (input features), b
the block side.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_int

__all__ = ["FP8_MAX", "dequantize_fp8_blocks", "quantize_fp8_blocks"]

#: The largest finite number of float8 E4M3 (``torch.float8_e4m3fn``).
FP8_MAX = 448.0


def _check_matrix(name: str, value) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        raise ValueError(f"{name} must be a 2-D tensor (R, C), got "
                         f"{value!r:.60}")


def dequantize_fp8_blocks(weight: torch.Tensor, scale_inv: torch.Tensor, *,
                          block: int = 128) -> torch.Tensor:
    r"""The float32 weight $W = Q \odot s$ (each block times its scale).

    Args:
        weight: ``(R, C)`` stored values $Q$ (``float8_e4m3fn``, or any
            float dtype holding them).
        scale_inv: ``(ceil(R / block), ceil(C / block))`` float scales
            $s$ (DeepSeek's ``weight_scale_inv``: despite the name, the
            factor that *multiplies* the stored value).
        block: the block side $b$ (128 in DeepSeek-V3).

    Returns:
        ``(R, C)`` float32.
    """
    _check_matrix("weight", weight)
    _check_matrix("scale_inv", scale_inv)
    check_int("block", block, minimum=1)
    R, C = weight.shape
    grid = (math.ceil(R / block), math.ceil(C / block))
    if tuple(scale_inv.shape) != grid:
        raise ValueError(f"scale_inv must have shape {grid} for a weight "
                         f"{(R, C)} in blocks of {block}, got "
                         f"{tuple(scale_inv.shape)}")
    if not weight.is_floating_point() or not scale_inv.is_floating_point():
        raise ValueError(f"weight and scale_inv must be float tensors, got "
                         f"{weight.dtype} and {scale_inv.dtype}")
    # one scale per element: repeat each block's scale b times along both
    # axes, then cut the partial blocks at the bottom and right edges
    full = scale_inv.float().repeat_interleave(block, 0) \
        .repeat_interleave(block, 1)[:R, :C]                  # (R, C)
    return weight.float() * full


def quantize_fp8_blocks(weight: torch.Tensor, *, block: int = 128
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Store ``weight`` as FP8 with one scale per block (the inverse of
    :func:`dequantize_fp8_blocks`, up to FP8 rounding).

    Each block's scale is its largest magnitude over ``FP8_MAX`` (an
    all-zero block gets scale 1), so the block's values fill E4M3's range.

    Args:
        weight: ``(R, C)`` float tensor. block: the block side $b$.

    Returns:
        ``(Q, s)``: ``(R, C)`` ``float8_e4m3fn`` values and
        ``(ceil(R / b), ceil(C / b))`` float32 scales.
    """
    _check_matrix("weight", weight)
    check_int("block", block, minimum=1)
    if not weight.is_floating_point():
        raise ValueError(f"weight must be a float tensor, got "
                         f"{weight.dtype}")
    R, C = weight.shape
    gr, gc = math.ceil(R / block), math.ceil(C / block)
    padded = weight.float().new_zeros(gr * block, gc * block)
    padded[:R, :C] = weight.float()
    amax = padded.view(gr, block, gc, block).abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    full = scale.repeat_interleave(block, 0) \
        .repeat_interleave(block, 1)[:R, :C]                  # (R, C)
    return (weight.float() / full).to(torch.float8_e4m3fn), scale

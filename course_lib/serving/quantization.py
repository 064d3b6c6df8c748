r"""Weight-only quantization: int8 per output channel and 4-bit per group.

Decoding one token multiplies one activation row by every weight matrix
of the model, so each step reads all the weights once and does two
floating-point operations per weight read: the step is bound by memory
bandwidth, not by arithmetic (chapter 13 measures it). Storing the
weights in fewer bits shrinks the model, and makes the step faster *only
if the matmul reads the small weights*; activations stay in floating
point ("weight-only" quantization).

**int8, symmetric, one scale per output channel.** Row $o$ of a weight
$W \in \mathbb{R}^{N \times K}$ (``nn.Linear``'s (out, in) layout) gets

$$s_o = \frac{\max_i |W_{oi}|}{127}, \qquad
q_{oi} = \mathrm{round}(W_{oi} / s_o) \in \{-127, \dots, 127\}, \qquad
\hat W_{oi} = s_o\,q_{oi},$$

so $|W_{oi} - \hat W_{oi}| \le s_o / 2$: 1 byte per weight plus one
float32 scale per row. The output $y = x\hat W^\top + b$ then differs
from the full-precision one by at most
$|\Delta y_o| \le \lVert x \rVert_1\, s_o / 2$.

**4-bit, per group of $G$ input weights, with a scale and a minimum**
(llama.cpp's Q4_1 for $G = 32$, the format of chapter 13's file). Each
group $g$ of $G$ consecutive weights of a row gets its minimum $m$ and
the step $d = (\max_g w - m)/15$:

$$q_j = \big\lfloor (w_j - m)/d + \tfrac12 \big\rfloor \in \{0, \dots, 15\},
\qquad \hat w_j = \mathrm{fp16}(d)\,q_j + \mathrm{fp16}(m).$$

As llama.cpp (``quantize_row_q4_1_ref``) does, $q$ is computed with the
float32 $d$ and $m$, and $d$ and $m$ are then stored as fp16: a group
takes $G/2$ bytes of 4-bit codes (two per byte) plus 4 bytes, 0.625
byte per weight at $G = 32$. Rounding puts each weight within $d/2$ of
a level, and the fp16 rounding of $d$ and $m$ adds at most
$15\,|d - \mathrm{fp16}(d)| + |m - \mathrm{fp16}(m)|$. The codes are
packed as in a GGUF block: byte $j$ of a group holds $q_j$ in its low
nibble and $q_{j + G/2}$ in its high nibble.

Each layer offers two forward paths:

* **dequantize** (``kernel=False``): rebuild $\hat W$ in float32 at every
  call, then an ordinary matmul. The module is 4x (int8) or 6.4x (4-bit)
  smaller in memory; a call reads the small weights, *writes* a float32
  copy and reads it again. Whether that is faster than the float32 layer
  depends on where the copy lives. One SmolLM2 layer's copy (at most
  3.4 MiB) stays in the CPU's cache, so the memory traffic of an int8
  layer drops to its int8 bytes: on the course's 2-core CPU an int8 model
  decoded 1.1-1.3x faster than float32 (``benchmarks/
  quantization_bench.py``, busy machine). The 108 MiB output head's copy
  does not fit and goes to memory and back (2x slower than float32), and
  unpacking 4-bit codes costs more arithmetic than it saves (2-4x slower).
* **kernel** (``kernel=True``): torch's fused CPU kernels, which read the
  int8 or 4-bit weights and dequantize in registers:
  ``torch._weight_int8pack_mm`` and ``torch._weight_int4pack_mm_for_cpu``
  (with its packing ``torch._convert_weight_to_int4pack_for_cpu``). In
  torch 2.13 both are vectorized only for bfloat16 activations (float32
  and float16 go through a scalar loop, 10-30x slower than a float32
  matmul), so this path rounds the activations to bfloat16, accumulates
  in float32 and returns the bfloat16 result: not bit-equal to the
  dequantize path, within bfloat16 rounding of it (the tests bound it).
  The int8 kernel is given unit scales and the float32 scales are applied
  to its output, so the weight is exactly $\hat W$; the 4-bit kernel
  takes its scale and offset in bfloat16 and computes
  $(q - 8)\,\mathrm{bf16}(d) + \mathrm{bf16}(m + 8d)$: bfloat16 keeps 8
  significant bits, so each weight moves by up to
  $2^{-8}\,(|q - 8|\,d + |m + 8d|)$.

:func:`quantize_model` returns a copy of a
:class:`~course_lib.model.decoder_lm.DecoderLM` whose decoder layers use
these modules; :func:`weight_bytes` counts what a model holds, by dtype;
:func:`quantization_error` measures what a weight loses, for figures;
:func:`perplexity` measures what the model loses, on text.

Shape letters: N output features, K input features, G group size,
B batch, T tokens, V vocabulary size.
"""
from __future__ import annotations

import copy
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .._util.validation import (
    check_bool,
    check_choice,
    check_even,
    check_ids,
    check_int,
    check_type,
)
from ..model.decoder_lm import DecoderLM
from ..pretrained.gguf_file import QK

__all__ = ["quantize_weight_int8", "quantize_weight_q4_1", "pack_int4",
           "unpack_int4", "dequantize_q4_1", "WeightOnlyInt8Linear",
           "WeightOnlyInt4Linear", "Int8Embedding", "quantize_model",
           "weight_bytes", "QuantizationStats", "quantization_error",
           "PerplexityResult", "perplexity"]

QMAX = 127                    # int8 codes -127..127: -w quantizes to -q
FP16_MAX = 65504.0            # largest finite fp16: Q4_1's d and m are fp16
KERNEL_GROUPS = (32, 64, 128, 256)   # group sizes torch's int4 kernel takes


# ---------------------------------------------------------------- checks

def _check_weight(weight, name: str = "weight") -> None:
    """``weight`` must be a floating (N, K) tensor (the quantizers check
    that it is finite on the maxima they compute anyway)."""
    check_type(name, weight, torch.Tensor, "a torch.Tensor")
    if not weight.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got "
                        f"{weight.dtype}")
    if weight.dim() != 2 or weight.numel() == 0:
        raise ValueError(f"{name} must have shape (N, K) with N, K >= 1, "
                         f"got {tuple(weight.shape)}")


def _check_bias(bias, N: int) -> None:
    """``bias`` must be None or a floating (N,) tensor."""
    if bias is None:
        return
    check_type("bias", bias, torch.Tensor, "a torch.Tensor or None")
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a floating tensor, got {bias.dtype}")
    if tuple(bias.shape) != (N,):
        raise ValueError(f"bias must have shape (N,) = ({N},), got "
                         f"{tuple(bias.shape)}")


def _check_group_size(group_size, K: int) -> None:
    """``group_size`` must be an even int dividing ``K``."""
    check_even("group_size", group_size)
    if K % group_size:
        raise ValueError(f"group_size must divide in_features, got "
                         f"group_size={group_size}, in_features={K}")


def _check_input(x, K: int) -> None:
    """``x`` must be a floating tensor (..., K) (cheap: every layer of
    every decoding step calls it)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating torch.Tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] != K:
        raise ValueError(f"x must have shape (..., in_features={K}), got "
                         f"{tuple(x.shape)}")


def _check_finite(extremes: torch.Tensor) -> None:
    """A weight's row or group maxima must be finite (amax propagates NaN,
    so one NaN or infinite weight makes its group's maximum non-finite)."""
    if not bool(torch.isfinite(extremes).all()):
        raise ValueError("weight must be finite, got NaN or infinite "
                         "values")


def _bias_buffer(bias) -> torch.Tensor | None:
    return None if bias is None else bias.detach().float().clone()


# ------------------------------------------------------- the two formats

def quantize_weight_int8(weight: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Symmetric int8 quantization with one scale per output channel.

    $s_o = \max_i |W_{oi}| / 127$ and
    $q_{oi} = \mathrm{round}(W_{oi}/s_o)$, so that $\hat W = s\,q$ is
    within $s_o/2$ of $W$ in row $o$. ``torch.round`` rounds halves to
    even (llama.cpp's ``roundf`` away from zero; a tie is a weight exactly
    halfway between two levels, which trained weights practically never
    are). A row of zeros gets $s_o = 1$ (any scale is exact).

    Args:
        weight: ``(N, K)`` finite floating tensor (``nn.Linear.weight``).

    Returns:
        ``(q, scale)``: int8 ``(N, K)`` codes in $[-127, 127]$ and float32
        ``(N,)`` scales.
    """
    _check_weight(weight)
    return _quantize_int8(weight)


def _quantize_int8(weight: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_weight_int8` of a checked weight."""
    w = weight.detach().float()                               # (N, K)
    amax = w.abs().amax(dim=1)                                # (N,)
    _check_finite(amax)
    scale = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    q = torch.round(w / scale[:, None]).clamp_(-QMAX, QMAX)   # (N, K)
    return q.to(torch.int8).contiguous(), scale               # (N, K), (N,)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    r"""Two 4-bit codes per byte, in the GGUF block layout.

    A group of $G$ codes $q_0 \dots q_{G-1}$ becomes $G/2$ bytes; byte
    $j$ is $q_j + 16\,q_{j+G/2}$: the low nibbles hold the first half of
    the group, the high nibbles the second (ggml's ``block_q4_1``).

    Args:
        q: ``(..., G)`` integer codes in $[0, 15]$, $G$ even.

    Returns:
        ``(..., G/2)`` uint8.
    """
    check_type("q", q, torch.Tensor, "a torch.Tensor")
    if q.is_floating_point() or q.is_complex() or q.dtype == torch.bool:
        raise TypeError(f"q must be an integer tensor, got {q.dtype}")
    if q.dim() == 0 or q.shape[-1] % 2:
        raise ValueError(f"q's last dimension must be even (two codes per "
                         f"byte), got shape {tuple(q.shape)}")
    if q.numel() and (int(q.min()) < 0 or int(q.max()) > 15):
        raise ValueError(f"q must hold 4-bit codes in [0, 15], got "
                         f"[{int(q.min())}, {int(q.max())}]")
    half = q.shape[-1] // 2
    low, high = q[..., :half], q[..., half:]                  # (..., G/2)
    return (low | (high << 4)).to(torch.uint8)                # (..., G/2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`: ``(..., G/2)`` uint8 -> ``(..., G)``
    uint8 codes (low nibbles first, then high nibbles)."""
    check_type("packed", packed, torch.Tensor, "a torch.Tensor")
    if packed.dtype != torch.uint8:
        raise TypeError(f"packed must be a uint8 tensor, got "
                        f"{packed.dtype}")
    if packed.dim() == 0:
        raise ValueError("packed must have at least one dimension")
    return torch.cat([packed & 0x0F, packed >> 4], dim=-1)    # (..., G)


def quantize_weight_q4_1(weight: torch.Tensor, group_size: int = QK
                         ) -> tuple[torch.Tensor, torch.Tensor,
                                    torch.Tensor]:
    r"""Q4_1 quantization: per group of ``group_size`` input weights, a
    minimum $m$, a step $d = (\max - m)/15$ and 4-bit codes
    $q = \lfloor (w - m)/d + 1/2 \rfloor$ clipped to $[0, 15]$
    (all 0 if $d = 0$), computed in float32; $d$ and $m$ returned as fp16,
    as a GGUF file stores them.

    At ``group_size=32`` the bytes are those of llama.cpp's Q4_1 blocks:
    the fp16 $d$, the fp16 $m$ and the 16 bytes of ``packed`` of a group,
    in that order, are the 20 bytes ``gguf.quants.quantize`` writes.

    Args:
        weight: ``(N, K)`` finite floating tensor, $|w| \le 65504$ (fp16).
        group_size: $G$, even, dividing $K$ (default 32, as Q4_1).

    Returns:
        ``(packed, d, m)``: uint8 ``(N, K/G, G/2)`` codes packed by
        :func:`pack_int4`, fp16 ``(N, K/G)`` steps and fp16 ``(N, K/G)``
        minima.
    """
    _check_weight(weight)
    _check_group_size(group_size, weight.shape[1])
    return _quantize_q4_1(weight, group_size)


def _quantize_q4_1(weight: torch.Tensor, group_size: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`quantize_weight_q4_1` of a checked weight and group size."""
    N, K = weight.shape
    groups = weight.detach().float().reshape(
        N, K // group_size, group_size)                       # (N, K/G, G)
    m = groups.amin(-1, keepdim=True)                         # (N, K/G, 1)
    top = groups.amax(-1, keepdim=True)                       # (N, K/G, 1)
    _check_finite(top - m)
    if max(float(m.abs().max()), float(top.abs().max())) > FP16_MAX:
        raise ValueError(f"weight must lie within fp16's range "
                         f"(|w| <= {FP16_MAX:g}): Q4_1 stores its minimum "
                         f"in fp16")
    d = (top - m) / 15                                        # (N, K/G, 1)
    inv = torch.where(d == 0, 0.0, 1 / d)                     # (N, K/G, 1)
    q = ((groups - m) * inv + 0.5).floor_().clamp_(0, 15)     # (N, K/G, G)
    packed = pack_int4(q.to(torch.uint8))                     # (N, K/G, G/2)
    return packed, d.squeeze(-1).half(), m.squeeze(-1).half()


def dequantize_q4_1(packed: torch.Tensor, d: torch.Tensor,
                    m: torch.Tensor) -> torch.Tensor:
    r"""$\hat w_j = d\,q_j + m$ for every group: the float32 weight that
    :func:`quantize_weight_q4_1`'s ``(packed, d, m)`` stands for.

    Args:
        packed: uint8 ``(N, K/G, G/2)``; d, m: ``(N, K/G)`` (fp16).

    Returns:
        float32 ``(N, K)``.
    """
    q = unpack_int4(packed)                                   # (N, K/G, G)
    check_type("d", d, torch.Tensor, "a torch.Tensor")
    check_type("m", m, torch.Tensor, "a torch.Tensor")
    if d.shape != q.shape[:-1] or m.shape != q.shape[:-1]:
        raise ValueError(f"d and m must have shape (N, K/G) = "
                         f"{tuple(q.shape[:-1])}, got {tuple(d.shape)} and "
                         f"{tuple(m.shape)}")
    # in place: one new float32 tensor; every extra temporary of a large
    # weight costs another allocation and pass over memory
    w = q.float().mul_(d.float()[..., None]).add_(m.float()[..., None])
    return w.reshape(q.shape[0], -1)                          # (N, K)


# ------------------------------------------------------------ the layers

class _WeightOnlyLinear(nn.Module):
    r"""What the int8 and the 4-bit layers share: the float32 path
    (dequantize $\hat W$, then ``F.linear``) and the kernel path (the
    subclass's ``_kernel_mm`` on bfloat16 activations, the bias added in
    float32). A subclass sets ``in_features``, ``out_features``,
    ``kernel`` and the ``bias`` buffer, and defines ``dequantize`` and
    ``_kernel_mm``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (..., K) -> (..., N), in ``x``'s dtype."""
        _check_input(x, self.in_features)
        if not self.kernel:
            return F.linear(x, self.dequantize().to(x.dtype),
                            None if self.bias is None
                            else self.bias.to(x.dtype))       # (..., N)
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16).contiguous()
        y = self._kernel_mm(x2)                               # (BT, N) fp32
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


class WeightOnlyInt8Linear(_WeightOnlyLinear):
    r"""``nn.Linear`` with int8 weights: $y = x\,\hat W^\top + b$,
    $\hat W = s\,q$ (:func:`quantize_weight_int8`).

    Holds ``weight`` (int8 ``(N, K)``: 1 byte per weight), ``scales``
    (float32 ``(N,)``) and ``bias`` (float32 ``(N,)`` or None) as buffers,
    nothing else.

    Args:
        weight: ``(N, K)`` floating weight to quantize (e.g. a
            ``nn.Linear``'s); not kept.
        bias: ``(N,)`` or None, kept in float32.
        kernel: False: dequantize $\hat W$ in float32 at every call, then
            ``F.linear`` (exactly ``F.linear(x, W_hat, b)``); True:
            ``torch._weight_int8pack_mm``, which reads the int8 weight,
            with bfloat16 activations and output (see the module
            docstring); needs $K$ a multiple of 16 (torch 2.13's kernel
            checks nothing and returns wrong values or crashes
            otherwise).
    """

    def __init__(self, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, *,
                 kernel: bool = False) -> None:
        super().__init__()
        _check_weight(weight)
        N, K = weight.shape
        _check_bias(bias, N)
        check_bool("kernel", kernel)
        if kernel and K % 16:
            raise ValueError(f"kernel=True needs in_features a multiple of "
                             f"16 (torch's int8 kernel), got {K}")
        self.in_features, self.out_features, self.kernel = K, N, kernel
        q, scales = _quantize_int8(weight)
        self.register_buffer("weight", q)                     # (N, K) int8
        self.register_buffer("scales", scales)                # (N,) fp32
        self.register_buffer("bias", _bias_buffer(bias))      # (N,) | None
        # the kernel multiplies by its own bf16 scales: give it ones and
        # apply the float32 scales to its output (not counted as weights)
        self.register_buffer("_ones", torch.ones(N, dtype=torch.bfloat16)
                             if kernel else None, persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *,
                    kernel: bool = False) -> "WeightOnlyInt8Linear":
        """The quantized copy of ``linear`` (its weight and bias)."""
        check_type("linear", linear, nn.Linear, "an nn.Linear")
        return cls(linear.weight, linear.bias, kernel=kernel)

    def dequantize(self) -> torch.Tensor:
        r"""$\hat W = s\,q$: float32 ``(N, K)``."""
        return self.weight.float().mul_(self.scales[:, None])  # (N, K)

    @property
    def nbytes(self) -> int:
        """Bytes of the weight, the scales and the bias."""
        return sum(t.nbytes for t in (self.weight, self.scales, self.bias)
                   if t is not None)

    def _kernel_mm(self, x2: torch.Tensor) -> torch.Tensor:
        r"""(BT, K) bf16 -> (BT, N) float32: $\sum_i x_i q_{oi}$ read from
        int8 (fp32 sums, bf16 out), times the float32 scales."""
        y = torch._weight_int8pack_mm(x2, self.weight, self._ones)
        return y.float() * self.scales                        # (BT, N)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features="
                f"{self.out_features}, bias={self.bias is not None}, "
                f"kernel={self.kernel}")


class WeightOnlyInt4Linear(_WeightOnlyLinear):
    r"""``nn.Linear`` with 4-bit weights, Q4_1 per group of $G$ input
    weights (:func:`quantize_weight_q4_1`): $y = x\,\hat W^\top + b$.

    With ``kernel=False`` it holds the GGUF layout: ``weight`` (uint8
    ``(N, K/G, G/2)``, two codes per byte), ``scales`` $d$ and ``mins``
    $m$ (fp16 ``(N, K/G)``), i.e. $0.5 + 4/G$ bytes per weight (0.625 at
    $G = 32$), and dequantizes $\hat W = d\,q + m$ in float32 at every
    call. With ``kernel=True`` it holds instead what
    ``torch._weight_int4pack_mm_for_cpu`` reads: ``weight`` (uint8
    ``(N, K/2)``, torch's packing, which depends on the CPU's vector
    width) and ``scales_and_zeros`` (bfloat16 ``(K/G, N, 2)``:
    $\mathrm{bf16}(d)$ and $\mathrm{bf16}(m + 8d)$, since the kernel
    computes $(q - 8)\cdot\text{scale} + \text{zero}$), the same number of
    bytes; it runs on bfloat16 activations (module docstring).

    Args:
        weight: ``(N, K)`` floating weight to quantize; not kept.
        bias: ``(N,)`` or None, kept in float32.
        group_size: $G$, even and dividing $K$ (default 32: Q4_1); with
            ``kernel=True`` one of 32, 64, 128, 256.
        kernel: use torch's int4 kernel (needs $N$ a multiple of 16).
    """

    def __init__(self, weight: torch.Tensor,
                 bias: torch.Tensor | None = None, *,
                 group_size: int = QK, kernel: bool = False) -> None:
        super().__init__()
        _check_weight(weight)
        N, K = weight.shape
        _check_bias(bias, N)
        _check_group_size(group_size, K)
        check_bool("kernel", kernel)
        if kernel:
            check_choice("group_size", group_size, KERNEL_GROUPS)
            if N % 16:
                raise ValueError(f"kernel=True needs out_features a "
                                 f"multiple of 16 (torch's int4 kernel), "
                                 f"got {N}")
        self.in_features, self.out_features = K, N
        self.group_size, self.kernel = group_size, kernel
        packed, d, m = _quantize_q4_1(weight, group_size)
        if not kernel:
            self.register_buffer("weight", packed)            # (N, K/G, G/2)
            self.register_buffer("scales", d)                 # (N, K/G) fp16
            self.register_buffer("mins", m)                   # (N, K/G) fp16
        else:
            q = unpack_int4(packed).reshape(N, K)             # (N, K) codes
            self.register_buffer(
                "weight", torch._convert_weight_to_int4pack_for_cpu(
                    q.to(torch.int32), 1))                    # (N, K/2)
            d32, m32 = d.float(), m.float()                   # (N, K/G)
            zero = m32 + 8 * d32             # d q + m = (q - 8) d + zero
            self.register_buffer("scales_and_zeros", torch.stack(
                [d32, zero], dim=-1).transpose(0, 1).contiguous()
                .to(torch.bfloat16))                          # (K/G, N, 2)
        self.register_buffer("bias", _bias_buffer(bias))      # (N,) | None

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, group_size: int = QK,
                    kernel: bool = False) -> "WeightOnlyInt4Linear":
        """The quantized copy of ``linear`` (its weight and bias)."""
        check_type("linear", linear, nn.Linear, "an nn.Linear")
        return cls(linear.weight, linear.bias, group_size=group_size,
                   kernel=kernel)

    def dequantize(self) -> torch.Tensor:
        r"""The float32 weight $\hat W$ ``(N, K)`` the layer multiplies by.

        ``kernel=False``: $d\,q + m$ from the GGUF layout
        (:func:`dequantize_q4_1`). ``kernel=True``: torch's packing is not
        meant to be read back, so the kernel itself is run on the identity
        matrix in float32, $\hat W^\top = I_K \hat W^\top$ (column $i$ of a
        linear map is its image of the basis vector $e_i$); exact, but
        torch's float32 path is a scalar loop: seconds for a large layer.
        """
        if not self.kernel:
            return dequantize_q4_1(self.weight, self.scales, self.mins)
        eye = torch.eye(self.in_features)                     # (K, K)
        return torch._weight_int4pack_mm_for_cpu(
            eye, self.weight, self.group_size,
            self.scales_and_zeros.float()).t().contiguous()   # (N, K)

    @property
    def nbytes(self) -> int:
        """Bytes of the codes, the scales (and minima) and the bias."""
        names = (("weight", "scales_and_zeros") if self.kernel
                 else ("weight", "scales", "mins")) + ("bias",)
        return sum(getattr(self, n).nbytes for n in names
                   if getattr(self, n) is not None)

    def _kernel_mm(self, x2: torch.Tensor) -> torch.Tensor:
        r"""(BT, K) bf16 -> (BT, N) float32: $x\,((q - 8)\,\text{scale} +
        \text{zero})^\top$ (fp32 sums, bf16 out)."""
        return torch._weight_int4pack_mm_for_cpu(
            x2, self.weight, self.group_size,
            self.scales_and_zeros).float()                    # (BT, N)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features="
                f"{self.out_features}, bias={self.bias is not None}, "
                f"group_size={self.group_size}, kernel={self.kernel}")


class Int8Embedding(nn.Module):
    r"""A token embedding stored in int8, one scale per row (token):
    row $v$ is $\hat E_v = s_v\,q_v$ (:func:`quantize_weight_int8`).

    A lookup returns the dequantized rows, float32 ``(..., D)``. Given a
    :class:`WeightOnlyInt8Linear` (the output head of a model whose head
    is tied to its embedding, as SmolLM2's), it *shares* that layer's
    int8 table and scales: the tie survives quantization, and the table
    is stored once.

    Args:
        weight: the ``(V, D)`` floating table, or a
            :class:`WeightOnlyInt8Linear` of shape ``(V, D)`` to share.
    """

    def __init__(self, weight: torch.Tensor | WeightOnlyInt8Linear) -> None:
        super().__init__()
        if isinstance(weight, WeightOnlyInt8Linear):
            q, scales = weight.weight, weight.scales          # shared
        else:
            _check_weight(weight)
            q, scales = _quantize_int8(weight)
        self.num_embeddings, self.embedding_dim = q.shape
        self.register_buffer("weight", q)                     # (V, D) int8
        self.register_buffer("scales", scales)                # (V,) fp32

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx`` (...) integer ids in $[0, V)$ -> float32 (..., D)."""
        if not isinstance(idx, torch.Tensor) or idx.is_floating_point() \
                or idx.is_complex() or idx.dtype == torch.bool:
            raise TypeError(f"idx must be an integer tensor, got "
                            f"{getattr(idx, 'dtype', type(idx).__name__)}")
        rows = self.weight[idx]                               # (..., D) int8
        return rows.float() * self.scales[idx][..., None]     # (..., D)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


# ------------------------------------------------------------- the model

def quantize_model(model: DecoderLM, bits: int, *, group_size: int = QK,
                   kernel: bool = False,
                   embeddings: bool = False) -> DecoderLM:
    r"""A copy of ``model`` whose decoder-layer linear layers are
    weight-only quantized; ``model`` itself is not changed.

    Every ``nn.Linear`` inside ``model.layers`` (the attention
    projections $W^Q, W^K, W^V, W^O$ and the feed-forward matrices)
    becomes a :class:`WeightOnlyInt8Linear` (``bits=8``) or a
    :class:`WeightOnlyInt4Linear` (``bits=4``). The norms stay float32.

    The token embedding and the output head (one tied $(V, D)$ matrix in
    SmolLM2, 28 M of its 135 M weights) are kept as they are by default.
    With ``embeddings=True`` both are stored in int8 with one scale per
    row, whatever ``bits`` is, and a tied pair shares one int8 table
    (:class:`Int8Embedding`); this follows llama.cpp, whose Q4_1 file of
    SmolLM2 keeps ``token_embd`` at 8 bits (Q8_0: an fp16 scale per 32
    weights) while the layers' matrices are Q4_1.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM`.
        bits: 8 or 4.
        group_size: weights per group of the 4-bit format (default 32, as
            Q4_1); ignored for ``bits=8`` (one scale per row).
        kernel: the layers' forward path: False dequantizes at every call,
            True calls torch's int8/int4 kernel (bfloat16 activations).
        embeddings: also store the embedding and output head in int8.

    Returns:
        the quantized copy, in eval mode (its quantized layers have no
        gradients: inference only).
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_type("bits", bits, int, "an int (8 or 4)")
    check_choice("bits", bits, (8, 4))
    check_int("group_size", group_size, minimum=2)
    check_bool("kernel", kernel)
    check_bool("embeddings", embeddings)

    def quantized(linear: nn.Linear) -> nn.Module:
        if bits == 8:
            return WeightOnlyInt8Linear.from_linear(linear, kernel=kernel)
        return WeightOnlyInt4Linear.from_linear(
            linear, group_size=group_size, kernel=kernel)

    # deepcopy copies the model; the memo entries hand it the quantized
    # layers in place of the originals, so no float32 copy of a replaced
    # weight is ever made.
    memo = {id(m): quantized(m) for m in model.layers.modules()
            if isinstance(m, nn.Linear)}
    if embeddings:
        head = WeightOnlyInt8Linear.from_linear(model.lm_head,
                                                kernel=kernel)
        tied = model.lm_head.weight is model.embed_tokens.weight
        memo[id(model.lm_head)] = head
        memo[id(model.embed_tokens)] = Int8Embedding(
            head if tied else model.embed_tokens.weight)
    return copy.deepcopy(model, memo).eval()


def weight_bytes(module: nn.Module) -> dict[str, int]:
    """Bytes of a module's weights by dtype: its parameters and
    persistent buffers (what its ``state_dict`` holds), each tensor
    counted once however many names it has (a tied embedding and head, or
    an :class:`Int8Embedding` sharing its head's table).

    Args:
        module: any ``nn.Module`` (a model, or e.g. ``model.layers``).

    Returns:
        ``{dtype name: bytes}``, e.g. ``{"float32": ..., "int8": ...}``,
        in order of first appearance.

    Raises:
        ValueError naming the entry if the state holds something other
        than tensors (torch.ao's quantized modules keep packed objects).
    """
    check_type("module", module, nn.Module, "a torch.nn.Module")
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    for name, t in module.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"module holds {name!r}, a "
                             f"{type(t).__name__} and not a tensor (e.g. "
                             f"torch.ao's packed parameters): its bytes "
                             f"cannot be counted")
        key = (t.data_ptr(), t.nbytes)
        if t.nbytes == 0 or key in seen:
            continue
        seen.add(key)
        name = str(t.dtype).removeprefix("torch.")
        out[name] = out.get(name, 0) + t.nbytes
    return out


class QuantizationStats(NamedTuple):
    """What quantizing one weight loses (:func:`quantization_error`)."""
    relative: float              # ||W - W_hat||_F / ||W||_F
    group_rms: torch.Tensor      # (n_groups,) RMS of w - w_hat per group
    group_step: torch.Tensor     # (n_groups,) the group's grid step


def quantization_error(weight: torch.Tensor, bits: int, *,
                       group_size: int = QK) -> QuantizationStats:
    r"""The error of quantizing ``weight`` (:func:`quantize_weight_int8` or
    :func:`quantize_weight_q4_1`), overall and per group.

    Overall: the relative Frobenius error
    $\lVert W - \hat W \rVert_F / \lVert W \rVert_F$. Per group (a row for
    int8, $G$ weights for 4-bit): the RMS of $w - \hat w$ and the step of
    the group's grid ($s_o$, or the fp16 $d$). Rounding to a grid of step
    $\Delta$ leaves an error spread evenly over $[-\Delta/2, \Delta/2]$
    when the weights are spread over many steps, whose RMS is
    $\Delta/\sqrt{12} \approx 0.29\,\Delta$: ``group_rms / group_step``
    sits near 0.29 and never above 0.5 (plus fp16 rounding for 4-bit).

    Args:
        weight: ``(N, K)`` floating tensor.
        bits: 8 or 4.
        group_size: $G$ for ``bits=4``.

    Returns:
        :class:`QuantizationStats` (relative, group_rms, group_step).
    """
    _check_weight(weight)
    check_type("bits", bits, int, "an int (8 or 4)")
    check_choice("bits", bits, (8, 4))
    w = weight.detach().float()                               # (N, K)
    N, K = w.shape
    if bits == 8:
        q, scales = _quantize_int8(w)
        w_hat = q.float() * scales[:, None]                   # (N, K)
        G, step = K, scales                                   # (N,)
    else:
        _check_group_size(group_size, K)
        packed, d, m = _quantize_q4_1(w, group_size)
        w_hat = dequantize_q4_1(packed, d, m)                 # (N, K)
        G, step = group_size, d.float().reshape(-1)           # (N K/G,)
    err = (w - w_hat).reshape(-1, G)                          # (groups, G)
    norm = float(torch.linalg.vector_norm(w))
    relative = float(torch.linalg.vector_norm(err)) / norm if norm else 0.0
    return QuantizationStats(relative, err.pow(2).mean(-1).sqrt(), step)


# ------------------------------------------------------------ perplexity

class PerplexityResult(NamedTuple):
    """:func:`perplexity`'s result."""
    perplexity: float     # exp(nll)
    nll: float            # mean negative log-likelihood, nats per token
    n_tokens: int         # tokens scored


@torch.no_grad()
def perplexity(model: nn.Module, ids: torch.Tensor, *, context: int = 512,
               stride: int | None = None) -> PerplexityResult:
    r"""Perplexity of ``model`` on a token stream, with a sliding window.

    $\mathrm{PPL} = \exp\big(-\frac{1}{n}\sum_t \log p(x_t \mid
    x_{b(t)} \dots x_{t-1})\big)$ in nats, over the scored tokens $t$.

    The stream is read in windows of ``context`` tokens that start every
    ``stride`` tokens (Hugging Face's perplexity guide): window
    $[b, \min(b + C, n))$ scores the tokens that no earlier window scored,
    each predicted from the window's tokens before it. With
    ``stride < context`` every token after the first is scored once, each
    with at least $C - \text{stride}$ tokens of context; with
    ``stride == context`` (the default) the windows are non-overlapping
    chunks, which cost one forward pass per $C$ tokens, and the first
    token of each chunk has no context inside its chunk and is not scored.

    Args:
        model: maps ``(1, T)`` ids to ``(1, T, V)`` logits (a
            :class:`~course_lib.model.decoder_lm.DecoderLM`); run in eval
            mode, its mode restored afterwards.
        ids: ``(n,)`` integer token ids, $n \ge 2$ (in $[0, V)$ if the
            model has a ``config.vocab_size``).
        context: window length $C \ge 2$, at most the model's
            ``config.max_position_embeddings`` if it has one.
        stride: tokens between window starts, in $[1, C]$ (default $C$).

    Returns:
        :class:`PerplexityResult` (perplexity, nll, n_tokens).
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_ids("ids", ids)
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"ids must be a 1-D stream (n,) of at least 2 "
                         f"tokens, got shape {tuple(ids.shape)}")
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    if vocab is not None and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"ids must hold token ids in [0, {vocab}), got "
                         f"[{int(ids.min())}, {int(ids.max())}]")
    limit = getattr(config, "max_position_embeddings", None)
    check_int("context", context, minimum=2, maximum=limit)
    stride = context if stride is None else stride
    check_int("stride", stride, minimum=1, maximum=context)
    ids = ids.long()
    n = ids.numel()
    was_training = model.training
    model.eval()
    try:
        total, count, done = 0.0, 0, 1    # tokens [0, done) need no score
        for begin in range(0, n, stride):
            end = min(begin + context, n)
            first = max(done, begin + 1)  # first token this window scores
            if first < end:
                logits = model(ids[None, begin:end])[0]       # (T, V)
                # logits at position j predict token j + 1
                pred = logits[first - begin - 1:end - begin - 1]  # (t, V)
                total += float(F.cross_entropy(
                    pred.float(), ids[first:end], reduction="sum"))
                count += end - first
            done = max(done, end)
            if end == n:
                break
    finally:
        model.train(was_training)
    nll = total / count
    return PerplexityResult(math.exp(nll), nll, count)

r"""Activation memory of training: what the backward pass keeps.

Training a layer needs its weights' gradients, and the gradient of a
product $y = xW$ with respect to $W$ is $x^\top \partial y$: the backward
pass needs the forward pass's *input* $x$. Autograd therefore keeps,
from the forward pass until the backward pass has used them, the input
of every matrix product and whatever each nonlinearity needs for its
derivative. These *activations* grow with the batch and the sequence;
the weights do not.

One pre-norm Llama block (RMSNorm, RoPE, multi-head attention, SwiGLU,
no bias, no dropout), run eagerly, keeps per token, with $D$ the width,
$H$ heads, $I$ the FFN width and $S$ the sequence:

- each RMSNorm: its input $x$, $\hat x = x/\mathrm{rms}(x)$ (for the
  gain's gradient) and its output (the next matmul's input): $3D$, twice;
- $1/\mathrm{rms}(x)$ of each norm, in float32: 2 values;
- $Q$ (after RoPE, scaled), $K$ (after RoPE) and $V$: $3D$;
- the softmax output $A$, which the softmax's backward
  $\partial S = A \odot (\partial A - \dots)$ and $AV$ both read: $HS$;
- the attention output (the input of $W^O$): $D$;
- SwiGLU: the gate pre-activation $g$, $\mathrm{SiLU}(g)$, the up
  projection $u$ and their product (the down projection's input): $4I$.

In all $10D + 4I + HS$ values plus two float32 statistics. RoPE keeps
nothing per token: a rotation is linear, and its backward needs only the
cos/sin tables. A FlashAttention-style kernel keeps no $S \times S$
matrix: it recomputes the scores block by block in the backward pass and
keeps, besides $Q, K, V$, its output (in the ``(B, H, S, d_h)`` layout
it wrote, a copy beside the $W^O$ input) and one float32 log-sum-exp per
head: $HS$ becomes $D$ values plus $H$ statistics.

Korthikanti et al. (2022, section 4) count $sbh(34 + 5as/h)$ bytes for a
16-bit GPT layer ($s$ sequence, $b$ batch, $h$ width, $a$ heads):
LayerNorm inputs $4sbh$; attention $11sbh + 5as^2b$ (the same $Q$, $K$, $V$,
the projections' input and $W^O$'s input; a dropout mask on the output;
the softmax output, its dropout mask and the dropped-out weights);
MLP $19sbh$ (input, GELU input and output at width $4h$, a dropout
mask). The Llama block has no dropout ($5as^2b \to 2as^2b$, one byte per
mask gone), keeps $\hat x$ in each eager RMSNorm (+$4sbh$), and its
SwiGLU keeps four tensors of width $I$ instead of two of width $4h$:
in 16-bit, $sbh(20 + 8I/h) + 2as^2b$, or $sbh(41.5 + 2as/h)$ at
Llama-2-7B's $I/h = 11008/4096$.

**Full recomputation** (activation checkpointing) keeps only each
layer's input, $sbh$ values ($2sbh$ bytes in 16-bit, as Korthikanti et
al.), and reruns the layer's forward pass just before its backward pass,
so that one layer's activations are live at a time: the peak is
$(N - 1)\,sbh$ values plus one layer's whole set (which includes its
own input), for one more forward pass of compute.

:func:`measure_saved_bytes` checks this on the course's
:class:`~course_lib.model.decoder_lm.DecoderLM`: it counts the storages
autograd saves, with ``torch.autograd.graph.saved_tensors_hooks``.

Shape letters: B batch, S sequence length, D = ``hidden_size``,
H = ``num_attention_heads``, d_h = D / H, I = ``intermediate_size``,
N = ``num_hidden_layers``.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointFunction

from .._util.threads import small_ops
from .._util.validation import (
    check_bool,
    check_choice,
    check_divides,
    check_int,
    check_sizes,
    check_type,
)
from ..model.decoder_lm import DecoderLM

__all__ = ["layer_activation_bytes", "model_activation_bytes",
           "decoder_lm_extra_bytes", "CheckpointedBlock", "checkpointed",
           "measure_saved_bytes"]

ATTENTION = ("explicit", "flash")
STAT_BYTES = 4       # norm statistics and log-sum-exp stay in float32


def _check_shape_args(batch, seq_len, hidden_size, num_attention_heads,
                      attention) -> None:
    check_sizes(batch=batch, seq_len=seq_len, hidden_size=hidden_size,
                num_attention_heads=num_attention_heads)
    check_divides("hidden_size", hidden_size, "num_attention_heads",
                  num_attention_heads)
    check_choice("attention", attention, ATTENTION)


def layer_activation_bytes(*, batch: int, seq_len: int, hidden_size: int,
                           num_attention_heads: int, intermediate_size: int,
                           bytes_per_value: int = 2,
                           attention: str = "explicit") -> int:
    r"""Bytes one Llama block keeps for its backward pass, no recomputation.

    Per token (module docstring): $10D + 4I$ values, two float32
    statistics ($1/\mathrm{rms}$ of each norm), and for attention either
    the softmax output, $HS$ values (``"explicit"``), or a
    FlashAttention-style kernel's output and log-sum-exp, $D$ values and
    $H$ float32 statistics (``"flash"``):

    $$\text{explicit: } BS\,[b\,(10D + 4I + HS) + 8], \qquad
    \text{flash: } BS\,[b\,(11D + 4I) + 4H + 8].$$

    With GQA an eager implementation repeats $K$ and $V$ to $H$ heads
    before the products, so the count is the same.

    Args:
        batch: $B$. seq_len: $S$. hidden_size: $D$.
        num_attention_heads: $H$ (divides $D$). intermediate_size: $I$.
        bytes_per_value: $b$, 2 for bf16/fp16, 4 for float32.
        attention: ``"explicit"`` or ``"flash"``.

    Returns:
        Bytes (an int).
    """
    _check_shape_args(batch, seq_len, hidden_size, num_attention_heads,
                      attention)
    check_sizes(intermediate_size=intermediate_size)
    check_int("bytes_per_value", bytes_per_value, minimum=1, maximum=8)
    B, S, D, H = batch, seq_len, hidden_size, num_attention_heads
    b, I = bytes_per_value, intermediate_size
    # norms 6D (input, x-hat, output), Q K V 3D, W^O input D, SwiGLU 4I,
    # and the two norms' 1/rms in float32 (STAT_BYTES = 4)
    per_token = b * (10 * D + 4 * I) + 2 * STAT_BYTES
    if attention == "explicit":
        per_token += b * H * S             # softmax output, H x S per token
    else:
        per_token += b * D + STAT_BYTES * H  # kernel output, log-sum-exp
    return B * S * per_token


def model_activation_bytes(*, batch: int, seq_len: int, hidden_size: int,
                           num_attention_heads: int, intermediate_size: int,
                           num_hidden_layers: int, bytes_per_value: int = 2,
                           attention: str = "explicit",
                           recompute: bool = False) -> int:
    r"""Peak activation bytes of $N$ blocks in one training step.

    Without recomputation all $N$ layers' activations are live at the
    end of the forward pass: $N \cdot L$, with $L$ =
    :func:`layer_activation_bytes`. With full recomputation each layer
    keeps only its input, $bBSD$ bytes, and the layer whose backward
    pass runs holds its whole set again (its input among them):

    $$\text{peak} = (N - 1)\,bBSD + L.$$

    The embedding, the final norm, the output head and the loss (its
    log-probabilities are $BSV$ values) come once per model and are not
    counted.

    Args:
        batch, seq_len, hidden_size, num_attention_heads,
        intermediate_size, bytes_per_value, attention: as
            :func:`layer_activation_bytes`.
        num_hidden_layers: $N$.
        recompute: full-layer recomputation (activation checkpointing).

    Returns:
        Bytes (an int).
    """
    check_sizes(num_hidden_layers=num_hidden_layers)
    check_bool("recompute", recompute)
    layer = layer_activation_bytes(
        batch=batch, seq_len=seq_len, hidden_size=hidden_size,
        num_attention_heads=num_attention_heads,
        intermediate_size=intermediate_size,
        bytes_per_value=bytes_per_value, attention=attention)
    if not recompute:
        return num_hidden_layers * layer
    layer_input = bytes_per_value * batch * seq_len * hidden_size
    return (num_hidden_layers - 1) * layer_input + layer


def decoder_lm_extra_bytes(*, batch: int, seq_len: int, hidden_size: int,
                           num_attention_heads: int, num_hidden_layers: int,
                           attention: str = "explicit",
                           recompute: bool = False) -> int:
    r"""What the course's float32 :class:`DecoderLM` blocks save beyond
    :func:`model_activation_bytes` (``bytes_per_value=4``).

    Per layer, whatever the batch: RoPE's cos and sin, rebuilt for $Q$
    and for $K$, four float32 tables $S \times d_h/2$ ($8Sd_h$ bytes);
    the mask's "row has a key" column ($S$ bools). ``"explicit"``: the
    boolean mask of ``masked_fill`` ($S^2$ bytes) and, per sequence, a
    second $H \times S \times S$ float32 copy of the weights (``attend``
    multiplies them by that column to zero query rows with no key, and
    ``A @ V`` keeps the product); ``"flash"``: torch's kernel turns the
    boolean mask into a float32 one ($4S^2$). With ``recompute`` only the
    layer being recomputed has these, and the checkpoints keep the
    model's one causal mask ($S^2$ bools) and positions ($S$ int64)
    beside the layer inputs.

    Args:
        batch, seq_len, hidden_size, num_attention_heads,
        num_hidden_layers, attention, recompute: as
            :func:`model_activation_bytes`.

    Returns:
        Bytes (an int).
    """
    _check_shape_args(batch, seq_len, hidden_size, num_attention_heads,
                      attention)
    check_sizes(num_hidden_layers=num_hidden_layers)
    check_bool("recompute", recompute)
    B, S, H = batch, seq_len, num_attention_heads
    d_h = hidden_size // H
    per_layer = 8 * S * d_h + S                  # cos/sin tables, has_key
    if attention == "explicit":
        per_layer += S * S + 4 * B * H * S * S   # bool mask, guarded A
    else:
        per_layer += 4 * S * S                   # float mask
    if not recompute:
        return num_hidden_layers * per_layer
    return per_layer + S * S + 8 * S             # checkpointed mask, pos


class CheckpointedBlock(nn.Module):
    r"""A decoder block run under activation checkpointing.

    The forward pass runs the block without keeping its activations
    (``torch.utils.checkpoint``'s re-entrant form: the checkpoint saves
    the block's tensor inputs for backward, which
    :func:`measure_saved_bytes` can count); the backward pass reruns the
    forward pass and then differentiates it. Same outputs and gradients.

    Args:
        block: a :class:`~course_lib.model.block.DecoderBlock` (any module
            called as ``block(x, mask, positions=...)``).
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        check_type("block", block, nn.Module, "an nn.Module")
        self.block = block

    def _run(self, x, mask, positions):
        return self.block(x, mask, positions=positions)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, positions: torch.Tensor | None = None,
                cache=None) -> torch.Tensor:
        """x (B, S, D) -> (B, S, D). Training only: no ``cache``."""
        if cache is not None:
            raise ValueError("cache must be None: checkpointing is for "
                             "training")
        # What checkpoint(self._run, ..., use_reentrant=True) runs, called
        # directly: the wrapper's first call imports torch._dynamo (seconds)
        return CheckpointFunction.apply(self._run, True,     # keep RNG state
                                        x, mask, positions)  # (B, S, D)


def checkpointed(model: DecoderLM) -> DecoderLM:
    """A copy of ``model`` (same weights) whose blocks are each wrapped in
    a :class:`CheckpointedBlock`; ``model`` is unchanged.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM`.

    Returns:
        A new ``DecoderLM``.
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    copy_ = copy.deepcopy(model)
    copy_.layers = nn.ModuleList(CheckpointedBlock(b) for b in copy_.layers)
    return copy_


class _Packed:
    """A saved tensor, counted while autograd holds it."""

    def __init__(self, tensor, key, counter):
        self.tensor, self.key, self.counter = tensor, key, counter

    def __del__(self):
        self.counter.release(self.key)


class _Counter:
    """Bytes of the storages autograd holds, now and at the peak; each
    storage counted once, however many views of it are saved."""

    def __init__(self, skip: set[int]) -> None:
        self.skip, self.live, self.now, self.peak = skip, {}, 0, 0

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.skip:                       # a parameter
            return t
        if key in self.live:
            self.live[key][0] += 1
        else:
            self.live[key] = [1, storage.nbytes()]
            self.now += storage.nbytes()
            self.peak = max(self.peak, self.now)
        return _Packed(t, key, self)

    @staticmethod
    def unpack(packed):
        return packed.tensor if isinstance(packed, _Packed) else packed

    def release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.live[key]


class _Counted(nn.Module):
    """Runs a block (or a checkpointed block) with the counter's hooks on."""

    def __init__(self, inner: nn.Module, counter: _Counter) -> None:
        super().__init__()
        self.inner, self.counter = inner, counter

    def forward(self, x, mask=None, *, positions=None, cache=None):
        with torch.autograd.graph.saved_tensors_hooks(self.counter.pack,
                                                      self.counter.unpack):
            return self.inner(x, mask, positions=positions, cache=cache)


def measure_saved_bytes(model: DecoderLM, idx: torch.Tensor, *,
                        attention: str = "explicit",
                        recompute: bool = False) -> int:
    r"""Peak bytes that ``model``'s blocks hold for backward in one step.

    Runs a copy of ``model`` (its weights, not its parameters: ``model``
    keeps no gradients) forward on ``idx`` and back from the sum of the
    logits. Every tensor autograd saves inside a block, in the forward
    pass or in a recomputation, is counted by its storage
    (``untyped_storage().data_ptr()``: views share one) from when it is
    saved until autograd frees it; parameters are not counted, nor what
    the embedding, final norm and head save. The result is the largest
    total held at once.

    Args:
        model: a :class:`~course_lib.model.decoder_lm.DecoderLM`.
        idx: ``(B, S)`` token ids.
        attention: ``"explicit"`` (the softmax written out) or
            ``"flash"`` (torch's fused kernel: ``fused=True`` on every
            attention of the copy; not for a factory's attention).
        recompute: wrap every block in a :class:`CheckpointedBlock`.

    Returns:
        Bytes (an int).
    """
    check_type("model", model, DecoderLM, "a DecoderLM")
    check_type("idx", idx, torch.Tensor, "a torch.Tensor")
    check_choice("attention", attention, ATTENTION)
    check_bool("recompute", recompute)
    copy_ = copy.deepcopy(model)
    copy_.train()
    counter = _Counter({p.untyped_storage().data_ptr()
                        for p in copy_.parameters()})
    layers = []
    for block in copy_.layers:
        if attention == "flash":
            block.attention.fused = True
        layer = _Counted(block, counter)
        if recompute:       # the checkpoint's inputs, then the rerun
            layer = _Counted(CheckpointedBlock(layer), counter)
        layers.append(layer)
    copy_.layers = nn.ModuleList(layers)
    with small_ops():        # a small model's step: one thread is faster
        copy_(idx).sum().backward()
    return counter.peak

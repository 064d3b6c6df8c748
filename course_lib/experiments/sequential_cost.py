r"""The first limit of a recurrent network, measured: its $T$ steps run one
after another. The recurrence (a Python loop, and ``torch.nn.RNN``'s C++
loop) and one self-attention over the same inputs, timed against each
other, and their matmul FLOPs counted.

Shape letters: B batch, T sequence length, D width of inputs, states,
queries, keys and values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .._util.threads import small_ops
from .._util.timing import best_time
from .._util.validation import check_alloc, check_bool, check_int, check_type

__all__ = ["TimingResult", "time_recurrence_vs_attention",
           "recurrence_and_attention", "fused_recurrence", "matmul_flops"]


@dataclass
class TimingResult:
    """Best-of-``repeats`` wall times for one sequence length."""

    length: int
    rnn_seconds: float  # T sequential recurrence steps, a Python loop
    attention_seconds: float  # one self-attention over all T positions
    # the same T steps in torch.nn.RNN's C++ loop; None if not timed
    fused_seconds: float | None = None

    @property
    def ratio(self) -> float:
        """How many times slower the recurrence is (< 1: attention slower)."""
        return self.rnn_seconds / self.attention_seconds


def time_recurrence_vs_attention(lengths: list[int], *, d_model: int = 64,
                                 batch: int = 8, repeats: int = 5,
                                 seed: int = 0, fused: bool = False
                                 ) -> list[TimingResult]:
    r"""Time an RNN's $T$ sequential steps against one self-attention.

    Both sides get one parallel input projection (RNN: $XW_{xh}^\top$;
    attention: $X[W^Q W^K W^V]$). Then the RNN runs $T$ dependent steps
    $h_t = \tanh(\cdot + W_{hh}h_{t-1})$, while attention runs
    $\mathrm{softmax}(QK^\top/\sqrt{d})V$ as two batched matmuls. Attention
    does $O(T^2 d)$ work against the RNN's $O(T d^2)$, so on a CPU it can be
    slower for long sequences; its advantage is $O(1)$ sequential steps.
    Each side runs as fast as it can: the recurrence on one thread
    (:func:`~course_lib._util.threads.small_ops`; its steps are too small to
    share between threads), attention on all of torch's threads.

    With ``fused=True`` the same recurrence, with the same weights, is also
    timed as ``torch.nn.RNN`` (:func:`fused_recurrence`), whose loop over
    $t$ runs in C++, on one thread like the Python loop. The difference
    between the two recurrence times is the Python and dispatch overhead of
    the loop; what the fused RNN still takes is the sequential chain itself.

    Args:
        lengths: sequence lengths T to time.
        d_model: width d of inputs, states, queries, keys and values.
        batch: batch size B.
        repeats: timed calls per measurement (the minimum is kept).
        seed: seed of the random weights and inputs.
        fused: also time ``torch.nn.RNN`` (``fused_seconds``); default
            ``False`` leaves ``fused_seconds`` as ``None``.

    Returns:
        One ``TimingResult`` per length, in order.
    """
    if not lengths or any(not isinstance(t, int) or t < 1 for t in lengths):
        raise ValueError(f"lengths must be positive ints, got {lengths!r}")
    for name, value in (("d_model", d_model), ("batch", batch),
                        ("repeats", repeats)):
        check_int(name, value, minimum=1)
    check_bool("fused", fused)
    # attention holds q, k, v (B, T, 3D) and the scores (B, T, T)
    T = max(lengths)
    check_alloc("batch * max(lengths) * (max(lengths) + 3 * d_model)",
                batch * T * (T + 3 * d_model))
    g = torch.Generator().manual_seed(seed)
    w_ih = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
    w_hh = torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model)
    w_qkv = torch.randn(d_model, 3 * d_model, generator=g) / math.sqrt(d_model)
    results = []
    for T in lengths:
        x = torch.randn(batch, T, d_model, generator=g)  # (B, T, D)
        recurrence, attention = recurrence_and_attention(x, w_ih, w_hh, w_qkv)
        with torch.inference_mode():
            result = TimingResult(T, best_time(recurrence, repeats),
                                  best_time(attention, repeats))
            if fused:
                result.fused_seconds = best_time(
                    fused_recurrence(x, w_ih, w_hh), repeats)
        results.append(result)
    return results


def recurrence_and_attention(x: torch.Tensor, w_ih: torch.Tensor,
                             w_hh: torch.Tensor, w_qkv: torch.Tensor):
    r"""The two computations that :func:`time_recurrence_vs_attention` times.

    Args:
        x: inputs (B, T, D).
        w_ih, w_hh: (D, D) recurrence weights; w_qkv: (D, 3D) projections.

    Returns:
        ``(recurrence, attention)``, two functions without arguments: the
        first returns $h_T$ (B, D) after $T$ dependent steps, the second
        $\mathrm{softmax}(QK^\top/\sqrt{D})V$ (B, T, D).
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    check_type("w_ih", w_ih, torch.Tensor, "a torch.Tensor")
    check_type("w_hh", w_hh, torch.Tensor, "a torch.Tensor")
    check_type("w_qkv", w_qkv, torch.Tensor, "a torch.Tensor")
    batch, T, d_model = x.shape

    @small_ops()  # T tiny steps: one thread, see course_lib._util.threads
    def recurrence() -> torch.Tensor:
        xw = x @ w_ih.T  # (B, T, D), parallel over t
        h = x.new_zeros(batch, d_model)  # (B, D)
        for t in range(T):  # T dependent steps
            h = torch.tanh(xw[:, t] + h @ w_hh.T)  # (B, D)
        return h

    def attention() -> torch.Tensor:
        q, k, v = (x @ w_qkv).split(d_model, dim=-1)  # 3 x (B, T, D)
        scores = q @ k.transpose(1, 2) / math.sqrt(d_model)  # (B, T, T)
        return torch.softmax(scores, dim=-1) @ v  # (B, T, D)

    return recurrence, attention


def fused_recurrence(x: torch.Tensor, w_ih: torch.Tensor,
                     w_hh: torch.Tensor):
    r"""The recurrence of :func:`recurrence_and_attention` as ``torch.nn.RNN``.

    The same $h_t = \tanh(W_{xh}x_t + W_{hh}h_{t-1})$, $h_0 = 0$, without
    biases, with the loop over $t$ in C++ instead of Python: the same
    matmul FLOPs ($4BTD^2$, see :func:`matmul_flops`) and the same $T$
    dependent steps, without the interpreter's per-step overhead. It runs
    on one thread, like the Python loop.

    Args:
        x: inputs (B, T, D).
        w_ih, w_hh: (D, D) recurrence weights, copied into the module.

    Returns:
        A function without arguments that returns $h_T$ (B, D).
    """
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    check_type("w_ih", w_ih, torch.Tensor, "a torch.Tensor")
    check_type("w_hh", w_hh, torch.Tensor, "a torch.Tensor")
    d_model = x.shape[-1]
    # Built on the meta device, then given empty storage: the weights are
    # overwritten below, so no random initialisation is drawn (which would
    # advance the caller's global random generator).
    rnn = torch.nn.RNN(d_model, d_model, bias=False, batch_first=True,
                       device="meta").to_empty(device=x.device)
    with torch.no_grad():
        rnn.weight_ih_l0.copy_(w_ih)
        rnn.weight_hh_l0.copy_(w_hh)

    @small_ops()  # the same tiny steps as the Python loop: one thread
    def recurrence() -> torch.Tensor:
        return rnn(x)[1][0]  # (B, D); rnn returns (1, B, D) for h_T

    return recurrence


def matmul_flops(length: int, *, d_model: int = 64,
                 batch: int = 8) -> tuple[int, int]:
    r"""Matmul FLOPs (2 per multiply-add) of :func:`recurrence_and_attention`.

    Recurrence: the input projection $2BTD^2$ plus $T$ steps of
    $h W_{hh}^\top$, $2BD^2$ each: $4BTD^2$. Attention: the Q, K, V
    projection $6BTD^2$ plus $QK^\top$ and $AV$, $2BT^2D$ each:
    $6BTD^2 + 4BT^2D$. With the projections counted, attention does more
    arithmetic at every length; without them, once $T > D$.

    Returns:
        ``(recurrence_flops, attention_flops)``.
    """
    check_int("length", length, minimum=1)
    check_int("d_model", d_model, minimum=1)
    check_int("batch", batch, minimum=1)
    B, T, D = batch, length, d_model
    return 4 * B * T * D * D, 6 * B * T * D * D + 4 * B * T * T * D

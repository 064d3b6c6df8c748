r"""Count-based n-gram models: the baselines a neural language model must beat.

An n-gram model predicts a symbol from the $n-1$ symbols before it, with
probabilities read off counts in the training text. With add-$k$
smoothing (Lidstone; $k = 1$ is Laplace),

$$q(x \mid c) = \frac{N(c, x) + k}{N(c) + kV},$$

where $c$ is the context (the previous $n - 1$ symbols), $N(c, x)$ the
number of times $x$ follows $c$ in the training text, $N(c) = \sum_x
N(c, x)$ and $V$ the vocabulary size. Every symbol gets a non-zero
probability, so the loss on new text is finite; a context never seen in
training ($N(c) = 0$) predicts the uniform $1/V$. $n = 1$ is the unigram
model (the symbol frequencies, no context), $n = 2$ the bigram model.

The loss on a validation text is a closed form in the counts: with
$M(c, x)$ the validation counts,

$$\text{bits per symbol} = -\frac{1}{\sum_{c,x} M(c,x)}
\sum_{c, x} M(c, x)\,\log_2 q(x \mid c).$$

Shape letters: N length of a text, C number of contexts ($V^{n-1}$), V
vocabulary.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_int, check_real, check_type

__all__ = ["ngram_counts", "NGramModel"]


def _check_ids(ids, vocab_size: int, order: int) -> None:
    check_type("ids", ids, torch.Tensor, "a torch.Tensor")
    if ids.dim() != 1 or ids.dtype != torch.long:
        raise ValueError(f"ids must be a 1-d long tensor, got "
                         f"{ids.dim()}-d {ids.dtype}")
    if ids.numel() < order:
        raise ValueError(f"ids must hold at least order={order} symbols, "
                         f"got {ids.numel()}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"ids must lie in [0, vocab_size={vocab_size}), "
                         f"got values in [{ids.min().item()}, "
                         f"{ids.max().item()}]")


def ngram_counts(ids: torch.Tensor, *, order: int, vocab_size: int,
                 start: int | None = None) -> torch.Tensor:
    r"""$N(c, x)$: how often symbol $x$ follows context $c$ in ``ids``.

    The context of position $t$ is $(x_{t-n+1}, \dots, x_{t-1})$, numbered
    $c = \sum_j x_{t-n+1+j} V^{n-2-j}$ (base-$V$ digits, oldest first).
    Targets are the positions $t \ge$ ``start`` (default and minimum
    $n - 1$, the first with a full context).

    Returns:
        ``(V^(n-1), V)`` float64 counts.
    """
    check_int("order", order, minimum=1)
    check_int("vocab_size", vocab_size, minimum=1)
    _check_ids(ids, vocab_size, order)
    start = order - 1 if start is None else start
    check_int("start", start, minimum=order - 1)
    V, N = vocab_size, ids.numel()
    ctx = torch.zeros(max(N - start, 0), dtype=torch.long)   # (N - start,)
    for j in range(order - 1):          # digit j: symbol at t - (n-1) + j
        ctx = ctx * V + ids[start - (order - 1) + j:N - (order - 1) + j]
    flat = ctx * V + ids[start:]
    counts = torch.bincount(flat, minlength=V ** (order - 1) * V)
    return counts.view(V ** (order - 1), V).double()


class NGramModel:
    r"""An add-$k$ smoothed n-gram model, fitted by counting.

    Example::

        model = NGramModel(train_ids, order=3, vocab_size=96, k=0.01)
        model.bits_per_symbol(val_ids)

    Attributes:
        counts: ``(C, V)`` float64 training counts $N(c, x)$.
        log_probs: ``(C, V)`` float64 $\ln q(x \mid c)$.
    """

    def __init__(self, ids: torch.Tensor, *, order: int, vocab_size: int,
                 k: float = 1.0) -> None:
        check_real("k", k, positive=True)
        self.order, self.vocab_size, self.k = order, vocab_size, float(k)
        self.counts = ngram_counts(ids, order=order, vocab_size=vocab_size)
        totals = self.counts.sum(-1, keepdim=True)               # (C, 1)
        self.log_probs = ((self.counts + self.k).log()
                          - (totals + self.k * vocab_size).log())  # (C, V)

    def __repr__(self) -> str:
        return (f"NGramModel(order={self.order}, vocab_size="
                f"{self.vocab_size}, k={self.k})")

    def bits_per_symbol(self, ids: torch.Tensor, *,
                        start: int | None = None) -> float:
        r"""Mean $-\log_2 q(x_t \mid c_t)$ over the targets
        $t \ge$ ``start`` (default and minimum $n - 1$) of ``ids``,
        computed from the validation counts $M(c, x)$ in closed form.
        """
        m = ngram_counts(ids, order=self.order, vocab_size=self.vocab_size,
                         start=start)                           # (C, V)
        if m.sum() == 0:
            raise ValueError("ids hold no target after start")
        return -(m * self.log_probs).sum().item() / m.sum().item() \
            / math.log(2)

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

**Kneser-Ney** smoothing (:class:`KneserNeyModel`; Kneser and Ney 1995,
in the interpolated form that Chen and Goodman 1998 found best) does
better with long contexts, where most counts are 0 or 1. It subtracts a
discount $D < 1$ from every seen count and gives the mass freed, $D$ times
the number of distinct symbols seen after $c$, to the model of the
shorter context $c'$ ($c$ without its oldest symbol):

$$q_n(x \mid c) = \frac{\max(N(c, x) - D_n, 0)}{N(c)}
+ \frac{D_n\,N_{1+}(c\,\bullet)}{N(c)}\,q_{n-1}(x \mid c').$$

The lower orders count differently. $q_{n-1}$ is only asked when the long
context gives little evidence, so it should predict how many *different*
contexts $x$ completes, not how often $x$ occurs: its counts are the
**continuation counts** $N_{1+}(\bullet\,c'x)$, the number of distinct
symbols seen before $c'x$ ("Francisco" is frequent but follows only
"San"). The recursion ends at the uniform $1/V$, so every symbol keeps a
non-zero probability, and each level is a distribution when the one below
it is (the discounted counts and the freed mass add up to $N(c)$). A
context never seen ($N(c) = 0$) passes the shorter context's prediction
through.

Shape letters: N length of a text, C number of contexts ($V^{n-1}$), V
vocabulary.
"""
from __future__ import annotations

import math

import torch

from .._util.validation import check_int, check_real, check_type

__all__ = ["ngram_counts", "NGramModel", "KneserNeyModel"]


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


def _gram_keys(ids: torch.Tensor, k: int, V: int, start: int) -> torch.Tensor:
    r"""The k-grams ending at the positions t >= ``start`` of ``ids``, each
    as one integer $\sum_j x_{t-k+1+j} V^{k-1-j}$ (oldest symbol first)."""
    N = ids.numel()
    keys = torch.zeros(N - start, dtype=torch.long)           # (N - start,)
    for j in range(k):
        keys = keys * V + ids[start - k + 1 + j:N - k + 1 + j]
    return keys


class _Level:
    r"""The counts of one order k, sorted by k-gram key for lookups:
    ``grams`` (G,) keys with count ``a`` (G,) > 0; ``contexts`` (H,) keys
    of the (k-1)-symbol contexts with ``total`` $\sum_x a$ and ``distinct``
    $N_{1+}(c\,\bullet)$."""

    def __init__(self, grams: torch.Tensor, a: torch.Tensor, V: int):
        self.grams, self.a = grams, a.double()
        self.contexts, inverse = torch.unique(grams // V, return_inverse=True)
        H = self.contexts.numel()
        self.total = torch.zeros(H, dtype=torch.float64).index_add_(
            0, inverse, self.a)
        self.distinct = torch.zeros(H, dtype=torch.float64).index_add_(
            0, inverse, torch.ones_like(self.a))

    @staticmethod
    def _lookup(sorted_keys, values, keys):
        """``values`` at ``keys`` (0 where a key is absent)."""
        if sorted_keys.numel() == 0:
            return torch.zeros(keys.shape, dtype=torch.float64)
        i = torch.searchsorted(sorted_keys, keys).clamp(
            max=sorted_keys.numel() - 1)
        return torch.where(sorted_keys[i] == keys, values[i],
                           torch.zeros((), dtype=torch.float64))


def _ney_discount(a: torch.Tensor) -> float:
    r"""$D = n_1 / (n_1 + 2 n_2)$ with $n_r$ the number of grams counted
    exactly $r$ times (Ney, Essen and Kneser 1994); 0.5 where the text has
    no singletons to estimate it from."""
    n1, n2 = (a == 1).sum().item(), (a == 2).sum().item()
    return n1 / (n1 + 2 * n2) if n1 > 0 else 0.5


class KneserNeyModel:
    r"""An interpolated Kneser-Ney n-gram model (Chen and Goodman 1998).

    For orders $k = 1, \dots, n$, with $c$ the last $k - 1$ symbols before
    $x$ and $c'$ the last $k - 2$,

    $$q_k(x \mid c) = \frac{\max(a_k(c x) - D_k, 0) + D_k\,
    N_{1+}(c\,\bullet)\,q_{k-1}(x \mid c')}{\sum_y a_k(c y)},
    \qquad q_0(x) = \frac1V,$$

    where $a_n$ is the count $N(c x)$ in the training text, $a_k$ for
    $k < n$ the continuation count $N_{1+}(\bullet\,c x)$ (distinct
    symbols seen before $c x$), and $N_{1+}(c\,\bullet)$ the number of $y$
    with $a_k(c y) > 0$. A context with $\sum_y a_k(c y) = 0$ predicts
    $q_{k-1}(x \mid c')$. One discount per order, by default
    $D_k = n_1 / (n_1 + 2 n_2)$ from that order's counts of counts.

    Counts are kept sparse (only the grams that occur: a dense table of a
    5-gram over 96 characters would hold $96^5$ entries).

    Example::

        model = KneserNeyModel(train_ids, order=5, vocab_size=96)
        model.bits_per_symbol(val_ids)

    Attributes:
        discounts: $(D_1, \dots, D_n)$.
    """

    def __init__(self, ids: torch.Tensor, *, order: int, vocab_size: int,
                 discounts=None) -> None:
        check_int("order", order, minimum=1)
        check_int("vocab_size", vocab_size, minimum=1)
        _check_ids(ids, vocab_size, order)
        if vocab_size ** order >= 2 ** 62:
            raise ValueError(f"vocab_size ** order must be < 2**62 (a gram "
                             f"is one int64 key), got {vocab_size}**{order}")
        if discounts is not None:
            check_type("discounts", discounts, (list, tuple),
                       "a list of floats")
            if len(discounts) != order:
                raise ValueError(f"discounts must hold order={order} "
                                 f"values, got {len(discounts)}")
            for d in discounts:
                check_real("discounts", d, positive=True)
                if d >= 1:
                    raise ValueError(f"discounts must lie in (0, 1), got {d}")
        self.order, self.vocab_size = order, vocab_size
        V = vocab_size
        # order n: ordinary counts of the n-grams of the text
        grams, a = torch.unique(_gram_keys(ids, order, V, order - 1),
                                return_counts=True)
        levels = [_Level(grams, a, V)]
        for k in range(order - 1, 0, -1):
            # a_k(g) = N1+(. g): the distinct (k+1)-grams ending in g
            grams, a = torch.unique(levels[0].grams % V ** k,
                                    return_counts=True)
            levels.insert(0, _Level(grams, a, V))
        self._levels = levels                            # index k - 1
        self.discounts = tuple(
            float(d) for d in (discounts if discounts is not None else
                               [_ney_discount(lv.a) for lv in levels]))

    def __repr__(self) -> str:
        return (f"KneserNeyModel(order={self.order}, vocab_size="
                f"{self.vocab_size})")

    def _probs(self, history: torch.Tensor, x: torch.Tensor,
               usable: torch.Tensor) -> torch.Tensor:
        r"""$q(x_i \mid$ ``history[i]``$)$ (P,) float64 for histories
        (P, n - 1) (oldest first) of which the last ``usable[i]`` symbols
        are real: orders above ``usable + 1`` pass the lower one through.
        """
        V = self.vocab_size
        q = torch.full(x.shape, 1.0 / V, dtype=torch.float64)   # q_0
        ctx = torch.zeros_like(x)                    # key of the last k-1
        for k, (level, D) in enumerate(zip(self._levels, self.discounts),
                                       start=1):
            if k > 1:                                # prepend one symbol
                ctx = ctx + history[:, self.order - k] * V ** (k - 2)
            total = _Level._lookup(level.contexts, level.total, ctx)
            distinct = _Level._lookup(level.contexts, level.distinct, ctx)
            a = _Level._lookup(level.grams, level.a, ctx * V + x)
            q_k = ((a - D).clamp(min=0) + D * distinct * q) / \
                total.clamp(min=1)
            q = torch.where((total > 0) & (usable >= k - 1), q_k, q)
        return q

    def probs(self, context) -> torch.Tensor:
        r"""$q(\cdot \mid c)$ over the whole vocabulary, ``(V,)`` float64.

        Args:
            context: the preceding symbols, oldest first (a list of ints
                or a 1-d long tensor); only the last $n - 1$ are used, and
                a shorter context uses the orders it can fill.
        """
        if isinstance(context, torch.Tensor):
            context = context.tolist()
        check_type("context", context, (list, tuple), "a list of ints")
        for c in context:
            check_int("context", c, minimum=0)
            if c >= self.vocab_size:
                raise ValueError(f"context must hold ids < vocab_size="
                                 f"{self.vocab_size}, got {c}")
        n_ctx = self.order - 1
        last = list(context)[len(context) - n_ctx:] if n_ctx else []
        history = torch.tensor([0] * (n_ctx - len(last)) + last,
                               dtype=torch.long).expand(self.vocab_size,
                                                        n_ctx)
        usable = torch.full((self.vocab_size,), len(last))
        return self._probs(history, torch.arange(self.vocab_size), usable)

    def bits_per_symbol(self, ids: torch.Tensor, *,
                        start: int | None = None) -> float:
        r"""Mean $-\log_2 q(x_t \mid x_{t-n+1..t-1})$ over the targets
        $t \ge$ ``start`` of ``ids`` (default $n - 1$; from 1, a target
        with fewer than $n - 1$ symbols before it uses the orders they
        fill)."""
        _check_ids(ids, self.vocab_size, 1)
        start = self.order - 1 if start is None else start
        check_int("start", start, minimum=min(1, self.order - 1))
        N, n_ctx = ids.numel(), self.order - 1
        if start >= N:
            raise ValueError(f"start must be < len(ids)={N}, got {start}")
        padded = torch.cat([torch.zeros(n_ctx, dtype=torch.long), ids])
        t = torch.arange(start, N)                               # (P,)
        history = torch.stack([padded[t + j] for j in range(n_ctx)], -1) \
            if n_ctx else torch.zeros(len(t), 0, dtype=torch.long)
        q = self._probs(history, ids[start:], t.clamp(max=n_ctx))
        return -q.log2().mean().item()

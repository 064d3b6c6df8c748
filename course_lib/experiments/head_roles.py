r"""Measuring what the heads of a language model do, on real text.

A head's attention matrix $A$ (rows: queries $t$, columns: keys $j \le t$)
suggests a role; a number confirms it. Two kinds of measurement:

1. **By offset.** :func:`offset_profile` averages $A_{t,\,t-k}$ over the
   queries, for $k = 0, 1, \dots, K$: a *previous-token* head has most of
   its weight at $k = 1$; a head that reads two characters back at
   $k = 2$. On a string that repeats with period $L$, the induction target
   of query $t$ (the token after the previous occurrence of $x_t$) is key
   $t - L + 1$, offset $k = L - 1$ (Olsson et al. 2022).
2. **By content.** :func:`target_weight` averages $A_{t,\,j(t)}$ for a
   key $j(t)$ chosen per query from the text: the first character of the
   current word (:func:`word_starts`), or the innermost bracket or quote
   that is still open (:func:`open_delimiters`). The same function applied
   to uniform causal weights, $A_{t,j} = 1/(t+1)$ (:func:`uniform_weights`),
   gives the score of a head that ignores the text, and
   :func:`distance_baseline` the score of a head that keeps its own
   weight at each distance but ignores what the keys hold: the baselines
   a role must beat.

:func:`repeated_windows` makes real text that repeats (the induction
task of chapter 5 on characters), to see which heads such data grows.

:func:`head_disagreement` says whether two heads of a layer read the same
keys for the same query (total-variation distance of their rows).

Shape letters: B batch, H heads, T length, K largest offset.
"""
from __future__ import annotations

import torch

from .._util.validation import check_int, check_type

__all__ = ["offset_profile", "target_weight", "uniform_weights", "word_starts",
           "open_delimiters", "head_disagreement", "distance_baseline",
           "repeated_windows"]

_OPEN, _CLOSE = "([{", ")]}"
_QUOTES = "\"'"


def _check_weights(weights) -> None:
    check_type("weights", weights, torch.Tensor, "a torch.Tensor")
    if weights.dim() != 4 or weights.shape[2] != weights.shape[3]:
        raise ValueError(f"weights must have shape (B, H, T, T), got "
                         f"{tuple(weights.shape)}")


def offset_profile(weights: torch.Tensor, max_offset: int) -> torch.Tensor:
    r"""Mean weight of each head on the key $k$ positions back.

    $$P_{h,k} = \frac{1}{B (T - k)} \sum_{b} \sum_{t=k}^{T-1}
    A^{(b,h)}_{t,\,t-k}, \qquad k = 0, \dots, K.$$

    Only queries $t \ge k$ have such a key, so each column averages over
    its own queries; a head that always reads offset $k$ scores 1 there.

    Args:
        weights: ``(B, H, T, T)`` attention weights of one layer.
        max_offset: K, ``0 <= K < T``.

    Returns:
        ``(H, K + 1)``.
    """
    _check_weights(weights)
    T = weights.shape[-1]
    check_int("max_offset", max_offset, minimum=0)
    if max_offset >= T:
        raise ValueError(f"max_offset must be < T={T}, got {max_offset}")
    w = weights.detach().float()
    # diagonal(offset=-k) of each (T, T) map holds A[t, t-k], t = k..T-1
    return torch.stack([w.diagonal(offset=-k, dim1=-2, dim2=-1)
                        .mean(dim=(0, 2))                  # (H,)
                        for k in range(max_offset + 1)], dim=1)


def target_weight(weights: torch.Tensor, targets: torch.Tensor
                  ) -> torch.Tensor:
    r"""Mean weight of each head on one chosen key per query.

    $$s_h = \frac{1}{|Q|} \sum_{(b,t) \in Q} A^{(b,h)}_{t,\,j_{b,t}},
    \qquad Q = \{(b, t) : j_{b,t} \ge 0\},$$

    where ``targets[b, t]`` $= j_{b,t} \le t$ is the key that the role
    predicts for query $t$, or $-1$ where the role predicts none.

    Args:
        weights: ``(B, H, T, T)``.
        targets: ``(B, T)`` long, entries in ``[-1, t]``; at least one
            $\ge 0$.

    Returns:
        ``(H,)``.
    """
    _check_weights(weights)
    check_type("targets", targets, torch.Tensor, "a torch.Tensor")
    B, H, T, _ = weights.shape
    if tuple(targets.shape) != (B, T) or targets.dtype != torch.long:
        raise ValueError(f"targets must be a long tensor (B, T) = {(B, T)}"
                         f", got {targets.dtype} {tuple(targets.shape)}")
    t = torch.arange(T)
    if ((targets < -1) | (targets > t)).any():
        raise ValueError("targets must lie in [-1, t] for query t (a key "
                         "at or before the query, or -1 for none)")
    valid = targets >= 0                                    # (B, T)
    if not valid.any():
        raise ValueError("targets must name at least one key (all are -1)")
    idx = targets.clamp(min=0)[:, None, :, None].expand(B, H, T, 1)
    picked = weights.detach().float().gather(3, idx)[..., 0]  # (B, H, T)
    return picked.permute(1, 0, 2)[:, valid].mean(dim=1)      # (H,)


def uniform_weights(B: int, H: int, T: int) -> torch.Tensor:
    r"""Causal weights that ignore the input: $A_{t,j} = 1/(t+1)$ for
    $j \le t$. Any score of a real head is compared with the same score of
    these weights.

    Returns:
        ``(B, H, T, T)``.
    """
    for name, value in (("B", B), ("H", H), ("T", T)):
        check_int(name, value, minimum=1)
    w = torch.tril(torch.ones(T, T))
    w = w / w.sum(-1, keepdim=True)                         # (T, T)
    return w.expand(B, H, T, T).clone()


def word_starts(text: str) -> torch.Tensor:
    r"""For each character, the position of the first character of its word.

    A word is a run of characters without space or newline. For a
    character inside a word, at position $t$, the target is the word's
    first position $j < t$; the first character of a word, a space and a
    newline get $-1$ (no earlier key to find).

    Returns:
        ``(T,)`` long.
    """
    check_type("text", text, str, "a str")
    out, start = [], 0
    for t, ch in enumerate(text):
        if ch in " \n":
            out.append(-1)
            start = t + 1
        else:
            out.append(start if start < t else -1)
    return torch.tensor(out, dtype=torch.long)


def open_delimiters(text: str) -> torch.Tensor:
    r"""For each character, the innermost bracket or quote still open.

    Scanning left to right, ``(``, ``[``, ``{`` open a span and the
    matching closer ends it; a quote (``"`` or ``'``) opens a span unless
    it closes the innermost open span of the same quote. The target of
    position $t$ is the opening position of the innermost span open
    *before* $t$ (so the closing character itself still points at its
    opener), or $-1$. An apostrophe inside a word (``don't``) does not
    count as a quote.

    Returns:
        ``(T,)`` long.
    """
    check_type("text", text, str, "a str")
    out, stack = [], []                  # stack of (position, character)
    for t, ch in enumerate(text):
        out.append(stack[-1][0] if stack else -1)
        if ch in _QUOTES:
            if stack and stack[-1][1] == ch:
                stack.pop()
            elif not (ch == "'" and 0 < t < len(text) - 1
                      and text[t - 1].isalpha() and text[t + 1].isalpha()):
                stack.append((t, ch))
        elif ch in _OPEN:
            stack.append((t, ch))
        elif ch in _CLOSE:
            opener = _OPEN[_CLOSE.index(ch)]
            if stack and stack[-1][1] == opener:
                stack.pop()
    return torch.tensor(out, dtype=torch.long)


def head_disagreement(weights: torch.Tensor) -> torch.Tensor:
    r"""How differently two heads of a layer spread one query's attention.

    The total-variation distance between the rows of heads $a$ and $b$,
    averaged over the queries:

    $$D_{ab} = \frac{1}{BT} \sum_{b', t} \tfrac12 \sum_j
    \big|A^{(b',a)}_{t,j} - A^{(b',b)}_{t,j}\big| \in [0, 1]:$$

    0 when the two heads read the same keys with the same weights, 1 when
    they never read a key in common.

    Args:
        weights: ``(B, H, T, T)``.

    Returns:
        ``(H, H)``, symmetric, zero diagonal.
    """
    _check_weights(weights)
    w = weights.detach().float()
    diff = (w[:, :, None] - w[:, None, :]).abs()       # (B, H, H, T, T)
    return 0.5 * diff.sum(-1).mean(dim=(0, 3))          # (H, H)


def distance_baseline(weights: torch.Tensor, targets: torch.Tensor
                      ) -> torch.Tensor:
    r"""What :func:`target_weight` would be if each head looked at distance
    only.

    A head that ignores the text but keeps its average weight
    $P_{h,k}$ at each offset $k$ (:func:`offset_profile` up to
    $k = T - 1$) puts weight $P_{h,\,t - j}$ on key $j$. Averaged over
    the same queries as :func:`target_weight`:

    $$\bar s_h = \frac{1}{|Q|} \sum_{(b,t) \in Q} P_{h,\,t - j_{b,t}}.$$

    A score well above $\bar s_h$ means the head finds the key by what it
    holds, not by how far back it is.

    Args:
        weights: ``(B, H, T, T)``.
        targets: ``(B, T)`` long, as for :func:`target_weight`.

    Returns:
        ``(H,)``.
    """
    target_weight(weights, targets)                 # the same checks
    T = weights.shape[-1]
    prof = offset_profile(weights, T - 1)           # (H, T)
    valid = targets >= 0                            # (B, T)
    dist = (torch.arange(T)[None, :] - targets)[valid]   # (Q,)
    return prof[:, dist].mean(dim=1)                # (H,)


def repeated_windows(ids: torch.Tensor, *, batch_size: int, length: int,
                     min_period: int, max_period: int, seed: int = 0):
    r"""Endless batches of real text that repeats: the induction task on
    characters.

    Each row draws a period $n \in [\text{min}, \text{max}]$ and a window
    $w = x_s, \dots, x_{s+n-1}$ of ``ids``, and writes it again and again:
    row position $j$ holds $x_{s + (j \bmod n)}$. After the first $n$
    characters every next character is the one that followed the previous
    occurrence of the current position in the window, which is what an
    induction head predicts; before that the text is ordinary text.

    Args:
        ids: ``(N,)`` long, ``N > max_period``.
        batch_size: B. length: T. min_period, max_period: range of $n$.
        seed: seed of the ``torch.Generator`` (same stream every run).

    Yields:
        ``(inputs, targets)``, both ``(B, T)`` long; targets are the
        inputs shifted by one (every position counts).
    """
    check_type("ids", ids, torch.Tensor, "a torch.Tensor")
    check_int("batch_size", batch_size, minimum=1)
    check_int("length", length, minimum=1)
    check_int("min_period", min_period, minimum=1)
    check_int("max_period", max_period, minimum=min_period)
    check_int("seed", seed, minimum=0)
    if ids.dim() != 1 or ids.dtype != torch.long or \
            ids.numel() <= max_period:
        raise ValueError(f"ids must be a 1-d long tensor longer than "
                         f"max_period={max_period}, got {ids.dim()}-d "
                         f"{ids.dtype} of {ids.numel()}")
    return _repeats(ids, batch_size, length, min_period, max_period, seed)


def _repeats(ids, batch_size, length, min_period, max_period, seed):
    gen = torch.Generator().manual_seed(seed)
    j = torch.arange(length + 1)                              # (T + 1,)
    while True:
        n = torch.randint(min_period, max_period + 1, (batch_size, 1),
                          generator=gen)                      # (B, 1)
        s = torch.randint(0, ids.numel() - max_period, (batch_size, 1),
                          generator=gen)                      # (B, 1)
        rows = ids[s + j % n]                                 # (B, T + 1)
        yield rows[:, :-1], rows[:, 1:]

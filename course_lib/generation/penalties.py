r"""Penalties against repetition (chapter 8).

Greedy decoding loops: once a phrase has been written, the most likely
continuation of the phrase is often the phrase again. Three standard
remedies change the next-token logits $z \in \mathbb{R}^V$ using the
tokens already in the sequence, before temperature and the filters of
:mod:`~course_lib.generation.sampling` (Hugging Face runs its logits
processors before its warpers in the same way):

* :func:`repetition_penalty`, CTRL's penalty (Keskar et al., 2019;
  ``repetition_penalty`` in Hugging Face): every token already present
  has its logit divided by $\theta > 1$ if positive, multiplied by
  $\theta$ if negative;
* :func:`frequency_presence_penalty`, the OpenAI API's two penalties:
  $z_j - \alpha_f c_j - \alpha_p [c_j > 0]$ with $c_j$ the count of
  token $j$ so far;
* :func:`no_repeat_ngram_filter` (``no_repeat_ngram_size``): a token that
  would complete an $n$-gram already in the sequence gets $-\infty$.

Each maps ``(logits (B, V), ids (B, T))`` to new logits ``(B, V)`` and
fits :func:`~course_lib.generation.sampling.generate`'s
``logits_processor``; bind the strength first, e.g.
``functools.partial(repetition_penalty, penalty=1.3)``. Here ``ids`` is
the whole sequence, prompt included, as in Hugging Face (the OpenAI API
counts only the tokens it generated).
"""
from __future__ import annotations

import torch

from .._util.validation import check_int, check_real

__all__ = ["repetition_penalty", "frequency_presence_penalty",
           "no_repeat_ngram_filter"]


def _check(logits, ids) -> None:
    if not isinstance(logits, torch.Tensor) \
            or not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be a floating tensor, got "
                        f"{getattr(logits, 'dtype', type(logits).__name__)}")
    if logits.dim() != 2:
        raise ValueError(f"logits must have shape (B, V), got "
                         f"{tuple(logits.shape)}")
    if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long:
        raise TypeError(f"ids must be a torch.long tensor, got "
                        f"{getattr(ids, 'dtype', type(ids).__name__)}")
    B, V = logits.shape
    if ids.dim() != 2 or ids.shape[0] != B:
        raise ValueError(f"ids must have shape (B, T) with B = {B}, got "
                         f"{tuple(ids.shape)}")
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < V):
        raise ValueError(f"ids must lie in [0, {V}), got values from "
                         f"{int(ids.min())} to {int(ids.max())}")


def repetition_penalty(logits: torch.Tensor, ids: torch.Tensor,
                       penalty: float) -> torch.Tensor:
    r"""CTRL's repetition penalty: for every token $j$ that occurs in
    ``ids``,

    $$z_j \leftarrow \begin{cases} z_j / \theta & z_j > 0 \\
    z_j \, \theta & z_j \le 0 \end{cases}$$

    so a seen token loses probability whatever the sign of its logit
    ($\theta > 1$; $\theta = 1$ changes nothing). How often it occurred
    does not matter.

    Args:
        logits: ``(B, V)`` next-token logits.
        ids: ``(B, T)`` the tokens so far (long).
        penalty: $\theta > 0$.

    Returns:
        ``(B, V)`` new logits (the input is not changed).
    """
    _check(logits, ids)
    check_real("penalty", penalty, positive=True)
    seen = logits.gather(1, ids)                             # (B, T)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.scatter(1, ids, seen)                      # (B, V)


def frequency_presence_penalty(logits: torch.Tensor, ids: torch.Tensor, *,
                               frequency: float = 0.0,
                               presence: float = 0.0) -> torch.Tensor:
    r"""The OpenAI API's penalties:

    $$z_j \leftarrow z_j - \alpha_f \, c_j - \alpha_p \, [c_j > 0],$$

    with $c_j$ the number of times token $j$ occurs in ``ids``: a
    presence penalty $\alpha_p$ is paid once, a frequency penalty
    $\alpha_f$ once per occurrence.

    Args:
        logits: ``(B, V)``. ids: ``(B, T)`` long.
        frequency: $\alpha_f$, a finite real (negative values reward
            repetition). presence: $\alpha_p$, likewise.

    Returns:
        ``(B, V)`` new logits.
    """
    _check(logits, ids)
    check_real("frequency", frequency)
    check_real("presence", presence)
    counts = torch.zeros_like(logits).scatter_add(
        1, ids, torch.ones_like(ids, dtype=logits.dtype))    # (B, V) c_j
    return logits - frequency * counts - presence * (counts > 0).to(
        logits.dtype)


def no_repeat_ngram_filter(logits: torch.Tensor, ids: torch.Tensor,
                           n: int) -> torch.Tensor:
    r"""Forbid every token that would complete an $n$-gram that already
    occurs in ``ids``: if the last $n - 1$ tokens
    $x_{T-n+2}, \dots, x_T$ also occurred at positions $i, \dots,
    i + n - 2$, the token $x_{i+n-1}$ that followed them there gets
    $-\infty$. With $n = 1$ every token already present is forbidden.

    When every token is forbidden the row is all $-\infty$ and cannot be
    sampled; choose $n$ large enough for the vocabulary and the length.

    Args:
        logits: ``(B, V)``. ids: ``(B, T)`` long.
        n: the n-gram length, an int $\ge 1$.

    Returns:
        ``(B, V)`` new logits.
    """
    _check(logits, ids)
    check_int("n", n, minimum=1)
    B, T = ids.shape
    if T < n:
        return logits.clone()
    windows = ids.unfold(1, n, 1)                            # (B, W, n)
    tail = ids[:, T - n + 1:]                                # (B, n - 1)
    # window i matches if its first n - 1 tokens are the current tail
    match = (windows[:, :, :-1] == tail[:, None, :]).all(-1)  # (B, W)
    hits = torch.zeros_like(logits).scatter_add(
        1, windows[:, :, -1], match.to(logits.dtype))        # (B, V)
    return logits.masked_fill(hits > 0, float("-inf"))

r"""Masks: which keys each query may read, and tools to check them.

A mask is a boolean tensor, ``True`` = "may attend", that
:func:`~course_lib.attention.scaled_dot_product_attention` applies to the
scores. This module builds them and holds what chapter 4 needs around
them:

* :func:`causal_mask` (end-aligned, so it works with a KV cache),
  :func:`sliding_window_mask`, :func:`padding_mask` and
  :func:`combine_masks` build and combine boolean masks;

* :func:`additive_mask` turns a boolean mask into the matrix $M$ of the
  formula $\mathrm{softmax}(QK^\top/\sqrt{d_k} + M)\,V$, with $M_{ij} = 0$
  where query $i$ may read key $j$ and $M_{ij} = -\infty$ where it may not;
* :func:`next_token_pairs` makes the shifted (input, target) pairs of
  next-token training, which is why a query may see its own position;
* :func:`influence_matrix` measures, by perturbation, which inputs can move
  which outputs, so causality can be checked on any sequence function;
* :func:`draw_mask` draws a mask (optionally with the weights in its
  cells) into a matplotlib Axes.

Shape letters: B batch, T sequence length, Lq query length, Lk key length,
D feature width, ... any leading dimensions (batch, heads).

Introduced in chapter 4.
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from .validation import check_bool_mask, check_int, check_lengths

__all__ = ["causal_mask", "sliding_window_mask", "padding_mask",
           "combine_masks", "additive_mask", "next_token_pairs",
           "influence_matrix", "draw_mask"]


# ---------------------------------------------------------- building masks
def causal_mask(q_len: int, k_len: int | None = None, *,
                device: torch.device | str | None = None) -> torch.Tensor:
    r"""Causal mask aligned to the end of the keys: (Lq, Lk) bool.

    Query $i$ may see key $j$ iff $j \le i + (L_k - L_q)$: the last query
    sits at the last key. With $L_q = L_k$ this is the lower triangle;
    with $L_q = 1$ (one new token against a cache of $L_k$ keys) the row
    is all True. torch's ``is_causal=True`` aligns to the *start*
    (top-left) instead, which differs when $L_q \ne L_k$. With
    $L_q > L_k$ the first $L_q - L_k$ rows allow no key at all (attention
    returns zeros there).

    Args:
        q_len, k_len: numbers of queries Lq and keys Lk (default Lq).
        device: device of the result.

    Introduced in chapter 3.
    """
    check_int("q_len", q_len, minimum=1)
    k_len = q_len if k_len is None else k_len
    check_int("k_len", k_len, minimum=1)
    i = torch.arange(q_len, device=device)[:, None]             # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]             # (1, Lk)
    # j <= i + Lk - Lq
    return j <= i + (k_len - q_len)                             # (Lq, Lk)


def sliding_window_mask(q_len: int, k_len: int | None = None, *,
                        window: int,
                        device: torch.device | str | None = None
                        ) -> torch.Tensor:
    r"""Causal sliding window: each query sees its last ``window`` keys.

    With $i' = i + L_k - L_q$ (end-aligned as in :func:`causal_mask`),
    query $i$ may see key $j$ iff $i' - w < j \le i'$: at most $w$ keys
    per row, so a block-wise kernel costs $O(Lw)$ instead of $O(L^2)$.

    Args:
        q_len, k_len, device: as in :func:`causal_mask`.
        window: keys visible per query, counting itself ($w \ge 1$).
    Returns:
        bool tensor (Lq, Lk).

    Introduced in chapter 3.
    """
    check_int("window", window, minimum=1)
    causal = causal_mask(q_len, k_len, device=device)           # (Lq, Lk)
    k_len = causal.shape[1]
    i = torch.arange(q_len, device=device)[:, None]             # (Lq, 1)
    j = torch.arange(k_len, device=device)[None, :]             # (1, Lk)
    # i' - w < j, with i' = i + Lk - Lq
    return causal & (j > i + (k_len - q_len) - window)          # (Lq, Lk)


def padding_mask(lengths, max_len: int, *,
                 device: torch.device | str | None = None) -> torch.Tensor:
    r"""Key-padding mask (B, 1, Lk): True for real keys, False for padding.

    Sequence $b$ has ``lengths[b]`` real tokens, then padding up to
    ``max_len``. The mask acts on the KEY axis (the last one): no query may
    attend to a padding key. (B, 1, Lk) broadcasts over the queries of
    scores (B, Lq, Lk); for per-head scores (B, H, Lq, Lk) insert the head
    axis, ``mask[:, None]`` = (B, 1, 1, Lk). Padding *queries* are not
    masked: their outputs are computed and ignored downstream.

    Args:
        lengths: B ints (list, 1-D integer tensor or array), each in
            [0, max_len].
        max_len: padded length Lk.
        device: where to build the mask (match it to the scores).

    Introduced in chapter 3.
    """
    check_int("max_len", max_len, minimum=1)
    lengths = check_lengths(lengths, minimum=0)
    if max(lengths) > max_len:
        raise ValueError(f"lengths must be <= max_len = {max_len}, got "
                         f"{max(lengths)}")
    lens = torch.tensor(lengths, device=device)[:, None, None]  # (B, 1, 1)
    pos = torch.arange(max_len, device=device)[None, None, :]   # (1, 1, Lk)
    return pos < lens                                           # (B, 1, Lk)


def combine_masks(*masks: torch.Tensor | None) -> torch.Tensor | None:
    r"""Logical AND of boolean masks, with broadcasting.

    A key is allowed only if every mask allows it: causal (Lq, Lk) AND
    padding (B, 1, Lk) gives (B, Lq, Lk). ``None`` means "no restriction";
    the result is None if all masks are None.

    Introduced in chapter 3.
    """
    present = [m for m in masks if m is not None]
    for m in present:
        check_bool_mask("masks", m)
    try:
        torch.broadcast_shapes(*(m.shape for m in present))
    except RuntimeError:
        raise ValueError(f"masks of shapes {[tuple(m.shape) for m in present]}"
                         f" do not broadcast together") from None
    return functools.reduce(torch.logical_and, present) if present else None


# ------------------------------------------ masks as the softmax sees them
def _check_tensor(name: str, value, *, bool_only: bool = False) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got "
                         f"{type(value).__name__}")
    if bool_only and value.dtype != torch.bool:
        raise ValueError(f"{name} must be a bool tensor (True = may attend), "
                         f"got dtype {value.dtype}")


def additive_mask(mask: torch.Tensor, *,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    r"""The additive form $M$ of a boolean mask: 0 where allowed, $-\infty$.

    Adding $M$ to the scores before the softmax gives a blocked key the
    weight $e^{-\infty} / Z = 0$ exactly, while allowed keys keep
    $e^{s_{ij}}$, so the softmax renormalises over the allowed keys only:

    $$a_{ij} = \frac{e^{s_{ij} + M_{ij}}}{\sum_{j'} e^{s_{ij'} + M_{ij'}}}
    = \frac{e^{s_{ij}}\,[j \text{ allowed}]}
    {\sum_{j' \text{ allowed}} e^{s_{ij'}}}.$$

    Args:
        mask: bool tensor of any shape, ``True`` where the query may attend.
        dtype: floating dtype of the result.

    Returns:
        A tensor of the shape of ``mask`` holding ``0.0`` and ``-inf``.

    Introduced in chapter 4.
    """
    _check_tensor("mask", mask, bool_only=True)
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    # M_ij = 0 if allowed else -inf
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill(~mask, float("-inf"))


def next_token_pairs(tokens: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Split a token sequence into model inputs and next-token targets.

    A language model is trained to predict token $t+1$ from tokens
    $0, \dots, t$. The input is the sequence without its last token and the
    target the sequence without its first, so position $t$ of the input is
    paired with token $t + 1$:

    $$\text{inputs}_t = x_t, \qquad \text{targets}_t = x_{t+1},
    \qquad t = 0, \dots, T - 2.$$

    This one-step shift is why a causal mask may include the diagonal:
    the token a position reads is never the token it must predict.

    Args:
        tokens: integer tensor ``(..., T)`` with ``T >= 2``.

    Returns:
        ``(inputs, targets)``, each ``(..., T - 1)`` (views of ``tokens``).

    Introduced in chapter 4.
    """
    _check_tensor("tokens", tokens)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"tokens must hold integer ids, got dtype "
                         f"{tokens.dtype}")
    if tokens.dim() < 1 or tokens.shape[-1] < 2:
        raise ValueError(f"tokens must have shape (..., T) with T >= 2, "
                         f"got {tuple(tokens.shape)}")
    return tokens[..., :-1], tokens[..., 1:]                 # (..., T - 1)


@torch.no_grad()
def influence_matrix(fn: Callable[[torch.Tensor], torch.Tensor],
                     x: torch.Tensor, *, n_trials: int = 3,
                     generator: torch.Generator | None = None
                     ) -> torch.Tensor:
    r"""Which input positions can change which output positions.

    For every input position $j$, the input row $x_j$ is replaced by fresh
    random values (``n_trials`` times) and the largest change of each output
    row is recorded:

    $$I_{ij} = \max_{\text{trials}}\ \max_{\text{batch, features}}
    \big| f(x')_i - f(x)_i \big|, \qquad x'_{j'} = x_{j'}
    \text{ for } j' \ne j.$$

    A function is causal if and only if $I_{ij} = 0$ for every $j > i$ and
    every perturbation; a perturbation test can only show that it is not,
    or that no tried perturbation broke it.

    Args:
        fn: maps ``(..., T, D)`` to ``(..., T, D_out)``.
        x: input ``(..., T, D)``, floating point.
        n_trials: random replacements per input position.
        generator: optional ``torch.Generator`` for the replacements.

    Returns:
        ``(T, T)`` tensor of non-negative changes, rows = outputs,
        columns = perturbed inputs.

    Introduced in chapter 4.
    """
    if not callable(fn):
        raise ValueError(f"fn must be callable, got {fn!r}")
    _check_tensor("x", x)
    if not x.dtype.is_floating_point or x.dim() < 2:
        raise ValueError(f"x must be a floating tensor of shape (..., T, D), "
                         f"got dtype {x.dtype} and shape {tuple(x.shape)}")
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) \
            or n_trials < 1:
        raise ValueError(f"n_trials must be an int >= 1, got {n_trials!r}")
    T = x.shape[-2]
    base = fn(x)                                             # (..., T, D_out)
    if base.dim() < 2 or base.shape[-2] != T:
        raise ValueError(f"fn must return shape (..., T={T}, D_out), got "
                         f"{tuple(base.shape)}")
    out = torch.zeros(T, T, dtype=base.dtype)
    for j in range(T):
        for _ in range(n_trials):
            x_new = x.clone()
            x_new[..., j, :] = torch.randn(
                x_new[..., j, :].shape, generator=generator,
                dtype=x.dtype).to(x.device)
            change = (fn(x_new) - base).abs()                # (..., T, D_out)
            # max over features, then over all leading dimensions
            per_row = change.amax(dim=-1).reshape(-1, T).amax(dim=0)  # (T,)
            out[:, j] = torch.maximum(out[:, j], per_row.cpu())
    return out


def draw_mask(ax, mask: torch.Tensor, *,
              weights: torch.Tensor | None = None,
              title: str | None = None,
              query_labels: Sequence[str] | None = None,
              key_labels: Sequence[str] | None = None,
              fontsize: float = 8) -> object:
    r"""Draw a ``(Lq, Lk)`` boolean mask; allowed cells blue, blocked grey.

    Rows are queries and columns keys, as in $QK^\top$. With ``weights``
    (same shape), each allowed cell is shaded by its weight and labelled
    with it to two decimals; blocked cells are always grey, so a reader
    can see that a blocked key gets weight 0 rather than a small weight.

    Args:
        ax: a matplotlib Axes to draw into.
        mask: bool ``(Lq, Lk)``.
        weights: optional float ``(Lq, Lk)`` attention weights.
        title: optional Axes title.
        query_labels, key_labels: tick labels (default ``0, 1, ...``).
        fontsize: size of the cell labels.

    Returns:
        The Axes.

    Introduced in chapter 4.
    """
    from matplotlib.colors import ListedColormap
    import numpy as np

    _check_tensor("mask", mask, bool_only=True)
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (Lq, Lk), got "
                         f"{tuple(mask.shape)}")
    Lq, Lk = mask.shape
    allowed = mask.cpu().numpy()
    if weights is None:
        ax.imshow(allowed.astype(float), cmap=ListedColormap(
            ["#d9d9d9", "#3b75af"]), vmin=0, vmax=1)
    else:
        _check_tensor("weights", weights)
        if tuple(weights.shape) != (Lq, Lk):
            raise ValueError(f"weights must have shape {(Lq, Lk)} like "
                             f"mask, got {tuple(weights.shape)}")
        w = weights.detach().double().cpu().numpy()
        ax.imshow(np.where(allowed, w, np.nan), cmap="Blues", vmin=0,
                  vmax=1)
        ax.imshow(np.where(allowed, np.nan, 1.0), cmap=ListedColormap(
            ["#d9d9d9"]), vmin=0, vmax=1)
        for i in range(Lq):
            for j in range(Lk):
                text = f"{w[i, j]:.2f}" if allowed[i, j] else "-"
                dark = allowed[i, j] and w[i, j] > 0.6
                ax.text(j, i, text, ha="center", va="center",
                        fontsize=fontsize,
                        color="white" if dark else "black")
    # thin white grid lines between cells
    ax.set_xticks(np.arange(-0.5, Lk, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, Lq, 1), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.set_xticks(range(Lk))
    ax.set_yticks(range(Lq))
    ax.set_xticklabels(key_labels if key_labels is not None
                       else [str(j) for j in range(Lk)], fontsize=fontsize)
    ax.set_yticklabels(query_labels if query_labels is not None
                       else [str(i) for i in range(Lq)], fontsize=fontsize)
    ax.set_xlabel("key", fontsize=fontsize + 1)
    ax.set_ylabel("query", fontsize=fontsize + 1)
    if title:
        ax.set_title(title, fontsize=fontsize + 2)
    return ax

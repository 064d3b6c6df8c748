r"""Probes of chapter 4: why a query may see itself, which inputs move
which outputs, and a picture of a mask.

* :func:`next_token_pairs` makes the shifted (input, target) pairs of
  next-token training, which is why a causal mask may include the
  diagonal;
* :func:`influence_matrix` measures, by perturbation, which inputs can
  move which outputs, so causality can be checked on any sequence
  function;
* :func:`draw_mask` draws a mask (optionally with the weights in its
  cells) into a matplotlib Axes.

Shape letters: T sequence length, Lq query length, Lk key length, D
feature width, ... any leading dimensions.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .._util.validation import check_bool_mask, check_int, check_type

__all__ = ["next_token_pairs", "influence_matrix", "draw_mask"]


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
    """
    check_type("tokens", tokens, torch.Tensor, "a torch.Tensor")
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
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r:.40}")
    check_type("x", x, torch.Tensor, "a torch.Tensor")
    if not x.dtype.is_floating_point:
        raise TypeError(f"x must be a floating tensor of shape (..., T, D), "
                        f"got dtype {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape (..., T, D), got "
                         f"{tuple(x.shape)}")
    check_int("n_trials", n_trials, minimum=1)
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
    """
    import numpy as np
    from matplotlib.colors import ListedColormap

    check_bool_mask("mask", mask)
    if mask.dim() != 2:
        raise ValueError(f"mask must have shape (Lq, Lk), got "
                         f"{tuple(mask.shape)}")
    Lq, Lk = mask.shape
    allowed = mask.cpu().numpy()
    if weights is None:
        ax.imshow(allowed.astype(float), cmap=ListedColormap(
            ["#d9d9d9", "#3b75af"]), vmin=0, vmax=1)
    else:
        check_type("weights", weights, torch.Tensor, "a torch.Tensor")
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

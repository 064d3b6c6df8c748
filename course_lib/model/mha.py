r"""Multi-head attention, with grouped-query (GQA) and multi-query (MQA) heads.

Multi-head attention (Vaswani et al. 2017) runs $h$ attention heads side
by side, each in its own learned $d_k$-dimensional subspace, and mixes
their outputs with one more matrix:

$$\mathrm{MultiHead}(X) = \mathrm{Concat}(\mathrm{head}_1, \dots,
\mathrm{head}_h)\,W^O, \qquad
\mathrm{head}_i = \mathrm{Attention}(XW_i^Q, CW_i^K, CW_i^V),$$

with $W_i^Q, W_i^K \in \mathbb{R}^{d_{\text{model}} \times d_k}$,
$W_i^V \in \mathbb{R}^{d_{\text{model}} \times d_v}$ and
$W^O \in \mathbb{R}^{h d_v \times d_{\text{model}}}$; $C = X$ in
self-attention, another sequence in cross-attention. As in the paper,
$d_k = d_v = d_{\text{model}} / h$; the $W_i^Q$ sit side by side as the
columns of one $W^Q$ (``q_proj``): one matmul and a reshape serve all heads.

Grouped-query attention (GQA, Ainslie et al. 2023) keeps $h$ query heads
but only $g$ key/value heads (``n_kv_heads``); query head $i$ reads K/V head
$\lfloor i / (h/g) \rfloor$. $g = h$ is ordinary multi-head attention,
$g = 1$ is multi-query attention (MQA, Shazeer 2019): a smaller KV cache.

Positions enter through one hook: given a
:class:`~course_lib.model.rope.RotaryEmbedding` (``rope=``), the module
rotates each head's queries and keys by their positions right after the
projections (RoPE, chapter 2); without it, it is the paper's attention,
whose positions were added to the embeddings at the input.

Shape letters: B batch, T query length (``x``), S key/value length
(``context``, or cached + new positions; S = T in plain self-attention),
D = ``d_model``, H = ``n_heads`` (query heads), G = ``n_kv_heads``,
d_k = ``head_dim`` = D / H. Module names follow the Llama checkpoints
(``q_proj`` ... ``o_proj``).

The module ends with the tensor layout every attention layer shares
(MLA and tensor-parallel attention too): heads cut out of the feature axis
and made a batch axis (:func:`split_heads`, :func:`merge_heads`), K/V heads
repeated for GQA (:func:`repeat_kv`), a boolean mask brought to 4-D
(:func:`mask_to_4d`) and the positions of the queries
(:func:`query_positions`).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from .._util.validation import (
    check_attention_inputs,
    check_bool,
    check_bool_mask,
    check_broadcasts,
    check_divides,
    check_equal,
    check_shape,
    check_sizes,
    check_type,
)
from .attention import attend, fused_attend
from .rope import RotaryEmbedding

if TYPE_CHECKING:  # annotations only: the cache is chapter 9's module
    from .kv_cache import LayerKVCache

__all__ = ["mha_param_count", "MultiHeadAttention", "split_heads",
           "merge_heads", "repeat_kv", "grouped_query_attention",
           "MASK_SHAPES", "mask_to_4d",
           "query_positions"]


def _check_heads(d_model, n_heads, n_kv_heads, bias) -> None:
    """Validate the sizes (``n_kv_heads`` already resolved from None)."""
    check_sizes(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads)
    check_divides("d_model", d_model, "n_heads", n_heads)
    check_divides("n_heads", n_heads, "n_kv_heads", n_kv_heads)
    check_bool("bias", bias)


def mha_param_count(*, d_model: int, n_heads: int,
                    n_kv_heads: int | None = None, bias: bool = True,
                    head_dim: int | None = None) -> int:
    r"""Closed-form parameter count of :class:`MultiHeadAttention`.

    $W^Q$ is $D \times h\,d_k$ and $W^O$ its transpose; $W^K$ and $W^V$
    are $D \times g\,d_k$. With biases each projection adds its output
    width:

    $$N = 2D\,h\,d_k + 2\,D\,g\,d_k + [\text{bias}]\,(h\,d_k + D +
    2\,g\,d_k),$$

    which is $4D^2 + 4D$ for ordinary multi-head attention ($g = h$,
    $h\,d_k = D$).

    Args:
        d_model: $D$; n_heads: $h$; n_kv_heads: $g$ (default $h$);
        bias: whether the four projections have biases; head_dim: $d_k$,
            default $D/h$ as in the course's module (a published model
            may choose another width: chapter 12).

    Returns:
        The number of scalars.
    """
    g = n_heads if n_kv_heads is None else n_kv_heads    # None: MHA
    _check_heads(d_model, n_heads, g, bias)
    d_k = d_model // n_heads if head_dim is None else head_dim
    check_sizes(head_dim=d_k)
    q_width, kv_width = n_heads * d_k, g * d_k
    n = 2 * d_model * q_width + 2 * d_model * kv_width   # W^Q, W^O; W^K, W^V
    if bias:
        n += q_width + d_model + 2 * kv_width
    return n


class MultiHeadAttention(nn.Module):
    r"""Multi-head attention with optional grouped K/V heads.

    $\mathrm{MultiHead}(X, C) = \mathrm{Concat}_i\big(\mathrm{softmax}
    (Q_i K_{k(i)}^\top / \sqrt{d_k})\,V_{k(i)}\big)\,W^O$ with
    $Q = XW^Q$, $K = CW^K$, $V = CW^V$ split into heads and
    $k(i) = \lfloor i\,g / h \rfloor$.

    Args:
        d_model: model width $D$ (divisible by ``n_heads``).
        n_heads: query heads $h$; ``head_dim`` $= D / h$.
        n_kv_heads: key/value heads $g$ (divides ``n_heads``); ``None``
            means $g = h$ (ordinary MHA), 1 means MQA.
        bias: biases in the four projections (the paper's formulas have
            none; torch's ``nn.MultiheadAttention`` has them by default).
        rope: the position hook: a
            :class:`~course_lib.model.rope.RotaryEmbedding` of width
            ``head_dim`` that rotates $q$ and $k$ (Llama), or ``None``
            (positions, if any, were added at the input).
        fused: run steps 4-5 in torch's fused kernel, which reads each
            K/V head for its query heads without copying it (as
            ``transformers`` runs Llama; chapter 13); same result up to
            rounding. A call that asks for the weights runs the explicit
            path anyway (the kernel keeps none).
    """

    def __init__(self, d_model: int, n_heads: int, *,
                 n_kv_heads: int | None = None, bias: bool = True,
                 rope: RotaryEmbedding | None = None,
                 fused: bool = False) -> None:
        super().__init__()
        g = n_heads if n_kv_heads is None else n_kv_heads  # None: MHA
        _check_heads(d_model, n_heads, g, bias)
        self.n_kv_heads = g
        check_bool("fused", fused)
        if rope is not None:
            check_type("rope", rope, RotaryEmbedding, "a RotaryEmbedding")
            check_equal("rope.head_dim", rope.head_dim, d_model // n_heads)
        self.fused = fused
        self.rope = rope                             # the position hook
        self.d_model, self.n_heads = d_model, n_heads
        self.head_dim = d_model // n_heads           # d_k = d_v
        self.scale = 1.0 / math.sqrt(self.head_dim)  # 1 / sqrt(d_k)
        self.n_rep = n_heads // self.n_kv_heads      # query heads per K/V head
        kv_width = self.n_kv_heads * self.head_dim
        # nn.Linear stores weight as (out, in), i.e. W^T: W^Q = q_proj.weight.T
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)   # W^Q
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)  # W^K
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)  # W^V
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)   # W^O

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, "
                f"n_kv_heads={self.n_kv_heads}, head_dim={self.head_dim}")

    # ------------------------------------------------------------ checks
    def _inputs(self, x, context):
        """Validate x and context; return context (x for self-attention)."""
        D = self.d_model
        check_shape("x", x, (None, None, D), f"(B, T, d_model={D})")
        if context is None:
            return x
        B = x.shape[0]
        check_shape("context", context, (B, None, D),
                    f"(B={B}, S, d_model={D})")
        return context

    def _mask4d(self, mask, B: int, T: int, S: int):
        """:func:`mask_to_4d` for this module's ``n_heads``."""
        return mask_to_4d(mask, B, self.n_heads, T, S)

    # ----------------------------------------------------------- forward
    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                *, context: torch.Tensor | None = None,
                positions: torch.Tensor | None = None,
                cache: LayerKVCache | None = None) -> torch.Tensor:
        r"""Batched multi-head attention: all heads in one reshape.

        Args:
            x: ``(B, T, D)`` queries come from here.
            mask: bool, True = may attend; ``(T, S)``, ``(B, 1, S)``,
                ``(B, T, S)`` or 4-D broadcastable to ``(B, H, T, S)``.
            context: ``(B, S, D)`` keys and values come from here
                (cross-attention); ``None`` means ``x`` (self-attention).
            positions: ``(T,)`` positions of the queries, used by the
                ``rope`` hook only; default $0, \dots, T-1$, or with a
                cache the $T$ positions after the cached ones; or
                ``(B, T)``, one row per sequence (left padding).
            cache: self-attention only: this layer's
                :class:`~course_lib.model.kv_cache.LayerKVCache`. The new K, V
                (G heads, before repetition, keys already rotated) are
                appended and attention runs over all cached positions, so
                $S$ = cached + $T$ (chapter 9).

        Returns:
            ``(B, T, D)``. :meth:`forward_with_weights` returns the
            attention weights too.
        """
        out, _ = self._attend(x, mask, context, positions, cache,
                              need_weights=False)
        return out                                           # (B, T, D)

    def forward_with_weights(
            self, x: torch.Tensor, mask: torch.Tensor | None = None, *,
            context: torch.Tensor | None = None,
            positions: torch.Tensor | None = None,
            cache: LayerKVCache | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`forward`, and the attention weights it used.

        Always the explicit path (the fused kernel never forms the
        weights), so a ``fused`` module gives the same output up to
        rounding.

        Returns:
            ``(out, weights)``: ``(B, T, D)`` and ``(B, H, T, S)``.
        """
        return self._attend(x, mask, context, positions, cache,
                            need_weights=True)

    def _attend(self, x, mask, context, positions, cache, *,
                need_weights: bool):
        """The steps of :meth:`forward`; weights None unless needed."""
        if cache is not None and context is not None:
            raise ValueError("cache is for self-attention: pass context="
                             "None with a cache")
        context = self._inputs(x, context)
        B, T, D = x.shape
        H, G = self.n_heads, self.n_kv_heads
        # 1) Project: Q = X W^Q, K = C W^K, V = C W^V (all heads at once).
        q = self.q_proj(x)                                   # (B, T, H*d_k)
        k = self.k_proj(context)                             # (B, S, G*d_k)
        v = self.v_proj(context)                             # (B, S, G*d_k)
        # 2) Split the feature axis into heads; heads become a batch axis.
        q = split_heads(q, H)                                # (B, H, T, d_k)
        k = split_heads(k, G)                                # (B, G, S, d_k)
        v = split_heads(v, G)                                # (B, G, S, d_k)
        # 3) Position hook: RoPE rotates q and k (never v), so that
        #    q_m . k_n depends on m - n only (chapter 2).
        if self.rope is not None:
            positions = query_positions(positions, T, cache, x.device)
            q = self.rope(q, positions)                      # (B, H, T, d_k)
            k = self.rope(k, positions)                      # (B, G, T, d_k)
        if cache is not None:
            # KV cache: past keys/values + this call's (chapter 9).
            k, v = cache.update(k, v)                        # (B, G, S, d_k)
        mask = self._mask4d(mask, B, T, k.shape[2])
        if self.fused and not need_weights:
            # 4-5) in torch's kernel, K/V heads shared without copies
            out, weights = fused_attend(
                q, k, v, mask, self.scale, G != H), None     # (B, H, T, d_k)
        else:
            # 4) GQA/MQA: each K/V head serves n_rep query heads.
            k = repeat_kv(k, self.n_rep)                     # (B, H, S, d_k)
            v = repeat_kv(v, self.n_rep)                     # (B, H, S, d_k)
            # 5) head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i, every head.
            out, weights = attend(q, k, v, mask, self.scale)
        #    out (B, H, T, d_k), weights (B, H, T, S)
        # 6) Concat(head_1, ..., head_h): heads back next to each other.
        out = merge_heads(out)                               # (B, T, D)
        # 7) MultiHead = Concat(...) W^O
        return self.o_proj(out), weights                     # (B, T, D)

    def forward_loop(self, x: torch.Tensor,
                     mask: torch.Tensor | None = None, *,
                     context: torch.Tensor | None = None,
                     positions: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Reference form: one head at a time, exactly as the equation reads.

        Head $i$ uses its own slices $W_i^Q$, $W_i^K$, $W_i^V$ (columns
        $i d_k \dots (i+1) d_k - 1$ of $W^Q$, $W^K$, $W^V$; with GQA the K/V
        slice of group $\lfloor i / n_{\text{rep}} \rfloor$), and the head
        outputs are concatenated before $W^O$. Same arguments and results
        as :meth:`forward_with_weights` (no cache): ``(out, weights)``;
        slower, for teaching and tests.
        """
        context = self._inputs(x, context)
        B, T, D = x.shape
        S = context.shape[1]
        d_k = self.head_dim
        mask = self._mask4d(mask, B, T, S)
        heads, all_weights = [], []
        for i in range(self.n_heads):
            g = i // self.n_rep                   # the K/V head query i reads
            rq = slice(i * d_k, (i + 1) * d_k)    # rows of the (out, in)
            rk = slice(g * d_k, (g + 1) * d_k)    # weight = columns of W
            q_i = _head_proj(self.q_proj, rq, x)             # (B, T, d_k)
            k_i = _head_proj(self.k_proj, rk, context)       # (B, S, d_k)
            v_i = _head_proj(self.v_proj, rk, context)       # (B, S, d_k)
            if self.rope is not None:
                pos = query_positions(positions, T, None, x.device)
                pos = pos[:, 0] if pos.dim() == 3 else pos   # (B, T)
                q_i, k_i = self.rope(q_i, pos), self.rope(k_i, pos)
            # Pick this head's slice of the mask (broadcast axes stay 1).
            m_i = None
            if mask is not None:
                m_i = mask if mask.dim() == 2 else \
                    mask[:, i if mask.shape[1] > 1 else 0]   # (B|1, T|1, S)
            # head_i = Attention(X W_i^Q, C W_i^K, C W_i^V)
            h_i, w_i = attend(q_i, k_i, v_i, m_i,
                              self.scale)                    # (B, T, d_k)
            heads.append(h_i)
            all_weights.append(w_i.expand(B, T, S))          # (B, T, S)
        # MultiHead = Concat(head_1, ..., head_h) W^O
        out = self.o_proj(torch.cat(heads, dim=-1))          # (B, T, D)
        return out, torch.stack(all_weights, dim=1)          # (B, H, T, S)


def _head_proj(layer: nn.Linear, rows: slice,
               x: torch.Tensor) -> torch.Tensor:
    """x W_i + b_i: one head's columns of W (rows of the (out, in) weight)."""
    bias = None if layer.bias is None else layer.bias[rows]
    return nn.functional.linear(x, layer.weight[rows], bias)   # (B, T, d_k)


def split_heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    r"""Cut the feature axis into heads and make heads a batch axis.

    Feature $i\,d_k + c$ is feature $c$ of head $i$ (head $i$ owns
    columns $i d_k, \dots, (i+1) d_k - 1$ of $W^Q$), so a ``view`` to
    ``(B, T, H, d_k)`` finds the heads; the transpose puts heads before
    tokens, so attention runs on one (T, d_k) matrix per (batch, head).

    Args:
        x: ``(B, T, H * d_k)`` queries, keys or values; n_heads: H.

    Returns:
        ``(B, H, T, d_k)``.
    """
    B, T, width = x.shape
    # Not x.view(B, H, T, d_k): that would mix tokens into heads.
    x = x.view(B, T, n_heads, width // n_heads)      # (B, T, H, d_k)
    return x.transpose(1, 2)                         # (B, H, T, d_k)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    r"""Inverse of :func:`split_heads`: $\mathrm{Concat}(\mathrm{head}_1,
    \dots, \mathrm{head}_h)$ along the feature axis.

    Args:
        x: ``(B, H, T, d_k)``.

    Returns:
        ``(B, T, H * d_k)``, head $i$ in features $i d_k$ to $(i+1)d_k - 1$.
    """
    B, H, T, d_k = x.shape
    # transpose makes x non-contiguous, so reshape (which copies) not view
    return x.transpose(1, 2).reshape(B, T, H * d_k)  # (B, T, H*d_k)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    r"""Repeat each key/value head ``n_rep`` times along the head axis.

    $g$ K/V heads serve $h = g\,n_{\text{rep}}$ query heads: query head
    $i$ reads K/V head $\lfloor i / n_{\text{rep}} \rfloor$ (Llama layout).

    Args:
        x: ``(B, G, S, d_k)``; n_rep: ``n_heads // n_kv_heads`` (>= 1).

    Returns:
        ``(B, G * n_rep, S, d_k)``; ``x`` itself when ``n_rep == 1``.
    """
    if n_rep == 1:
        return x
    B, G, S, d_k = x.shape
    # expand is a view (no copy); the reshape then materialises the copies.
    x = x[:, :, None, :, :].expand(B, G, n_rep, S, d_k)  # (B, G, r, S, d_k)
    return x.reshape(B, G * n_rep, S, d_k)               # (B, H, S, d_k)


def grouped_query_attention(q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor,
                            mask: torch.Tensor | None = None, *,
                            scale: float | None = None) -> torch.Tensor:
    r"""Attention of $H$ query heads over $G$ shared key/value heads.

    Query head $i$ reads K/V head $\lfloor i / r \rfloor$ with
    $r = H / G$ (the Llama layout of :func:`repeat_kv`):

    $$\mathrm{out}_i = \mathrm{softmax}\!\left(\frac{Q_i
    K_{\lfloor i/r \rfloor}^\top}{\sqrt{d_k}} + M\right)
    V_{\lfloor i/r \rfloor}.$$

    Computed as :class:`MultiHeadAttention` does it: :func:`repeat_kv`
    copies each K/V head to the $r$ query heads of its group, then
    ordinary attention runs on $H$ heads (fully masked rows give zeros).

    Args:
        q: (B, H, T, d_k) queries; k: (B, G, S, d_k) keys; v: (B, G, S,
            d_v) values; H a multiple of G.
        mask: None, or bool broadcastable to (B, H, T, S), e.g. (T, S);
            True where query t may read key s.
        scale: multiplier of the scores; default $1/\sqrt{d_k}$.
    Returns:
        (B, H, T, d_v).
    """
    scale = check_attention_inputs(q, k, v, mask, scale, gqa=True)
    n_rep = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)      # (B, H, S, d)
    out, _ = attend(q, k, v, mask, scale)                # (B, H, T, d_v)
    return out


#: The mask shapes attention accepts (True = may attend).
MASK_SHAPES = "(T, S), (B, 1, S), (B, T, S) or (B, H, T, S)"


def mask_to_4d(mask, B: int, H: int, T: int, S: int):
    """Bring a boolean mask (True = may attend) to 4-D (.., .., T, S),
    checking that it broadcasts to ``(B, H, T, S)``.

    A 3-D mask is read as per-example, (B, T, S) or (B, 1, S), so it
    gains a head axis at 1: broadcasting it as-is would align its batch
    axis with the head axis. ``None`` passes through.
    """
    if mask is None:
        return None
    check_bool_mask("mask", mask)
    m4 = mask[:, None] if mask.dim() == 3 else mask      # (B, 1, T|1, S)
    # Only 2-D and 4-D pass: a 1-D mask would broadcast but names no query
    # axis, so any other rank is checked as a shape that cannot broadcast.
    check_broadcasts("mask", m4.shape if m4.dim() in (2, 4) else (0,) * 5,
                     (B, H, T, S), MASK_SHAPES, given=mask.shape)
    return m4


def query_positions(positions, T: int, cache, device) -> torch.Tensor:
    """The absolute positions of T queries: ``positions`` as given
    (checked to have shape (T,) and, with a cache, to continue it), or by
    default the T positions after those already in ``cache`` (0.. without
    one). Per-row positions (B, T), as a left-padded batch needs, come
    back as (B, 1, T), broadcasting over the heads of (B, H, T, d_k).
    Used by every attention layer that rotates by position.
    """
    if positions is None:
        past = len(cache) if cache is not None else 0
        return torch.arange(past, past + T, device=device)   # (T,)
    if isinstance(positions, torch.Tensor) and positions.dim() == 2:
        return positions[:, None, :]                         # (B, 1, T)
    check_shape("positions", positions, (T,), f"(T,) = ({T},)")
    if cache is not None:
        cache.check_next(positions)        # rotations must match the keys
    return positions

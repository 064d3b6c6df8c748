r"""Attention by blocks of keys with an online softmax, as in FlashAttention.

The explicit path (:mod:`course_lib.model.attention`) forms all $L_q L_k$
scores of a head before the softmax. The softmax of a row only needs two
numbers besides the scores themselves, the row maximum $m$ (for a stable
exponential) and the denominator $\ell = \sum_j e^{s_j - m}$, and both can
be kept *running* while the keys arrive in blocks (the "online
softmax" of Milakov and Gimelshein, 2018): a new block with a larger
maximum rescales what was summed so far by
$e^{m_{\text{old}} - m_{\text{new}}}$. Carrying the unnormalised output
along with them gives attention without ever holding more than one
$(L_q, b)$ tile of scores (Algorithm 1 of FlashAttention, Dao et al.,
2022, which also cuts the queries into blocks: each row is its own
softmax, so that split needs no bookkeeping). Here it is a Python loop
over blocks, the algorithm and not the kernel: FlashAttention is fast on
a GPU because the whole loop is one kernel whose tiles stay in on-chip
SRAM, while each step of this loop is a separate torch operation.

Shape letters as in :mod:`course_lib.model.attention`: Lq queries, Lk keys
(and values), d_k query/key width, d_v value width, b block size, ...
leading batch dimensions (e.g. (B, H)).
"""
from __future__ import annotations

import torch

from .._util.validation import (check_attention_inputs, check_bool,
                                check_int, check_type)

__all__ = ["tiled_attention", "tiled_attend", "merge_states"]


def tiled_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    block_size: int, *, is_causal: bool = False,
                    scale: float | None = None) -> torch.Tensor:
    r"""$\mathrm{softmax}(QK^\top s)\,V$ computed over blocks of
    ``block_size`` keys, never forming the (..., Lq, Lk) weights.

    For each query row, with $S^{(t)}$ the scores of key block $t$, the
    loop keeps the running maximum $m$, the running denominator $\ell$
    and the running unnormalised output $o$ (starting from $m = -\infty$,
    $\ell = 0$, $o = 0$):

    $$m' = \max\big(m, \max_j S^{(t)}_j\big),\qquad
      P^{(t)} = e^{S^{(t)} - m'},$$
    $$\ell' = e^{m - m'}\,\ell + \textstyle\sum_j P^{(t)}_j,\qquad
      o' = e^{m - m'}\,o + P^{(t)} V^{(t)},$$

    and returns $o/\ell$ after the last block. Then
    $m = \max_j S_j$, $\ell = \sum_j e^{S_j - m}$ and
    $o/\ell = \sum_j \mathrm{softmax}(S)_j\, v_j$ exactly, whatever the
    block size: the rescaling makes every term carry the same $e^{-m}$.
    With ``is_causal`` the mask is aligned to the end of the keys, as
    :func:`~course_lib.model.masks.causal_mask` (query $i$ sees keys
    $j \le i + L_k - L_q$). (The last query sees every key, so no key
    block can be skipped here; FlashAttention also cuts the queries into
    blocks and skips the tiles above the diagonal, about half the work.)

    Args:
        q, k, v: queries (..., Lq, d_k), keys (..., Lk, d_k), values
            (..., Lk, d_v); leading dims broadcast.
        block_size: keys per block $b$, an int >= 1 (any size: the last
            block may be shorter; $b \ge L_k$ is one block, the ordinary
            softmax).
        is_causal: apply the end-aligned causal mask (needs Lq <= Lk, so
            that every query sees at least one key).
        scale: multiplier $s$ of the scores; default $1/\sqrt{d_k}$.
    Returns:
        out (..., Lq, d_v), equal (to rounding) to the output of
        :func:`~course_lib.model.attention.scaled_dot_product_attention`.
    """
    check_int("block_size", block_size, minimum=1)
    check_bool("is_causal", is_causal)
    scale = check_attention_inputs(q, k, v, None, scale)
    if is_causal and q.shape[-2] > k.shape[-2]:
        raise ValueError(f"is_causal needs Lq <= Lk (every query must see "
                         f"a key), got Lq={q.shape[-2]}, Lk={k.shape[-2]}")
    out, _, _ = tiled_attend(q, k, v, block_size, is_causal, scale)
    return out


def tiled_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 block_size: int, is_causal: bool, scale: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""The loop of :func:`tiled_attention`, for callers that have
    validated its arguments. Returns ``(out, m, l)``: the output
    (..., Lq, d_v) and the final statistics (..., Lq, 1), the row maximum
    $m = \max_j S_{ij}$ and the denominator $\ell = \sum_j e^{S_{ij} - m}$
    (so $m + \log \ell$ is the row's log-sum-exp).
    """
    dtype = v.dtype
    if q.element_size() < 4:       # accumulate half precision in float32
        q, k, v = q.float(), k.float(), v.float()
    Lq, Lk = q.shape[-2], k.shape[-2]
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    # End-aligned causal mask: query i sits at key position i + Lk - Lq.
    q_pos = torch.arange(Lq, device=q.device)[:, None] + (Lk - Lq)  # (Lq, 1)
    q = q * scale                                            # (..., Lq, d_k)
    m = q.new_full((*batch, Lq, 1), float("-inf"))           # running max
    l = q.new_zeros((*batch, Lq, 1))                         # running sum
    o = q.new_zeros((*batch, Lq, v.shape[-1]))               # (..., Lq, d_v)
    for start in range(0, Lk, block_size):
        k_t = k[..., start:start + block_size, :]            # (..., b, d_k)
        v_t = v[..., start:start + block_size, :]            # (..., b, d_v)
        # S^(t) = Q K_t^T s: one (Lq, b) tile of scores, never (Lq, Lk)
        s = q @ k_t.transpose(-2, -1)                        # (..., Lq, b)
        if is_causal:
            k_pos = torch.arange(start, start + s.shape[-1], device=q.device)
            s = s.masked_fill(k_pos > q_pos, float("-inf"))  # (..., Lq, b)
        # m' = max(m, max_j S_j); every query has seen key 0 by now, so m'
        # is finite and e^{m - m'} is 0 on the first block, never NaN
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp(m - m_new)                 # rescales old l and o
        p = torch.exp(s - m_new)                     # P^(t), (..., Lq, b)
        # l' = e^{m - m'} l + sum_j P_j ;  o' = e^{m - m'} o + P^(t) V_t
        l = alpha * l + p.sum(dim=-1, keepdim=True)
        o = alpha * o + p @ v_t                              # (..., Lq, d_v)
        m = m_new
    return (o / l).to(dtype), m, l


def merge_states(m1: torch.Tensor, l1: torch.Tensor, o1: torch.Tensor,
                 m2: torch.Tensor, l2: torch.Tensor, o2: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Merge the online-softmax states of two disjoint blocks of keys.

    A state $(m, \ell, o)$ of one query row over a set of keys $J$ holds
    $m = \max_{j \in J} s_j$, $\ell = \sum_{j \in J} e^{s_j - m}$ and the
    unnormalised output $o = \sum_{j \in J} e^{s_j - m} v_j$ (the running
    statistics of :func:`tiled_attention`; its output is $o/\ell$). For
    $J_1 \cap J_2 = \emptyset$ the state over $J_1 \cup J_2$ is

    $$m = \max(m_1, m_2),\quad
      \ell = e^{m_1 - m}\ell_1 + e^{m_2 - m}\ell_2,\quad
      o = e^{m_1 - m}o_1 + e^{m_2 - m}o_2,$$

    exactly, and $o/\ell$ is attention over all the keys. Every factor
    $e^{m_b - m} \le 1$, so nothing overflows whatever the scores. A block
    in which a row sees no key (all masked) has $m = -\infty$, $\ell = 0$,
    $o = 0$ and contributes nothing ($e^{-\infty} = 0$); at least one of
    the two must have seen a key. The merge is associative and
    commutative, which is what lets split-KV decoding (FlashDecoding)
    process the cache in parallel chunks and combine them at the end.

    Args:
        m1, l1: (..., Lq, 1) row maxima and denominators of block 1.
        o1: (..., Lq, d_v) its unnormalised outputs.
        m2, l2, o2: the same for block 2; leading dims broadcast.
    Returns:
        ``(m, l, o)``, the state over both blocks, shaped like the inputs
        (broadcast).
    """
    for name, t in (("m1", m1), ("l1", l1), ("o1", o1), ("m2", m2),
                    ("l2", l2), ("o2", o2)):
        check_type(name, t, torch.Tensor, "a torch.Tensor")
        if t.dim() < 2:
            raise ValueError(f"{name} must have shape (..., Lq, "
                             f"{'d_v' if name[0] == 'o' else 1}), got "
                             f"{tuple(t.shape)}")
    for name, t in (("m1", m1), ("l1", l1), ("m2", m2), ("l2", l2)):
        if t.shape[-1] != 1:
            raise ValueError(f"{name} must have shape (..., Lq, 1), got "
                             f"{tuple(t.shape)}")
    try:
        torch.broadcast_shapes(m1.shape, l1.shape, m2.shape, l2.shape)
        torch.broadcast_shapes(o1.shape[:-1], o2.shape[:-1], m1.shape[:-1])
    except RuntimeError:
        raise ValueError(f"the states must broadcast: m1 {tuple(m1.shape)}, "
                         f"o1 {tuple(o1.shape)}, m2 {tuple(m2.shape)}, "
                         f"o2 {tuple(o2.shape)}") from None
    m = torch.maximum(m1, m2)                                # (..., Lq, 1)
    if torch.isneginf(m).any():
        raise ValueError("every row must have seen a key in one of the two "
                         "blocks (m1 and m2 are both -inf somewhere)")
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)            # each <= 1
    return m, a1 * l1 + a2 * l2, a1 * o1 + a2 * o2

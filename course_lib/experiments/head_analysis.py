r"""A tiny attention-only model whose heads can be read off, and tools to read them.

The task is *induction* (Olsson et al. 2022): a sequence starts with a
beginning-of-sequence token (BOS, id 0) and then repeats a random segment of
distinct tokens with a random period $n$, e.g. ``BOS 5 2 9 5 2 9 5 ...``.
Once the segment has been seen, the next token is determined: if the current
token $x_t$ occurred before at position $t - n$, the next one is
$x_{t+1} = x_{t-n+1}$. Because $n$ varies from sequence to sequence, no
fixed positional offset solves the task. A two-layer attention-only model
solves it with two cooperating heads (Elhage et al. 2021):

1. a *previous-token head* in layer 1 copies $x_{j-1}$ into position $j$;
2. an *induction head* in layer 2 lets position $t$ attend to the position
   $j$ whose previous token equals $x_t$, i.e. $j = t - n + 1$, and copies
   $x_j$, which is the answer.

:func:`head_scores` measures how much weight each head puts on those
positions, so the roles can be named from numbers rather than from pictures.

Shape letters: B batch, T length, V vocabulary, D = ``d_model``,
H heads.
"""
from __future__ import annotations

import torch
from torch import nn

from .._util.threads import small_ops
from .._util.validation import check_alloc, check_int, check_shape, check_type
from ..model.masks import causal_mask
from ..model.mha import MultiHeadAttention
from ..training import IGNORE, next_token_loss, train

__all__ = ["BOS", "induction_batch", "TinyAttentionModel", "train_induction",
           "accuracy", "head_scores", "copy_head", "head_distance"]

BOS = 0          # beginning-of-sequence token id


def _check_index(name: str, value, n: int) -> None:
    """``value`` must be an int in ``[0, n)`` (a head or layer index)."""
    check_int(name, value, minimum=0)
    if value >= n:
        raise ValueError(f"{name} must be < {n}, got {value}")


def induction_batch(batch_size: int, *, length: int = 24,
                    vocab_size: int = 17, min_period: int = 3,
                    max_period: int = 8,
                    generator: torch.Generator | None = None):
    r"""Sequences ``BOS s s s ...`` with a random segment $s$ of distinct tokens.

    Each sequence draws a period $n \in [\text{min}, \text{max}]$ and $n$
    distinct tokens from $1, \dots, V-1$. Targets are the next tokens;
    those that cannot be inferred from the past (before the segment has
    been seen once completely) are set to ``IGNORE``.

    Args:
        batch_size: B.
        length: T, the input length (BOS included).
        vocab_size: V, including BOS; needs ``V - 1 >= max_period``.
        min_period, max_period: range of the period $n$.
        generator: torch random generator.

    Returns:
        ``(inputs, targets)``, both ``(B, T)`` long; ``targets[:, t]`` is
        the token at position ``t + 1`` or ``IGNORE``.
    """
    check_int("batch_size", batch_size, minimum=1)
    check_int("min_period", min_period, minimum=1)
    check_int("max_period", max_period, minimum=min_period)
    check_int("vocab_size", vocab_size, minimum=max_period + 1)
    check_int("length", length, minimum=max_period + 2)
    # the permutations (B, V-1) and the sequences (B, T+1)
    check_alloc("batch_size * (length + vocab_size)",
                batch_size * (length + vocab_size))
    periods = torch.randint(min_period, max_period + 1, (batch_size, 1),
                            generator=generator)                # (B, 1)
    # A random permutation per row; its first n entries are the segment.
    perm = torch.rand(batch_size, vocab_size - 1,
                      generator=generator).argsort(dim=1) + 1  # (B, V-1)
    pos = torch.arange(length)[None, :]                         # (1, T)
    body = perm.gather(1, pos % periods)                        # (B, T)
    seqs = torch.cat([torch.full((batch_size, 1), BOS), body], dim=1)
    # Position t (token x_t) predicts x_{t+1}; it is determined once x_t
    # has occurred before, i.e. for t >= n + 1.
    targets = torch.where(pos >= periods + 1, seqs[:, 1:],
                          torch.full_like(body, IGNORE))        # (B, T)
    return seqs[:, :length], targets


class TinyAttentionModel(nn.Module):
    r"""Token + learned position embeddings, N residual attention layers.

    $h^0 = E[x] + P$, $h^{\ell} = h^{\ell-1} +
    \mathrm{MHA}_\ell(\mathrm{LN}(h^{\ell-1}))$ with a causal mask, then
    logits $= \mathrm{LN}(h^N) W_U$. There is no feed-forward layer, so
    everything the model computes across positions happens in the heads.

    Args:
        vocab_size: V.
        d_model: D.
        n_heads: H per layer.
        n_layers: N.
        max_len: longest input (size of the position table).
    """

    def __init__(self, *, vocab_size: int, d_model: int, n_heads: int,
                 n_layers: int, max_len: int) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model),
                            ("n_layers", n_layers), ("max_len", max_len)):
            check_int(name, value, minimum=1)
        # checked before any layer is built (n_layers=10**6 would take
        # minutes): embeddings, per layer a LayerNorm and an attention
        # (4 D^2 + 4 D), the final norm and the head
        check_alloc("the parameters of vocab_size, d_model, n_layers and "
                    "max_len", (2 * vocab_size + max_len) * d_model
                    + n_layers * (4 * d_model * d_model + 6 * d_model)
                    + 2 * d_model + vocab_size)
        self.max_len = max_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)   # learned positions
        self.norms = nn.ModuleList(
            nn.LayerNorm(d_model) for _ in range(n_layers))
        self.layers = nn.ModuleList(
            MultiHeadAttention(d_model, n_heads) for _ in range(n_layers))
        self.norm_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens ``(B, T)`` long -> logits ``(B, T, V)``."""
        logits, _ = self.forward_with_weights(tokens)
        return logits

    def forward_with_weights(
            self, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """:meth:`forward`, and the N layers' attention weights, a list
        of ``(B, H, T, T)``."""
        if tokens.dim() != 2 or tokens.dtype != torch.long \
                or not 1 <= tokens.shape[1] <= self.max_len:
            raise ValueError(
                f"tokens must be a long tensor (B, T) with T <= max_len="
                f"{self.max_len}, got {tokens.dtype} {tuple(tokens.shape)}")
        B, T = tokens.shape
        pos = torch.arange(T, device=tokens.device)
        h = self.tok_emb(tokens) + self.pos_emb(pos)           # (B, T, D)
        mask = causal_mask(T, device=tokens.device)            # (T, T)
        all_weights = []
        for norm, attn in zip(self.norms, self.layers):
            out, w = attn.forward_with_weights(norm(h), mask=mask)
            h = h + out                                        # residual
            all_weights.append(w)                              # (B, H, T, T)
        logits = self.lm_head(self.norm_f(h))                  # (B, T, V)
        return logits, all_weights


def train_induction(model: TinyAttentionModel, *, steps: int,
                    batch_size: int = 64, lr: float = 3e-3, seed: int = 0,
                    **batch_kwargs) -> list[float]:
    """Train ``model`` on fresh induction batches with AdamW, using the
    course's one training loop (:func:`~course_lib.training.train`,
    explained in chapter 7) with a constant rate and no clipping.

    Args:
        model: the model (trained in place).
        steps: optimiser steps.
        batch_size: sequences per step.
        lr: AdamW learning rate.
        seed: seed of the data generator (the model's init is separate).
        **batch_kwargs: passed to :func:`induction_batch`.

    Returns:
        The training loss (cross-entropy, nats) of every step.
    """
    check_int("steps", steps, minimum=1)
    gen = torch.Generator().manual_seed(seed)
    batches = (induction_batch(batch_size, generator=gen, **batch_kwargs)
               for _ in range(steps))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    # next_token_loss: cross-entropy over (B, T, V) logits, IGNORE skipped
    history = train(model, batches, steps=steps, lr=lr, clip_norm=None,
                    loss_fn=next_token_loss, optimizer=opt, seed=None,
                    progress=False)
    return history.loss


@torch.no_grad()
@small_ops()  # forwards of a small model: see course_lib._util.threads
def accuracy(model: TinyAttentionModel, inputs: torch.Tensor,
             targets: torch.Tensor, *,
             ablate: tuple[tuple[int, int], ...] = ()) -> float:
    """Next-token accuracy on the predictable positions, optionally with
    heads switched off.

    Ablating head ``(layer, head)`` zeroes its columns of ``o_proj`` for
    the evaluation (restored afterwards), so its output never reaches the
    residual stream: a causal test of what the head is needed for.

    Args:
        model: a trained :class:`TinyAttentionModel`.
        inputs, targets: ``(B, T)`` from :func:`induction_batch`.
        ablate: ``(layer, head)`` pairs to switch off.

    Returns:
        Fraction of non-``IGNORE`` targets predicted by the argmax.
    """
    check_type("model", model, TinyAttentionModel, "a TinyAttentionModel")
    n_layers, n_heads = len(model.layers), model.layers[0].n_heads
    for pair in ablate:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"ablate must hold (layer, head) pairs, got "
                             f"{pair!r}")
        _check_index("layer", pair[0], n_layers)
        _check_index("head", pair[1], n_heads)
    keep = targets != IGNORE
    if not keep.any():
        raise ValueError("targets must hold at least one target that is "
                         "not IGNORE (accuracy over no tokens is undefined)")
    saved = []
    try:
        for layer, head in ablate:
            mha = model.layers[layer]
            cols = slice(head * mha.head_dim, (head + 1) * mha.head_dim)
            saved.append((mha, cols, mha.o_proj.weight[:, cols].clone()))
            mha.o_proj.weight[:, cols] = 0.0
        model.eval()
        pred = model(inputs).argmax(-1)                        # (B, T)
    finally:
        for mha, cols, w in reversed(saved):
            mha.o_proj.weight[:, cols] = w
    return (pred[keep] == targets[keep]).float().mean().item()


def head_scores(weights: torch.Tensor, tokens: torch.Tensor, *,
                queries: torch.Tensor | None = None
                ) -> dict[str, torch.Tensor]:
    r"""Average attention of each head on four kinds of key position.

    For a query at position $t$: ``previous`` is key $t - 1$, ``self`` is
    key $t$, ``bos`` is key 0, and ``induction`` is every key $j \le t$
    whose previous token equals the current one ($x_{j-1} = x_t$, $j \ge 2$).
    Each score is the weight on those keys averaged over the queries where
    the kind exists (``previous`` for $t \ge 1$; ``induction`` where some
    earlier $x_{j-1} = x_t$), so a pure head of that kind scores 1.

    Args:
        weights: ``(B, H, T, T)`` attention weights of one layer.
        tokens: ``(B, T)`` the input tokens.
        queries: optional bool ``(B, T)``: average over these queries only.

    Returns:
        dict name -> ``(H,)`` scores in [0, 1].
    """
    check_type("weights", weights, torch.Tensor, "a torch.Tensor")
    check_type("tokens", tokens, torch.Tensor, "a torch.Tensor")
    if weights.dim() != 4 or tokens.dim() != 2 \
            or weights.shape[0] != tokens.shape[0] \
            or weights.shape[2:] != (tokens.shape[1], tokens.shape[1]):
        raise ValueError(
            f"weights must be (B, H, T, T) and tokens (B, T), got weights "
            f"{tuple(weights.shape)} and tokens {tuple(tokens.shape)}")
    B, H, T, _ = weights.shape
    if queries is not None:
        check_shape("queries", queries, (B, T), f"(B, T) = {(B, T)}")
        if queries.dtype != torch.bool:
            raise TypeError(f"queries must be a bool tensor, got "
                            f"{queries.dtype}")
    if queries is None:
        queries = torch.ones(B, T, dtype=torch.bool)
    t = torch.arange(T)
    w = weights.detach().float()
    # induction[b, t, j] = (x_{j-1} == x_t) for 2 <= j <= t
    prev_tok = torch.cat([torch.full((B, 1), -1), tokens[:, :-1]], dim=1)
    match = tokens[:, :, None] == prev_tok[:, None, :]         # (B, T, T)
    match &= (t[None, :] <= t[:, None]) & (t[None, :] >= 2)
    has_prev = (t >= 1)[None, :].expand(B, T)                  # (B, T)
    w_prev = torch.zeros(B, H, T)
    w_prev[:, :, 1:] = w[:, :, t[1:], t[1:] - 1]               # (B, H, T)

    def mean(per_query, where):   # (B, H, T) averaged over chosen queries
        where = (where & queries)[:, None]                     # (B, 1, T)
        return (per_query * where).sum((0, 2)) / where.sum().clamp(min=1)

    return {
        "previous": mean(w_prev, has_prev),
        "self": mean(w[:, :, t, t], queries),
        "bos": mean(w[:, :, :, 0], queries),
        "induction": mean((w * match[:, None]).sum(-1), match.any(-1)),
    }


def copy_head(mha: MultiHeadAttention, *, src: int, dst: int) -> None:
    r"""Make head ``dst`` an exact copy of head ``src`` (in place).

    Copies the head's rows of $W^Q, W^K, W^V$ (and biases) and its columns
    of $W^O$. Two such heads compute the same output and receive the same
    gradient, so gradient descent can never tell them apart.

    Args:
        mha: a module with ``n_kv_heads == n_heads``.
        src, dst: head indices.
    """
    check_type("mha", mha, MultiHeadAttention, "a MultiHeadAttention")
    if mha.n_kv_heads != mha.n_heads:
        raise ValueError(f"copy_head needs n_kv_heads == n_heads, got "
                         f"{mha.n_kv_heads} and {mha.n_heads}")
    for name, value in (("src", src), ("dst", dst)):
        check_int(name, value, minimum=0)
        if value >= mha.n_heads:
            raise ValueError(f"{name} must be < n_heads={mha.n_heads}, "
                             f"got {value}")
    d = mha.head_dim
    s, t = slice(src * d, (src + 1) * d), slice(dst * d, (dst + 1) * d)
    with torch.no_grad():
        for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
            proj.weight[t] = proj.weight[s]          # rows = output features
            if proj.bias is not None:
                proj.bias[t] = proj.bias[s]
        mha.o_proj.weight[:, t] = mha.o_proj.weight[:, s]   # input columns


def head_distance(mha: MultiHeadAttention, a: int, b: int) -> float:
    """Largest absolute difference between the parameters of heads a and b.

    Compares the heads' rows of q/k/v projections (weights and biases) and
    their columns of ``o_proj``. 0.0 means the heads are identical.
    """
    check_type("mha", mha, MultiHeadAttention, "a MultiHeadAttention")
    _check_index("a", a, mha.n_heads)
    _check_index("b", b, mha.n_heads)
    d = mha.head_dim
    sa, sb = slice(a * d, (a + 1) * d), slice(b * d, (b + 1) * d)
    diffs = [(mha.o_proj.weight[:, sa] - mha.o_proj.weight[:, sb]).abs().max()]
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
        diffs.append((proj.weight[sa] - proj.weight[sb]).abs().max())
        if proj.bias is not None:
            diffs.append((proj.bias[sa] - proj.bias[sb]).abs().max())
    return torch.stack(diffs).max().item()

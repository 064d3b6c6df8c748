r"""The recall experiment: how far back can a model fetch one symbol?

A sequence starts with the symbol to remember, continues with distractors
and ends with a query token; the model must output the first symbol. A
recurrent network must carry it through every step (its gradient decays
like $\rho^{T}$, :mod:`course_lib.experiments.rnn`), while one attention layer reads
it directly, one step away from the query, at any distance.

Shape letters: B batch, T sequence length (distance + 1), d_h hidden width,
d attention width, V vocabulary size (symbols, without the query token).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._util.validation import check_alloc, check_int, check_real, check_type
from ..training import train

__all__ = ["make_recall_batch", "RNNRecaller", "AttentionRecaller",
           "train_recall", "recall_accuracy"]


def make_recall_batch(batch: int, distance: int, *, vocab_size: int,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Sample the recall task: recall the first symbol ``distance`` steps on.

    A sequence is $s_0, s_1, \dots, s_{n-1}, \mathtt{QUERY}$ with
    $n$ = ``distance`` i.i.d. uniform symbols from $\{0,\dots,V-1\}$ and the
    query token $V$ at position $n$; the target is $s_0$. Symbols
    $s_1..s_{n-1}$ are distractors drawn from the same alphabet, so chance
    accuracy is $1/V$.

    Returns:
        ``(inputs, targets)``: int64 (B, distance + 1) and (B,).
    """
    check_int("batch", batch, minimum=1)
    check_int("distance", distance, minimum=1)
    check_int("vocab_size", vocab_size, minimum=2)
    check_alloc("batch * (distance + 1)", batch * (distance + 1))
    symbols = torch.randint(vocab_size, (batch, distance),
                            generator=generator)  # (B, distance)
    query = torch.full((batch, 1), vocab_size)  # (B, 1): token id V
    return torch.cat([symbols, query], dim=1), symbols[:, 0]


class RNNRecaller(nn.Module):
    """Embedding -> tanh RNN (``torch.nn.RNN``) -> linear readout of $h_T$.
    """

    def __init__(self, *, vocab_size: int, hidden_size: int = 64) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size + 1, hidden_size)  # +1: QUERY
        # The fused torch.nn.RNN computes exactly SimpleRNN (tested), faster.
        self.rnn = nn.RNN(hidden_size, hidden_size, batch_first=True)
        self.readout = nn.Linear(hidden_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (B, V) for int tokens (B, T)."""
        _, h_T = self.rnn(self.embed(tokens))  # (1, B, d_h)
        return self.readout(h_T[0])  # (B, V)


class AttentionRecaller(nn.Module):
    r"""One attention layer whose only query is the last (QUERY) position.

    $h_j = e(x_j) + p_j$, $q = W^Q h_T$, $k_j = W^K h_j$, $v_j = W^V h_j$,
    $\alpha = \mathrm{softmax}(k_j^\top q / \sqrt{d})$, logits $=
    W^{out} \sum_j \alpha_j v_j$. Every position is one step from the query.
    """

    def __init__(self, *, vocab_size: int, d_model: int = 32,
                 max_len: int = 128) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size + 1, d_model)  # +1: QUERY
        self.pos = nn.Embedding(max_len, d_model)  # learned positions p_j
        self.q_proj = nn.Linear(d_model, d_model, bias=False)  # W^Q
        self.k_proj = nn.Linear(d_model, d_model, bias=False)  # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=False)  # W^V
        self.readout = nn.Linear(d_model, vocab_size)  # W^{out}
        self.last_weights: torch.Tensor | None = None  # (B, T), for plots

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        r"""Logits (B, V) for int tokens (B, T); keeps $\alpha$ for plots."""
        B, T = tokens.shape
        if T > self.pos.num_embeddings:
            raise ValueError(f"tokens length must be <= max_len "
                             f"{self.pos.num_embeddings}, got {T}")
        h = self.embed(tokens) + self.pos.weight[:T]  # (B, T, d)
        q = self.q_proj(h[:, -1])  # (B, d)
        k, v = self.k_proj(h), self.v_proj(h)  # (B, T, d) each
        # alpha = softmax(K q / sqrt(d))
        scores = (k @ q.unsqueeze(-1)).squeeze(-1) / math.sqrt(q.shape[-1])
        alpha = torch.softmax(scores, dim=-1)  # (B, T)
        self.last_weights = alpha.detach()
        return self.readout((alpha.unsqueeze(1) @ v).squeeze(1))  # (B, V)


def train_recall(model: nn.Module, distance: int, *, steps: int = 300,
                 batch: int = 64, lr: float = 3e-3, seed: int = 0
                 ) -> list[float]:
    """Train ``model`` on fresh recall batches with AdamW and cross-entropy,
    using the course's one training loop (:func:`~course_lib.training.train`,
    explained in chapter 7) with a constant rate and no clipping.

    Args:
        model: an :class:`RNNRecaller` or :class:`AttentionRecaller`.
        distance: recall distance of every training sequence.
        steps: optimiser steps; batch: sequences per step.
        lr: AdamW's learning rate (torch's default betas).
        seed: seed of the data generator (the model's init is separate).

    Returns:
        The training loss of every step.
    """
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_int("steps", steps, minimum=1)
    check_int("batch", batch, minimum=1)
    check_real("lr", lr, positive=True)
    g = torch.Generator().manual_seed(seed)
    batches = (make_recall_batch(batch, distance,
                                 vocab_size=model.vocab_size, generator=g)
               for _ in range(steps))
    # fused=True: one kernel updates every parameter, instead of a dozen
    # tiny ops per parameter tensor (these models are small; overhead rules).
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    history = train(model, batches, steps=steps, lr=lr, clip_norm=None,
                    loss_fn=_recall_loss, optimizer=opt, seed=None,
                    progress=False)
    return history.loss


def _recall_loss(model: nn.Module, batch) -> torch.Tensor:
    inputs, targets = batch
    return nn.functional.cross_entropy(model(inputs), targets)


@torch.no_grad()
def recall_accuracy(model: nn.Module, distance: int, *, batch: int = 1000,
                    seed: int = 12345) -> float:
    """Accuracy on one fixed held-out batch. Introduced in chapter 1."""
    check_type("model", model, nn.Module, "a torch.nn.Module")
    check_int("batch", batch, minimum=1)
    check_int("distance", distance, minimum=1)
    # one evaluation batch: (batch, distance + 1) embeddings of the
    # model's width (the recallers' `embed`)
    width = getattr(getattr(model, "embed", None), "embedding_dim", 1)
    check_alloc("batch * (distance + 1) * the model's width",
                batch * (distance + 1) * width)
    g = torch.Generator().manual_seed(seed)
    x, y = make_recall_batch(batch, distance, vocab_size=model.vocab_size,
                             generator=g)
    model.eval()
    return (model(x).argmax(-1) == y).float().mean().item()

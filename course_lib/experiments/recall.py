r"""The recall experiment: how far back can a model fetch one symbol?

A sequence starts with the symbol to remember, continues with distractors
and ends with a query token; the model must output the first symbol. A
recurrent network must carry it through every step (its gradient decays
like $\rho^{T}$, :mod:`course_lib.experiments.rnn`), while one attention layer reads
it directly, one step away from the query, at any distance.

With the symbol always first, a model with learned positions can find it
by *position*. The second version, :func:`make_marked_recall_batch`, puts
a marker at a random position and asks for the symbol after it, so it
must be found by *content*; :func:`run_marked_recall` trains one model on
it and :func:`make_sweep` runs the RNN and the attention model over three
seeds (the stored results chapter 1 plots).

Shape letters: B batch, T sequence length (distance + 1), d_h hidden width,
d attention width, V vocabulary size (symbols, without the query token).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from .._util.validation import (check_alloc, check_bool, check_choice,
                                check_int, check_real, check_type)
from ..training import train
from .sweeps import Sweep, run_sweep

__all__ = ["make_recall_batch", "RNNRecaller", "AttentionRecaller",
           "train_recall", "recall_accuracy", "make_marked_recall_batch",
           "EVAL_DISTANCES", "run_marked_recall", "make_sweep"]


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

    With ``previous_token=True`` each position also holds an embedding of
    the token before it, $h_j = e(x_j) + e'(x_{j-1}) + p_j$ ($x_{-1}$ is
    the QUERY id, "nothing"). That is what the recall by content
    (:func:`make_marked_recall_batch`) needs: the key of the symbol after
    the marker then says "my predecessor is the marker", which the query
    can match wherever it sits. In a Transformer a first attention layer
    writes this in (the previous-token head of an induction circuit,
    chapter 5); here it is given, so one attention step suffices.
    """

    def __init__(self, *, vocab_size: int, d_model: int = 32,
                 max_len: int = 128, previous_token: bool = False) -> None:
        super().__init__()
        check_bool("previous_token", previous_token)
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size + 1, d_model)  # +1: QUERY
        self.embed_previous = (nn.Embedding(vocab_size + 1, d_model)
                               if previous_token else None)  # e'
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
        if self.embed_previous is not None:  # + e'(x_{j-1})
            previous = torch.cat([torch.full_like(tokens[:, :1],
                                                  self.vocab_size),
                                  tokens[:, :-1]], dim=1)  # (B, T)
            h = h + self.embed_previous(previous)  # (B, T, d)
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


# ------------------------------------------------ recall by content
def make_marked_recall_batch(batch: int, length: int, *, vocab_size: int,
                             distance: int | None = None,
                             generator: torch.Generator | None = None
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Sample the recall task by content: recall the symbol after a marker.

    A sequence is $L$ = ``length`` tokens: i.i.d. uniform symbols from
    $\{0, \dots, V-1\}$, except that a ``MARKER`` (id $V$) sits at a
    random position $p$ and the last token is the ``QUERY`` (id $V+1$);
    the target is the symbol $s_{p+1}$ right after the marker. Its
    *distance* to the query is $n = L - 2 - p$, drawn uniformly from
    $1, \dots, L-2$ unless ``distance`` fixes it. The symbol's position
    changes from one sequence to the next, so no model can find it by
    position: it must look for the marker, by content. Chance accuracy is
    $1/V$.

    Returns:
        ``(inputs, targets)``: int64 (B, L) and (B,).
    """
    check_int("batch", batch, minimum=1)
    check_int("length", length, minimum=3)
    check_int("vocab_size", vocab_size, minimum=2)
    if distance is not None:
        check_int("distance", distance, minimum=1, maximum=length - 2)
    check_alloc("batch * length", batch * length)
    tokens = torch.randint(vocab_size, (batch, length),
                           generator=generator)              # (B, L)
    if distance is None:                                     # n ~ U{1..L-2}
        n = torch.randint(1, length - 1, (batch,), generator=generator)
    else:
        n = torch.full((batch,), distance)                   # (B,)
    p = length - 2 - n                                       # marker at p
    rows = torch.arange(batch)
    tokens[rows, p] = vocab_size                             # MARKER
    tokens[:, -1] = vocab_size + 1                           # QUERY
    return tokens, tokens[rows, p + 1]


EVAL_DISTANCES = [1, 5, 10, 15, 20, 30, 40]


def run_marked_recall(*, kind: str, seed: int, length: int = 42,
                      vocab_size: int = 8, steps: int = 600,
                      batch: int = 64, lr: float = 1e-2,
                      eval_batch: int = 500) -> dict:
    r"""Train one model on :func:`make_marked_recall_batch` (distances
    mixed, $1 \dots L-2$) and measure it at fixed distances.

    ``kind`` ``"rnn"`` is an :class:`RNNRecaller` ($d_h = 64$),
    ``"attention"`` an :class:`AttentionRecaller` ($d = 32$) with
    ``previous_token=True``; both are built for $V + 1$ symbols (the
    marker is one that is never asked for), so the QUERY id is $V + 1$.
    ``torch.manual_seed(seed)`` fixes the initial weights, a generator
    seeded with ``seed`` the training batches and one seeded with
    ``10_000 + seed`` the test batches. AdamW at ``lr`` without clipping,
    as :func:`train_recall`.

    Returns:
        ``{"distances", "accuracy", "final_loss"}``: the distances of
        ``EVAL_DISTANCES`` that fit, the held-out accuracy at each (on
        ``eval_batch`` sequences), and the mean training loss of the last
        50 steps.
    """
    check_choice("kind", kind, ("rnn", "attention"))
    check_int("seed", seed, minimum=0)
    check_int("length", length, minimum=3)
    check_int("vocab_size", vocab_size, minimum=2)
    check_int("steps", steps, minimum=1)
    check_int("eval_batch", eval_batch, minimum=1)
    torch.manual_seed(seed)
    if kind == "rnn":
        model = RNNRecaller(vocab_size=vocab_size + 1, hidden_size=64)
    else:
        model = AttentionRecaller(vocab_size=vocab_size + 1, d_model=32,
                                  max_len=length, previous_token=True)
    g = torch.Generator().manual_seed(seed)
    batches = (make_marked_recall_batch(batch, length, vocab_size=vocab_size,
                                        generator=g) for _ in range(steps))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
    history = train(model, batches, steps=steps, lr=lr, clip_norm=None,
                    loss_fn=_recall_loss, optimizer=opt, seed=None,
                    progress=False)
    distances = [n for n in EVAL_DISTANCES if n <= length - 2]
    g_test = torch.Generator().manual_seed(10_000 + seed)
    accuracy = []
    model.eval()
    with torch.no_grad():
        for n in distances:
            x, y = make_marked_recall_batch(eval_batch, length,
                                            vocab_size=vocab_size,
                                            distance=n, generator=g_test)
            accuracy.append((model(x).argmax(-1) == y).float().mean().item())
    return {"distances": distances, "accuracy": accuracy,
            "final_loss": sum(history.loss[-50:]) / len(history.loss[-50:])}


def make_sweep() -> Sweep:
    """The recall by content, RNN and attention, seeds 0, 1, 2."""
    return run_sweep(
        "recall", run_marked_recall,
        [{"kind": "rnn"}, {"kind": "attention"}], [0, 1, 2],
        description="recall of the symbol after a marker at a random "
                    "position (sequences of 42 tokens, 8 symbols): a tanh "
                    "RNN against one attention layer, 600 AdamW steps of "
                    "64 sequences at lr 1e-2; accuracy on 500 held-out "
                    "sequences per distance",
        meta={"length": 42, "vocab_size": 8, "steps": 600, "batch": 64,
              "lr": 1e-2, "eval_batch": 500}, progress=True)

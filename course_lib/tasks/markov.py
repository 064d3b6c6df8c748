r"""A synthetic language with an exact entropy rate, and its training recipe.

Symbols are drawn by a Markov chain of order $k$
over $V$ symbols: the next symbol depends on the last $k$ only,
$p(x_t \mid x_{<t}) = P[c_t, x_t]$ with context $c_t = (x_{t-k}, \dots,
x_{t-1})$. Each context allows only a few successors, with random
probabilities. For a stationary chain the entropy rate is exact,

$$h = \sum_{c} \pi(c)\, H\big(P[c, \cdot]\big)
    = -\sum_{c} \pi(c) \sum_{x} P[c, x] \log P[c, x] \quad\text{nats},$$

where $\pi$ is the stationary distribution over contexts. No model can have
a lower expected cross-entropy per token, so $h$ is the floor for the
validation loss of a language model trained on this process.

The recipe :func:`train_synthetic_lm` trains chapter 7's decoder-only
model on it with the one loop of :mod:`course_lib.training`;
:func:`load_synthetic_lm` loads the model it trains with its defaults, as
committed by ``make checkpoints``, for chapters 7 and 8 (a unit test
checks that the two agree).

Shape letters: B batch, T sequence length, V vocabulary (number of
symbols), C number of contexts ($V^k$).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from .._util.validation import check_alloc, check_bool, check_int, check_type
from ..model.decoder_lm import DecoderLM, DecoderLMConfig
from ..training import (
    IGNORE,
    History,
    next_token_loss,
    read_state_file,
    save_state_file,
    train,
)

__all__ = ["MarkovSource", "stationary_distribution", "entropy_rate",
           "random_markov_source", "sample_markov", "token_nll", "lm_batches",
           "LMRun", "train_synthetic_lm", "SYNTHETIC_LM_PATH",
           "save_synthetic_lm", "load_synthetic_lm"]


# ------------------------------------------------------ synthetic language
@dataclass(frozen=True)
class MarkovSource:
    r"""A Markov chain of order $k$ over $V$ symbols.

    ``probs[c, x]`` is $P[c, x] = p(x_t = x \mid c_t = c)$; the context
    $c = (x_{t-k}, \dots, x_{t-1})$ is numbered in base $V$ with the
    oldest symbol as the leading digit. ``symbols`` names the ids.
    Every row of ``probs`` (float64, shape $(V^k, V)$) must be a
    distribution: finite, $\ge 0$, summing to 1 within $10^{-6}$.
    """

    vocab_size: int
    order: int
    probs: torch.Tensor              # (C, V), float64, rows sum to 1
    symbols: str

    def __post_init__(self) -> None:
        check_int("vocab_size", self.vocab_size, minimum=2)
        check_int("order", self.order, minimum=1)
        check_type("probs", self.probs, torch.Tensor, "a torch.Tensor")
        check_type("symbols", self.symbols, str, "a str")
        V, P = self.vocab_size, self.probs
        C = P.shape[0] if P.dim() == 2 else 0
        # V ** order is only computed when it can equal C (order = 10**9
        # would be a number of a billion digits)
        if P.dim() != 2 or P.shape[1] != V or \
                self.order > C.bit_length() or V ** self.order != C:
            raise ValueError(f"probs must have shape (vocab_size ** order, "
                             f"vocab_size) = ({V}^{self.order}, {V}), got "
                             f"{tuple(P.shape)}")
        if P.dtype != torch.float64:
            raise TypeError(f"probs must be a float64 tensor, got "
                            f"{P.dtype}")
        # Every row is a distribution: otherwise the entropy rate and the
        # losses come out as numbers that mean nothing (even negative).
        if not bool(P.isfinite().all()) or bool((P < 0).any()) or \
                not bool(((P.sum(-1) - 1).abs() <= 1e-6).all()):
            raise ValueError("probs must hold finite probabilities >= 0 "
                             "whose rows sum to 1")
        if len(self.symbols) < V:
            raise ValueError(f"symbols must name the {V} ids, got "
                             f"{self.symbols!r:.40}")

    def context_ids(self, seqs: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` symbols -> ``(B, T - k + 1)`` ids of every window."""
        windows = seqs.unfold(1, self.order, 1)          # (B, T-k+1, k)
        weights = self.vocab_size ** torch.arange(self.order - 1, -1, -1)
        return (windows * weights).sum(-1)               # (B, T-k+1)

    def decode(self, ids) -> str:
        """Symbol ids -> a string of letters."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else ids
        return "".join(self.symbols[i] for i in ids)


def _transition_matrix(source: MarkovSource) -> torch.Tensor:
    """(C, C) chain over contexts: c = (.., a, b) -> c' = (.., b, x)."""
    C, V = source.probs.shape
    nxt = (torch.arange(C)[:, None] * V) % C + torch.arange(V)   # (C, V)
    M = torch.zeros(C, C, dtype=torch.float64)
    M.scatter_add_(1, nxt, source.probs)
    return M


def stationary_distribution(source: MarkovSource) -> torch.Tensor:
    r"""The stationary distribution $\pi$ over contexts, $\pi M = \pi$.

    $M$ is the chain over contexts; $\pi$ is its left eigenvector for
    eigenvalue 1 with $\sum_c \pi(c) = 1$, solved as a linear system in
    float64; it is unique because the chain has one recurrent class (see
    :func:`random_markov_source`).

    Returns:
        ``(C,)`` float64, sums to 1.
    """
    check_type("source", source, MarkovSource, "a MarkovSource")
    M = _transition_matrix(source)                           # (C, C)
    C = M.shape[0]
    # pi (M - I) = 0 has a one-dimensional solution space; replacing one
    # equation by sum(pi) = 1 makes the system regular.
    A = (M - torch.eye(C, dtype=torch.float64)).T            # (C, C)
    A[-1] = 1.0
    rhs = torch.zeros(C, dtype=torch.float64)
    rhs[-1] = 1.0
    pi = torch.linalg.solve(A, rhs)                          # (C,)
    # exact zeros on transient contexts are tiny negatives after rounding
    pi = pi.clamp(min=0.0)
    return pi / pi.sum()


def entropy_rate(source: MarkovSource) -> float:
    r"""Exact entropy rate $h = \sum_c \pi(c) H(P[c, \cdot])$ in nats.
    """
    check_type("source", source, MarkovSource, "a MarkovSource")
    P = source.probs
    # H(P[c, .]) = -sum_x P log P, with 0 log 0 = 0
    per_context = -(P * torch.where(P > 0, P.log(), 0.0)).sum(-1)  # (C,)
    return float(stationary_distribution(source) @ per_context)


def random_markov_source(*, vocab_size: int = 16, order: int = 2,
                         branching: int = 3, concentration: float = 1.0,
                         seed: int = 0) -> MarkovSource:
    r"""A random sparse Markov chain with a unique stationary distribution.

    Each of the $V^k$ contexts gets ``branching`` distinct successors with
    probabilities from a Dirichlet(``concentration``) draw. Some contexts
    may be transient (no context leads to them; $\pi = 0$ there). A draw
    whose recurrent contexts do not form one aperiodic class (every
    context must reach every recurrent context in exactly $n$ steps for
    large $n$) is rejected and redrawn, so the stationary distribution
    is unique and long samples are ergodic.
    """
    check_int("vocab_size", vocab_size, minimum=2)
    check_int("order", order, minimum=1)
    check_int("branching", branching, minimum=1)
    if branching > vocab_size:
        raise ValueError(f"branching must be <= vocab_size={vocab_size}, "
                         f"got {branching}")
    if vocab_size > 26 or vocab_size ** order > 1024:
        raise ValueError(f"vocab_size must be <= 26 (one letter each) and "
                         f"vocab_size ** order <= 1024 contexts, got "
                         f"vocab_size={vocab_size}, order={order}")
    if not concentration > 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    C = vocab_size ** order
    symbols = "abcdefghijklmnopqrstuvwxyz"[:vocab_size]
    dirichlet = torch.distributions.Dirichlet(
        torch.full((C, branching), float(concentration), dtype=torch.float64))
    # A private RNG stream: the caller's global state is left untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(100):
            succ = torch.rand(C, vocab_size).argsort(-1)[:, :branching]
            probs = torch.zeros(C, vocab_size, dtype=torch.float64)
            probs.scatter_(1, succ, dirichlet.sample())           # (C, V)
            source = MarkovSource(vocab_size, order, probs, symbols)
            reach = (_transition_matrix(source) > 0).double()
            # Squaring j times gives the pattern of M^(2^j); 2^j >= C^2 + C
            # exceeds Wielandt's bound (C-1)^2 + 1 plus C transient steps.
            for _ in range(math.ceil(math.log2(C * C + C))):
                reach = ((reach @ reach) > 0).double()
            # Primitive on its recurrent contexts: from every context, after
            # many steps, every recurrent context is reachable (a column of
            # all ones) and no transient one is (a column of zeros).
            cols = reach.sum(0)                                  # (C,)
            if bool(((cols == C) | (cols == 0)).all()):
                return source
    raise ValueError("no primitive chain found; increase branching")


def sample_markov(source: MarkovSource, *, n_sequences: int, length: int,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    r"""Sample sequences from the stationary chain.

    The first context is drawn from $\pi$, so every position of every
    sequence has the stationary distribution (no burn-in needed).

    Returns:
        ``(B, T)`` long symbol ids, ``T = length >= order``.
    """
    check_type("source", source, MarkovSource, "a MarkovSource")
    check_int("n_sequences", n_sequences, minimum=1)
    check_int("length", length, minimum=source.order)
    # the ids and their uniform draws, (B, T) each
    check_alloc("n_sequences * length", n_sequences * length)
    V, k = source.vocab_size, source.order
    C = V ** k
    pi = stationary_distribution(source)
    ctx = torch.multinomial(pi, n_sequences, replacement=True,
                            generator=generator)             # (B,)
    seqs = torch.empty(n_sequences, length, dtype=torch.long)
    for j in range(k):                    # digits of the first context
        seqs[:, j] = ctx // V ** (k - 1 - j) % V
    cdf = source.probs.cumsum(-1)                            # (C, V)
    # From the last allowed symbol on the CDF must be exactly 1, or a
    # rounding gap below 1 could select a forbidden symbol.
    tail = source.probs.flip(-1).cumsum(-1).flip(-1) - source.probs
    cdf[tail == 0] = 1.0
    u = torch.rand(n_sequences, length, generator=generator,
                   dtype=torch.float64)                      # (B, T)
    for t in range(k, length):
        # inverse-CDF sampling: x = number of CDF entries <= u
        x = (cdf[ctx] <= u[:, t, None]).sum(-1)              # (B,)
        seqs[:, t] = x
        ctx = (ctx * V) % C + x           # drop the oldest symbol
    return seqs


def token_nll(source: MarkovSource, seqs: torch.Tensor) -> torch.Tensor:
    r"""True $-\log p(x_t \mid c_t)$ of every predictable token, in nats.

    Args:
        seqs: ``(B, T)`` symbol ids.

    Returns:
        ``(B, T - k)`` float64: the loss of the ideal model on tokens
        $t = k, \dots, T-1$; ``inf`` where the chain forbids a token.
    """
    check_type("source", source, MarkovSource, "a MarkovSource")
    check_type("seqs", seqs, torch.Tensor, "a torch.Tensor")
    if seqs.dim() != 2 or seqs.shape[1] <= source.order:
        raise ValueError(f"seqs must have shape (B, T) with T > order="
                         f"{source.order}, got {tuple(seqs.shape)}")
    if seqs.is_floating_point() or seqs.is_complex() or \
            seqs.dtype == torch.bool:
        raise TypeError(f"seqs must be an integer tensor of symbol ids, "
                        f"got {seqs.dtype}")
    # an id of -1 would index the last symbol, and one >= V another context
    if seqs.numel() and (seqs.min() < 0 or seqs.max() >= source.vocab_size):
        raise ValueError(f"seqs must hold ids in [0, {source.vocab_size}), "
                         f"got [{seqs.min().item()}, {seqs.max().item()}]")
    ctx = source.context_ids(seqs[:, :-1])                   # (B, T-k)
    p = source.probs[ctx, seqs[:, source.order:]]            # (B, T-k)
    return -p.log()


def lm_batches(source: MarkovSource, *, batch_size: int, length: int,
               seed: int = 0):
    """Endless fresh batches for next-token prediction.

    Each sequence has ``length + 1`` symbols; inputs are the first
    ``length``, targets the last ``length``. The first ``order - 1``
    targets are set to ``IGNORE``: they lack a full context, so their
    best possible loss is above the entropy rate.

    Yields:
        ``(inputs, targets)``, both ``(B, length)`` long.
    """
    # checked at the call, not at the first batch (a generator's body only
    # starts then)
    check_type("source", source, MarkovSource, "a MarkovSource")
    check_int("batch_size", batch_size, minimum=1)
    check_int("length", length, minimum=source.order)
    check_alloc("batch_size * (length + 1)", batch_size * (length + 1))
    return _lm_batches(source, batch_size, length, seed)


def _lm_batches(source: MarkovSource, batch_size: int, length: int,
                seed: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        seqs = sample_markov(source, n_sequences=batch_size,
                             length=length + 1, generator=gen)
        targets = seqs[:, 1:].clone()
        targets[:, :source.order - 1] = IGNORE
        yield seqs[:, :-1], targets


# ------------------------------------------------------------ training recipe
class LMRun(NamedTuple):
    """Result of :func:`train_synthetic_lm`."""
    model: nn.Module                 # a trained DecoderLM, in eval mode
    history: History
    source: MarkovSource           # the language it was trained on
    val_batch: tuple                 # (inputs, targets) of the val loss
    entropy_rate: float              # exact floor, nats per token
    val_floor: float                 # true -log p on val_batch's targets


def _synthetic_language(length: int) -> tuple[MarkovSource, tuple, float]:
    """Chapter 7's language, its validation batch and the true loss on it."""
    source = random_markov_source(vocab_size=16, order=2, branching=3,
                                  seed=0)
    val = next(lm_batches(source, batch_size=128, length=length,
                          seed=10_000))
    full = torch.cat([val[0], val[1][:, -1:]], dim=1)     # (B, T + 1)
    return source, val, token_nll(source, full).mean().item()


def train_synthetic_lm(*, seed: int = 0, steps: int = 300,
                       batch_size: int = 32, length: int = 64,
                       lr: float = 1e-2, warmup_steps: int = 30,
                       schedule: str = "cosine", eval_every: int = 25,
                       progress: bool = False) -> LMRun:
    r"""Train chapter 7's decoder-only LM on its synthetic language.

    Language: :func:`random_markov_source` with 16
    symbols, order 2, 3 successors per context (seed 0, whatever ``seed``
    is). Model: a Llama-style :class:`~course_lib.model.decoder_lm.DecoderLM`
    (RoPE, RMSNorm, SwiGLU), 2 layers, $D = 64$, 4 heads, context 64.
    ``seed`` sets the initialisation, the dropout stream and the data.
    """
    check_bool("progress", progress)
    source, val, val_floor = _synthetic_language(length)
    torch.manual_seed(seed)
    model = DecoderLM(DecoderLMConfig(
        vocab_size=16, hidden_size=64, num_attention_heads=4,
        num_hidden_layers=2, max_position_embeddings=length))
    history = train(model, lm_batches(source, batch_size=batch_size,
                                      length=length, seed=seed + 1),
                    steps=steps, lr=lr, warmup_steps=warmup_steps,
                    schedule=schedule, weight_decay=0.1, clip_norm=1.0,
                    eval_fn=lambda m: next_token_loss(m, val).item(),
                    eval_every=eval_every, seed=seed, progress=progress)
    return LMRun(model.eval(), history, source, val,
                 entropy_rate(source), val_floor)


# ---------------------------------------------------- the committed checkpoint
SYNTHETIC_LM_PATH = Path(__file__).resolve().parents[1] / "data" / "synthetic_lm.pt"


def save_synthetic_lm(run: LMRun, path=SYNTHETIC_LM_PATH) -> None:
    """Write a run of :func:`train_synthetic_lm` (float32 weights, config,
    history) for :func:`load_synthetic_lm` (``make checkpoints``)."""
    check_type("run", run, LMRun, "an LMRun from train_synthetic_lm")
    save_state_file(path, {"config": asdict(run.model.config),
                           "weights": run.model.state_dict(),
                           "history": asdict(run.history)})


def load_synthetic_lm(path=SYNTHETIC_LM_PATH) -> LMRun:
    """The model ``train_synthetic_lm(seed=0)`` trains, as committed.

    Returns the same :class:`LMRun` as the recipe: the model (float32, eval
    mode) and its training history from the file; the language, the
    validation batch and the floors rebuilt as the recipe builds them.
    """
    state = read_state_file(path, "synthetic-LM checkpoint",
                            " (run `make checkpoints`)")
    model = DecoderLM(DecoderLMConfig(**state["config"]))
    model.load_state_dict(state["weights"])
    source, val, val_floor = _synthetic_language(
        model.config.max_position_embeddings)
    return LMRun(model.eval(), History(**state["history"]), source, val,
                 entropy_rate(source), val_floor)
